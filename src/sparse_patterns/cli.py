"""The ``patterns`` command line: a thin shell over the library.

Every command parses its arguments, calls one library function that returns
data, and prints it (the result's ``table()``, or JSON with ``--json``). Bad
input is one line on stderr and exit status 2; a pattern that fails
verification exits 1. Commands, in the order ``patterns --help`` lists them:
``list``, ``show``, ``verify``, ``analyze``, ``render``, ``export``, ``profile``.
Heavy libraries (numba, torch, matplotlib) are imported inside the commands
that need them, so ``patterns --help`` and ``patterns list`` stay fast.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand

if TYPE_CHECKING:
    from .pattern import Pattern

__all__ = ["app", "main", "parse_params", "pattern_from_args", "parse_ns", "UsageError"]

app = typer.Typer(
    name="patterns",
    help="Generate, verify, render, export and profile sparse attention patterns.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

#: The options every pattern command shares (typer reads a default; sharing one is safe).
_NAME = typer.Argument(None, help="Pattern name (see `patterns list`).")
_N = typer.Option(None, "--n", help="Sequence length.")
_FILE = typer.Option(None, "--file", help="A saved pattern (.npz, .safetensors, .json).")
_JSON = typer.Option(False, "--json", help="Print JSON.")

#: context settings for commands that take a pattern's parameters as options
PATTERN_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


class _Lazy:
    """A module imported on first attribute access: ``--help`` loads neither NumPy nor SciPy."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


registry = _Lazy("sparse_patterns.patterns.registry")


def _check_int(name: str, value: Any, lo: int, hi: int) -> int:
    from ._validate import check_int  # noqa: PLC0415

    return check_int(name, value, lo, hi)


class UsageError(ValueError):
    """Bad input detected by the CLI itself (reported like a ValueError)."""


#: What each command can do instead when a size does not fit in memory.
_INSTEAD = {
    "show": "show a registered pattern by name (its |A_i| come from its rule; the picture "
            "needs n <= 64)",
    "verify": "verify a generated pattern by name (decided from its rule), or the block "
              "layout with --block 128",
    "analyze": "use smaller --n values; `patterns show NAME --n N` reads |A_i| at any n",
    "render": "draw block densities: --view matrix --tile 1024",
    "export": "export the recipe (--format json), which regenerates the pattern at any n",
    "profile": "use a smaller n, --heads, --batch or --head-dim",
}


def cli_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn ``ValueError`` (bad input) into one line on stderr and exit status 2.

    A size that does not fit in memory (``config.MemoryLimitError``, raised before
    allocating, or a ``MemoryError``) exits 2 too, saying what to use instead.
    """
    instead = _INSTEAD.get(func.__name__.removesuffix("_cmd"))

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, OSError, MemoryError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if isinstance(exc, MemoryError):
                msg = msg if isinstance(exc, ValueError) else f"out of memory: {msg}"
                msg += f"; from the command line: {instead}" if instead and instead not in msg else ""
            err_console.print(f"error: {msg}", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def parse_params(name: str | Sequence[str], args: Sequence[str]) -> dict[str, str | bool]:
    """Parse ``--param value`` / ``--flag`` / ``--no-flag`` for pattern ``name``.

    Dashes stand for underscores (``--summary-heads 2``). A parameter the
    pattern does not take is an error listing the ones it takes. With several
    names (``patterns profile strided fixed``) an option must be taken by at
    least one of them.

    Examples
    --------
    >>> parse_params("fixed", ["--stride", "8", "--summary-heads=2", "--no-causal"])
    {'stride': '8', 'summary_heads': '2', 'causal': False}
    >>> parse_params(["strided", "fixed"], ["--c", "2"])
    {'c': '2'}
    """
    names = [name] if isinstance(name, str) else list(name)
    known: dict[str, registry.Param] = {}
    for nm in names:
        for p in registry.get(nm).params:
            known.setdefault(p.name, p)
    takes = ", ".join("--" + k.replace("_", "-") for k in known) or "no parameters"
    if isinstance(name, str):
        who, no_such = f"pattern {name!r}", "takes no such option; it takes"
    else:
        who, no_such = f"none of the patterns {', '.join(names)}", "takes it; they take"
    out: dict[str, str | bool] = {}
    k = 0
    args = list(args)
    while k < len(args):
        tok = args[k]
        if not tok.startswith("--"):
            raise UsageError(f"{tok}: unexpected argument; the pattern options are {takes}")
        key, eq, val = tok[2:].partition("=")
        key = key.replace("-", "_")
        if key.startswith("no_") and key[3:] in known and known[key[3:]].type is bool and not eq:
            out[key[3:]] = False
            k += 1
            continue
        if key not in known:
            raise UsageError(f"--{key.replace('_', '-')}: {who} {no_such} {takes}")
        p = known[key]
        if eq:
            out[key] = val
            k += 1
        elif p.type is bool and (k + 1 == len(args) or args[k + 1].startswith("--")):
            out[key] = True
            k += 1
        else:
            if k + 1 == len(args):
                raise UsageError(f"--{key.replace('_', '-')}: needs a value")
            out[key] = args[k + 1]
            k += 2
    return out


def pattern_from_args(name: str | None, n: int | None, args: Sequence[str], file: str | None = None) -> Pattern:
    """Build the pattern a command names: ``NAME --n N [--param value ...]`` or ``--file F``."""
    if file is not None:
        if name is not None or args:
            raise UsageError("file: give either a pattern name with its options or --file, not both")
        from .export import load  # noqa: PLC0415

        return load(file)
    if name is None:
        raise UsageError(f"name: give a pattern name ({', '.join(sorted(registry.REGISTRY))}) or --file")
    registry.get(name)  # unknown names fail before the options are read
    if n is None:
        raise UsageError("n: --n is required (an integer >= 1)")
    return registry.make(name, n, **parse_params(name, args))


def parse_ns(text: str) -> list[int]:
    """Parse ``--n 1024,4096`` into a list of ints (each >= 1)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise UsageError(f"n: expected comma-separated integers >= 1, got {text!r}") from None
        if v < 1:
            raise UsageError(f"n: every n must be >= 1, got {v}")
        out.append(v)
    if not out:
        raise UsageError(f"n: expected at least one integer, got {text!r}")
    return out


def emit_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (numpy scalars converted)."""

    def default(o: Any) -> Any:
        import numpy as np  # noqa: PLC0415

        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(f"not JSON serializable: {type(o).__name__}")

    sys.stdout.write(json.dumps(obj, default=default, indent=2) + "\n")


@app.command("list")
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


@app.command("show", context_settings=PATTERN_CONTEXT)
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


def _split_steps(name: str | None, args: list[str]) -> tuple[int | None, list[str]]:
    """Take ``--p P`` out of the pattern options unless the pattern has a parameter ``p``."""
    takes_p = name is not None and name in registry.REGISTRY and any(
        q.name == "p" for q in registry.REGISTRY[name].params
    )
    if takes_p:
        return None, args
    out, steps, k = [], None, 0
    while k < len(args):
        tok = args[k]
        if tok == "--p" or tok.startswith("--p="):
            if "=" in tok:
                val = tok.split("=", 1)[1]
                k += 1
            elif k + 1 < len(args):
                val = args[k + 1]
                k += 2
            else:
                raise UsageError("p: --p needs a value (an integer >= 1)")
            try:
                steps = int(val)
            except ValueError:
                raise UsageError(f"p: must be an integer >= 1, got {val!r}") from None
            continue
        out.append(tok)
        k += 1
    return steps, out


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


@app.command("verify", context_settings=PATTERN_CONTEXT)
@cli_command
def verify_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Pattern name (default: strided, n=16384, stride 128)."),
    n: int = _N,
    mode: str = typer.Option("interleaved", "--mode",
                             help="interleaved (step m uses head m), merged or multihead."),
    residual: bool = typer.Option(True, "--residual/--no-residual",
                                  help="Add the identity at every step."),
    steps: int = typer.Option(None, "--steps",
                              help="Number of steps p (also --p unless the pattern takes p)."),
    block: int = typer.Option(None, "--block", help="Verify the block layout at this block size."),
    depth: bool = typer.Option(None, "--depth/--no-depth",
                               help="Force (or skip) the search for the steps full "
                                    "connectivity needs."),
    file: str = _FILE,
    json_out: bool = _JSON,
) -> None:
    """Check the paper's two criteria exactly: exit 0 when both hold, 1 when one fails.

    Pattern parameters are options of the same name (--stride 128 --c 8).
    """
    from .analysis import verify  # noqa: PLC0415

    p_opt, args = _split_steps(name, list(ctx.args))
    if steps is not None and p_opt is not None and steps != p_opt:
        raise UsageError(f"p: --p {p_opt} and --steps {steps} disagree")
    p = steps if steps is not None else p_opt
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


@app.command("analyze", context_settings=PATTERN_CONTEXT)
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


def _parse_heads(text: str | None) -> list[str | int] | None:
    """``--heads A1,2`` -> ``["A1", 2]``: names, or indices when numeric."""
    if text is None:
        return None
    out: list[str | int] = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(int(part) if part.lstrip("-").isdigit() else part)
    return out


@app.command("render", context_settings=PATTERN_CONTEXT)
@cli_command
def render_cmd(
    ctx: typer.Context,
    name: str = _NAME,
    n: int = _N,
    file: str = _FILE,
    view: str = typer.Option("matrix", "--view", help="matrix, image, hops or scaling."),
    output: str = typer.Option(None, "--output", "-o", help="Output file: .png, .svg or .pdf."),
    position: int = typer.Option(
        None, "--position", "-i", help="Image view: the output position (default: 2/3 down, 2/3 across)."
    ),
    height: int = typer.Option(None, "--height", help="Image view: raster height (and the pattern's, if it has one)."),
    width: int = typer.Option(None, "--width", help="Image view: raster width (and the pattern's, if it has one)."),
    heads: str = typer.Option(None, "--heads", help="Heads to draw, by name or index: A1,A2."),
    tile: int = typer.Option(None, "--tile", help="Matrix view: draw block densities with this tile size."),
    ns: str = typer.Option("256,1024,4096,16384", "--ns", help="Scaling view: the sequence lengths."),
    mode: str = typer.Option("interleaved", "--mode", help="Hops view: interleaved, merged or multihead."),
    residual: bool = typer.Option(True, "--residual/--no-residual", help="Hops view: residual stream."),
    dpi: int = typer.Option(100, "--dpi", help="PNG resolution."),
    gallery: str = typer.Option(None, "--gallery", help="Regenerate the whole gallery into this directory."),
) -> None:
    """Draw a pattern and save it: PNG, SVG or PDF by the output's suffix.

    Pattern parameters are options of the same name (--stride 8 --c 2). Views:
    matrix (the connectivity matrix, rows are outputs), image (one output
    position on a height x width raster, as in the paper's Figure 3), hops (the
    hop distance of every pair), scaling (|A_i| against n for --ns).
    `patterns render --gallery figures/` regenerates the committed gallery.
    """
    from .render import (
        check_output,  # noqa: PLC0415
        save_figure,  # noqa: PLC0415
    )

    dpi = _check_int("dpi", dpi, 10, 1200)
    if gallery is not None:
        if name is not None or file is not None or ctx.args or output is not None:
            raise UsageError("gallery: --gallery DIR takes no pattern, --file or --output")
        from .render.gallery import build_gallery  # noqa: PLC0415

        for path in build_gallery(gallery, dpi=dpi):
            console.print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)", highlight=False)
        return
    if view not in _VIEWS:
        raise UsageError(f"view: unknown view {view!r}; use one of {', '.join(_VIEWS)}")
    if output is None:
        raise UsageError("output: --output/-o FILE is required (.png, .svg or .pdf)")
    out = check_output(output)
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from .render import render_view  # noqa: PLC0415

    if view == "scaling":
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
        pat = pattern_from_args(name, n, args, file)
        if view == "image" and position is not None:
            position = _check_int("position", position, 0, pat.n - 1)
        fig = render_view(
            view, pat, i=position, height=height, width=width, heads=_parse_heads(heads),
            block=tile, mode=mode, residual=residual,
        )
    try:
        save_figure(fig, out, dpi=dpi)
    finally:
        plt.close(fig)
    console.print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB)", highlight=False)


class _ExportCommand(TyperCommand):
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
    block: int = typer.Option(None, "--block", help="Block size (flex 128, bsa 128, layouts 16)."),
    mode: str = typer.Option("multihead", "--mode", help="multihead (head h uses h mod p) or merged."),
    num_heads: int = typer.Option(None, "--num-heads", help="Attention heads H (default p, or 1 merged)."),
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

    from .profiling import profile  # noqa: PLC0415
    from .render import check_output  # noqa: PLC0415

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

    from .render import save_figure  # noqa: PLC0415
    from .render.profile import plot_profile  # noqa: PLC0415

    ax = plot_profile(table)
    try:
        save_figure(ax.figure, out)
    finally:
        plt.close(ax.figure)


def main() -> None:
    """Entry point of the ``patterns`` console script."""
    app()
