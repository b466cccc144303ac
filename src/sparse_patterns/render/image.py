"""The image view of a pattern (the lower row of the paper's Figure 3).

The sequence is laid out on a ``height x width`` raster in row-major order
(position ``i`` at row ``i // width``, column ``i % width``); one output
position is highlighted and the inputs each head lets it see are drawn in the
head colours. Only row ``i`` of each head's CSR is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..pattern import Pattern
from ..util.checks import check_int
from ._style import (
    QUERY_COLOR,
    _rgb,
    cell_grid,
    combo_color,
    combo_label,
    legend_handles,
    legend_kwargs,
    new_axes,
    paint,
    select_heads,
)

__all__ = ["plot_image_view", "check_raster"]


def check_raster(n: int, height: Any, width: Any) -> tuple[int, int]:
    """Validate a raster shape for a sequence of length ``n``.

    Examples
    --------
    >>> check_raster(36, 6, 6)
    (6, 6)
    """
    height = check_int("height", height, 1)
    width = check_int("width", width, 1)
    if height * width != n:
        raise ValueError(
            f"height, width: the raster must hold n={n} positions, got "
            f"{height} x {width} = {height * width}"
        )
    return height, width


def plot_image_view(
    pattern: Pattern,
    i: int,
    *,
    height: int,
    width: int,
    ax: Any = None,
    heads: Any = None,
    legend: bool = True,
) -> Any:
    """Draw what output position ``i`` sees, on a ``height x width`` raster.

    Position ``i`` (row ``i // width``, column ``i % width``) is filled in
    black; every input ``j`` in a drawn head's row ``i`` is filled in that
    head's colour, or in the mean colour of the heads when several attend it.

    Parameters
    ----------
    pattern : Pattern
    i : int
        The output position, ``0 <= i < n``.
    height, width : int
        Raster shape, ``height * width == n``.
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new figure when None.
    heads : int, str or sequence of them, optional
        The heads to draw (indices or names); all by default.
    legend : bool
        Add a legend (below the axes).

    Returns
    -------
    matplotlib.axes.Axes
        The axes holding the raster: position ``i`` and what it sees.

    Raises
    ------
    ValueError
        ``height * width != n``, ``i`` outside ``[0, n)``, or an unknown head.

    See Also
    --------
    plot_pattern : the connectivity matrix of the same heads.

    References
    ----------
    R. Child et al., "Generating Long Sequences with Sparse Transformers",
    arXiv:1904.10509, 2019, Figure 3 (lower row).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sparse_patterns import make
    >>> ax = plot_image_view(make("strided", 16, stride=4), 10, height=4, width=4)
    >>> [t.get_text() for t in ax.get_legend().get_texts()]
    ['output i = 10', 'A1', 'A2', 'A1 + A2']
    >>> import matplotlib.pyplot as plt; plt.close("all")
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    n = pattern.n
    height, width = check_raster(n, height, width)
    i = check_int("i", i, 0, n - 1)
    drawn = select_heads(pattern, heads)
    codes = np.zeros(n, dtype=np.uint16)
    for t, h in enumerate(drawn):  # one row: O(|A_i|), never the whole CSR
        codes[pattern.rows(i, i + 1, head=h).indices] |= np.uint16(1 << t)
    rgb, _ = paint(codes, drawn)
    rgb[i] = _rgb(QUERY_COLOR)
    others = np.ones(n, dtype=bool)
    others[i] = False
    present = np.unique(codes[others]).tolist()  # the query cell is drawn black
    ax = new_axes(ax)
    ax.imshow(rgb.reshape(height, width, 3), interpolation="nearest",
              extent=(-0.5, width - 0.5, height - 0.5, -0.5))
    cell_grid(ax, height, width)
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(height - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    names = pattern.head_names
    entries = [(f"output i = {i}", QUERY_COLOR)]
    for c in sorted(present, key=lambda c: (bin(c).count("1"), c)):
        if c:
            ks = [drawn[t] for t in range(len(drawn)) if c >> t & 1]
            entries.append((combo_label(c, drawn, names), combo_color(ks)))
    if legend:
        ax.legend(handles=legend_handles(entries), **legend_kwargs(len(entries)))
    return ax
