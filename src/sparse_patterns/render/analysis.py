"""Figures of the analysis: hop distances of every pair, and ``|A_i|`` against n.

:func:`plot_hops` draws the hop distance of every (output, input) pair as a
matrix for small n (from :func:`sparse_patterns.analysis.hop_matrix`) and the
hop-distance histogram of a :class:`~sparse_patterns.analysis.VerifyReport`
for large n. :func:`plot_scaling` draws a
:class:`~sparse_patterns.analysis.ScalingTable` on log-log axes with the
``n^(1/p)`` guide the paper promises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..pattern import Pattern
from ._style import (
    BACKGROUND,
    OKABE_ITO,
    UNREACHABLE_COLOR,
    _rgb,
    cell_grid,
    head_color,
    legend_handles,
    legend_kwargs,
    matrix_axes,
    new_axes,
)

__all__ = ["plot_hops", "plot_scaling", "hop_color", "scaling_title", "HOP_LIMIT"]

#: Largest n whose hop distances are drawn pair by pair; above it, a histogram.
HOP_LIMIT = 256

_HOP_COLORS = tuple(
    OKABE_ITO[k]
    for k in ("blue", "sky_blue", "bluish_green", "yellow", "reddish_purple", "orange")
)


def hop_color(k: int) -> str:
    """Colour of hop distance ``k`` (``k >= 1``); ``-1`` (unreachable) is vermillion.

    Examples
    --------
    >>> hop_color(1), hop_color(2), hop_color(-1)
    ('#0072B2', '#56B4E9', '#D55E00')
    """
    if k == -1:
        return UNREACHABLE_COLOR
    if k == 0:
        return BACKGROUND
    return _HOP_COLORS[(k - 1) % len(_HOP_COLORS)]


def _hop_label(k: int) -> str:
    if k == -1:
        return "unreachable"
    return f"{k} hop" + ("s" if k != 1 else "")


def plot_hops(
    report_or_pattern: Any,
    ax: Any = None,
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    limit: int = HOP_LIMIT,
) -> Any:
    """Draw hop distances: per pair for a small pattern, a histogram otherwise.

    Given a :class:`~sparse_patterns.Pattern` with ``n <= limit``, every cell
    ``(i, j)`` of the matrix is coloured by the number of attention steps after
    which input ``j`` reaches output ``i`` (1 hop, 2 hops, ...), target pairs
    that are not reached within ``p`` steps in vermillion, and other pairs in
    the background colour. Given a larger pattern (which is verified first) or
    a ``VerifyReport``, a bar per hop distance counts the pairs.

    Parameters
    ----------
    report_or_pattern : Pattern or VerifyReport
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new figure when None.
    p : int, optional
        Number of steps (default: the pattern's number of heads).
    mode : {"interleaved", "merged", "multihead"}
        How heads combine across steps (see :func:`sparse_patterns.verify`).
    residual : bool
        Whether a position keeps what it had at each step.
    limit : int
        Largest n drawn pair by pair.

    Returns
    -------
    matplotlib.axes.Axes

    See Also
    --------
    sparse_patterns.verify : the report behind the histogram.

    References
    ----------
    R. Child et al., arXiv:1904.10509, 2019, section 4.1 (the p + 1 path criterion).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sparse_patterns import make
    >>> ax = plot_hops(make("strided", 16, stride=4))
    >>> [t.get_text() for t in ax.get_legend().get_texts()]
    ['1 hop', '2 hops']
    >>> import matplotlib.pyplot as plt; plt.close("all")
    """
    from .. import analysis  # noqa: PLC0415

    if isinstance(report_or_pattern, Pattern):
        pattern = report_or_pattern
        if pattern.n <= limit:
            hops = analysis.hop_matrix(pattern, p=p, mode=mode, residual=residual)
            return _hop_matrix_axes(hops, new_axes(ax))
        report = analysis.verify(pattern, p=p, mode=mode, residual=residual)
    elif hasattr(report_or_pattern, "hops") and hasattr(report_or_pattern, "unreachable"):
        report = report_or_pattern
    else:
        raise ValueError(
            f"report_or_pattern: expected a Pattern or a VerifyReport, got "
            f"{type(report_or_pattern).__name__}"
        )
    return _hop_histogram_axes(report, new_axes(ax, (5.5, 4.0)))


def _hop_matrix_axes(hops: np.ndarray, ax: Any) -> Any:
    """Colour an ``int (n, n)`` hop matrix (0 background, -1 unreachable)."""
    n = hops.shape[0]
    values = sorted(int(v) for v in np.unique(hops))
    rgb = np.empty((n, n, 3), dtype=np.uint8)
    for v in values:
        rgb[hops == v] = _rgb(hop_color(v))
    ax.imshow(rgb, interpolation="nearest", extent=(-0.5, n - 0.5, n - 0.5, -0.5))
    cell_grid(ax, n, n)
    matrix_axes(ax, n)
    order = [v for v in values if v > 0] + [v for v in values if v < 0]
    entries = [(_hop_label(v), hop_color(v)) for v in order]
    if entries:
        ax.legend(handles=legend_handles(entries), **legend_kwargs(len(entries)))
    return ax


def _hop_histogram_axes(report: Any, ax: Any) -> Any:
    """Bars: pairs per hop distance, and the unreachable target pairs."""
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    ks = sorted(int(k) for k in report.hops)
    counts = [int(report.hops[k]) for k in ks]
    labels = [str(k) for k in ks]
    colors = [hop_color(k) for k in ks]
    if int(report.unreachable) > 0 or not ks:
        labels.append("unreachable")
        counts.append(int(report.unreachable))
        colors.append(UNREACHABLE_COLOR)
    x = np.arange(len(labels))
    bars = ax.bar(x, counts, color=colors, width=0.7)
    ax.bar_label(bars, labels=[f"{c:,}" for c in counts], fontsize="small", padding=2)
    ax.set_xticks(x, labels)
    ax.set_xlabel("hop distance (attention steps from input j to output i)")
    block = getattr(report, "level", "token") == "block"
    ax.set_ylabel("target block pairs" if block else "target pairs (i, j)")
    ax.margins(y=0.15)
    ax.spines[["top", "right"]].set_visible(False)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    total = sum(counts)
    ax.set_title(
        f"n = {int(report.n):,}, p = {int(report.p)} steps, {report.mode}: {total:,} target pairs",
        fontsize="small",
    )
    return ax


def scaling_title(table: Any) -> str:
    """One line naming the swept pattern and its fitted exponent."""
    ps = ", ".join(f"{k}={v!r}" for k, v in dict(table.params).items())
    return (
        f"{table.name}({ps}): |A_i| against n, fitted exponent {float(table.exponent):.3f} "
        f"(1/p = {float(table.expected):.3f})"
    )


def plot_scaling(
    table: Any, ax: Any = None, *, color: str | None = None, label: str | None = None
) -> Any:
    """Draw ``max |A_i|`` and mean ``|A_i|`` against n on log-log axes, with the ``n^(1/p)`` guide.

    The guide ``c * n^(1/p)`` goes through the largest n's ``max |A_i|``, so a
    pattern that keeps the paper's promise runs parallel to it. Several tables
    can share one Axes: each takes the next head colour unless ``color`` is given.

    Parameters
    ----------
    table : ScalingTable
        From :func:`sparse_patterns.scaling` (``ns``, ``max_row``, ``mean_row``,
        ``p``, ``exponent``, ``expected``, ``name``).
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new figure when None.
    color : str, optional
        Line colour (default: the next Okabe-Ito head colour on this Axes).
    label : str, optional
        Prefix of the legend entries (default: the table's pattern name).

    Returns
    -------
    matplotlib.axes.Axes

    References
    ----------
    R. Child et al., arXiv:1904.10509, 2019, section 4.1 (``|A_i| ~ n^(1/p)``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from sparse_patterns import scaling
    >>> ax = plot_scaling(scaling("strided", [64, 256, 1024], stride="sqrt"))
    >>> ax.get_xscale(), ax.get_yscale()
    ('log', 'log')
    >>> import matplotlib.pyplot as plt; plt.close("all")
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: PLC0415

    ax = new_axes(ax, (8.0, 4.5))
    ns = np.asarray(table.ns, dtype=np.float64)
    mx = np.asarray(table.max_row, dtype=np.float64)
    mean = np.asarray(table.mean_row, dtype=np.float64)
    if ns.size == 0:
        raise ValueError("table: the scaling table has no sequence lengths")
    drawn = getattr(ax, "_sparse_patterns_scaling", 0)
    ax._sparse_patterns_scaling = drawn + 1  # how many tables this Axes holds
    color = color or head_color(drawn)
    label = label or str(table.name)
    p = int(table.p)
    ax.loglog(ns, mx, "o-", color=color, label=f"{label}: max |A_i| (fit n^{float(table.exponent):.2f})")
    ax.loglog(ns, mean, "s--", color=color, alpha=0.8, markersize=4, label=f"{label}: mean |A_i|")
    guide = mx[-1] * (ns / ns[-1]) ** (1.0 / p)
    ax.loglog(ns, guide, ":", color="0.35", linewidth=1.2,
              label=f"n^(1/{p}) guide" if p > 1 else "n guide")
    ticks = sorted(set(getattr(ax, "_sparse_patterns_ns", ())) | {int(v) for v in ns})
    ax._sparse_patterns_ns = ticks  # every n drawn on this Axes gets a tick
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}")
    ax.set_xticks(ticks, [f"{v:,}" for v in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("|A_i| (inputs per output)")
    ax.grid(True, which="major", color="0.9")
    handles, labels = ax.get_legend_handles_labels()
    seen: dict[str, Any] = {}
    for h, lab in zip(handles, labels, strict=True):
        seen.setdefault(lab, h)  # one guide entry per p
    ax.legend(seen.values(), seen.keys(), fontsize="small", frameon=False, loc="upper left",
              bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return ax
