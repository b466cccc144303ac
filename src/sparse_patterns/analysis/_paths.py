"""Hop counts and paths: the loops that both a pattern's verification
(:mod:`.criteria`) and a stack of layers' (:mod:`.schedule`) run, and :func:`explain`.

Private to :mod:`sparse_patterns.analysis`; :func:`explain` is public through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp

from ..pattern import Pattern
from ..util.checks import check_int
from . import _numba as K
from ._common import Steps, as_pattern, check_common, chunk, nthreads, step_mats
from .report import Explanation

__all__ = ["METHODS", "EXPLAIN_LIMIT", "PROGRESS_BELOW", "explain"]

#: Values of ``verify(..., method=)``.
METHODS = ("auto", "generic", "structured")
#: Largest n at which ``explain_failure`` builds the token CSR of a pattern that does not hold it.
EXPLAIN_LIMIT = 65536
#: Smallest n whose rows are verified in several batches, so ``progress`` is called between them.
PROGRESS_BELOW = 8192


def _check_progress(progress: Any) -> Callable[[int, int], None] | None:
    if progress is None or progress is False:
        return None
    if not callable(progress):
        raise ValueError(f"progress: expected a callable progress(done, total), None or False, "
                         f"got {progress!r}")
    return progress


def _hop_counts(st: Steps, p: int, residual: bool, causal: bool, progress, mat=None):
    n = st.n
    want = mat is not None
    out_mat = mat if want else np.zeros((1, 1), np.int32)
    # every parallel call costs a thread wake-up, so split the rows only for a progress callback
    nb = 8 if (progress is not None and n >= PROGRESS_BELOW and not want) else 1
    # causal rows cost about i: equal-work batches have edges at n * sqrt(b / nb)
    edges = (n * np.sqrt(np.arange(nb + 1) / nb)).round().astype(np.int64)
    hops = np.zeros(p + 1, np.int64)
    miss1 = miss2 = 0
    bad1 = bad2 = None
    with numba.parallel_chunksize(1):
        for b in range(nb):
            lo, hi = int(edges[b]), int(edges[b + 1])
            if hi <= lo:
                continue
            h, m1, m2, bad = K.pick("hop_kernel", n)(
                n, p, st.step_base, st.rptr, st.rst, st.rln, st.lptr, st.lst, st.lln, residual,
                causal, lo, hi, chunk(n), nthreads(), want, out_mat,
            )
            hops += h.sum(axis=0)
            miss1 += int(m1.sum())
            miss2 += int(m2.sum())
            if bad1 is None:
                w = np.flatnonzero(bad[:, 0] >= 0)
                if w.size:
                    bad1 = (int(bad[w[0], 0]), int(bad[w[0], 1]))
            if bad2 is None:
                w = np.flatnonzero(bad[:, 2] >= 0)
                if w.size:
                    bad2 = (int(bad[w[0], 2]), int(bad[w[0], 3]))
            if progress is not None:
                progress(b + 1, nb)
    return hops, miss1, miss2, bad1, bad2


def _gather(m: sp.csr_matrix, cur: np.ndarray, residual: bool) -> tuple[np.ndarray, np.ndarray]:
    """All (child, parent) pairs with child in row ``parent`` of m (plus parent if residual)."""
    starts = m.indptr[cur].astype(np.int64)
    lens = (m.indptr[cur + 1] - m.indptr[cur]).astype(np.int64)
    total = int(lens.sum())
    off = np.repeat(np.cumsum(lens) - lens, lens)
    idx = np.repeat(starts, lens) + (np.arange(total, dtype=np.int64) - off)
    child = m.indices[idx].astype(np.int64)
    parent = np.repeat(cur, lens)
    if residual:
        child = np.concatenate([child, cur])
        parent = np.concatenate([parent, cur])
    return child, parent


def explain(
    pattern: Pattern | Sequence[Any],
    i: int,
    j: int,
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
) -> Explanation:
    """A shortest path from input ``j`` to output ``i``, or the reason none exists.

    Parameters
    ----------
    pattern : Pattern or sequence of (n, n) matrices
    i, j : int
        Output (query) and input (key) positions.
    p, mode, residual
        As in :func:`verify`.

    Returns
    -------
    Explanation
        ``path`` = ``(j, a, ..., i)`` with the fewest steps k (the pair's hop
        distance), ``steps`` the head used at every step (``"residual"`` for the
        identity), or ``path=None`` and ``reason``.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> e = explain(make("strided", 16, stride=4), 15, 0)
    >>> e.path, e.steps
    ((0, 3, 15), ('A1', 'A2'))
    >>> explain(make("local", 16, window=2), 9, 0, p=2, mode="merged").path is None
    True
    """
    pat = as_pattern(pattern)
    p, mode, residual = check_common(p, mode, residual, pat.num_heads)
    n = pat.n
    i = check_int("i", i, 0, n - 1)
    j = check_int("j", j, 0, n - 1)
    if pat.causal and j > i:
        return Explanation(i, j, None, (), None, False,
                           f"({i}, {j}) is not a target pair: j > i in a causal pattern")
    mats, names = step_mats(pat, p, mode)
    found: tuple[tuple[int, ...], tuple[str, ...], int] | None = None
    in_last = False
    for k in range(1, p + 1):
        layer = np.array([i], dtype=np.int64)
        parents: list[tuple[np.ndarray, np.ndarray]] = []
        for t in range(1, k + 1):
            m = mats[k - t]
            child, parent = _gather(m, layer, residual)
            uniq, first = np.unique(child, return_index=True)
            parents.append((uniq, parent[first]))
            layer = uniq
        hit = layer.size and np.searchsorted(layer, j) < layer.size and layer[
            np.searchsorted(layer, j)] == j
        if k == p:
            in_last = bool(hit)
        if hit and found is None:
            path = [j]
            x = j
            for t in range(k, 0, -1):
                uniq, par = parents[t - 1]
                x = int(par[np.searchsorted(uniq, x)])
                path.append(x)
            steps = []
            for s in range(1, k + 1):
                a, b = path[s - 1], path[s]
                m = mats[s - 1]
                row = m.indices[m.indptr[b]:m.indptr[b + 1]]
                real = a in set(row.tolist()) if row.size < 64 else bool(
                    np.searchsorted(row, a) < row.size and row[np.searchsorted(row, a)] == a)
                steps.append(names[s - 1] if real else "residual")
            found = (tuple(path), tuple(steps), k)
    if found is None:
        how = f"{mode}{', residual' if residual else ', no residual'}"
        return Explanation(
            i, j, None, (), None, False,
            f"no path of at most {p + 1} positions joins input {j} to output {i} ({how}): "
            f"({i}, {j}) is in none of " + (f"R_1 .. R_{p}" if p > 1 else "R_1"),
        )
    path, steps, k = found
    return Explanation(i, j, path, steps, k, in_last, f"hop distance {k}")

