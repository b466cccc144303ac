"""Streaming helpers of the exporters: a head's CSR read in bounded row chunks,
the memory guard of whatever cannot be streamed, and the compiled loop that
orders block columns the way a FlexAttention ``BlockMask`` stores them.

A generated pattern is never materialized here: its rows come from
:meth:`~sparse_patterns.Pattern.iter_rows` (about
:data:`~sparse_patterns.pattern.CHUNK_ENTRIES` entries a chunk, from
:meth:`~sparse_patterns.Pattern.chunk_rows`, which tests shrink), so writing a
file of several GB holds one chunk at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .. import config
from ..pattern import Pattern

__all__ = ["index_dtype", "chunk_rows", "head_indices", "check_fits", "check_load", "ordered_into"]


def index_dtype(n: int, nnz: int) -> np.dtype:
    """The dtype of a file's ``indptr_k`` / ``indices_k``: int32, or int64 when needed.

    Examples
    --------
    >>> index_dtype(16, 40), index_dtype(16, 2**31)
    (dtype('int32'), dtype('int64'))
    """
    return np.dtype(np.int32 if max(n, nnz) < 2**31 - 1 else np.int64)


def chunk_rows(pattern: Pattern) -> int:
    """Rows per chunk when streaming ``pattern`` (the pattern's bounded default)."""
    return int(pattern.chunk_rows())


def head_indices(pattern: Pattern, k: int, chunk: int) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Yield ``(start, stop, counts, indices)`` of head ``k`` over row chunks covering ``[0, n)``.

    ``counts`` is ``|A_i|`` of the rows ``start .. stop-1``, ``indices`` their
    column indices, concatenated. A held CSR is sliced; otherwise the rows come
    from the pattern's rule (:meth:`~sparse_patterns.Pattern.rows`), chunk by chunk.
    """
    n = pattern.n
    if pattern.materialized:
        m = pattern.heads[k]
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            a, b = int(m.indptr[start]), int(m.indptr[stop])
            yield start, stop, np.diff(m.indptr[start : stop + 1]), m.indices[a:b]
        return
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        m = pattern.rows(start, stop, head=k)
        yield start, stop, np.diff(m.indptr), m.indices


def check_fits(what: str, need: int, instead: str) -> None:
    """Raise :class:`~sparse_patterns.config.MemoryLimitError` when ``need`` bytes pass the limit.

    Examples
    --------
    >>> with config.memory_limit(1000):
    ...     check_fits("kv_indices", 4000, "a larger block")
    Traceback (most recent call last):
    ...
    sparse_patterns.config.MemoryLimitError: kv_indices: needs 4.0 kB, above the memory limit of 1.0 kB (sparse_patterns.config.set_memory_limit); use a larger block
    """
    limit = config.get_memory_limit()
    if need > limit:
        raise config.MemoryLimitError(
            f"{what}: needs {config.format_bytes(need)}, above the memory limit of "
            f"{config.format_bytes(limit)} (sparse_patterns.config.set_memory_limit); use {instead}"
        )


def check_load(where: str, what: str, need: int) -> None:
    """Raise :class:`~sparse_patterns.config.MemoryLimitError` when loading a file would
    allocate ``need`` bytes, more than :func:`~sparse_patterns.config.get_load_limit`.

    ``what`` names the field of the file that asks for it.

    Examples
    --------
    >>> with config.load_limit(1000):
    ...     check_load("f.npz", "indices_0 declares 1,000 int32 entries", 5000)
    Traceback (most recent call last):
    ...
    sparse_patterns.config.MemoryLimitError: f.npz: indices_0 declares 1,000 int32 entries: loading needs 5.0 kB, above the load limit of 1.0 kB (raise it with sparse_patterns.config.set_load_limit)
    """
    limit = config.get_load_limit()
    if need > limit:
        raise config.MemoryLimitError(
            f"{where}: {what}: loading needs {config.format_bytes(need)}, above the load limit of "
            f"{config.format_bytes(limit)} (raise it with sparse_patterns.config.set_load_limit)"
        )


_KERNELS: dict = {}


def _kernel():
    """Compile (once, cached on disk) the ordering loop; numba is imported lazily."""
    if not _KERNELS:
        from numba import njit  # noqa: PLC0415

        @njit(cache=True, nogil=True)
        def ordered(sel, counts, order):  # pragma: no cover - numba
            rows, cols = sel.shape
            for r in range(rows):
                k = 0
                for j in range(cols):
                    if sel[r, j]:
                        order[r, k] = j
                        k += 1
                counts[r] = k
                for j in range(cols):
                    if not sel[r, j]:
                        order[r, k] = j
                        k += 1

        @njit(cache=True, nogil=True)
        def transpose(src, dst):  # pragma: no cover - numba
            rows, cols = src.shape
            for r0 in range(0, rows, 32):  # 32 x 32 tiles, written row by row: 5x numpy's copy
                r1 = min(r0 + 32, rows)
                for c0 in range(0, cols, 32):
                    c1 = min(c0 + 32, cols)
                    for c in range(c0, c1):
                        for r in range(r0, r1):
                            dst[c, r] = src[r, c]

        _KERNELS["ordered"] = ordered
        _KERNELS["transpose"] = transpose
    return _KERNELS["ordered"]


def ordered_into(sel: np.ndarray, counts: np.ndarray, order: np.ndarray) -> None:
    """Write the ``BlockMask`` ordering of the bool ``(R, C)`` tile set ``sel``.

    ``counts[r]`` (int32 ``(R,)``) gets the number of set tiles of row ``r``;
    ``order[r]`` (int32 ``(R, C)``) its set columns in ascending order, then the
    unset ones in ascending order: what ``BlockMask`` derives from a dense
    block mask (a stable descending sort), in one pass, without a sort.

    Examples
    --------
    >>> sel = np.array([[False, True, False, True]])
    >>> counts, order = np.empty(1, np.int32), np.empty((1, 4), np.int32)
    >>> ordered_into(sel, counts, order)
    >>> counts.tolist(), order.tolist()
    ([2], [[1, 3, 0, 2]])
    """
    ordered = _kernel()
    sel = np.asarray(sel, dtype=np.bool_)
    if not sel.flags.c_contiguous and sel.T.flags.c_contiguous:  # a transposed view: tiled copy
        flat = np.empty(sel.shape, dtype=np.bool_)
        _KERNELS["transpose"](sel.T, flat)
        sel = flat
    ordered(np.ascontiguousarray(sel), counts, order)
