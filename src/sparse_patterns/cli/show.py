"""``patterns list`` and ``patterns show``: the registered families, and one pattern's |A_i|.
"""

from __future__ import annotations

import typer
from rich.table import Table

from ._app import FILE, JSON, NAME, PATTERN_CONTEXT, N, cli_command, console, emit_json
from ._args import Command, pattern_from_args


@cli_command
def list_cmd(json_out: bool = JSON) -> None:
    """List the registered patterns, their parameters and the papers they come from."""
    from ..catalog import CATALOG, describe  # noqa: PLC0415 (no NumPy: the table is static)

    rows = describe()
    if json_out:
        emit_json(rows)
        return
    t = Table(title="Registered patterns")
    for col in ("name", "parameters (defaults)", "description", "reference"):
        t.add_column(col)
    for r in rows:
        fam = CATALOG[r["name"]]
        ps = ", ".join(f"--{p.name.replace('_', '-')} {p.default_text()}" for p in fam.params)
        t.add_row(r["name"], ps, r["description"], r["reference"])
    console.print(t)


@cli_command
def show_cmd(
    ctx: typer.Context,
    name: str = NAME,
    n: int = N,
    file: str = FILE,
    json_out: bool = JSON,
) -> None:
    """Show a pattern: a text picture for n <= 64 and |A_i| figures per head.

    Pattern parameters are options of the same name: --stride 8 --c 2 --window reference.
    """
    from ..analysis.budget import budget_table  # noqa: PLC0415

    result = budget_table(pattern_from_args(name, n, ctx.args, file))
    if json_out:
        emit_json(result.to_dict())
    else:
        console.print(result.table())


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("list", cls=Command)(list_cmd)
    app.command("show", cls=Command, context_settings=PATTERN_CONTEXT)(show_cmd)
