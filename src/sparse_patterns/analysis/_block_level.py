"""The block-level check's kernels: a block layout as CSR (:func:`bool_csr`), one step of
block reachability (:func:`block_step`) and its counts (:func:`block_count`), on bitset
rows. Plain functions are compiled by :mod:`._numba` (a parallel and a serial form each)."""

from __future__ import annotations

import numpy as np
from numba import prange

from ._bits import _ONE, first_zero, popcount

__all__ = ["bool_csr", "block_step", "block_count"]


def bool_csr(lay):
    """CSR (ptr, idx) of a square bool matrix, row by row."""
    nb = lay.shape[0]
    cnt = np.zeros(nb, np.int64)
    for I in prange(nb):
        c = 0
        for J in range(lay.shape[1]):
            c += lay[I, J]
        cnt[I] = c
    ptr = np.zeros(nb + 1, np.int64)
    for I in range(nb):
        ptr[I + 1] = ptr[I] + cnt[I]
    idx = np.empty(ptr[nb], np.int64)
    for I in prange(nb):
        q = ptr[I]
        for J in range(lay.shape[1]):
            if lay[I, J]:
                idx[q] = J
                q += 1
    return ptr, idx


def block_step(nb, bptr, bidx, prev, add_self, keep_prev, out):
    """One step at block level: out[I] = U_{K in B(I)} (prev[K] | {K} if add_self) | prev[I] if keep_prev.

    ``prev`` and ``out`` are bit matrices ``uint64 (nb, ceil(nb / 64))``.
    """
    W = prev.shape[1]
    for I in prange(nb):
        row = out[I]
        if keep_prev:
            for w in range(W):
                row[w] = prev[I, w]
        else:
            for w in range(W):
                row[w] = 0
        for t in range(bptr[I], bptr[I + 1]):
            K = bidx[t]
            src = prev[K]
            for w in range(W):
                row[w] |= src[w]
            if add_self:
                row[K >> 6] |= _ONE << np.uint64(K & 63)


def block_count(nb, R, E, causal, write_e):
    """Per block row: target pairs of R not in E (E |= R when write_e), |R| on target, first miss."""
    new = np.zeros(nb, np.int64)
    have = np.zeros(nb, np.int64)
    miss = np.full(nb, -1, np.int64)
    for I in prange(nb):
        T = I + 1 if causal else nb
        hw = (T + 63) >> 6
        a = 0
        h = 0
        for w in range(hw):
            x = R[I, w]
            if w == hw - 1 and (T & 63):
                x &= (_ONE << np.uint64(T & 63)) - _ONE
            h += popcount(x)
            a += popcount(x & ~E[I, w])
            if write_e:
                E[I, w] |= x
        new[I] = a
        have[I] = h
        if h < T:
            miss[I] = first_zero(R[I], T)
    return new, have, miss
