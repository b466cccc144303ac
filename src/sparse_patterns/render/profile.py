"""The profile figure: forward time against n on log-log axes, one colour per
pattern and one line style per runner, with n^1.5 and n^2 guides, drawn from a
:class:`~sparse_patterns.profiling.ProfileTable`. Like every ``plot_*`` here it
takes ``ax=None``, imports matplotlib inside and returns the Axes; it never
saves or prints."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._style import OKABE_ITO

__all__ = ["plot_profile"]

#: One colour per pattern, in order.
_COLORS = [OKABE_ITO[k] for k in ("blue", "vermillion", "bluish_green", "reddish_purple",
                                    "orange", "sky_blue", "black")]
_STYLES = {"sdpa": ("--", "s"), "flex": (":", "^")}


def plot_profile(table: Any, ax: Any = None) -> Any:
    """Log-log time against n per pattern and runner, with n^1.5 and n^2 guides.

    Parameters
    ----------
    table : sparse_patterns.profiling.ProfileTable
        What :func:`sparse_patterns.profiling.profile` returned.
    ax : matplotlib.axes.Axes, optional
        Where to draw (a new figure when None).

    Returns
    -------
    matplotlib.axes.Axes
        The axes, a line per pattern and runner.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> from sparse_patterns.profiling import profile
    >>> t = profile(["full"], [8, 16], impls=("reference",), baselines=(), repeats=1,
    ...             heads=1, head_dim=4)
    >>> ax = plot_profile(t)
    >>> ax.get_xscale(), ax.get_yscale()
    ('log', 'log')
    >>> plt.close(ax.figure)
    """
    import matplotlib.pyplot as plt  # noqa: PLC0415

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 5))
    names = list(dict.fromkeys(r.pattern for r in table.rows))
    runners = [(r, "impl") for r in table.impls] + [(b, "baseline") for b in table.baselines]
    ns_all, t_first = [], []
    for pi, name in enumerate(names):
        rows = sorted((r for r in table.rows if r.pattern == name), key=lambda r: r.n)
        for k, (runner, kind) in enumerate(runners):
            pts = [(r.n, r.get(runner, kind).median_s) for r in rows
                   if r.get(runner, kind) is not None and r.get(runner, kind).ok]
            if not pts:
                continue
            base = kind == "baseline"
            ls, mk = _STYLES[runner] if base and runner in _STYLES else ("-", "os*Dv"[k % 5])
            x, y = zip(*pts, strict=True)
            label = f"{runner} (baseline)" if base and runner in table.impls else runner
            ax.plot(x, y, ls, marker=mk, color=_COLORS[pi % len(_COLORS)],
                    label=f"{name} / {label}")
            ns_all += list(x)
            t_first.append(pts[0])
    if ns_all:
        n0, n1 = min(ns_all), max(ns_all)
        base = [t for n, t in t_first if n == n0] or [t for _, t in t_first]
        y0 = float(np.exp(np.mean(np.log(base))))
        xs = np.geomspace(n0, max(n1, n0 * 2), 32)
        for e, lab, ls in ((1.5, "n^1.5", ":"), (2.0, "n^2", "-.")):
            ax.plot(xs, y0 * (xs / n0) ** e, color="0.5", lw=0.9, ls=ls, label=f"~ {lab}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if ns_all:
        ticks = sorted(set(ns_all))
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.xaxis.set_minor_formatter("")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("forward time (s), median")
    s = table.settings
    ax.set_title(f"B={s['batch']}, H={s['heads']}, d={s['head_dim']}, {s['dtype']}, "
                 f"{s['mode']}")
    if ns_all:
        ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    return ax
