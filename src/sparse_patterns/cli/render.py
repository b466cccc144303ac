"""``patterns render``: a pattern, a schedule or a scaling sweep drawn to PNG, SVG or PDF.
"""

from __future__ import annotations

import typer

from ._app import FILE, NAME, PATTERN_CONTEXT, N, cli_command, console, int_opt
from ._args import (
    Command,
    UsageError,
    parse_heads,
    parse_int,
    parse_ns,
    parse_params,
    pattern_from_args,
    registry,
)
from ._schedule import parse_documents, render_schedule_check, schedule_from_args

_VIEWS = ("matrix", "image", "hops", "scaling")


@cli_command
def render_cmd(
    ctx: typer.Context,
    name: str = NAME,
    n: int = N,
    file: str = FILE,
    view: str = typer.Option(None, "--view", help="matrix, image, hops or scaling (default: "
                             "matrix; hops with --schedule)."),
    output: str = typer.Option(None, "--output", "-o", help="Output file: .png, .svg or .pdf."),
    position: int = int_opt("position", None, "Image view: the output position (default: 2/3 down, "
                         "2/3 across)", 0, flags=("--position", "-i")),
    height: int = int_opt("height", None, "Image view: raster height (and the pattern's, if it has one)"),
    width: int = int_opt("width", None, "Image view: raster width (and the pattern's, if it has one)"),
    heads: str = typer.Option(None, "--heads", help="Heads to draw, by name or index: A1,A2."),
    tile: int = int_opt("tile", None, "Matrix view: draw block densities with this tile size"),
    ns: str = typer.Option("256,1024,4096,16384", "--ns", help="Scaling view: the sequence lengths."),
    mode: str = typer.Option("interleaved", "--mode", help="Hops view: interleaved, merged or multihead."),
    residual: bool = typer.Option(True, "--residual/--no-residual", help="Hops view: residual stream."),
    dpi: int = int_opt("dpi", 100, "PNG resolution", 10, 1200),
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
    from ..render import (
        check_output,  # noqa: PLC0415
        save_figure,  # noqa: PLC0415
    )

    if gallery is not None:
        if name is not None or file is not None or ctx.args or output is not None:
            raise UsageError("gallery: --gallery DIR takes no pattern, --file or --output")
        from ..render.gallery import build_gallery  # noqa: PLC0415

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

    from ..render import render_view  # noqa: PLC0415

    if schedule is not None:
        from ..render import schedule_figure  # noqa: PLC0415

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
        from ..analysis import scaling  # noqa: PLC0415

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


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("render", cls=Command, context_settings=PATTERN_CONTEXT)(render_cmd)
