"""``patterns profile``: the cost of each pattern in our kernel, next to torch SDPA and FlexAttention."""

from __future__ import annotations

import typer
from rich.table import Table

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

__all__ = ["profile_cmd", "parse_shared_params"]


def parse_shared_params(names: list[str], args: list[str]) -> dict[str, str | bool]:
    """Parse ``--param value`` / ``--flag`` / ``--no-flag`` shared across ``names``.

    A parameter must be taken by at least one of the patterns; ``profile``
    gives each pattern only the parameters it takes.

    Examples
    --------
    >>> parse_shared_params(["strided", "fixed"], ["--stride", "sqrt", "--no-causal"])
    {'stride': 'sqrt', 'causal': False}
    """
    return parse_params(names, args)


def _split(ctx_args: list[str]) -> tuple[list[str], list[str]]:
    """Leading words are pattern names; everything from the first ``--option`` on are parameters."""
    names: list[str] = []
    k = 0
    while k < len(ctx_args) and not ctx_args[k].startswith("--"):
        names.append(ctx_args[k])
        k += 1
    return names, ctx_args[k:]


#: short headers for the terminal (the markdown and JSON keep the long names)
_SHORT = {"density": "dens", "useful GFLOP": "GFLOP", "computed/useful": "c/u",
          "median s": "median", "min-max s": "min-max", "compile s": "1st-med",
          "GFLOP/s": "GF/s", "% matmul": "%mm", "peak MB": "MB", "sdpa s": "sdpa",
          "x sdpa": "xsdpa", "flex s": "flex", "x flex": "xflex"}
_LEGEND = ("GFLOP: useful work (4 d per attended pair per head); c/u: computed / useful FLOPs "
           "of the plan; 1st-med: first call minus median (compilation); GF/s: useful GFLOP/s; "
           "%mm: of fp32 matmul; MB: peak memory of one call; xsdpa, xflex: baseline time / "
           "ours (above 1: ours is faster).")


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
    markdown: bool = typer.Option(False, "--markdown", help="Print a markdown table."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
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
    from ..kernels.profile import profile  # noqa: PLC0415

    names, rest = _split(list(ctx.args))
    if not names:
        raise UsageError(f"patterns: name at least one pattern ({', '.join(sorted(registry.REGISTRY))})")
    for name in names:
        registry.get(name)
    if n is None:
        raise UsageError("n: --n is required (comma-separated integers >= 1, e.g. 4096,16384)")
    ns = parse_ns(n)
    params = parse_shared_params(names, rest)
    out = None
    if plot is not None:
        from ..render._save import check_output  # noqa: PLC0415

        out = check_output(plot)

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task("profiling", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        table = profile(names, ns, impls=_list(impls), baselines=_list(baselines), batch=batch,
                        heads=heads, head_dim=head_dim, dtype=dtype, repeats=repeats, mode=mode,
                        params=params, progress=progress)
    if out is not None:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415

        from ..render._save import save_figure  # noqa: PLC0415

        ax = table.plot()
        try:
            save_figure(ax.figure, out)
        finally:
            plt.close(ax.figure)
    if json_out:
        emit_json(table.to_dict())
    elif markdown:
        console.print(table.to_markdown(), markup=False, highlight=False, soft_wrap=True)
    else:
        cols, rows = table.table()
        t = Table(title="patterns profile: forward time per call (seconds)")
        for c in cols:
            left = c in ("pattern", "impl", "check")
            t.add_column(_SHORT.get(c, c), justify="left" if left else "right", no_wrap=left)
        for r in rows:
            t.add_row(*r, style="bold red" if r[-1] == "wrong" else None)
        console.print(t)
        m, s = table.machine, table.settings
        console.print(
            f"B={s['batch']} H={s['heads']} d={s['head_dim']} {s['dtype']} {s['mode']}; "
            f"median of {s['repeats']} after a warm-up; {m['cores']} cores, CPU capability "
            f"{m['cpu_capability']}; {table.matmul_source}: {table.matmul_gflops:.0f} GFLOP/s; "
            f"load {m['load_before']} -> {m['load_after']}; {m['date']}",
            highlight=False, markup=False, soft_wrap=True,
        )
        console.print(_LEGEND, highlight=False, markup=False, soft_wrap=True)
        for note in table.notes:
            console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if out is not None:
        err_console.print(f"wrote {out}", highlight=False)
    if table.failed:
        bad = ", ".join(f"{r} on {p} n={n_}" for p, n_, r in table.failed)
        err_console.print(f"error: wrong output or failure: {bad}", highlight=False, markup=False)
        raise typer.Exit(1)
