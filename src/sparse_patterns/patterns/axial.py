"""Axial (row and column) attention on a raster: the Sparse Transformer's image
setting, where the stride equals the image width."""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern
from ..util.checks import MAX_N, check_bool, check_int
from ._build import progression_rule, with_union
from ._flex import Rule, causal_rule
from .local import raster
from .registry import register

__all__ = ["axial2d"]


def _axial_flex(pattern: Pattern) -> list[Rule]:
    """row: ``q // w == kv // w``; col: ``(q - kv) mod w == 0``."""
    import torch  # noqa: PLC0415

    w, causal = pattern.params["width"], bool(pattern.params["causal"])
    row = causal_rule(lambda q, kv: (q // w) == (kv // w), causal)
    col = causal_rule(lambda q, kv: torch.remainder(q - kv, w) == 0, causal)
    return [row, col]


@register("axial2d", flex=_axial_flex)
def axial2d(
    n: int, height: int | None = None, width: int | None = None, causal: bool = True
) -> Pattern:
    """Row head ``A1`` (same raster row) and column head ``A2`` (same column).

    Parameters
    ----------
    n : int
        ``height * width``.
    height, width : int, optional
        The raster (row-major); a square by default.
    causal : bool
        Raster-order causal (``j <= i``, default) or bidirectional.

    Returns
    -------
    Pattern
        Heads ``row`` and ``col``.

    Examples
    --------
    >>> pat = axial2d(9)
    >>> pat.heads[0][5].indices.tolist(), pat.heads[1][5].indices.tolist()
    ([3, 4, 5], [2, 5])
    """
    n = check_int("n", n, 1, MAX_N)
    h, w = raster(n, height, width)
    causal = check_bool("causal", causal)

    def spec(i: np.ndarray):
        rs = (i // w) * w
        yield rs, (i - rs + 1) if causal else np.full_like(i, w), 1
        del rs
        yield i % w, (i // w + 1) if causal else np.full_like(i, h), w

    def union_counts() -> np.ndarray:  # row and column meet in i only
        i = np.arange(n, dtype=np.int64)
        if causal:
            return (i % w + 1) + (i // w + 1) - 1
        return np.full(n, w + h - 1, dtype=np.int64)

    return Pattern.from_rule(
        with_union(progression_rule(n, 2, spec), union_counts), n, name="axial2d", params={"height": h, "width": w, "causal": causal},
        causal=causal, head_names=("row", "col"),
    )
