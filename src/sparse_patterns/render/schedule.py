"""Figures of a layer schedule: which pairs each layer connects, and how many.

A schedule is a list of layer patterns (see
:func:`sparse_patterns.analysis.verify_schedule`); layer k attends through the
union of its heads ``A_k``, with the residual ``M_k = A_k + I``, and connects
``R_k = M_k R_{k-1}`` (rows are outputs, ``R_1 = M_1``). :func:`schedule_hops`
computes, densely for ``n <= SCHEDULE_LIMIT``, the first layer after which each
target pair is connected; :func:`plot_schedule` draws it as a matrix coloured by
that layer (or, given a :class:`~sparse_patterns.analysis.ScheduleReport` or a
longer sequence, the pairs connected after each layer as bars), and
:func:`schedule_figure` puts both side by side, as ``patterns render --schedule``
saves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..documents import document_offsets
from ..pattern import Pattern
from ..util.checks import check_bool, check_int
from ._style import (
    BACKGROUND,
    OKABE_ITO,
    UNREACHABLE_COLOR,
    cell_grid,
    legend_handles,
    legend_kwargs,
    matrix_axes,
    new_axes,
)
from .analysis import hop_color
from .matrix import document_legend, draw_documents

__all__ = ["plot_schedule", "schedule_hops", "schedule_figure", "layer_color", "SCHEDULE_LIMIT",
           "LEAK", "UNREACHABLE", "LEAK_COLOR"]

#: Largest n whose pairs :func:`schedule_hops` computes densely (four ``n x n`` arrays).
SCHEDULE_LIMIT = 2048
#: :func:`schedule_hops` value of a target pair no layer connects.
UNREACHABLE = -1
#: :func:`schedule_hops` value of a pair across documents that the layers connect (a leak).
LEAK = -2
#: Colour of the pairs across documents that the layers connect.
LEAK_COLOR = OKABE_ITO["black"]


def layer_color(k: int, p: int) -> str:
    """Colour of the pairs first connected by layer ``k`` (1-based) of a ``p``-layer schedule.

    The hop colours of :func:`~sparse_patterns.render.hop_color` up to six
    layers (layer k is hop k); evenly spaced viridis colours beyond, so that no
    two layers share one.

    Examples
    --------
    >>> layer_color(1, 3), layer_color(3, 3)
    ('#0072B2', '#009E73')
    """
    k, p = int(k), int(p)
    if p <= 6:
        return hop_color(k)
    from matplotlib import colormaps  # noqa: PLC0415
    from matplotlib.colors import to_hex  # noqa: PLC0415

    return to_hex(colormaps["viridis"]((k - 1) / (p - 1))).upper()


def _layers(layers: Any) -> list[Pattern]:
    from ..analysis.schedule import check_layers  # noqa: PLC0415 - the verifier's own check

    return check_layers(layers)


def schedule_hops(
    layers: Sequence[Pattern],
    *,
    documents: Sequence[int] | np.ndarray | None = None,
    residual: bool = True,
) -> np.ndarray:
    """The layer after which each pair is first connected, as a dense ``int32 (n, n)`` array.

    Parameters
    ----------
    layers : list of Pattern
        One pattern per layer, in order; every layer has the same
        ``n <= SCHEDULE_LIMIT``. A layer attends through the union of its heads.
    documents : sequence of int, optional
        Packed documents (lengths or ``cu_seqlens`` offsets): target pairs stay
        inside a document, as in :func:`~sparse_patterns.analysis.verify_schedule`.
    residual : bool
        Add the identity at every layer.

    Returns
    -------
    numpy.ndarray
        ``int32 (n, n)``: ``k >= 1`` for a target pair first in ``R_k`` (layer
        k, 1-based), :data:`UNREACHABLE` (-1) for a target pair in no ``R_k``,
        :data:`LEAK` (-2) for a pair across documents that some ``R_k`` of the
        unrestricted layers holds, 0 for every other pair (``j > i`` of a
        causal schedule, pairs across documents that nothing connects).
        Targets are ``j <= i`` when every layer is causal, else all pairs, and
        inside one document; as in ``verify_schedule``, a target's layer counts
        only paths inside its document (leaving it needs an entry across
        documents, which is a leak).

    Raises
    ------
    ValueError
        ``n > SCHEDULE_LIMIT``, or as ``verify_schedule`` (an empty schedule,
        layers of different n, bad documents).

    Examples
    --------
    >>> from sparse_patterns import make
    >>> schedule_hops([make("local", 5, window=1)] * 2)
    array([[ 1,  0,  0,  0,  0],
           [ 1,  1,  0,  0,  0],
           [ 2,  1,  1,  0,  0],
           [-1,  2,  1,  1,  0],
           [-1, -1,  2,  1,  1]], dtype=int32)
    >>> schedule_hops([make("full", 4)], documents=[2, 2])
    array([[ 1,  0,  0,  0],
           [ 1,  1,  0,  0],
           [-2, -2,  1,  0],
           [-2, -2,  1,  1]], dtype=int32)
    """
    layers = _layers(layers)
    residual = check_bool("residual", residual)
    n = layers[0].n
    if n > SCHEDULE_LIMIT:
        raise ValueError(f"n: schedule_hops builds dense (n, n) arrays for n <= {SCHEDULE_LIMIT}, "
                         f"got n={n}; use verify_schedule() for larger n")
    offs = document_offsets(documents, n)
    doc = np.repeat(np.arange(offs.size - 1), np.diff(offs))  # (n,) document of each token
    same = doc[:, None] == doc[None, :]  # (n, n) pairs inside one document
    causal = all(layer.causal for layer in layers)
    target = np.tril(same) if causal else same
    eye = np.eye(n, dtype=bool)
    hop = np.zeros((n, n), np.int32)
    inside = whole = None  # R_k of the layers cut to the documents, and of the whole layers
    for k, layer in enumerate(layers, 1):
        a = layer.rows(0, n).toarray()  # (n, n) union of the heads
        if residual:
            a |= eye
        inside = _step(a & same, inside)
        hop[inside & target & (hop == 0)] = k
        if documents is not None:
            whole = _step(a, whole)
            hop[whole & ~same] = LEAK
    hop[target & (hop == 0)] = UNREACHABLE
    return hop


def _step(m: np.ndarray, reach: np.ndarray | None) -> np.ndarray:
    """``M R`` as booleans (``M`` itself for the first layer); float32 sums of at most
    n <= 2048 ones are exact."""
    if reach is None:
        return m.copy()
    return (m.astype(np.float32) @ reach.astype(np.float32)) > 0


def plot_schedule(
    report_or_layers: Any,
    ax: Any = None,
    *,
    documents: Sequence[int] | np.ndarray | None = None,
    residual: bool = True,
    limit: int = SCHEDULE_LIMIT,
) -> Any:
    """Draw what a schedule connects: per pair for a small schedule, per layer otherwise.

    Given a list of layer patterns with ``n <= limit``, cell ``(i, j)`` is
    coloured by the layer after which input ``j`` first reaches output ``i``
    (:func:`schedule_hops`), target pairs no layer connects in vermillion,
    pairs across documents that the layers connect (a leak) in black, and the
    rest in the background colour; document boundaries are drawn as thin lines
    and the legend counts the pairs of each colour. The image's array
    (``ax.images[0].get_array()``) is the ``schedule_hops`` matrix. Given a
    :class:`~sparse_patterns.analysis.ScheduleReport` (or longer layers, which
    are verified first), a bar per layer counts the target pairs connected
    after it, against the line of all target pairs.

    Parameters
    ----------
    report_or_layers : list of Pattern, or ScheduleReport
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new figure when None.
    documents : sequence of int, optional
        Packed documents, lengths or ``cu_seqlens`` offsets (layers only; a
        report holds its own).
    residual : bool
        Add the identity at every layer (layers only).
    limit : int
        Largest n drawn pair by pair.

    Returns
    -------
    matplotlib.axes.Axes
        The axes, each target pair coloured by the layer that first reaches it.

    Raises
    ------
    ValueError
        Neither layers nor a report, ``documents`` or ``residual`` given with
        a report, or as :func:`~sparse_patterns.analysis.verify_schedule`.

    See Also
    --------
    sparse_patterns.analysis.verify_schedule : the numbers behind the bars.
    plot_hops : the same for the heads of one pattern.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sparse_patterns import make
    >>> layers = [make("local", 16, window=3)] * 2 + [make("full", 16)]
    >>> ax = plot_schedule(layers)
    >>> [t.get_text() for t in ax.get_legend().get_texts()]
    ['layer 1: 58', 'layer 2: 33', 'layer 3: 45']
    >>> from sparse_patterns.analysis import verify_schedule
    >>> ax = plot_schedule(verify_schedule(layers))
    >>> [int(b.get_height()) for b in ax.patches]
    [58, 91, 136]
    >>> import matplotlib.pyplot as plt; plt.close("all")
    """
    from ..analysis.schedule import ScheduleReport, verify_schedule  # noqa: PLC0415

    limit = check_int("limit", limit, 1)
    if isinstance(report_or_layers, ScheduleReport):
        if documents is not None or residual is not True:
            raise ValueError("documents, residual: a ScheduleReport holds its own; give them to "
                             "verify_schedule() or pass the layers")
        return _bars(report_or_layers, new_axes(ax, (5.5, 4.0)))
    if not isinstance(report_or_layers, (list, tuple)):
        raise ValueError(f"report_or_layers: expected a list of Patterns or a ScheduleReport, got "
                         f"{type(report_or_layers).__name__}")
    layers = _layers(report_or_layers)
    if layers[0].n <= limit:
        hops = schedule_hops(layers, documents=documents, residual=residual)
        offs = None if documents is None else document_offsets(documents, layers[0].n)
        return _matrix(hops, len(layers), offs, new_axes(ax))
    report = verify_schedule(layers, documents=documents, residual=residual)
    return _bars(report, new_axes(ax, (5.5, 4.0)))


def _matrix(hops: np.ndarray, p: int, offsets: np.ndarray | None, ax: Any) -> Any:
    """Draw an ``int (n, n)`` schedule hop matrix with one colour per value (-2 .. p)."""
    from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: PLC0415

    n = hops.shape[0]
    colors = [LEAK_COLOR, UNREACHABLE_COLOR, BACKGROUND] + [layer_color(k, p)
                                                            for k in range(1, p + 1)]
    norm = BoundaryNorm(np.arange(LEAK - 0.5, p + 1.0), len(colors))
    ax.imshow(hops, cmap=ListedColormap(colors), norm=norm, interpolation="nearest",
              extent=(-0.5, n - 0.5, n - 0.5, -0.5))
    cell_grid(ax, n, n)
    counts = np.bincount((hops - LEAK).ravel(), minlength=p + 3)  # index v - LEAK
    entries = [(f"layer {k}: {int(counts[k - LEAK]):,}", layer_color(k, p))
               for k in range(1, p + 1) if counts[k - LEAK]]
    if counts[UNREACHABLE - LEAK]:
        entries.append((f"unreachable: {int(counts[UNREACHABLE - LEAK]):,}", UNREACHABLE_COLOR))
    if counts[0]:
        entries.append((f"leak across documents: {int(counts[0]):,}", LEAK_COLOR))
    handles = legend_handles(entries)
    if offsets is not None and offsets.size > 2:
        handles.append(document_legend(offsets, draw_documents(ax, offsets, n)))
    matrix_axes(ax, n)
    if handles:
        kw = legend_kwargs(len(handles))
        kw["ncols"] = len(handles) if len(handles) <= 4 else -(-len(handles) // 2)
        leg = ax.legend(handles=handles, **kw)
        leg.set_title("target pairs first connected after", prop={"size": "small"})
    return ax


def _bars(report: Any, ax: Any) -> Any:
    """Bars: target pairs connected after each layer, the line of all target pairs."""
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    p, targets = int(report.p), int(report.targets)
    reach = [int(v) for v in report.reachable]
    x = np.arange(1, p + 1)
    bars = ax.bar(x, reach, color=[layer_color(k, p) for k in x], width=0.7)
    share = [f"{v:,}\n{v / max(targets, 1):.0%}" for v in reach]
    ax.bar_label(bars, labels=share, fontsize="x-small", padding=2)
    ax.axhline(targets, color="0.35", linestyle="--", linewidth=1.0)
    ax.annotate(f"all {targets:,} target pairs", (0.02, targets), xycoords=("axes fraction", "data"),
                xytext=(0, 3), textcoords="offset points", fontsize="x-small", color="0.35")
    names = [str(name).split("(")[0] for name in report.layer_names]
    ax.set_xticks(x, [f"{k}\n{name}" for k, name in zip(x, names, strict=True)],
                  fontsize="small" if p <= 8 else "x-small")
    ax.set_xlabel("after layer")
    ax.set_ylabel("target pairs connected")
    ax.set_ylim(0, targets * 1.3 if targets else 1)
    ax.spines[["top", "right"]].set_visible(False)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    done = report.layers_to_connect
    line = (f"every target pair connected after layer {done}" if done is not None
            else f"not connected after {p} layers: {int(report.not_in_last):,} pairs missing")
    if report.leak is not None:
        k = None if report.leak_example is None else report.leak_example[0] + 1
        line += (f"\nleaks across documents (layer {k} has an entry across)" if report.leak
                 else "\nno leak across documents")
    ax.set_title(line, fontsize="small")
    return ax


def _layer_text(layer: Pattern) -> str:
    """``name(params)`` without the documents (drawn) and a default ``causal=True``."""
    ps = [f"{k}={v}" for k, v in layer.params.items()
          if k != "documents" and not (k == "causal" and v is True)]
    return f"{layer.name}({', '.join(ps)})" if ps else layer.name


def schedule_figure(
    layers: Sequence[Pattern],
    *,
    documents: Sequence[int] | np.ndarray | None = None,
    residual: bool = True,
    size: tuple[float, float] | None = None,
) -> Any:
    """A titled figure of a schedule: the pairs by layer (``n <= SCHEDULE_LIMIT``) and the bars.

    Returns
    -------
    matplotlib.figure.Figure
        Two panels (:func:`plot_schedule` of the layers, then of their
        ``verify_schedule`` report), or the bars alone for larger n.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sparse_patterns import make
    >>> fig = schedule_figure([make("local", 16, window=3), make("full", 16)], documents=[6, 10])
    >>> len(fig.axes), fig.get_suptitle().splitlines()[0]
    (2, 'schedule of 2 layers, n = 16: local(window=3) -> full')
    >>> import matplotlib.pyplot as plt; plt.close(fig)
    """
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from ..analysis.schedule import verify_schedule  # noqa: PLC0415

    layers = _layers(layers)
    report = verify_schedule(layers, documents=documents, residual=residual)
    n, p = layers[0].n, len(layers)
    small = n <= SCHEDULE_LIMIT
    if small:
        fig, (left, right) = plt.subplots(1, 2, figsize=size or (11.0, 6.2), layout="constrained",
                                          width_ratios=(1.15, 1.0))
        plot_schedule(layers, ax=left, documents=documents, residual=residual)
    else:
        fig, right = plt.subplots(figsize=size or (6.5, 4.5), layout="constrained")
    _bars(report, right)
    docs = report.documents
    where = ""
    if docs is not None:
        where = f", {len(docs) - 1} documents"
        if len(docs) <= 9:
            where += " (" + " + ".join(str(b - a) for a, b in zip(docs, docs[1:], strict=False)) + ")"
    fig.suptitle(
        f"schedule of {p} layer{'s' * (p != 1)}, n = {n:,}: "
        + " -> ".join(_layer_text(layer) for layer in layers)
        + f"\nreachability after each layer{where}, "
        + ("residual" if residual else "no residual"),
        fontsize="medium",
    )
    return fig
