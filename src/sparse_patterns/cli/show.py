"""``patterns list`` and ``patterns show``."""

from __future__ import annotations

import typer
from rich.table import Table

from ..patterns import registry
from ._app import PATTERN_CONTEXT, app, cli_command, console, emit_json, pattern_from_args

__all__ = ["list_patterns", "list_cmd", "show_cmd"]


def list_patterns() -> list[dict]:
    """Registered patterns with their parameters, defaults, description and reference."""
    out = []
    for name in sorted(registry.REGISTRY):
        spec = registry.REGISTRY[name]
        out.append(
            {
                "name": name,
                "params": {p.name: p.default for p in spec.params},
                "description": spec.description,
                "reference": spec.reference,
            }
        )
    return out


@app.command("list")
@cli_command
def list_cmd(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the registered patterns, their parameters and the papers they come from."""
    rows = list_patterns()
    if json_out:
        emit_json(rows)
        return
    t = Table(title="Registered patterns")
    for col in ("name", "parameters (defaults)", "description", "reference"):
        t.add_column(col)
    for r in rows:
        spec = registry.REGISTRY[r["name"]]
        ps = ", ".join(f"--{p.name.replace('_', '-')} {p.default_text()}" for p in spec.params)
        t.add_row(r["name"], ps, r["description"], r["reference"])
    console.print(t)


@app.command("show", context_settings=PATTERN_CONTEXT)
@cli_command
def show_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Pattern name (see `patterns list`)."),
    n: int = typer.Option(None, "--n", help="Sequence length."),
    file: str = typer.Option(None, "--file", help="A saved pattern (.npz, .safetensors, .json)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
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
