"""What the verification, the sweep and the cuts share: input checks, run structures, step matrices.

:func:`as_pattern` turns the accepted inputs into a :class:`Pattern` and
:func:`check_common` validates ``p``, ``mode`` and ``residual`` once for every
analysis. A connectivity matrix is handed to the numba kernels of
:mod:`._numba` as **runs** (every row a sorted list of maximal runs of
consecutive columns); :func:`counts` gives the row counts of every head and of
their union from those runs, without building the union's CSR, and
:func:`steps` stacks the structures every attention step uses. Private to the
package: the names carry no underscore so that sibling modules may import them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp

from ..pattern import MODES, Pattern
from ..util.checks import check_bool, check_choice, check_int
from . import _numba as K

__all__ = [
    "as_pattern", "check_p", "check_common", "runs", "stack", "union_of", "row_sizes", "counts",
    "Steps", "steps", "step_mats", "nthreads", "chunk",
]


# ----------------------------------------------------------------------- input
def as_pattern(pattern: Any) -> Pattern:
    """A :class:`Pattern` from a Pattern, an array ``(n, n)`` / ``(H, n, n)`` or a sequence of heads."""
    if isinstance(pattern, Pattern):
        return pattern
    if isinstance(pattern, np.ndarray) and pattern.ndim in (2, 3):
        pattern = list(pattern) if pattern.ndim == 3 else [pattern]
    if isinstance(pattern, (list, tuple)):
        heads = list(pattern)
        if not heads:
            raise ValueError("pattern: needs at least one head, got an empty sequence")
        ns = []
        mats = []
        for k, h in enumerate(heads):
            if not (sp.issparse(h) or isinstance(h, np.ndarray)):
                raise ValueError(f"pattern: heads[{k}] must be a sparse matrix or an array, "
                                 f"got {type(h).__name__}")
            if h.ndim != 2 or h.shape[0] != h.shape[1]:
                raise ValueError(f"pattern: heads[{k}] must be square (n, n), got {h.shape}")
            ns.append(h.shape[0])
            mats.append(sp.csr_matrix(h))
        if len(set(ns)) > 1:
            raise ValueError(f"pattern: heads have different n {ns}; every head must have the same n")
        causal = all(sp.triu(m, 1).nnz == 0 for m in mats)
        return Pattern(mats, causal=causal)
    raise ValueError(
        f"pattern: expected a Pattern, a BlockLayout or a sequence of (n, n) matrices, "
        f"got {type(pattern).__name__}"
    )


def check_p(p: Any, heads: int, mode: str) -> int:
    """``p`` as an int (the number of heads when None; at most that in interleaved mode)."""
    if p is None:
        return heads
    if mode == "interleaved":
        return check_int("p", p, 1, heads)
    return check_int("p", p, 1)


def check_common(p: Any, mode: Any, residual: Any, heads: int) -> tuple[int, str, bool]:
    """Validate ``p``, ``mode`` and ``residual`` of an analysis of ``heads`` heads."""
    mode = check_choice("mode", mode, MODES)
    residual = check_bool("residual", residual)
    p = check_p(p, heads, mode)
    return p, mode, residual


# ------------------------------------------------------------------ structures
def runs(m: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of a sorted CSR matrix: ``(ptr (n + 1,), starts, lengths)``."""
    n = m.shape[0]
    with numba.parallel_chunksize(max(1, n // 256)):
        cnt = K.pick("count_runs", n)(m.indptr, m.indices, n)
        ptr = np.zeros(n + 1, np.int64)
        np.cumsum(cnt, out=ptr[1:])
        rst = np.empty(int(ptr[-1]), np.int64)
        rln = np.empty(int(ptr[-1]), np.int64)
        K.pick("fill_runs", n)(m.indptr, m.indices, n, ptr, rst, rln)
    return ptr, rst, rln


def stack(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """Stack run structures: row ``a`` of structure ``s`` becomes row ``s * n + a``."""
    ptrs, offs = [], 0
    for ptr, _, _ in parts:
        ptrs.append(ptr[:-1] + offs)
        offs += int(ptr[-1])
    rptr = np.concatenate([*ptrs, np.array([offs], np.int64)])
    rst = np.concatenate([x[1] for x in parts]) if parts else np.empty(0, np.int64)
    rln = np.concatenate([x[2] for x in parts]) if parts else np.empty(0, np.int64)
    return rptr, rst, rln


def union_of(parts, n):
    """Runs of the union of several run structures of n rows."""
    if len(parts) == 1:
        return parts[0]
    rptr, rst, rln = stack(parts)
    return K.pick("union_runs", n)(rptr, rst, rln, n, len(parts))


def row_sizes(ptr: np.ndarray, rln: np.ndarray) -> np.ndarray:
    """Number of columns of every row of a run structure."""
    csum = np.zeros(rln.size + 1, np.int64)
    np.cumsum(rln, out=csum[1:])
    return csum[ptr[1:]] - csum[ptr[:-1]]


def counts(pat: Pattern, want_union: bool = True):
    """Row counts ``(heads + 1, n)`` (the union's from runs, no CSR union), head runs, union runs.

    The union's runs are built only when ``want_union`` (else None).
    """
    n = pat.n
    heads = pat.heads
    parts = [runs(h) for h in heads]
    out = np.empty((len(heads) + 1, n), dtype=np.int64)
    for k, h in enumerate(heads):
        out[k] = np.diff(h.indptr)
    uni = None
    if want_union or len(parts) == 1:
        uni = union_of(parts, n)
        out[-1] = row_sizes(uni[0], uni[2])
    else:
        rptr, rst, rln = stack(parts)
        out[-1] = K.pick("union_sizes", n)(rptr, rst, rln, n, len(parts))
    return out, parts, uni


@dataclass
class Steps:
    """Stacked run structures and which one each step uses."""

    n: int
    rptr: np.ndarray
    rst: np.ndarray
    rln: np.ndarray
    lptr: np.ndarray
    lst: np.ndarray
    lln: np.ndarray
    step_base: np.ndarray  # int64 (p,): structure index * n of every step


def steps(parts, p: int, mode: str, n: int) -> Steps:
    """The structures of the p steps: head m at step m (interleaved), else the union."""
    if mode == "interleaved":
        used = parts[:p]
        base = np.arange(p, dtype=np.int64) * n
    else:
        used = [union_of(parts, n)]
        base = np.zeros(p, dtype=np.int64)
    rptr, rst, rln = stack(used)
    lptr, lst, lln = K.long_index(rptr, rst, rln, len(used) * n)
    return Steps(n, rptr, rst, rln, lptr, lst, lln, base)


def step_mats(pat: Pattern, p: int, mode: str) -> tuple[list[sp.csr_matrix], list[str]]:
    """The CSR matrix and the name of every step (head m, or the union)."""
    if mode == "interleaved":
        return list(pat.heads[:p]), list(pat.head_names[:p])
    return [pat.union()] * p, ["union"] * p


def nthreads() -> int:
    """Number of numba threads."""
    return int(numba.config.NUMBA_NUM_THREADS)


def chunk(n: int) -> int:
    """Rows per parallel chunk of the token kernel."""
    return int(min(256, max(16, n // 512)))
