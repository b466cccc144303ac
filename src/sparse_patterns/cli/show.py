"""``patterns list`` and ``patterns show``."""

from __future__ import annotations

import typer
from rich.table import Table

from ..analysis.budget import budgets
from ..patterns import registry
from ._app import PATTERN_CONTEXT, app, cli_command, console, emit_json, pattern_from_args


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
    pat = pattern_from_args(name, n, ctx.args, file)
    rows = budgets(pat)
    picture = pat.to_string() if pat.n <= 64 else None
    if json_out:
        emit_json(
            {
                "name": pat.name,
                "n": pat.n,
                "params": dict(pat.params),
                "causal": pat.causal,
                "heads": [r.to_dict() for r in rows],
                "picture": picture,
            }
        )
        return
    ps = ", ".join(f"{k}={v}" for k, v in pat.params.items())
    console.print(f"[bold]{pat.name}[/]({ps})  n={pat.n}  heads={pat.num_heads}", highlight=False)
    if picture is not None:
        legend = "  ".join(f"{k + 1}={h}" for k, h in enumerate(pat.head_names) if k < 9)
        console.print(picture, highlight=False, markup=False)
        console.print(f"rows are outputs i, columns inputs j; {legend}; # = several heads",
                      highlight=False)
    t = Table()
    for col in ("head", "nnz", "density", "max |A_i|", "mean |A_i|", "n^(1/p)", "max/n^(1/p)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r.head, f"{r.nnz:,}", f"{r.density:.4g}", str(r.max_row), f"{r.mean_row:.2f}",
                  f"{r.root:.2f}", f"{r.max_over_root:.2f}")
    console.print(t)
