"""Vectorized CSR builders shared by the generators (no dense n x n array anywhere).

Every generator describes a head row by row as an arithmetic progression of
columns, a prefix of a sorted column set, a union of column blocks, or a 2D
window; these helpers turn such descriptions of the rows ``start .. stop-1``
into canonical boolean CSR (sorted, unique column indices) of shape
``(stop - start, n)``, at a cost of O(nnz of those rows). A family whose rows are
progressions hands :func:`progression_rule` one function of the row indices, and
gets its row builder, its closed-form ``|A_i|`` and its whole CSR (``rows(0, n)``,
one code path) in one :class:`~sparse_patterns.pattern.PatternRule`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._csr import csr, index_dtype
from ..pattern import BlockLayout, PatternRule
from ..rule import residue_order

__all__ = [
    "csr", "progression_csr", "prefix_csr", "blocks_csr", "block_row_counts", "local2d_csr",
    "local2d_counts", "from_row_lists", "tril_counts", "progression_rule",
    "Progression", "with_union",
]

#: One head's rows as progressions: ``(first column, count, step)`` per row (step may be an int).
Progression = tuple[np.ndarray, np.ndarray, "int | np.ndarray"]


def _offsets(counts: np.ndarray) -> np.ndarray:
    indptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr


_KERNELS: dict = {}


def _kernels() -> dict:
    """Compile (once, cached on disk) the fill loops; numba is imported lazily."""
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
        def fill_blocks(n, block, bptr, bidx, rows, causal, indptr, out):  # pragma: no cover
            # row r is token i = rows[r]; its columns: the blocks of block row i // block
            for r in range(indptr.size - 1):
                i = rows[r]
                bi = i // block
                k = indptr[r]
                for t in range(bptr[bi], bptr[bi + 1]):
                    j0 = bidx[t] * block
                    j1 = min(n, j0 + block)
                    if causal:
                        j1 = min(j1, i + 1)
                    for j in range(j0, j1):
                        out[k] = j
                        k += 1

        @njit(cache=True, nogil=True)
        def fill_local2d(h, w, q, m, causal, rows, indptr, out):  # pragma: no cover - numba
            # row r is raster position i = rows[r]; indptr is known (local2d_counts)
            for r in range(indptr.size - 1):
                i = rows[r]
                row, col = i // w, i % w
                r0, c0 = (row // q) * q, (col // q) * q
                r_end = min(h, r0 + q + (0 if causal else m))
                k = indptr[r]
                for rr in range(max(0, r0 - m), r_end):
                    for cc in range(max(0, c0 - m), min(w, c0 + q + m)):
                        j = rr * w + cc
                        if causal and j > i:
                            break
                        out[k] = j
                        k += 1

        _KERNELS["local2d"] = fill_local2d
        _KERNELS["progression"] = fill_progression
        _KERNELS["prefix"] = fill_prefix
        _KERNELS["blocks"] = fill_blocks
    return _KERNELS


def progression_csr(
    n: int, start: np.ndarray, count: np.ndarray, step: int | np.ndarray = 1
) -> sp.csr_matrix:
    """Row ``r`` holds columns ``start[r] + step * k`` for ``k in range(count[r])``.

    One row per entry of ``start``: the result is ``(start.size, n)``. ``step``
    must be positive so columns come out sorted.
    """
    start = np.ascontiguousarray(start, dtype=np.int64)
    count = np.maximum(np.broadcast_to(np.asarray(count, dtype=np.int64), start.shape), 0)
    indptr = _offsets(count)
    step_arr = np.atleast_1d(np.asarray(step, dtype=np.int64))
    out = np.empty(int(indptr[-1]), dtype=index_dtype(n, int(indptr[-1])))
    _kernels()["progression"](start, np.ascontiguousarray(count), step_arr, indptr, out)
    return csr(n, indptr, out)


def prefix_csr(n: int, cols: np.ndarray, count: np.ndarray) -> sp.csr_matrix:
    """Row ``r`` holds ``cols[:count[r]]`` (``cols`` sorted and unique): ``(count.size, n)``."""
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    count = np.ascontiguousarray(count, dtype=np.int64)
    indptr = _offsets(count)
    out = np.empty(int(indptr[-1]), dtype=index_dtype(n, int(indptr[-1])))
    _kernels()["prefix"](cols, count, indptr, out)
    return csr(n, indptr, out)


def block_row_counts(
    n: int, block: int, bptr: np.ndarray, bidx: np.ndarray, i: np.ndarray, causal: bool
) -> np.ndarray:
    """``|A_i|`` of the token rows ``i`` of a block-level CSR ``(bptr, bidx)`` (sorted blocks).

    A block row ``I`` holding column blocks ``J`` expands to the token rows of
    ``I`` holding the tokens of every ``J`` (cropped to ``n``; causal keeps
    ``j <= i``, so a causal layout must have ``J <= I``).
    """
    nb = bptr.size - 1
    size = np.minimum(block, n - np.arange(nb, dtype=np.int64) * block)  # tokens per block
    csum = _offsets(size[bidx])
    per_row = csum[bptr[1:]] - csum[bptr[:-1]]  # tokens of every block row, uncut
    bi = i // block
    if not causal:
        return per_row[bi]
    # causal: blocks J < I are whole, the diagonal block is cut at i
    nonempty = np.diff(bptr) > 0
    last = np.full(nb, -1, dtype=np.int64)  # the largest J of every block row
    last[nonempty] = bidx[bptr[1:][nonempty] - 1]
    diag = last == np.arange(nb)
    below = per_row - np.where(diag, size, 0)
    return below[bi] + np.where(diag[bi], i - bi * block + 1, 0)


def blocks_csr(
    n: int, block: int, bptr: np.ndarray, bidx: np.ndarray, i: np.ndarray, causal: bool
) -> sp.csr_matrix:
    """Token rows ``i`` (int64, any order) of a block-level CSR ``(bptr, bidx)``: ``(i.size, n)``.

    See :func:`block_row_counts` for the expansion.
    """
    bptr = np.ascontiguousarray(bptr, dtype=np.int64)
    bidx = np.ascontiguousarray(bidx, dtype=np.int64)
    i = np.ascontiguousarray(i, dtype=np.int64)
    indptr = _offsets(block_row_counts(n, block, bptr, bidx, i, causal))
    out = np.empty(int(indptr[-1]), dtype=index_dtype(n, int(indptr[-1])))
    _kernels()["blocks"](n, block, bptr, bidx, i, causal, indptr, out)
    return csr(n, indptr, out)


def local2d_counts(h: int, w: int, q: int, m: int, causal: bool, i: np.ndarray) -> np.ndarray:
    """``|A_i|`` of the 2D local pattern (see :func:`local2d_csr`) for the positions ``i``."""
    r, c = i // w, i % w
    r0, c0 = (r // q) * q, (c // q) * q
    rlo, clo = np.maximum(0, r0 - m), np.maximum(0, c0 - m)
    width = np.minimum(w, c0 + q + m) - clo
    if causal:  # whole rows above i, then the columns of i's row up to c
        return (r - rlo) * width + (c - clo + 1)
    return (np.minimum(h, r0 + q + m) - rlo) * width


def local2d_csr(h: int, w: int, q: int, m: int, causal: bool, i: np.ndarray) -> sp.csr_matrix:
    """Rows ``i`` (int64 raster positions, any order) of the Image Transformer's 2D local pattern."""
    n = h * w
    i = np.ascontiguousarray(i, dtype=np.int64)
    indptr = _offsets(local2d_counts(h, w, q, m, causal, i))
    out = np.empty(int(indptr[-1]), dtype=index_dtype(n, int(indptr[-1])))
    _kernels()["local2d"](h, w, q, m, causal, i, indptr, out)
    return csr(n, indptr, out)


def progression_rule(
    n: int,
    num_heads: int,
    spec: Callable[[np.ndarray], Iterable[Progression]],
    blocks: Callable[[int], BlockLayout] | None = None,
) -> PatternRule:
    """A rule whose heads are progressions: ``spec(i)`` gives ``(start, count, step)`` per head.

    ``spec`` takes the int64 row indices ``i`` and yields one progression per
    head for those rows (a generator, so that one head's temporaries are freed
    before the next head's are made); ``rows(start, stop)`` calls it on ``start .. stop-1``
    only, ``counts()`` reads the counts at every ``i`` (O(n) memory), and
    ``build()`` is ``rows(0, n)``.
    """

    def take(i: np.ndarray) -> list[sp.csr_matrix]:
        return [progression_csr(n, s, c, st) for s, c, st in spec(i)]

    def rows(start: int, stop: int) -> list[sp.csr_matrix]:
        return take(np.arange(start, stop, dtype=np.int64))

    def counts() -> np.ndarray:
        i = np.arange(n, dtype=np.int64)
        return np.stack([np.maximum(np.broadcast_to(c, i.shape), 0) for _, c, _ in spec(i)])

    sorted_by = SortedTokens(n)

    def spans(i: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        out = []
        for s, c, st in spec(i):
            if np.ndim(st) != 0:
                return None  # per-row steps: no shared array
            out.append(sorted_by.progression(s, c, int(st)))
        return out

    return PatternRule(num_heads, lambda: rows(0, n), blocks, rows, counts, take=take, spans=spans)


class SortedTokens:
    """The tokens ``0 .. n-1`` sorted by residue mod ``s`` (one int32 array per ``s``, made
    on first use), so that a progression of step ``s`` is a slice of one array.

    Examples
    --------
    >>> ind, a, b = SortedTokens(10).progression(np.array([1, 2]), np.array([3, 2]), 3)
    >>> [ind[x:y].tolist() for x, y in zip(a, b)]
    [[1, 4, 7], [2, 5]]
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def progression(self, start: np.ndarray, count: Any, step: int):
        """``(ind, starts, ends)``: row r is ``start[r] + step * k``, ``k < count[r]``."""
        start = np.asarray(start, dtype=np.int64)
        count = np.maximum(np.broadcast_to(np.asarray(count, dtype=np.int64), start.shape), 0)
        if step not in self.orders:
            first = np.zeros(step + 1, np.int64)  # where each residue class starts
            sizes = np.maximum(0, (self.n - np.arange(step, dtype=np.int64) + step - 1) // step)
            np.cumsum(sizes, out=first[1:])
            self.orders[step] = (residue_order(self.n, step).astype(np.int32), first)
        ind, first = self.orders[step]
        at = first[start % step] + start // step
        return ind, at, at + count


def with_union(rule: PatternRule, union_counts: Callable[[], np.ndarray]) -> PatternRule:
    """``rule`` with ``union_counts() -> int64 (n,)``, ``|S_i|`` of the union in closed form."""
    return dataclasses.replace(rule, union_counts=union_counts)


def from_row_lists(n: int, rows: list[np.ndarray]) -> sp.csr_matrix:
    """Build from one sorted unique column array per row."""
    count = np.array([r.size for r in rows], dtype=np.int64)
    indptr = _offsets(count)
    cols = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
    return csr(n, indptr, cols)


def tril_counts(cols: np.ndarray, i: int | np.ndarray) -> np.ndarray:
    """For each row ``i`` (an array, or ``range(n)`` for an int), how many sorted ``cols`` are ``<= i``."""
    rows = np.arange(i, dtype=np.int64) if np.ndim(i) == 0 else np.asarray(i, dtype=np.int64)
    return np.searchsorted(cols, rows, side="right")
