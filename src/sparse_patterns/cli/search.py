"""``patterns search``: a grid of pattern parameters on a Dask cluster (:func:`register`
adds it to the app; :mod:`sparse_patterns.cli` calls it).

The command parses the names, ``--n``, the ``--grid`` axes and the options,
calls :func:`sparse_patterns.search.search` once, and prints the Pareto front
of the result (``--all``: every row; ``--json``: everything). A progress bar
over the grid is drawn on stderr when it is a terminal. Bad input (an unknown
family or parameter, a value of the wrong type, an unreachable scheduler) is
one line and exit status 2 before any cluster starts; Ctrl-C says how much is
saved in the cache and exits 130. Candidates that fail (an invalid parameter
combination, out of memory) are rows with their error, listed on stderr; the
search goes on, prints every row it has, and then exits 1 when any candidate
errored or failed a criterion (0 only when every candidate verified). dask and
distributed log nothing here: what matters comes back as one line (a lost
scheduler, a worker with no package, no worker left).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from typing import Any

import typer

from ._app import PATTERN_CONTEXT, cli_command, console, emit_json, err_console
from ._args import (
    Command,
    UsageError,
    int_option,
    parse_list,
    parse_params,
    shown,
    split_names,
)

__all__ = ["search_cmd", "parse_grid"]

_MEASURES = ("verify", "flops", "time")
#: Errors listed on stderr after the table (the rest are counted).
_SHOWN_ERRORS = 10


#: ``--grid``, repeatable (a module-level default: typer reads it, nothing mutates it).
_GRID = typer.Option(None, "--grid", metavar="<NAME=V1,V2>",
                     help="A grid axis: a pattern parameter and its values (repeat for more axes).")


def _int(name: str, default: int | None, help: str, lo: int, hi: int) -> Any:
    return typer.Option(default, "--" + name.replace("_", "-"), help=f"{help} ({lo} to {hi}).",
                        metavar="<int>", parser=int_option(name, lo, hi))


def parse_grid(items: list[str] | None) -> dict[str, list[str]]:
    """``--grid stride=64,128 --grid c=4,8`` -> ``{"stride": ["64", "128"], "c": ["4", "8"]}``.

    Examples
    --------
    >>> parse_grid(["stride=64, 128", "summary-heads=1,2"])
    {'stride': ['64', '128'], 'summary_heads': ['1', '2']}
    >>> parse_grid(["stride"])
    Traceback (most recent call last):
    ...
    sparse_patterns.cli._args.UsageError: grid: expected NAME=V1,V2,... (e.g. stride=64,128), got 'stride'
    """
    out: dict[str, list[str]] = {}
    for item in items or []:
        key, eq, vals = item.partition("=")
        key = key.strip().replace("-", "_")
        values = [v.strip() for v in vals.split(",") if v.strip()]
        if not eq or re.fullmatch(r"[A-Za-z_]\w{0,63}", key, re.ASCII) is None or not values:
            raise UsageError(f"grid: expected NAME=V1,V2,... (e.g. stride=64,128), got {shown(item)}")
        if key in out:
            raise UsageError(f"grid: {key} given twice; give its values in one --grid {key}=...")
        out[key] = values
    return out


def _ints(name: str, text: str, lo: int, hi: int) -> list[int]:
    from ._args import parse_int  # noqa: PLC0415

    vals = [parse_int(name, v, lo, hi) for v in text.split(",") if v.strip()]
    if not vals:
        raise UsageError(f"{name}: expected comma-separated integers [{lo}, {hi}], got {shown(text)}")
    return vals


@contextlib.contextmanager
def _quiet_dask() -> Iterator[None]:
    """Only errors from distributed's loggers, and none of its warnings, while the search runs."""
    import distributed  # noqa: F401, PLC0415 - its import sets its loggers' levels: first

    names = [name for name in list(logging.root.manager.loggerDict)
             if name.split(".")[0] in ("distributed", "dask")]
    loggers = [logging.getLogger(name) for name in ("distributed", "dask", *names)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"distributed(\..*)?")
            warnings.filterwarnings("ignore", module=r"dask(\..*)?")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def register(app: typer.Typer) -> None:
    """Add ``patterns search`` to ``app``."""
    app.command("search", cls=Command, context_settings=PATTERN_CONTEXT,
                options_metavar="NAME... --n N1,N2 --grid KEY=V1,V2 [OPTIONS] [PATTERN OPTIONS]"
                )(cli_command(search_cmd))


def search_cmd(
    ctx: typer.Context,
    n: str = typer.Option(None, "--n", help="Sequence lengths, comma-separated: 16384,65536."),
    grid: list[str] = _GRID,
    scheduler: str = typer.Option(
        None, "--scheduler", metavar="<address>",
        help="A running Dask scheduler (tcp://HOST:8786); default: a local cluster."),
    workers: int = _int("workers", None, "Worker processes of the local cluster (default: one "
                        "per core)", 1, 256),
    measure: str = typer.Option(
        None, "--measure", metavar="<list>",
        help="Also measure: time (the kernel's forward on the worker); the criteria (verify) "
             "and the plan's FLOPs (flops) always are."),
    mode: str = typer.Option("interleaved", "--mode",
                             help="Verification: interleaved, merged or multihead."),
    block: str = typer.Option("32", "--block", help="Plan tile sizes, comma-separated (1 to 4096)."),
    batch: int = _int("batch", 1, "Batch size B of the counted kernel call", 1, 1 << 16),
    heads: int = _int("heads", 8, "Attention heads H of the counted kernel call", 1, 1 << 16),
    head_dim: int = _int("head_dim", 64, "Head dimension d", 1, 1 << 14),
    repeats: int = _int("repeats", 3, "Timed kernel calls with --measure time", 1, 1000),
    depth: bool = typer.Option(None, "--depth/--no-depth",
                               help="Force (or skip) the depth search when a criterion fails."),
    timeout: int = _int("timeout", 10, "Seconds to reach --scheduler, and the longest wait with "
                        "no worker left", 1, 3600),
    cache: str = typer.Option(
        None, "--cache", metavar="<file>",
        help="Results file (.parquet or .jsonl), written as tasks finish; a search run again "
             "computes only what it lacks."),
    retry_errors: bool = typer.Option(False, "--retry-errors",
                                      help="Compute again the cached candidates that failed."),
    plot: str = typer.Option(None, "--plot", metavar="<file>",
                             help="Save the figure (FLOPs against max hops, the Pareto front)."),
    plot_x: str = typer.Option("max_hops", "--plot-x", help="The figure's x axis: max_hops or n."),
    all_rows: bool = typer.Option(False, "--all", help="Print every candidate, not only the "
                                  "Pareto front."),
    markdown: bool = typer.Option(False, "--markdown", help="Print a markdown table."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (every row, the front's keys)."),
) -> None:
    """Verify, plan and time a grid of pattern parameters on a Dask cluster.

    Usage: patterns search fixed strided --n 16384,65536 --grid stride=64,128,256
    --grid c=4,8,16,32. Every (pattern, parameters, n) is one task: both criteria
    (exact), depth, max hops, |A_i| against n^(1/p), nnz and the kernel plan's FLOPs
    (--measure time: also its forward time). A grid parameter applies to every named
    pattern that takes it; pattern options (--window reference) fix a value. Prints the
    Pareto front (cheapest verified candidates per n); failed candidates are rows with
    their error, listed on stderr. Exit status 1 when any candidate errored or failed a
    criterion, 2 for bad input, 130 on Ctrl-C.
    """
    from ..search import PLOT_AXES, SearchInterrupted, search  # noqa: PLC0415 - dask: only here

    names, rest, ns = split_names(list(ctx.args), n, "16384,65536")
    axes: dict[str, Any] = parse_grid(grid)
    for key, value in parse_params(names, rest).items():
        if key in axes:
            raise UsageError(f"{key}: given both as --grid {key}=... and --{key.replace('_', '-')}")
        axes[key] = value
    measures = parse_list(measure) if measure is not None else []
    for m in measures:
        if m not in _MEASURES:
            raise UsageError(f"measure: unknown measure {m!r}; use {', '.join(_MEASURES)}")
    if json_out and markdown:
        raise UsageError("json: give --json or --markdown, not both")
    if scheduler is not None and workers is not None:
        raise UsageError("workers: --workers sizes the local cluster; a --scheduler has its "
                         "own workers (dask worker --nworkers N)")
    if plot_x not in PLOT_AXES:
        raise UsageError(f"plot_x: must be one of {', '.join(PLOT_AXES)}; got {shown(plot_x)}")
    out = None
    if plot is not None:
        from ..render import check_output  # noqa: PLC0415

        out = check_output(plot)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with _quiet_dask(), Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=err_console, transient=True,
            disable=not err_console.is_terminal) as bar:
        task = bar.add_task("searching", total=None)
        try:
            result = search(
                names, axes, ns, mode=mode, measure=["verify", "flops", *measures],
                client=scheduler, cache=cache, block=_ints("block", block, 1, 4096),
                batch=batch, heads=heads, head_dim=head_dim, repeats=repeats, depth=depth,
                workers=workers, timeout=float(timeout), retry_errors=retry_errors,
                progress=lambda done, total: bar.update(task, completed=done, total=total))
        except SearchInterrupted as exc:
            bar.stop()
            err_console.print(f"interrupted: {str(exc).removeprefix('search interrupted: ')}",
                              highlight=False, markup=False)
            raise typer.Exit(130) from None
    for note in result.notes:
        err_console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    shown_rows = result if all_rows else result.pareto()
    if out is not None:
        _save_plot(result, out, plot_x)
    if json_out:
        emit_json(result.to_dict())
    elif markdown:
        console.print(shown_rows.to_markdown(), markup=False, highlight=False, soft_wrap=True)
    else:
        title = None if all_rows else "Pareto front: cheapest verified per n (FLOPs, max hops)"
        console.print(shown_rows.table(title=title))
        c = result.counts()
        where = f" ({result.cache})" if result.cache else ""
        console.print(
            f"{c['candidates']} candidates: {c['verified']} verified, {c['failed']} failing a "
            f"criterion, {c['errors']} errors; {c['computed']} computed, {c['cached']} from the "
            f"cache{where}", highlight=False, markup=False, soft_wrap=True)
    _list_errors(result)
    if out is not None:
        err_console.print(f"wrote {out}", highlight=False)
    c = result.counts()
    if c["failed"] or c["errors"]:  # the rows are printed; the status says not all verified
        raise typer.Exit(1)


def _list_errors(result: Any) -> None:
    bad = [r for r in result.rows if r["status"] == "error"]
    for r in bad[:_SHOWN_ERRORS]:
        err_console.print(f"failed: {result.label(r)} n={r['n']:,}: {r['error']}",
                          highlight=False, markup=False, soft_wrap=True)
    if len(bad) > _SHOWN_ERRORS:
        err_console.print(f"failed: {len(bad) - _SHOWN_ERRORS} more (see --all or --json)",
                          highlight=False, markup=False)


def _save_plot(result: Any, out: Any, x: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from ..render import save_figure  # noqa: PLC0415

    ax = result.plot(x=x)
    try:
        save_figure(ax.figure, out)
    finally:
        plt.close(ax.figure)
