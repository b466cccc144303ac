"""The ``patterns`` command line: a thin shell over the library.

Every command parses its arguments, calls one library function that returns
data, and prints it (the result's ``table()``, or JSON with ``--json``). Bad
input (a bad or repeated option, a size that does not fit, a malformed file) is
one line on stderr and exit status 2; a pattern that fails verification exits
1; so does a bug, with one line pointing to ``patterns --debug``, which prints
the traceback. Ctrl-C exits 130. Option parsing lives in :mod:`._cliargs`. Commands, in the order ``patterns --help`` lists them:
``list``, ``show``, ``verify``, ``analyze``, ``render``, ``export``, ``profile``.
Heavy libraries (numba, torch, matplotlib) are imported inside the commands
that need them, so ``patterns --help`` and ``patterns list`` stay fast.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted(signum: int, frame: object) -> None:
    raise SystemExit(130)


#: As the ``patterns`` script, a Ctrl-C while the imports below run (a few tenths of a
#: second) exits 130 without a traceback; main() puts Python's handler back. (Before this
#: line only the interpreter's own start-up runs, which no package can guard.)
_STARTING = (bool(sys.argv) and os.path.basename(sys.argv[0]).split(".")[0] in (
    "patterns", "patterns-script") and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
if _STARTING:
    signal.signal(signal.SIGINT, _interrupted)

import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from ._cliapp import (  # noqa: E402 - the app and its helpers: re-exported
    PATTERN_CONTEXT,
    app,
    cli_command,
    console,
    emit_json,
    err_console,
)
from ._cliargs import (  # noqa: E402 - parse_params ... UsageError: re-exported
    MAX_N,
    Command,
    UsageError,
    int_option,
    parse_documents,
    parse_heads,
    parse_int,
    parse_list,
    parse_ns,
    parse_params,
    pattern_from_args,
    registry,
    render_schedule_check,
    schedule_from_args,
    split_names,
    split_steps,
)

__all__ = ["app", "main", "parse_params", "pattern_from_args", "parse_ns", "UsageError"]

#: The options every pattern command shares (typer reads a default; sharing one is safe).
_NAME = typer.Argument(None, help="Pattern name (see `patterns list`).")
_N = typer.Option(None, "--n", help=f"Sequence length (1 to {MAX_N}).", metavar="<int>",
                  parser=int_option("n", 1, MAX_N))
_FILE = typer.Option(None, "--file", help="A saved pattern (.npz, .safetensors, .json).")
_JSON = typer.Option(False, "--json", help="Print JSON.")

def _int(name: str, default: int | None, help: str, lo: int = 1, hi: int | None = None,
         flags: tuple[str, ...] = ()) -> Any:
    """An integer option whose bad value is one line naming the range (not typer's box)."""
    rng = f"{lo} to {hi}" if hi is not None else f">= {lo}"
    return typer.Option(default, *(flags or ("--" + name.replace("_", "-"),)),
                        help=f"{help} ({rng}).", metavar="<int>", parser=int_option(name, lo, hi))


@app.command("list", cls=Command)
@cli_command
def list_cmd(json_out: bool = _JSON) -> None:
    """List the registered patterns, their parameters and the papers they come from."""
    from .catalog import CATALOG, describe  # noqa: PLC0415 (no NumPy: the table is static)

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


@app.command("show", cls=Command, context_settings=PATTERN_CONTEXT)
@cli_command
def show_cmd(
    ctx: typer.Context,
    name: str = _NAME,
    n: int = _N,
    file: str = _FILE,
    json_out: bool = _JSON,
) -> None:
    """Show a pattern: a text picture for n <= 64 and |A_i| figures per head.

    Pattern parameters are options of the same name: --stride 8 --c 2 --window reference.
    """
    from .analysis.budget import budget_table  # noqa: PLC0415

    result = budget_table(pattern_from_args(name, n, ctx.args, file))
    if json_out:
        emit_json(result.to_dict())
    else:
        console.print(result.table())


#: What ``patterns verify`` checks with no pattern: the README's main job.
DEFAULT = ("strided", 16384, ["--stride", "128"])


class _ProgressBar:
    """A ``progress(done, total)`` callback drawing a rich bar once a run has lasted ``delay`` seconds."""

    def __init__(self, label: str, delay: float = 1.0) -> None:
        self.label = label
        self.delay = delay
        self.start = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if done >= total or time.perf_counter() - self.start < self.delay:
                return
            from rich.progress import Progress  # noqa: PLC0415

            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@app.command("verify", cls=Command, context_settings=PATTERN_CONTEXT)
@cli_command
def verify_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Pattern name (default: strided, n=16384, stride 128)."),
    n: int = _N,
    mode: str = typer.Option("interleaved", "--mode",
                             help="interleaved (step m uses head m), merged or multihead."),
    residual: bool = typer.Option(True, "--residual/--no-residual",
                                  help="Add the identity at every step."),
    steps: int = _int("steps", None, "Number of steps p (also --p unless the pattern takes p)"),
    block: int = _int("block", None, "Verify the block layout at this block size"),
    depth: bool = typer.Option(None, "--depth/--no-depth",
                               help="Force (or skip) the search for the steps full "
                                    "connectivity needs."),
    file: str = _FILE,
    schedule: str = typer.Option(
        None, "--schedule", metavar="<str>",
        help="Verify a schedule of layers instead, each made at --n: layers separated by commas, "
             "each NAME or NAME:KEY=VALUE:KEY=VALUE (e.g. local:window=128,full), or a .json "
             'file with a list of {"pattern": NAME, "params": {...}}.'),
    documents: str = typer.Option(
        None, "--documents", metavar="<str>",
        help="With --schedule: packed documents, as lengths (1024,3072) or cu_seqlens offsets "
             "from 0 (0,1024,4096): every layer is made inside each document, targets stay "
             "inside a document, and a pair across documents fails (a leak)."),
    json_out: bool = _JSON,
) -> None:
    """Check the paper's two criteria exactly: exit 0 when both hold, 1 when one fails.

    Pattern parameters are options of the same name (--stride 128 --c 8). With
    --schedule the layers run in order (p = their number) and exit 1 also means a leak.
    """
    from .analysis import verify  # noqa: PLC0415

    p_opt, args = split_steps(name, list(ctx.args))
    if steps is not None and p_opt is not None and steps != p_opt:
        raise UsageError(f"p: --p {p_opt} and --steps {steps} disagree")
    p = steps if steps is not None else p_opt
    if schedule is not None or documents is not None:
        from .analysis import verify_schedule  # noqa: PLC0415

        layers, docs = schedule_from_args(schedule, documents, n, name, file, args, p, block,
                                          mode, depth)
        report = verify_schedule(layers, documents=docs, residual=residual, explain_failure=True)
    else:
        if name is None and file is None:
            name = DEFAULT[0]
            n = DEFAULT[1] if n is None else n
            args = args or list(DEFAULT[2])
        pat = pattern_from_args(name, n, args, file)
        target = pat.to_blocks(block) if block is not None else pat
        bar = _ProgressBar("verifying") if not json_out and sys.stdout.isatty() else None
        try:
            report = verify(target, p=p, mode=mode, residual=residual, depth=depth, progress=bar,
                            explain_failure=True)
        finally:
            if bar is not None:
                bar.close()
    if json_out:
        emit_json(report.to_dict())
    else:
        console.print(report.table())
    if not report.ok:
        raise typer.Exit(1)


@app.command("analyze", cls=Command, context_settings=PATTERN_CONTEXT)
@cli_command
def analyze_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Pattern name (see `patterns list`)."),
    ns: str = typer.Option("1024,4096,16384,65536", "--n",
                           help="Comma-separated sequence lengths."),
    json_out: bool = _JSON,
) -> None:
    """Sweep n and fit the growth of max |A_i| (compare with 1/p; use --stride sqrt).

    Pattern parameters are options of the same name; integer parameters that
    should follow n take 'sqrt' or 'cbrt'.
    """
    from .analysis import scaling  # noqa: PLC0415

    registry.get(name)
    params = parse_params(name, list(ctx.args))
    table = scaling(name, parse_ns(ns), **params)
    if json_out:
        emit_json(table.to_dict())
    else:
        console.print(table.table())


_VIEWS = ("matrix", "image", "hops", "scaling")


@app.command("render", cls=Command, context_settings=PATTERN_CONTEXT)
@cli_command
def render_cmd(
    ctx: typer.Context,
    name: str = _NAME,
    n: int = _N,
    file: str = _FILE,
    view: str = typer.Option(None, "--view", help="matrix, image, hops or scaling (default: "
                             "matrix; hops with --schedule)."),
    output: str = typer.Option(None, "--output", "-o", help="Output file: .png, .svg or .pdf."),
    position: int = _int("position", None, "Image view: the output position (default: 2/3 down, "
                         "2/3 across)", 0, flags=("--position", "-i")),
    height: int = _int("height", None, "Image view: raster height (and the pattern's, if it has one)"),
    width: int = _int("width", None, "Image view: raster width (and the pattern's, if it has one)"),
    heads: str = typer.Option(None, "--heads", help="Heads to draw, by name or index: A1,A2."),
    tile: int = _int("tile", None, "Matrix view: draw block densities with this tile size"),
    ns: str = typer.Option("256,1024,4096,16384", "--ns", help="Scaling view: the sequence lengths."),
    mode: str = typer.Option("interleaved", "--mode", help="Hops view: interleaved, merged or multihead."),
    residual: bool = typer.Option(True, "--residual/--no-residual", help="Hops view: residual stream."),
    dpi: int = _int("dpi", 100, "PNG resolution", 10, 1200),
    gallery: str = typer.Option(None, "--gallery", help="Regenerate the whole gallery into this directory."),
    schedule: str = typer.Option(
        None, "--schedule", metavar="<str>",
        help="Hops view of a schedule of layers, each made at --n (as `patterns verify "
             "--schedule`): local:window=8,local:window=8,full, or a .json file."),
    documents: str = typer.Option(
        None, "--documents", metavar="<str>",
        help="Packed documents, as lengths (20,44) or cu_seqlens offsets from 0: the pattern "
             "is made inside each (a --file is cut at them); with --schedule, every layer is "
             "made inside each and targets stay inside a document. Boundaries are drawn."),
) -> None:
    """Draw a pattern and save it: PNG, SVG or PDF by the output's suffix.

    Pattern parameters are options of the same name (--stride 8 --c 2). Views:
    matrix (the connectivity matrix, rows are outputs; the default), image (one
    output position on a height x width raster, as in the paper's Figure 3),
    hops (the hop distance of every pair; with --schedule, the layer after
    which each pair is first connected, the default there), scaling (|A_i|
    against n for --ns). `patterns render --gallery figures/` regenerates the
    committed gallery.
    """
    from .render import (
        check_output,  # noqa: PLC0415
        save_figure,  # noqa: PLC0415
    )

    if gallery is not None:
        if name is not None or file is not None or ctx.args or output is not None:
            raise UsageError("gallery: --gallery DIR takes no pattern, --file or --output")
        from .render.gallery import build_gallery  # noqa: PLC0415

        for path in build_gallery(gallery, dpi=dpi):
            console.print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)", highlight=False)
        return
    view = view if view is not None else ("hops" if schedule is not None else "matrix")
    if view not in _VIEWS:
        raise UsageError(f"view: unknown view {view!r}; use one of {', '.join(_VIEWS)}")
    if output is None:
        raise UsageError("output: --output/-o FILE is required (.png, .svg or .pdf)")
    out = check_output(output)
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from .render import render_view  # noqa: PLC0415

    if schedule is not None:
        from .render import schedule_figure  # noqa: PLC0415

        render_schedule_check(view, position=position, height=height, width=width, heads=heads,
                              tile=tile)
        layers, docs = schedule_from_args(schedule, documents, n, name, file, ctx.args, None,
                                          None, mode, None)
        fig = schedule_figure(layers, documents=docs, residual=residual)
    elif view == "scaling":
        if documents is not None:
            raise UsageError("documents: the scaling view sweeps n; --documents fits one n")
        if file is not None:
            raise UsageError("file: the scaling view generates the pattern at every n; give a name")
        if name is None:
            raise UsageError(f"name: give a pattern name ({', '.join(sorted(registry.REGISTRY))})")
        from .analysis import scaling  # noqa: PLC0415

        table = scaling(name, parse_ns(ns), **parse_params(name, ctx.args))
        fig = render_view("scaling", table=table)
    else:
        args = list(ctx.args)
        if name is not None and file is None:
            # --height/--width belong to this command, but local2d and axial2d take them too
            taken = {p.name for p in registry.get(name).params}
            for key, val in (("height", height), ("width", width)):
                if key in taken and val is not None:
                    args += [f"--{key}", str(val)]
        docs = None if documents is None else parse_documents(documents)
        pat = pattern_from_args(name, n, args, file, documents=docs)
        if view == "image" and position is not None:
            position = parse_int("position", position, 0, pat.n - 1)
        fig = render_view(
            view, pat, i=position, height=height, width=width, heads=parse_heads(heads),
            block=tile, mode=mode, residual=residual,
        )
    try:
        save_figure(fig, out, dpi=dpi)
    finally:
        plt.close(fig)
    console.print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB)", highlight=False)


class _ExportCommand(Command):
    """``patterns export``: its ``--format`` help lists the format table, read when help is shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from .export.formats import FORMATS, TORCH_FORMATS  # noqa: PLC0415

        files = "|".join(name for name in FORMATS if name not in TORCH_FORMATS)
        for param in self.params:
            if param.name == "fmt":
                param.help = (f"{'|'.join(TORCH_FORMATS)} (a .pt of tensors) or {files}; "
                              "default: from the suffix of -o.")
        super().format_help(ctx, formatter)


@app.command("export", context_settings=PATTERN_CONTEXT, cls=_ExportCommand)
@cli_command
def export_cmd(
    ctx: typer.Context,
    name: str = _NAME,
    n: int = _N,
    file: str = typer.Option(None, "--file", help="Read the pattern from a saved file instead."),
    fmt: str = typer.Option(None, "--format", help="The format; default: from the suffix of -o."),
    out: str = typer.Option(..., "-o", "--output", help="Output file."),
    block: int = _int("block", None, "Block size (flex 128, bsa 128, layouts 16)"),
    mode: str = typer.Option("multihead", "--mode", help="multihead (head h uses h mod p) or merged."),
    num_heads: int = _int("num_heads", None, "Attention heads H (default p, or 1 merged)", 1, 1 << 16),
    json_out: bool = _JSON,
) -> None:
    """Export a pattern to a framework's tensors or to a file.

    Pattern parameters are options of the same name: patterns export strided --n 4096
    --stride 64 --format flex -o strided.pt. A .pt holds a dict of tensors; read it with
    torch.load(f, weights_only=True).
    """
    from .export import export_pattern  # noqa: PLC0415

    pat = pattern_from_args(name, n, ctx.args, file)
    result = export_pattern(pat, out, fmt, block=block, mode=mode, num_heads=num_heads)
    if json_out:
        emit_json(result.to_dict())
        return
    console.print(result.summary(), highlight=False, markup=False, soft_wrap=True)


#: Width ``--wide`` is laid out in: every column at its natural width, never squeezed.
_WIDE_WIDTH = 1000


@app.command("profile", cls=Command, context_settings=PATTERN_CONTEXT,
             options_metavar="NAME... --n N1,N2 [OPTIONS] [PATTERN OPTIONS]")
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
    batch: int = _int("batch", 1, "Batch size B", 1, 1 << 16),
    heads: int = _int("heads", 8, "Attention heads H", 1, 1 << 16),
    head_dim: int = _int("head_dim", 64, "Head dimension d", 1, 1 << 14),
    dtype: str = typer.Option(
        None, "--dtype",
        help="float32, float64, float16 or bfloat16 (default: float32 on cpu, bfloat16 on cuda)."),
    mode: str = typer.Option("merged", "--mode", help="merged (union) or multihead."),
    repeats: int = _int("repeats", 5, "Timed calls after the warm-up", 1, 1000),
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

    from .profiling import profile  # noqa: PLC0415
    from .render import check_output  # noqa: PLC0415

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

    from .render import save_figure  # noqa: PLC0415
    from .render.profile import plot_profile  # noqa: PLC0415

    ax = plot_profile(table)
    try:
        save_figure(ax.figure, out)
    finally:
        plt.close(ax.figure)


# `patterns search` lives in its own module, which uses this one's helpers: imported last.
from . import _search_cli  # noqa: E402 - registers `patterns search` on the app

_search_cli.register(app)


def main() -> None:
    """Entry point of the ``patterns`` console script: errors end as one line, Ctrl-C as 130."""
    try:
        if _STARTING:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        app()
    except KeyboardInterrupt:  # outside a command (typer turns those into 130 itself)
        sys.exit(130)
