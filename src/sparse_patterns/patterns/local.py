"""Local patterns: the 1D sliding window, its dilated form, and the Image
Transformer's 2D local blocks on a raster."""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern, PatternRule
from ..util.checks import MAX_N, check_bool, check_int, check_size
from ._blocks import distance_band, layout_of
from ._build import Progression, local2d_counts, local2d_csr, progression_rule
from ._flex import Offsets, Rule, dilated_band
from .registry import register

__all__ = ["local", "dilated", "local2d", "raster", "dilated_rows"]


def _local_flex(pattern: Pattern) -> list[Rule]:
    """``|q - kv| <= w d`` (``kv <= q`` if causal) and ``(q - kv) mod d == 0``
    (``d = 1`` for ``local``)."""
    p = pattern.params
    return [dilated_band(p["window"], p.get("dilation", 1), pattern.n, bool(p["causal"]))]


def _local_offsets(pattern: Pattern) -> list[Offsets | None]:
    """Causal: ``0 <= i - j <= w d`` and ``(i - j) mod d == 0``."""
    p = pattern.params
    if not p["causal"]:
        return [None]
    d = p.get("dilation", 1)
    return [Offsets(0, p["window"] * d, d)]


@register("local", flex=_local_flex, offsets=_local_offsets)
def local(n: int, window: int, causal: bool = True) -> Pattern:
    """Sliding window ``A_i = {max(0, i - w) .. i}`` (``|i - j| <= w`` if bidirectional).

    This equals the window head A1 of ``strided(n, stride=w)``.

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    window : int
        ``w`` in ``[0, 2^31 - 1]``: the number of earlier positions each position sees.
    causal : bool
        Causal (default) or bidirectional.

    Returns
    -------
    Pattern
        One head ``A``.

    Examples
    --------
    >>> local(6, window=2).heads[0][5].indices.tolist()
    [3, 4, 5]
    """
    return _dilated(n, window, 1, causal, "local")


@register("dilated", flex=_local_flex, offsets=_local_offsets)
def dilated(n: int, window: int, dilation: int, causal: bool = True) -> Pattern:
    """Dilated window ``A_i = {i - k d : 0 <= k <= w, i - k d >= 0}``.

    Bidirectional adds ``i + k d`` for ``1 <= k <= w``. ``dilation=1`` is :func:`local`.

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    window : int
        ``w`` in ``[0, 2^31 - 1]`` positions on each side (besides ``i`` itself).
    dilation : int
        ``d`` in ``[1, 2^31 - 1]``.
    causal : bool
        Causal (default) or bidirectional.

    Returns
    -------
    Pattern
        One head ``A``.

    Examples
    --------
    >>> dilated(10, window=2, dilation=3).heads[0][9].indices.tolist()
    [3, 6, 9]
    """
    return _dilated(n, window, dilation, causal, "dilated")


def dilated_rows(n: int, window: int, d: int, causal: bool, i: np.ndarray) -> Progression:
    """Rows ``i`` of the dilated window as a progression ``(first column, count, step)``.

    Examples
    --------
    >>> first, count, step = dilated_rows(10, 2, 3, True, np.array([1, 9]))
    >>> first.tolist(), count.tolist(), step
    ([1, 3], [1, 3], 3)
    """
    back = np.minimum(window, i // d)
    fwd = np.zeros_like(i) if causal else np.minimum(window, (n - 1 - i) // d)
    return i - back * d, back + fwd + 1, d


def _dilated(n: int, window: int, dilation: int, causal: bool, _name: str) -> Pattern:
    n = check_int("n", n, 1, MAX_N)
    window = check_size("window", window, 0)
    d = check_size("dilation", dilation)
    causal = check_bool("causal", causal)
    params = {"window": window, "causal": causal}
    if _name == "dilated":
        params = {"window": window, "dilation": d, "causal": causal}

    def spec(i: np.ndarray):
        yield dilated_rows(n, window, d, causal, i)

    blocks = None
    if d == 1:
        def blocks(block: int):
            return layout_of(n, block, [distance_band(n, block, 0 if causal else -window, window)])

    return Pattern.from_rule(
        progression_rule(n, 1, spec, blocks), n, name=_name, params=params, causal=causal, head_names=("A",),
    )


def raster(n: int, height: int | None, width: int | None) -> tuple[int, int]:
    """Resolve an ``height x width`` raster for ``n`` positions (square by default)."""
    if height is None and width is None:
        r = int(round(n**0.5))
        if r * r != n:
            raise ValueError(
                f"height: n={n} is not a square; give height and width with height * width == n"
            )
        return r, r
    if height is None:
        width = check_size("width", width, 1, n)
        height = n // width
    elif width is None:
        height = check_size("height", height, 1, n)
        width = n // height
    height = check_size("height", height, 1, n)
    width = check_size("width", width, 1, n)
    if height * width != n:
        raise ValueError(f"height: height * width must equal n={n}; got {height} x {width}")
    return height, width


@register("local2d")
def local2d(
    n: int,
    height: int | None = None,
    width: int | None = None,
    query_block: int = 4,
    memory: int = 4,
    causal: bool = True,
) -> Pattern:
    """2D local attention on a raster of ``height x width`` (row-major) positions.

    The raster is cut into ``query_block x query_block`` query blocks. Every
    position of a query block attends to its memory block: rows from ``memory``
    above the query block to its last row, columns from ``memory`` left of it to
    ``memory`` right of it (and ``memory`` rows below too, if bidirectional);
    causal keeps the positions before ``i`` in raster order.

    Parameters
    ----------
    n : int
        ``height * width``.
    height, width : int, optional
        The raster, each in ``[1, n]``; a square by default.
    query_block : int
        Side of the query blocks, in ``[1, 2^31 - 1]``.
    memory : int
        Margin of the memory block, in ``[0, 2^31 - 1]``.
    causal : bool
        Raster-order causal (default) or bidirectional.

    Returns
    -------
    Pattern
        One head ``A``.

    Examples
    --------
    >>> pat = local2d(16, query_block=2, memory=1)
    >>> pat.heads[0][10].indices.tolist()  # (row 2, col 2): rows 1-2, cols 1-3, j <= 10
    [5, 6, 7, 9, 10]
    """
    n = check_int("n", n, 1, MAX_N)
    h, w = raster(n, height, width)
    q = check_size("query_block", query_block)
    m = check_size("memory", memory, 0)
    causal = check_bool("causal", causal)
    params = {"height": h, "width": w, "query_block": q, "memory": m, "causal": causal}

    def take(i: np.ndarray) -> list:
        return [local2d_csr(h, w, q, m, causal, i)]

    def rows(start: int, stop: int) -> list:
        return take(np.arange(start, stop, dtype=np.int64))

    def counts() -> np.ndarray:
        return local2d_counts(h, w, q, m, causal, np.arange(n, dtype=np.int64))[None]

    return Pattern.from_rule(
        PatternRule(1, lambda: rows(0, n), None, rows, counts, take=take), n, name="local2d", params=params, causal=causal, head_names=("A",),
    )
