"""``patterns render``: save a figure of a pattern, or regenerate the gallery."""

from __future__ import annotations

import typer

from .._validate import check_int
from ..patterns import registry
from ._app import (
    PATTERN_CONTEXT,
    UsageError,
    app,
    cli_command,
    console,
    parse_ns,
    parse_params,
    pattern_from_args,
)

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
    name: str = typer.Argument(None, help="Pattern name (see `patterns list`)."),
    n: int = typer.Option(None, "--n", help="Sequence length."),
    file: str = typer.Option(None, "--file", help="A saved pattern (.npz, .safetensors, .json)."),
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
    from ..render import save_figure  # noqa: PLC0415
    from ..render._save import check_output  # noqa: PLC0415

    dpi = check_int("dpi", dpi, 10, 1200)
    if gallery is not None:
        if name is not None or file is not None or ctx.args or output is not None:
            raise UsageError("gallery: --gallery DIR takes no pattern, --file or --output")
        from ..render.gallery import build_gallery  # noqa: PLC0415

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

    from ..render import render_view  # noqa: PLC0415

    if view == "scaling":
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
        pat = pattern_from_args(name, n, args, file)
        if view == "image" and position is not None:
            position = check_int("position", position, 0, pat.n - 1)
        fig = render_view(
            view, pat, i=position, height=height, width=width, heads=_parse_heads(heads),
            block=tile, mode=mode, residual=residual,
        )
    try:
        save_figure(fig, out, dpi=dpi)
    finally:
        plt.close(fig)
    console.print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB)", highlight=False)
