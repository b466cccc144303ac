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


def _by_tile(fn, n: int, block: int) -> np.ndarray:
    """``bool (nb, nb)``: ``fn(dmin, dmax)`` of every tile, ``dmin``/``dmax`` the smallest and
    largest ``i - j`` over it.

    A tile off the last block row and column spans ``(I - J) * block +- (block - 1)``,
    so it depends on ``I - J`` only: ``fn`` runs on the ``2 nb - 1`` diagonals,
    which are laid out as a Toeplitz matrix, and again on the last block row and
    column (the only blocks that can be shorter), never on ``(nb, nb)`` int arrays.
    """
    nb = -(-n // block)
    t = np.arange(-(nb - 1), nb, dtype=np.int64)  # I - J
    diag = np.asarray(fn(t * block - (block - 1), t * block + (block - 1)))
    # out[I, J] = diag[I - J + nb - 1]: windows of the reversed diagonals, reversed
    out = np.lib.stride_tricks.sliding_window_view(diag[::-1], nb)[::-1].copy()
    lo, hi = block_bounds(n, block)
    out[-1, :] = fn(lo[-1] - hi, hi[-1] - lo)
    out[:, -1] = fn(lo - hi[-1], hi - lo[-1])
    return out


def distance_band(n: int, block: int, dlo: int, dhi: int) -> tuple[np.ndarray, np.ndarray]:
    """Tiles of ``{(i, j) : dlo <= i - j <= dhi}``.

    Examples
    --------
    >>> lay, full = distance_band(8, 2, 0, 2)
    >>> lay.astype(int).tolist()[2], full.astype(int).tolist()[2]
    ([0, 1, 1, 0], [0, 0, 0, 0])
    """
    return (_by_tile(lambda a, b: (b >= dlo) & (a <= dhi), n, block),
            _by_tile(lambda a, b: (a >= dlo) & (b <= dhi), n, block))


def distance_multiple(n: int, block: int, step: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Tiles of ``{(i, j) : (i - j) mod step == 0}`` (and ``i >= j`` when causal)."""

    def lay(dmin, dmax):
        lo = np.maximum(dmin, 0) if causal else dmin
        return (dmax >= lo) & (np.floor_divide(dmax, step) * step >= lo)

    def full(dmin, dmax):
        # every distance of the tile is a multiple of step (and >= 0 if causal)
        every = (step == 1) | ((dmin == dmax) & (dmin % step == 0))
        return lay(dmin, dmax) & every & ((dmin >= 0) if causal else True)

    return _by_tile(lay, n, block), _by_tile(full, n, block)


def layout_of(n: int, block: int, heads: list[tuple[np.ndarray, np.ndarray]]) -> BlockLayout:
    """Stack per-head ``(layout, full)`` pairs into a :class:`BlockLayout`."""
    lay = np.stack([h[0] for h in heads])
    full = np.stack([h[1] for h in heads])
    return BlockLayout(lay, block=block, n=n, full=full)
