"""The connectivity matrix of a pattern (the upper row of the paper's Figure 3).

Rows are outputs (queries) ``i``, columns inputs (keys) ``j``. Up to
:data:`TOKEN_LIMIT` positions every cell is drawn in the colour of the heads that
attend it; above that the figure shows block densities, counted by a compiled
loop over the pattern's rows, streamed in bounded chunks, so that neither an
``n x n`` array nor the whole CSR is ever built. A pattern of packed documents
(``params["documents"]``, as ``make(..., documents=...)`` and ``within`` set it)
is drawn with a thin line at every document start, across rows and columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..documents import document_offsets
from ..pattern import Pattern
from ..util.checks import check_int
from ._style import (
    BACKGROUND,
    _rgb,
    cell_grid,
    combo_color,
    combo_label,
    head_color,
    legend_handles,
    legend_kwargs,
    matrix_axes,
    new_axes,
    paint,
    select_heads,
)

__all__ = ["plot_pattern", "block_density", "TOKEN_LIMIT", "auto_block", "pattern_documents",
           "draw_documents", "document_legend", "DOCUMENT_LINE_LIMIT", "DOCUMENT_COLOR"]

#: Largest n drawn cell by cell; longer sequences are drawn as block densities.
TOKEN_LIMIT = 2048
#: Most document boundaries drawn; more would cover the picture (the legend says how many).
DOCUMENT_LINE_LIMIT = 256
#: Colour of the document boundaries.
DOCUMENT_COLOR = "#1A1A1A"
#: gid of the LineCollection holding the boundaries (``ax.collections``).
DOCUMENT_GID = "document-boundaries"
#: Entries of the rows read at once (all heads) when counting pairs per block: bounds the
#: scratch memory (the rows' CSR, about 5 bytes an entry) whatever n is.
_CHUNK = 1 << 22


def auto_block(n: int, target: int = 256) -> int:
    """Block size of the density view: the smallest power of two with ``ceil(n / b) <= target``.

    Examples
    --------
    >>> auto_block(65536), auto_block(4096), auto_block(100)
    (256, 16, 1)
    """
    n = check_int("n", n, 1)
    b = 1
    while -(-n // b) > target:
        b *= 2
    return b


def block_density(pattern: Pattern, block: int, *, heads: Any = None) -> np.ndarray:
    """Fraction of set pairs in every ``block x block`` tile, per head.

    Tiles at the right and bottom edges are cropped to ``n``; their fraction is
    over the cropped area. Computed from row ranges of the pattern (:meth:`Pattern.iter_rows`),
    whole row blocks at a time, so it never holds the whole CSR.

    Parameters
    ----------
    pattern : Pattern
    block : int
        Tile side in tokens, ``>= 1``.
    heads : int, str or sequence of them, optional
        The heads to count (indices or names); all by default.

    Returns
    -------
    numpy.ndarray
        ``float64 (len(heads), nb, nb)`` with ``nb = ceil(n / block)``.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> d = block_density(make("strided", 8, stride=2), 4)
    >>> d.shape, d[1].tolist()
    ((2, 2, 2), [[0.375, 0.0], [0.5, 0.375]])
    """
    block = check_int("block", block, 1)
    drawn = select_heads(pattern, heads)
    n = pattern.n
    nb = -(-n // block)
    sizes = np.full(nb, block, dtype=np.float64)
    sizes[-1] = n - block * (nb - 1)
    area = np.multiply.outer(sizes, sizes)  # (nb, nb)
    counts = np.zeros((len(drawn), nb, nb), dtype=np.int64)
    # streamed from the pattern's rule in chunks of about _CHUNK entries (never the whole CSR)
    count = _tile_counter()
    for start, _, mats in pattern.iter_rows(pattern.chunk_rows(_CHUNK)):
        for t, h in enumerate(drawn):
            m = mats[h]
            count(m.indptr, m.indices, block, start, counts[t])
    return counts / area


_KERNELS: dict = {}


def _tile_counter() -> Any:
    """Compile (once, cached on disk) the tile-counting loop; numba is imported lazily.

    ``count(indptr, indices, block, row0, out)`` adds the entries of the CSR
    rows ``row0, row0 + 1, ...`` to ``out[I, J]`` (int64 ``(nb, nb)``), one
    pass over sorted columns with a division only where a row enters a new
    column block.
    """
    if not _KERNELS:
        from numba import njit  # noqa: PLC0415

        @njit(cache=True, nogil=True)
        def count(indptr, indices, block, row0, out):  # pragma: no cover - numba
            for r in range(indptr.size - 1):
                bi = (row0 + r) // block
                k, end = indptr[r], indptr[r + 1]
                while k < end:
                    bj = indices[k] // block
                    edge = (bj + 1) * block
                    c = 0
                    while k < end and indices[k] < edge:
                        c += 1
                        k += 1
                    out[bi, bj] += c

        _KERNELS["count"] = count
    return _KERNELS["count"]


def pattern_documents(pattern: Pattern) -> np.ndarray | None:
    """The ``cu_seqlens`` offsets of a pattern's packed documents, or None.

    Read from ``params["documents"]`` (lengths or offsets, as ``make(...,
    documents=...)`` and ``within`` record them); None when the pattern has no
    documents, a single one, or a value that is not valid documents of its n.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pattern_documents(make("local", 8, window=1, documents=[3, 5])).tolist()
    [0, 3, 8]
    >>> pattern_documents(make("local", 8, window=1)) is None
    True
    """
    docs = pattern.params.get("documents")
    if docs is None:
        return None
    try:
        offs = document_offsets(docs, pattern.n)
    except ValueError:  # a hand-made params dict: nothing to draw
        return None
    return offs if offs.size > 2 else None


def draw_documents(ax: Any, offsets: Any, n: int) -> Any:
    """Draw a thin line at every document start after the first, across rows and columns.

    Lines lie between cells, at ``start - 0.5`` on both axes (data coordinates
    of an image drawn with unit cells, as every matrix view is), in one
    ``LineCollection`` whose gid is ``"document-boundaries"``. Nothing is drawn
    for more than :data:`DOCUMENT_LINE_LIMIT` boundaries.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    offsets : sequence of int
        ``cu_seqlens`` offsets ``0 = o_0 < o_1 < ... < o_D = n``.
    n : int
        Sequence length (the lines span ``[-0.5, n - 0.5]``).

    Returns
    -------
    matplotlib.collections.LineCollection or None
        The lines; None when there is no boundary or too many to draw.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> _, ax = plt.subplots()
    >>> lines = draw_documents(ax, [0, 3, 8], 8)
    >>> [seg.tolist() for seg in lines.get_segments()]
    [[[-0.5, 2.5], [7.5, 2.5]], [[2.5, -0.5], [2.5, 7.5]]]
    >>> plt.close("all")
    """
    from matplotlib.collections import LineCollection  # noqa: PLC0415

    starts = [int(s) for s in np.asarray(offsets, dtype=np.int64)[1:-1]]
    if not starts or len(starts) > DOCUMENT_LINE_LIMIT:
        return None
    lo, hi = -0.5, n - 0.5
    segs = [[(lo, s - 0.5), (hi, s - 0.5)] for s in starts]  # rows: horizontal lines
    segs += [[(s - 0.5, lo), (s - 0.5, hi)] for s in starts]  # columns: vertical lines
    width = 1.0 if len(starts) <= 16 else 0.5
    lines = LineCollection(segs, colors=DOCUMENT_COLOR, linewidths=width, zorder=3,
                           label="document boundary")
    lines.set_gid(DOCUMENT_GID)
    ax.add_collection(lines, autolim=False)
    return lines


def document_legend(offsets: Any, drawn: Any) -> Any:
    """The legend handle of the document boundaries (a line, or a note when not drawn)."""
    from matplotlib.lines import Line2D  # noqa: PLC0415

    count = len(offsets) - 1
    if drawn is None:
        return Line2D([], [], color="none", label=f"{count:,} documents (boundaries not drawn)")
    return Line2D([], [], color=DOCUMENT_COLOR, linewidth=1.0,
                  label=f"document boundary ({count:,} documents)")


def _token_codes(pattern: Pattern, drawn: list[int]) -> np.ndarray:
    """``uint16 (n, n)``: bit t set where head ``drawn[t]`` attends (small n only)."""
    n = pattern.n
    codes = np.zeros((n, n), dtype=np.uint16)
    for t, h in enumerate(drawn):
        m = pattern.heads[h]
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(m.indptr))
        codes[rows, m.indices] |= np.uint16(1 << t)
    return codes


def _shade(dens: np.ndarray, drawn: list[int]) -> np.ndarray:
    """Blend head colours by block density over the background: ``float (nb, nb, 3)`` in [0, 1]."""
    alpha = np.where(dens > 0, 0.2 + 0.8 * np.sqrt(dens), 0.0)  # (H, nb, nb)
    cols = np.stack([_rgb(head_color(h)) for h in drawn]).astype(np.float64) / 255  # (H, 3)
    total = alpha.sum(axis=0)  # (nb, nb)
    mix = np.einsum("hij,hc->ijc", alpha, cols) / np.maximum(total, 1e-12)[..., None]
    a = alpha.max(axis=0)[..., None]  # opacity of the cell
    bg = _rgb(BACKGROUND).astype(np.float64) / 255
    return bg * (1 - a) + mix * a


def plot_pattern(
    pattern: Pattern,
    *,
    ax: Any = None,
    heads: Any = None,
    block: int | None = None,
    legend: bool = True,
) -> Any:
    """Draw the connectivity matrix: rows are outputs ``i``, columns inputs ``j``.

    Each head has its own colour (Okabe-Ito, colour-blind safe); a cell that
    several heads attend takes the mean of their colours, and the legend names
    every colour that appears. For ``n > TOKEN_LIMIT`` (or when ``block`` is
    given) the view shows ``block x block`` tiles instead, shaded by the
    fraction of their pairs each head sets (``0.2 + 0.8 * sqrt(fraction)`` for
    a tile with any pair), computed from the CSR without an ``n x n`` array.
    When ``pattern.params`` holds ``documents`` (packed documents), both views
    draw a thin line at each document start, on rows and columns
    (:func:`draw_documents`), and the legend names them.

    Parameters
    ----------
    pattern : Pattern
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new figure when None.
    heads : int, str or sequence of them, optional
        The heads to draw (indices or names); all by default.
    block : int, optional
        Force the block-density view with this tile size. By default tokens
        are drawn up to ``TOKEN_LIMIT`` and tiles of :func:`auto_block` above.
    legend : bool
        Add a legend (below the axes).

    Returns
    -------
    matplotlib.axes.Axes
        The axes, the heads' matrices drawn in their colours.

    Raises
    ------
    ValueError
        An unknown head or a block size below 1.

    See Also
    --------
    plot_image_view : the same heads seen from one position of an image.
    block_density : the numbers behind the block view.

    References
    ----------
    R. Child et al., "Generating Long Sequences with Sparse Transformers",
    arXiv:1904.10509, 2019, Figure 3 (upper row).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sparse_patterns import make
    >>> ax = plot_pattern(make("strided", 16, stride=4))
    >>> [t.get_text() for t in ax.get_legend().get_texts()]
    ['A1', 'A2', 'A1 + A2']
    >>> ax = plot_pattern(make("strided", 16, stride=4, documents=[6, 10]))
    >>> [t.get_text() for t in ax.get_legend().get_texts()][-1]
    'document boundary (2 documents)'
    >>> import matplotlib.pyplot as plt; plt.close("all")
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    drawn = select_heads(pattern, heads)
    n = pattern.n
    if block is None and n > TOKEN_LIMIT:
        block = auto_block(n)
    ax = new_axes(ax)
    names = pattern.head_names
    if block is None:
        codes = _token_codes(pattern, drawn)
        rgb, present = paint(codes, drawn)
        ax.imshow(rgb, interpolation="nearest", extent=(-0.5, n - 0.5, n - 0.5, -0.5))
        cell_grid(ax, n, n)
        entries = [(combo_label(c, drawn, names), combo_color(drawn[t] for t in range(len(drawn))
                    if c >> t & 1)) for c in _legend_order(present) if c]
        note = None
    else:
        block = check_int("block", block, 1)
        dens = block_density(pattern, block, heads=drawn)  # (H, nb, nb)
        nb = dens.shape[1]
        rgb = _shade(dens, drawn)
        ax.imshow(rgb, interpolation="nearest", extent=(-0.5, nb * block - 0.5,
                                                          nb * block - 0.5, -0.5))
        entries = [(names[h], head_color(h)) for t, h in enumerate(drawn) if dens[t].any()]
        if len(entries) > 1:
            entries.append(("several heads", combo_color(h for t, h in enumerate(drawn)
                                                          if dens[t].any())))
        note = f"tiles of {block} x {block}: shade = fraction of pairs set (sqrt scale)"
    handles = legend_handles(entries)
    offsets = pattern_documents(pattern)
    if offsets is not None:
        handles.append(document_legend(offsets, draw_documents(ax, offsets, n)))
    matrix_axes(ax, n)
    if legend and handles:
        leg = ax.legend(handles=handles, **legend_kwargs(len(handles)))
        if note is not None:
            leg.set_title(note, prop={"size": "x-small"})
    return ax


def _legend_order(codes: list[int]) -> list[int]:
    """Single heads first (by head), then combinations by size and value."""
    return sorted(codes, key=lambda c: (bin(c).count("1"), c))
