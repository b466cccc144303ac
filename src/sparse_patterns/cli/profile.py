"""``patterns profile``: the cost of each pattern in our kernel, next to torch SDPA and FlexAttention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..patterns import registry
from ._app import (
    PATTERN_CONTEXT,
    UsageError,
    app,
    cli_command,
    console,
    emit_json,
    err_console,
    parse_ns,
    parse_params,
)

__all__ = ["profile_cmd"]

#: Width ``--wide`` is laid out in: every column at its natural width, never squeezed.
_WIDE_WIDTH = 1000


def _split(ctx_args: list[str]) -> tuple[list[str], list[str]]:
    """Leading words are pattern names; everything from the first ``--option`` on are parameters."""
    k = next((i for i, a in enumerate(ctx_args) if a.startswith("--")), len(ctx_args))
    return ctx_args[:k], ctx_args[k:]


def _list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    return [] if items == ["none"] else items


@app.command("profile", context_settings=PATTERN_CONTEXT,
             options_metavar="NAME... --n N1,N2 [OPTIONS] [PATTERN OPTIONS]")
@cli_command
def profile_cmd(
    ctx: typer.Context,
    n: str = typer.Option(None, "--n", help="Sequence lengths, comma-separated: 4096,16384."),
    impls: str = typer.Option("numba", "--impls", help="Our implementations, comma-separated."),
    baselines: str = typer.Option(
        "sdpa,flex", "--baselines", help="Baselines, comma-separated: sdpa, flex (or none)."
    ),
    batch: int = typer.Option(1, "--batch", help="Batch size B."),
    heads: int = typer.Option(8, "--heads", help="Attention heads H."),
    head_dim: int = typer.Option(64, "--head-dim", help="Head dimension d."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, float64, float16 or bfloat16."),
    mode: str = typer.Option("merged", "--mode", help="merged (union) or multihead."),
    repeats: int = typer.Option(5, "--repeats", help="Timed calls after the warm-up."),
    plot: str = typer.Option(None, "--plot", help="Also save a log-log plot: .png, .svg or .pdf."),
    wide: bool = typer.Option(False, "--wide", help="Every column (the default fits 80 columns)."),
    markdown: bool = typer.Option(False, "--markdown", help="Print a markdown table (every column)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (everything)."),
) -> None:
    """Time patterns in our kernel next to torch SDPA and FlexAttention (CPU).

    Usage: patterns profile strided fixed full --n 4096,16384 [--stride sqrt ...].
    Pattern names come first; pattern parameters (--stride sqrt, --c 16,
    --no-causal) apply to every named pattern that takes them. Each runner's
    output is checked against an exact oracle before it is timed; a wrong one
    is reported as WRONG and not timed (exit status 1, as when ours fails).
    Times are medians after a warm-up; "x sdpa" is SDPA's time over ours
    (above 1: ours is faster). FlexAttention compiles for 15-70 s per shape.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from ..profiling import profile  # noqa: PLC0415
    from ..render._save import check_output  # noqa: PLC0415

    names, rest = _split(list(ctx.args))
    if not names:
        raise UsageError(f"patterns: name at least one pattern ({', '.join(sorted(registry.REGISTRY))})")
    for name in names:
        registry.get(name)
    if n is None:
        raise UsageError("n: --n is required (comma-separated integers >= 1, e.g. 4096,16384)")
    ns, params = parse_ns(n), parse_params(names, rest)
    out = None if plot is None else check_output(plot)

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task("profiling", total=None)
        table = profile(names, ns, impls=_list(impls), baselines=_list(baselines), batch=batch,
                        heads=heads, head_dim=head_dim, dtype=dtype, repeats=repeats, mode=mode,
                        params=params, progress=lambda done, total, what: bar.update(
                            task, completed=done, total=total, description=what))
    if out is not None:
        _save_plot(table, out)
    if json_out:
        emit_json(table.to_dict())
    elif markdown:
        console.print(table.to_markdown(), markup=False, highlight=False, soft_wrap=True)
    else:  # the compact table fits 80 columns; --wide is never squeezed into "…"
        (Console(width=_WIDE_WIDTH) if wide else console).print(table.table(wide=wide))
    if out is not None:
        err_console.print(f"wrote {out}", highlight=False)
    if table.failed:
        bad = ", ".join(f"{r} on {p} n={n_}" for p, n_, r in table.failed)
        err_console.print(f"error: wrong output or failure: {bad}", highlight=False, markup=False)
        raise typer.Exit(1)


def _save_plot(table: Any, out: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from ..render import save_figure  # noqa: PLC0415
    from ..render.profile import plot_profile  # noqa: PLC0415

    ax = plot_profile(table)
    try:
        save_figure(ax.figure, out)
    finally:
        plt.close(ax.figure)
