"""The online softmax's loops on transposed score matrices of any tile size: the
general path of the forward (other tile sizes than 32, float64), beside the fused
32-token passes of :mod:`._llvm_fwd`.

The row max: a float max reduction is not vectorized
without fast-math (which would drop NaN semantics), so the forward keeps the scores
transposed (keys x queries) and takes elementwise maxima across the queries.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._llvm import _FM, _exp2f, _wide

__all__ = ["_mask_tile_t", "_softmax_cols", "_exp_cols", "_exp_rows"]


@numba.njit(cache=True)
def _mask_tile_t(st, c0, ncol, nrow, masks, mi):  # pragma: no cover - compiled
    """``-inf`` where partial tile ``mi`` is unset, in transposed scores: tile
    column ``c`` (a key) is row ``c0 + c`` of ``st``, tile row ``r`` its column ``r``."""
    _wide()
    W = masks.shape[2]
    ninf = st.dtype.type(-np.inf)
    for w in range(W):
        lo = w * 64
        hi = min(ncol, lo + 64)
        for c in range(lo, hi):
            sh = np.uint64(c - lo)
            row = st[c0 + c]
            for r in range(nrow):  # contiguous in st and in masks[mi, :, w] (W = 1)
                keep = (masks[mi, r, w] >> sh) & np.uint64(1)
                row[r] = row[r] if keep else ninf


@numba.njit(cache=True, fastmath=_FM)
def _softmax_cols(st, nk, rows, mrow, cmax, msub, csum, precise):  # pragma: no cover - compiled
    """Online-softmax step on transposed scores ``st`` (``nk`` keys x ``rows``
    queries), vectorized across the queries: ``cmax`` = max of ``mrow`` and each
    column (NaN if the column has one), ``st = exp(st - cmax)`` (0 for a column
    whose max is ``-inf``), ``csum`` = the column sums. ``precise`` (float64):
    natural units and ``math.exp``; otherwise the scores are in base-2 units
    (scaled by ``log2 e``) and the exponential is :func:`_exp2f`."""
    _wide()
    for r in range(rows):
        cmax[r] = mrow[r]
    for j in range(nk):
        for r in range(rows):
            x = st[j, r]
            m = cmax[r]
            cmax[r] = x if (x > m or x != x) else m
    _exp_cols(st, nk, rows, cmax, msub, csum, precise)


@numba.njit(cache=True, fastmath=_FM)
def _exp_cols(st, nk, rows, cmax, msub, csum, precise):  # pragma: no cover - compiled
    """Second half of :func:`_softmax_cols`, given the column maxima ``cmax``:
    ``st = exp(st - cmax)`` (0 for a column whose max is ``-inf``), ``csum`` = the
    column sums."""
    _wide()
    F = st.dtype.type
    ninf = F(-np.inf)
    for r in range(rows):
        msub[r] = cmax[r] if cmax[r] != ninf else F(0.0)
        csum[r] = F(0.0)
    if precise:
        for j in range(nk):
            for r in range(rows):
                y = math.exp(st[j, r] - msub[r])
                st[j, r] = y
                csum[r] += y
        return
    G = np.float32
    for j in range(nk):
        for r in range(rows):
            y = _exp2f(G(st[j, r]) - G(msub[r]))
            st[j, r] = y
            csum[r] += y


@numba.njit(cache=True, fastmath=_FM)
def _exp_rows(x, rows, precise):  # pragma: no cover - compiled
    """``x[:rows] = exp(x[:rows])`` (``precise``) or ``2**x[:rows]`` (float32, vectorized);
    ``-inf`` gives 0, NaN stays NaN."""
    _wide()
    if precise:
        for r in range(rows):
            x[r] = math.exp(x[r])
        return
    for r in range(rows):
        x[r] = _exp2f(np.float32(x[r]))
