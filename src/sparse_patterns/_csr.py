"""CSR helpers of the core types: validation, causality, block pooling and expansion.

Private to :mod:`sparse_patterns.pattern`; no n x n array is built anywhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["freeze", "check_csr", "upper_entry", "block_counts", "expand_blocks", "union_rows", "text_picture",
           "index_dtype", "csr"]


def freeze(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def check_csr(m: Any, k: int, n: int | None) -> sp.csr_matrix:
    """Validate one head and return it as a frozen canonical bool CSR."""
    if not sp.issparse(m):
        raise ValueError(f"heads[{k}]: expected a scipy.sparse matrix, got {type(m).__name__}")
    m = sp.csr_matrix(m)
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"heads[{k}]: must be square (n x n), got shape {m.shape}")
    if n is not None and m.shape[0] != n:
        raise ValueError(f"heads[{k}]: has n={m.shape[0]} but heads[0] has n={n}")
    if m.dtype != np.bool_:
        m = m.astype(np.bool_)  # a copy
    if not m.data.all():
        m = m.copy()
        m.eliminate_zeros()
    if not m.has_canonical_format:
        # has_canonical_format checks sorted indices and no duplicates
        m = m.copy()
        m.sum_duplicates()
        m.sort_indices()
    m.indptr = freeze(np.ascontiguousarray(m.indptr))
    m.indices = freeze(np.ascontiguousarray(m.indices))
    m.data = freeze(np.ascontiguousarray(m.data))
    return m


def upper_entry(m: sp.csr_matrix) -> tuple[int, int] | None:
    """First entry (i, j) with j > i, or None."""
    rows = np.repeat(np.arange(m.shape[0], dtype=np.int64), np.diff(m.indptr))
    bad = np.flatnonzero(m.indices > rows)
    if bad.size == 0:
        return None
    return int(rows[bad[0]]), int(m.indices[bad[0]])


def block_counts(m: sp.csr_matrix, block: int, nb: int) -> np.ndarray:
    """Set token pairs per (row block, column block) of ``m``'s rows: int64 ``(ceil(rows/block), nb)``.

    ``m`` holds whole block rows (its first row starts a block).
    """
    mb = -(-m.shape[0] // block)
    rows = np.repeat(np.arange(m.shape[0], dtype=np.int64) // block, np.diff(m.indptr))
    key = rows * nb + m.indices.astype(np.int64) // block
    return np.bincount(key, minlength=mb * nb).reshape(mb, nb)


def expand_blocks(lay: np.ndarray, block: int, n: int, causal: bool) -> sp.csr_matrix:
    """Kronecker-expand a (nb, nb) bool layout to an (n, n) CSR, cropped, optionally causal."""
    nb = lay.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    pieces: list[np.ndarray] = []
    tok = np.arange(n, dtype=np.int64)
    for bi in range(nb):
        r0, r1 = bi * block, min((bi + 1) * block, n)
        cb = np.flatnonzero(lay[bi])
        # the token columns of this block row: whole column blocks, cropped to n
        cols = (cb[:, None] * block + np.arange(block)[None, :]).ravel()
        cols = cols[cols < n]
        rows = tok[r0:r1]
        cnt = np.searchsorted(cols, rows, side="right") if causal else np.full(rows.size, cols.size)
        counts[r0:r1] = cnt
        total = int(cnt.sum())
        if total:
            off = np.repeat(np.cumsum(cnt) - cnt, cnt)
            pieces.append(cols[np.arange(total, dtype=np.int64) - off])
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    dt = np.int32 if max(n, indices.size) < 2**31 - 1 else np.int64
    return sp.csr_matrix(
        (np.ones(indices.size, dtype=bool), indices.astype(dt), indptr.astype(dt)), shape=(n, n)
    )


def union_rows(mats: list[sp.csr_matrix]) -> sp.csr_matrix:
    """Canonical boolean union of CSR matrices of one shape."""
    u = mats[0]
    for m in mats[1:]:
        u = u + m
    u = sp.csr_matrix(u, dtype=bool)
    u.sum_duplicates()
    u.sort_indices()
    return u


def text_picture(d: np.ndarray) -> str:
    """``#`` attended, ``.`` not, for dense heads ``bool (p, n, n)``: with several heads,
    a cell attended by exactly one shows that head's number (1-9).

    Examples
    --------
    >>> print(text_picture(np.array([[[1, 0], [1, 1]], [[1, 0], [0, 0]]], dtype=bool)))
    #.
    11
    """
    count = d.sum(axis=0)
    which = d.argmax(axis=0)
    lines = []
    for i in range(d.shape[1]):
        row = []
        for j in range(d.shape[2]):
            c = count[i, j]
            if c == 0:
                row.append(".")
            elif c == 1 and d.shape[0] > 1 and which[i, j] < 9:
                row.append(str(which[i, j] + 1))
            else:
                row.append("#")
        lines.append("".join(row))
    return "\n".join(lines)


def index_dtype(n: int, nnz: int) -> type:
    """int32 where ``n`` and ``nnz`` fit it, else int64: a CSR's index dtype."""
    return np.int32 if max(n, nnz) < 2**31 - 1 else np.int64


def csr(n: int, indptr: np.ndarray, indices: np.ndarray) -> sp.csr_matrix:
    """Wrap canonical CSR arrays (sorted unique columns per row) as a bool ``(rows, n)`` matrix."""
    dt = index_dtype(n, int(indptr[-1]))
    m = sp.csr_matrix(
        (np.ones(indices.size, dtype=bool), indices.astype(dt, copy=False), indptr.astype(dt)),
        shape=(indptr.size - 1, n),
    )
    m.has_canonical_format = True  # the builders emit sorted unique columns
    return m
