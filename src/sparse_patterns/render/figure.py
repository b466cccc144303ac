"""Whole figures for one view of one pattern, with a title: what the CLI saves.

:func:`render_view` validates the request, builds a matplotlib ``Figure``
holding one view (``matrix``, ``image``, ``hops`` or ``scaling``) titled with
the pattern and its parameters, and returns it; :func:`save_figure` writes it.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from ..pattern import Pattern
from ..util.checks import check_choice, check_int
from ._style import pattern_title

__all__ = ["VIEWS", "render_view", "default_raster", "default_position"]

#: The views :func:`render_view` draws.
VIEWS = ("matrix", "image", "hops", "scaling")


def default_raster(pattern: Pattern) -> tuple[int, int]:
    """Raster of the image view: the pattern's own ``height``/``width``, else a square.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> default_raster(make("strided", 36, stride=6))
    (6, 6)
    """
    h, w = pattern.params.get("height"), pattern.params.get("width")
    if isinstance(h, int) and isinstance(w, int) and h * w == pattern.n:
        return h, w
    r = math.isqrt(pattern.n)
    if r * r != pattern.n:
        raise ValueError(
            f"height, width: n={pattern.n} is not a square; give height and width "
            f"with height x width = {pattern.n}"
        )
    return r, r


def default_position(height: int, width: int) -> int:
    """Output position drawn by default: two thirds down and two thirds across.

    Examples
    --------
    >>> default_position(6, 6)
    28
    """
    return (2 * height // 3) * width + min(width - 1, 2 * width // 3)


def render_view(
    view: str,
    pattern: Pattern | None = None,
    *,
    table: Any = None,
    i: int | None = None,
    height: int | None = None,
    width: int | None = None,
    heads: Any = None,
    block: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    size: tuple[float, float] | None = None,
) -> Any:
    """A titled figure of one view.

    Parameters
    ----------
    view : {"matrix", "image", "hops", "scaling"}
    pattern : Pattern, optional
        Required for every view but ``scaling``.
    table : ScalingTable, optional
        Required for ``scaling`` (from :func:`sparse_patterns.scaling`).
    i, height, width : int, optional
        Image view: output position and raster (defaults: :func:`default_position`,
        :func:`default_raster`).
    heads : optional
        Heads to draw (matrix and image views).
    block : int, optional
        Matrix view: force block densities with this tile size.
    mode, residual :
        Hops view: how heads combine across steps (see ``verify``).
    size : (float, float), optional
        Figure size in inches.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        Unknown view, or bad arguments for it.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sparse_patterns import make
    >>> fig = render_view("image", make("strided", 16, stride=4))
    >>> fig.get_suptitle()
    "strided(stride=4, window='paper', causal=True), n=16\\noutput i = 10 on a 4 x 4 raster"
    >>> import matplotlib.pyplot as plt; plt.close(fig)
    """
    import matplotlib.pyplot as plt  # noqa: PLC0415

    view = check_choice("view", view, VIEWS)
    if view == "scaling":
        if table is None:
            raise ValueError("table: the scaling view needs a ScalingTable, got None")
        from .analysis import plot_scaling, scaling_title  # noqa: PLC0415

        fig, ax = plt.subplots(figsize=size or (8.5, 4.5), layout="constrained")
        plot_scaling(table, ax=ax)
        fig.suptitle(_wrap(scaling_title(table), fig.get_figwidth()), fontsize="medium")
        return fig
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: the {view} view needs a Pattern, got {type(pattern).__name__}")
    title = pattern_title(pattern)
    if view == "image":
        from .image import check_raster, plot_image_view  # noqa: PLC0415

        if height is None and width is None:
            height, width = default_raster(pattern)
        elif height is None or width is None:
            raise ValueError("height, width: give both or neither")
        height, width = check_raster(pattern.n, height, width)
        i = default_position(height, width) if i is None else check_int("i", i, 0, pattern.n - 1)
        scale = 4.5 / max(height, width)
        fig, ax = plt.subplots(
            figsize=size or (max(3.5, width * scale + 0.5), height * scale + 1.3),
            layout="constrained",
        )
        plot_image_view(pattern, i, height=height, width=width, ax=ax, heads=heads)
        title += f"\noutput i = {i} on a {height} x {width} raster"
    elif view == "matrix":
        from .matrix import plot_pattern  # noqa: PLC0415

        fig, ax = plt.subplots(figsize=size or (5.5, 6.0), layout="constrained")
        plot_pattern(pattern, ax=ax, heads=heads, block=block)
    else:
        from .analysis import plot_hops  # noqa: PLC0415

        fig, ax = plt.subplots(figsize=size or (5.5, 6.0), layout="constrained")
        plot_hops(pattern, ax=ax, mode=mode, residual=residual)
        title += f"\nhop distance ({mode}, residual={residual})"
    fig.suptitle(_wrap(title, fig.get_figwidth()), fontsize="medium")
    return fig


def _wrap(title: str, width_in: float) -> str:
    """Wrap each line of a title to fit a figure ``width_in`` inches wide (medium font)."""
    width = max(30, int(width_in * 11))
    return "\n".join("\n".join(textwrap.wrap(line, width)) or line for line in title.split("\n"))
