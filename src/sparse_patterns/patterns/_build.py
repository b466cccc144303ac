"""Vectorized CSR builders shared by the generators (no dense n x n array anywhere).

Every generator describes a head row by row as an arithmetic progression of
columns, a prefix of a sorted column set, or a union of those; these helpers turn
such descriptions into canonical boolean CSR (sorted, unique column indices).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["progression_csr", "prefix_csr", "local2d_csr", "from_row_lists", "union_csr", "csr"]


def _index_dtype(n: int, nnz: int) -> type:
    return np.int32 if max(n, nnz) < 2**31 - 1 else np.int64


def csr(n: int, indptr: np.ndarray, indices: np.ndarray) -> sp.csr_matrix:
    """Wrap canonical CSR arrays (sorted unique columns per row) as a bool matrix."""
    dt = _index_dtype(n, int(indptr[-1]))
    m = sp.csr_matrix(
        (np.ones(indices.size, dtype=bool), indices.astype(dt, copy=False), indptr.astype(dt)),
        shape=(n, n),
    )
    m.has_canonical_format = True  # the builders emit sorted unique columns
    return m


def _offsets(counts: np.ndarray) -> np.ndarray:
    indptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr


_KERNELS: dict = {}


def _kernels() -> dict:
    """Compile (once, cached on disk) the two fill loops; numba is imported lazily."""
    if not _KERNELS:
        from numba import njit  # noqa: PLC0415

        @njit(cache=True, nogil=True)
        def fill_progression(start, count, step, indptr, out):  # pragma: no cover - numba
            for r in range(count.size):
                base = indptr[r]
                s = start[r]
                st = step[r] if step.size > 1 else step[0]
                for k in range(count[r]):
                    out[base + k] = s + k * st

        @njit(cache=True, nogil=True)
        def fill_prefix(cols, count, indptr, out):  # pragma: no cover - numba
            for r in range(count.size):
                base = indptr[r]
                for k in range(count[r]):
                    out[base + k] = cols[k]

        @njit(cache=True, nogil=True)
        def fill_local2d(h, w, q, m, causal, indptr, out):  # pragma: no cover - numba
            # two passes: with out.size == 0 only count (into indptr[1:]), else fill
            n = h * w
            for i in range(n):
                r, c = i // w, i % w
                r0, c0 = (r // q) * q, (c // q) * q
                r_end = min(h, r0 + q + (0 if causal else m))
                k = 0
                for rr in range(max(0, r0 - m), r_end):
                    for cc in range(max(0, c0 - m), min(w, c0 + q + m)):
                        j = rr * w + cc
                        if causal and j > i:
                            break
                        if out.size:
                            out[indptr[i] + k] = j
                        k += 1
                if not out.size:
                    indptr[i + 1] = k

        _KERNELS["local2d"] = fill_local2d
        _KERNELS["progression"] = fill_progression
        _KERNELS["prefix"] = fill_prefix
    return _KERNELS


def progression_csr(
    n: int, start: np.ndarray, count: np.ndarray, step: int | np.ndarray = 1
) -> sp.csr_matrix:
    """Row ``i`` holds columns ``start[i] + step * k`` for ``k in range(count[i])``.

    ``step`` must be positive so columns come out sorted.
    """
    start = np.ascontiguousarray(start, dtype=np.int64)
    count = np.maximum(np.asarray(count, dtype=np.int64), 0)
    indptr = _offsets(count)
    step_arr = np.atleast_1d(np.asarray(step, dtype=np.int64))
    out = np.empty(int(indptr[-1]), dtype=_index_dtype(n, int(indptr[-1])))
    _kernels()["progression"](start, count, step_arr, indptr, out)
    return csr(n, indptr, out)


def prefix_csr(n: int, cols: np.ndarray, count: np.ndarray) -> sp.csr_matrix:
    """Row ``i`` holds ``cols[:count[i]]`` (``cols`` sorted and unique)."""
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    indptr = _offsets(count)
    out = np.empty(int(indptr[-1]), dtype=_index_dtype(n, int(indptr[-1])))
    _kernels()["prefix"](cols, count, indptr, out)
    return csr(n, indptr, out)


def local2d_csr(h: int, w: int, q: int, m: int, causal: bool) -> sp.csr_matrix:
    """The Image Transformer's 2D local pattern on an ``h x w`` raster (see ``local2d``)."""
    n = h * w
    indptr = np.zeros(n + 1, dtype=np.int64)
    fill = _kernels()["local2d"]
    fill(h, w, q, m, causal, indptr, np.empty(0, dtype=np.int64))
    np.cumsum(indptr, out=indptr)
    out = np.empty(int(indptr[-1]), dtype=_index_dtype(n, int(indptr[-1])))
    if out.size:
        fill(h, w, q, m, causal, indptr, out)
    return csr(n, indptr, out)


def from_row_lists(n: int, rows: list[np.ndarray]) -> sp.csr_matrix:
    """Build from one sorted unique column array per row."""
    count = np.array([r.size for r in rows], dtype=np.int64)
    indptr = _offsets(count)
    cols = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
    return csr(n, indptr, cols)


def union_csr(*mats: sp.csr_matrix) -> sp.csr_matrix:
    """Boolean union of CSR matrices of one shape, canonical."""
    u = mats[0]
    for m in mats[1:]:
        u = u + m
    u = sp.csr_matrix(u, dtype=bool)
    u.sum_duplicates()
    u.sort_indices()
    return u


def tril_counts(cols: np.ndarray, n: int) -> np.ndarray:
    """For each row i, how many of the sorted ``cols`` are <= i."""
    return np.searchsorted(cols, np.arange(n, dtype=np.int64), side="right")
