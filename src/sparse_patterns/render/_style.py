"""Colours, titles and small shared helpers of the figures.

The palette is Okabe and Ito's colour-blind-safe set (Okabe & Ito 2008,
"Color Universal Design"). Heads take its colours in a fixed order; a cell that
several heads attend takes the mean of their colours, so every combination of
heads has one colour that the legend names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..pattern import Pattern

__all__ = [
    "matrix_axes",
    "OKABE_ITO", "HEAD_COLORS", "BACKGROUND", "QUERY_COLOR", "UNREACHABLE_COLOR",
    "head_color", "combo_color", "pattern_title", "select_heads",
]

#: The eight colours of the Okabe-Ito palette, as hex strings.
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}

#: Head colours in order: head 0 blue, head 1 orange, head 2 bluish green, ...
HEAD_COLORS = tuple(
    OKABE_ITO[k]
    for k in ("blue", "orange", "bluish_green", "reddish_purple", "sky_blue", "vermillion", "yellow")
)
#: Colour of a cell no drawn head attends.
BACKGROUND = "#EBEBEB"
#: Colour of the highlighted output position in the image view.
QUERY_COLOR = OKABE_ITO["black"]
#: Colour of target pairs that are not reached (hop plots).
UNREACHABLE_COLOR = OKABE_ITO["vermillion"]


def _rgb(hex_color: str) -> np.ndarray:
    """``"#RRGGBB"`` -> ``uint8 (3,)``."""
    h = hex_color.lstrip("#")
    return np.array([int(h[k : k + 2], 16) for k in (0, 2, 4)], dtype=np.uint8)


def head_color(k: int) -> str:
    """Colour of head ``k`` (the palette repeats after seven heads).

    Examples
    --------
    >>> head_color(0), head_color(1)
    ('#0072B2', '#E69F00')
    """
    return HEAD_COLORS[k % len(HEAD_COLORS)]


def combo_color(heads: Iterable[int]) -> str:
    """Colour of a cell attended by exactly the heads ``heads``: the mean of their colours.

    Examples
    --------
    >>> combo_color([0]), combo_color([0, 1])
    ('#0072B2', '#738959')
    """
    ks = list(heads)
    if not ks:
        return BACKGROUND
    rgb = np.mean([_rgb(head_color(k)).astype(np.float64) for k in ks], axis=0)
    r, g, b = (int(v) for v in np.floor(rgb + 0.5))
    return f"#{r:02X}{g:02X}{b:02X}"


def code_lut(codes: np.ndarray, drawn: Sequence[int]) -> dict[int, np.ndarray]:
    """Colour (``uint8 (3,)``) of each bit code in ``codes``; bit ``t`` = ``drawn[t]``."""
    out: dict[int, np.ndarray] = {}
    for c in np.unique(codes).tolist():
        ks = [drawn[t] for t in range(len(drawn)) if c >> t & 1]
        out[int(c)] = _rgb(combo_color(ks))
    return out


def paint(codes: np.ndarray, drawn: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """``uint8 (..., 3)`` RGB image of a bit-code array, and the codes present (sorted)."""
    lut = code_lut(codes, drawn)
    keys = np.array(sorted(lut), dtype=codes.dtype)
    table = np.stack([lut[int(k)] for k in keys])  # (K, 3)
    rgb = table[np.searchsorted(keys, codes)]
    return rgb, [int(k) for k in keys]


def combo_label(code: int, drawn: Sequence[int], names: Sequence[str]) -> str:
    """Legend label of a bit code: ``"A1"``, ``"A1 + A2"``."""
    return " + ".join(names[drawn[t]] for t in range(len(drawn)) if code >> t & 1)


def select_heads(pattern: Pattern, heads: Any) -> list[int]:
    """Validate ``heads`` (None, indices or names) and return head indices in order."""
    p = pattern.num_heads
    if heads is None:
        return list(range(p))
    if isinstance(heads, (str, int, np.integer)):
        heads = [heads]
    out: list[int] = []
    for h in heads:
        if isinstance(h, str):
            if h not in pattern.head_names:
                raise ValueError(
                    f"heads: unknown head {h!r}; this pattern has {', '.join(pattern.head_names)}"
                )
            k = pattern.head_names.index(h)
        elif isinstance(h, (int, np.integer)) and not isinstance(h, (bool, np.bool_)):
            k = int(h)
            if not 0 <= k < p:
                raise ValueError(f"heads: head index must be in [0, {p}), got {k}")
        else:
            raise ValueError(f"heads: expected head indices or names, got {h!r}")
        if k not in out:
            out.append(k)
    if not out:
        raise ValueError("heads: select at least one head, got none")
    if len(out) > 16:
        raise ValueError(f"heads: at most 16 heads can be drawn at once, got {len(out)}")
    return out


def pattern_title(pattern: Pattern) -> str:
    """One line naming the pattern, its parameters and n.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pattern_title(make("strided", 16, stride=4))
    "strided(stride=4, window='paper', causal=True), n=16"
    """
    ps = ", ".join(f"{k}={v!r}" for k, v in pattern.params.items())
    return f"{pattern.name}({ps}), n={pattern.n:,}"


def legend_handles(entries: Sequence[tuple[str, str]]) -> list[Any]:
    """Square patches for a legend from ``(label, colour)`` pairs."""
    from matplotlib.patches import Patch  # noqa: PLC0415

    return [Patch(facecolor=c, edgecolor="none", label=lab) for lab, c in entries]


def legend_kwargs(count: int) -> dict[str, Any]:
    """Keyword arguments of ``ax.legend`` for a legend centred below the axes."""
    return {
        "loc": "upper center",
        "bbox_to_anchor": (0.5, -0.03),
        "ncols": min(count, 4),
        "borderaxespad": 0.0,
        "fontsize": "small",
        "frameon": False,
        "handlelength": 1.2,
        "columnspacing": 1.2,
    }


def new_axes(ax: Any, size: tuple[float, float] = (5.0, 5.0)) -> Any:
    """``ax`` itself, or the axes of a new figure when ``ax`` is None."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # noqa: PLC0415

    _, ax = plt.subplots(figsize=size, layout="constrained")
    return ax


def cell_grid(ax: Any, rows: int, cols: int, limit: int = 64) -> None:
    """White lines between the cells of an image drawn with unit cells (small grids only)."""
    if max(rows, cols) > limit:
        return
    lw = 1.0 if max(rows, cols) <= 40 else 0.5
    ax.set_xticks(np.arange(-0.5, cols, 1.0), minor=True)
    ax.set_yticks(np.arange(-0.5, rows, 1.0), minor=True)
    ax.grid(which="minor", color="white", linewidth=lw)
    ax.grid(which="major", visible=False)
    ax.tick_params(which="minor", length=0)


def matrix_axes(ax: Any, n: int) -> None:
    """Frame an ``n x n`` connectivity picture: rows are outputs (top down), inputs on top."""
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xlabel("input j (key position)")
    ax.set_ylabel("output i (query position)")
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
