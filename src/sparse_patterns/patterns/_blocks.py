"""Closed-form block layouts for families whose membership depends on simple
arithmetic of ``i`` and ``j``; these never touch the token-level CSR, so a block
layout at n = 2^20 costs O(nb^2) instead of O(nnz).

Each function returns ``(layout, full)`` as ``bool (nb, nb)`` arrays.
"""

from __future__ import annotations

import numpy as np

from ..pattern import BlockLayout

__all__ = ["block_bounds", "distance_band", "distance_multiple", "layout_of"]


def block_bounds(n: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """First and last token (inclusive) of every block: two int64 (nb,) arrays."""
    nb = -(-n // block)
    lo = np.arange(nb, dtype=np.int64) * block
    hi = np.minimum(lo + block, n) - 1
    return lo, hi


def _distances(n: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest ``i - j`` over each tile: two int64 (nb, nb) arrays."""
    lo, hi = block_bounds(n, block)
    if n < 2**30:  # halve the memory traffic of the (nb, nb) arrays
        lo, hi = lo.astype(np.int32), hi.astype(np.int32)
    return lo[:, None] - hi[None, :], hi[:, None] - lo[None, :]


def distance_band(n: int, block: int, dlo: int, dhi: int) -> tuple[np.ndarray, np.ndarray]:
    """Tiles of ``{(i, j) : dlo <= i - j <= dhi}``."""
    dmin, dmax = _distances(n, block)
    return (dmax >= dlo) & (dmin <= dhi), (dmin >= dlo) & (dmax <= dhi)


def distance_multiple(n: int, block: int, step: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Tiles of ``{(i, j) : (i - j) mod step == 0}`` (and ``i >= j`` when causal)."""
    dmin, dmax = _distances(n, block)
    lo = np.maximum(dmin, 0) if causal else dmin
    lay = (dmax >= lo) & (np.floor_divide(dmax, step) * step >= lo)
    # full: every distance of the tile is a multiple of step (and >= 0 if causal)
    every = (step == 1) | ((dmin == dmax) & (dmin % step == 0))
    full = lay & every & ((dmin >= 0) if causal else True)
    return lay, full


def layout_of(n: int, block: int, heads: list[tuple[np.ndarray, np.ndarray]]) -> BlockLayout:
    """Stack per-head ``(layout, full)`` pairs into a :class:`BlockLayout`."""
    lay = np.stack([h[0] for h in heads])
    full = np.stack([h[1] for h in heads])
    return BlockLayout(lay, block=block, n=n, full=full)
