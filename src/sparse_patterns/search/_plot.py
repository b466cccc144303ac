"""The search figure: each candidate's cost against its largest hop distance (or
against n), verified candidates filled, the others hollow, the Pareto front
drawn as a line through the cheapest verified candidates. Like every ``plot_*``
of :mod:`sparse_patterns.render` it takes ``ax=None``, imports matplotlib
inside and returns the Axes; it never saves or prints."""

from __future__ import annotations

from typing import Any

from ..render import OKABE_ITO, new_axes
from ._tasks import COSTS

__all__ = ["plot_search", "X_AXES"]

#: What the x axis can show.
X_AXES = ("max_hops", "n")
_COLORS = [OKABE_ITO[k] for k in ("blue", "vermillion", "bluish_green", "reddish_purple",
                                    "orange", "sky_blue", "black")]
_YLABEL = {"computed_flops": "computed FLOPs of one forward (the plan's tiles)",
           "useful_flops": "useful FLOPs of one forward (the pattern's pairs)",
           "time_s": "forward time on the worker (s, median)", "nnz": "nnz of the union"}
_FAILED = "0.55"


def plot_search(result: Any, x: str = "max_hops", y: str = "computed_flops", ax: Any = None) -> Any:
    """Cost against max hops (one colour per n) or against n (one colour per family).

    Parameters
    ----------
    result : SearchResult
        What :func:`~sparse_patterns.search.search` returned.
    x : {"max_hops", "n"}
        ``max_hops``: the largest hop distance of the candidate (how many
        steps the worst pair needs); ``n``: the sequence length (log scale).
    y : {"computed_flops", "useful_flops", "time_s", "nnz"}
        The cost (log scale).
    ax : matplotlib.axes.Axes, optional
        Where to draw (a new figure when None).

    Returns
    -------
    matplotlib.axes.Axes
        The axes, a point per row (hollow: not verified) and the Pareto front.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> from sparse_patterns.search import SearchResult
    >>> rows = [{"key": k, "family": "fixed", "params": f'{{"stride": {s}}}', "n": 64,
    ...          "status": "ok", "ok": ok, "max_hops": 2, "computed_flops": f}
    ...         for k, s, ok, f in (("a", 4, True, 9e5), ("b", 8, True, 7e5), ("c", 16, False, 5e5))]
    >>> ax = plot_search(SearchResult(rows, settings={"grid": {"stride": [4, 8, 16]}}))
    >>> ax.get_yscale(), [t.get_text() for t in ax.get_legend().get_texts()]
    ('log', ['n = 64', 'not verified', 'Pareto front'])
    >>> plt.close(ax.figure)
    """
    if x not in X_AXES:
        raise ValueError(f"x: must be one of {', '.join(map(repr, X_AXES))}; got {x!r}")
    if y not in COSTS:
        raise ValueError(f"y: must be one of {', '.join(map(repr, COSTS))}; got {y!r}")
    ax = new_axes(ax, (7.0, 5.0))
    rows = [r for r in result.rows if r["status"] == "ok" and r.get(y) is not None
            and (x == "n" or r.get("max_hops") is not None)]
    front = result.pareto(by=y).rows if any(r.get("ok") is not None for r in rows) else []
    groups = sorted({r["n"] for r in rows}) if x == "max_hops" else list(
        dict.fromkeys(r["family"] for r in rows))
    for k, g in enumerate(groups):
        color = _COLORS[k % len(_COLORS)]
        mine = [r for r in rows if (r["n"] if x == "max_hops" else r["family"]) == g]
        good = [r for r in mine if r.get("ok") is not False]
        if not good:
            continue
        ax.scatter([r[x] for r in good], [r[y] for r in good], s=28, color=color, alpha=0.85,
                   label=f"n = {g:,}" if x == "max_hops" else str(g), zorder=3)
    bad = [r for r in rows if r.get("ok") is False]
    if bad:
        ax.scatter([r[x] for r in bad], [r[y] for r in bad], s=28, facecolors="none",
                   edgecolors=_FAILED, label="not verified", zorder=2)
    if front:
        _draw_front(ax, result, front, x, y)
    ax.set_yscale("log")
    if x == "n":
        ax.set_xscale("log")
        ax.margins(x=0.15)  # room for the labels of the front
        ticks = sorted({r["n"] for r in rows})
        if ticks:
            ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
            ax.xaxis.set_minor_formatter("")
        ax.set_xlabel("sequence length n")
    else:
        hops = sorted({int(r["max_hops"]) for r in rows})
        if hops:
            ax.set_xticks(hops)
            ax.set_xlim(min(hops) - 0.5, max(hops) + 0.5)
        ax.set_xlabel("max hops (steps the worst pair needs)")
    ax.set_ylabel(_YLABEL[y])
    s = result.settings
    mode = f", mode={s['mode']}" if s.get("mode") else ""
    ax.set_title(f"{len(result.rows)} candidates{mode}: Pareto front of verified ones")
    if rows:
        ax.legend(fontsize=8)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    return ax


def _draw_front(ax: Any, result: Any, front: list[dict[str, Any]], x: str, y: str) -> None:
    """The Pareto front: per n a step line (x = hops), or the cheapest per n joined (x = n)."""
    if x == "n":  # the cheapest verified candidate at each n, joined
        cheapest: dict[int, dict[str, Any]] = {}
        for r in front:
            cheapest.setdefault(r["n"], r)
        front = [cheapest[n] for n in sorted(cheapest)]
        ax.plot([r["n"] for r in front], [r[y] for r in front], "-", color="black", lw=1.2,
                marker="D", mfc="none", ms=9, label="Pareto front", zorder=4)
    else:  # per n, a staircase: each step down costs one more hop
        first = True
        for n in sorted({r["n"] for r in front}):
            pts = sorted((r for r in front if r["n"] == n), key=lambda r: r["max_hops"])
            ax.plot([r["max_hops"] for r in pts], [r[y] for r in pts], "-", color="black",
                    lw=1.2, marker="D", mfc="none", ms=9, zorder=4, drawstyle="steps-post",
                    label="Pareto front" if first else None)
            first = False
    seen: set[tuple[Any, Any]] = set()
    for r in front:
        where = (r[x], r[y])
        if where in seen:
            continue
        seen.add(where)
        ax.annotate(result.label(r), where, xytext=(6, 4), textcoords="offset points",
                    fontsize=7)
