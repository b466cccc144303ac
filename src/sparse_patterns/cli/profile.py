"""``patterns profile``: our kernels timed next to torch SDPA and FlexAttention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ._app import PATTERN_CONTEXT, cli_command, console, emit_json, err_console, int_opt
from ._args import Command, parse_list, parse_params, split_names

#: Width ``--wide`` is laid out in: every column at its natural width, never squeezed.
_WIDE_WIDTH = 1000


@cli_command
def profile_cmd(
    ctx: typer.Context,
    n: str = typer.Option(None, "--n", help="Sequence lengths, comma-separated: 4096,16384."),
    impls: str = typer.Option(
        "auto", "--impls", "--impl",
        help="Our backends, comma-separated: auto (numba on cpu, torch on cuda), numba, "
             "torch, flex, cuda, reference."),
    baselines: str = typer.Option(
        "sdpa,flex", "--baselines", help="Baselines, comma-separated: sdpa, flex (or none)."
    ),
    batch: int = int_opt("batch", 1, "Batch size B", 1, 1 << 16),
    heads: int = int_opt("heads", 8, "Attention heads H", 1, 1 << 16),
    head_dim: int = int_opt("head_dim", 64, "Head dimension d", 1, 1 << 14),
    dtype: str = typer.Option(
        None, "--dtype",
        help="float32, float64, float16 or bfloat16 (default: float32 on cpu, bfloat16 on cuda)."),
    mode: str = typer.Option("merged", "--mode", help="merged (union) or multihead."),
    repeats: int = int_opt("repeats", 5, "Timed calls after the warm-up", 1, 1000),
    device: str = typer.Option(
        "cpu", "--device",
        help="Where the inputs live: cpu, or cuda (CUDA events, torch.cuda peak memory)."),
    plot: str = typer.Option(None, "--plot", help="Also save a log-log plot: .png, .svg or .pdf."),
    wide: bool = typer.Option(False, "--wide", help="Every column (the default fits 80 columns)."),
    markdown: bool = typer.Option(False, "--markdown", help="Print a markdown table (every column)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (everything)."),
) -> None:
    """Time patterns in our kernels next to torch SDPA and FlexAttention (CPU or CUDA).

    Usage: patterns profile strided fixed full --n 4096,16384 [--stride sqrt ...]
    [--impl auto,numba,torch,flex,cuda] [--device cpu|cuda].
    Pattern names come first; pattern parameters (--stride sqrt, --c 16,
    --no-causal) apply to every named pattern that takes them. Each runner's
    output is checked against an exact oracle before it is timed; a wrong one
    is reported as WRONG and not timed (exit status 1, as when ours fails).
    Times are medians after a warm-up; "x sdpa" is SDPA's time over ours
    (above 1: ours is faster); "%pk" is the useful throughput as a share of the
    host's measured FMA peak, "%mm" of fp32 matmul. FlexAttention (the "flex"
    baseline, natural-order BlockMask, and impl "flex", the plan's pieces)
    compiles for 15-70 s per shape.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from ..profiling import profile  # noqa: PLC0415
    from ..render import check_output  # noqa: PLC0415

    names, rest, ns = split_names(list(ctx.args), n, "4096,16384")
    params = parse_params(names, rest)
    out = None if plot is None else check_output(plot)

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task("profiling", total=None)
        table = profile(names, ns, impls=parse_list(impls), baselines=parse_list(baselines), batch=batch,
                        heads=heads, head_dim=head_dim, dtype=dtype, repeats=repeats, mode=mode,
                        params=params, device=device, progress=lambda done, total, what: bar.update(
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


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("profile", cls=Command, context_settings=PATTERN_CONTEXT,
             options_metavar="NAME... --n N1,N2 [OPTIONS] [PATTERN OPTIONS]")(profile_cmd)
