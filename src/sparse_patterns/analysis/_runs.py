"""Connectivity rows as **runs**, the form the exact verification works on: every row a
sorted list of maximal runs of consecutive columns ``[start, start + length)``, built from a
CSR (:func:`count_runs`, :func:`fill_runs`), merged over heads (:func:`union_runs`,
:func:`union_sizes`), and the long runs (``length >= LONG``) of chosen rows copied out
(:func:`long_index`). Plain functions are compiled by :mod:`._numba` (a parallel and a
serial form each)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["LONG", "count_runs", "fill_runs", "union_runs", "union_sizes", "long_index"]

#: A run at least this long is "long": a union ORs the long runs of a layer first.
LONG = 64


@njit(cache=True)
def _run_end(indices, t, hi):
    """Last index e in [t, hi) with indices[t..e] consecutive (galloping search)."""
    v = indices[t]
    if indices[hi - 1] - v == hi - 1 - t:
        return hi - 1
    e = t
    step = 1
    while e + step < hi and indices[e + step] - v == e + step - t:
        e += step
        step *= 2
    lo = e
    top = min(e + step, hi) - 1
    while lo < top:
        mid = (lo + top + 1) >> 1
        if indices[mid] - v == mid - t:
            lo = mid
        else:
            top = mid - 1
    return lo


def count_runs(indptr, indices, n):
    """Number of maximal runs of consecutive columns in each CSR row: int64 (n,)."""
    out = np.zeros(n, np.int64)
    for a in prange(n):
        hi = indptr[a + 1]
        t = indptr[a]
        c = 0
        while t < hi:
            t = _run_end(indices, t, hi) + 1
            c += 1
        out[a] = c
    return out


def fill_runs(indptr, indices, n, rptr, rst, rln):
    """Write the runs of every CSR row at ``rptr[a]`` (from :func:`count_runs`)."""
    for a in prange(n):
        hi = indptr[a + 1]
        t = indptr[a]
        q = rptr[a]
        while t < hi:
            e = _run_end(indices, t, hi)
            rst[q] = indices[t]
            rln[q] = e - t + 1
            q += 1
            t = e + 1


@njit(cache=True)
def _merge_row(heads_ptr, rst, rln, n, H, a, ost, oln, what):
    """Union of row ``a`` over the H stacked heads as maximal runs (H-way merge).

    ``what``: 0 returns the number of runs, 1 also writes them to ost/oln,
    2 returns the number of positions.
    """
    write = what == 1
    pos = np.empty(H, np.int64)
    for h in range(H):
        pos[h] = heads_ptr[h * n + a]
    m = 0
    size = 0
    cur_s = -1
    cur_e = -1
    while True:
        best = -1
        bs = 0
        e = 0
        for h in range(H):
            if pos[h] < heads_ptr[h * n + a + 1]:
                s = rst[pos[h]]
                if best < 0 or s < bs:
                    best = h
                    bs = s
        if best >= 0:
            e = bs + rln[pos[best]]
            pos[best] += 1
            if cur_s >= 0 and bs <= cur_e:  # extends the current run
                cur_e = max(cur_e, e)
                continue
        if cur_s >= 0:  # a gap, or no runs left: the current run is complete
            if write:
                ost[m] = cur_s
                oln[m] = cur_e - cur_s
            m += 1
            size += cur_e - cur_s
        if best < 0:
            break
        cur_s = bs
        cur_e = e
    return size if what == 2 else m


def union_runs(heads_ptr, rst, rln, n, H):
    """Runs of the union of H stacked structures: (rptr, rst, rln)."""
    cnt = np.zeros(n, np.int64)
    dummy = np.empty(0, np.int64)
    for a in prange(n):
        cnt[a] = _merge_row(heads_ptr, rst, rln, n, H, a, dummy, dummy, 0)
    ptr = np.zeros(n + 1, np.int64)
    for a in range(n):
        ptr[a + 1] = ptr[a] + cnt[a]
    ost = np.empty(ptr[n], np.int64)
    oln = np.empty(ptr[n], np.int64)
    for a in prange(n):
        _merge_row(heads_ptr, rst, rln, n, H, a, ost[ptr[a]:ptr[a + 1]], oln[ptr[a]:ptr[a + 1]], 1)
    return ptr, ost, oln


def union_sizes(heads_ptr, rst, rln, n, H):
    """Number of positions in every row of the union of H stacked structures."""
    out = np.zeros(n, np.int64)
    for a in prange(n):
        out[a] = _merge_row(heads_ptr, rst, rln, n, H, a, rst[:0], rln[:0], 2)
    return out


@njit(cache=True)
def long_index(rptr, rst, rln, rows):
    """The runs with ``length >= LONG`` of every row, copied compactly: (lptr, lst, lln).

    Pass 1 of a union reads only these small arrays, which stay in cache while
    the rows it visits are scattered.
    """
    lptr = np.zeros(rows + 1, np.int64)
    for r in range(rows):
        c = 0
        for q in range(rptr[r], rptr[r + 1]):
            if rln[q] >= LONG:
                c += 1
        lptr[r + 1] = lptr[r] + c
    lst = np.empty(lptr[rows], np.int64)
    lln = np.empty(lptr[rows], np.int64)
    m = 0
    for q in range(rptr[rows]):
        if rln[q] >= LONG:
            lst[m] = rst[q]
            lln[m] = rln[q]
            m += 1
    return lptr, lst, lln
