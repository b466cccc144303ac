"""Exact verification of the Sparse Transformer's two factorization criteria.

For a pattern of p heads the paper (Child et al. 2019, section 4.1) asks that
(1) every input ``j <= i`` be connected to every output ``i`` across the p
steps of attention, and (2) through a path of at most ``p + 1`` positions.
Let ``M_m`` be the connectivity of step m (head m in ``interleaved`` mode, the
union of the heads in ``merged`` and ``multihead`` mode, plus the identity when
``residual``) and ``R_k = M_k ... M_1`` (boolean products; rows are outputs).
Criterion 1 holds when every target pair is in ``R_p``; criterion 2 when every
target pair has a hop distance, the least ``k <= p`` with the pair in ``R_k``.
:func:`verify` checks every pair exactly (no sampling, no n x n array) with the
numba kernels of :mod:`._numba`; :func:`explain` gives a shortest path or the
reason none exists; :func:`hop_matrix` gives every pair's hop distance for
small n. The report types live in :mod:`.report`, the block-level check in
:mod:`.blocks`. A generated strided, local, dilated or fixed pattern is
decided instead by the exact structured check of :mod:`.structured` (offset
sets or the period, no token CSR), which is what makes n = 2^20 cheap; the
report's ``method`` says which one decided it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numba
import numpy as np

from ..pattern import MODES, BlockLayout, Pattern
from ..util.checks import check_bool, check_choice
from . import _numba as K
from ._common import (
    as_pattern,
    check_common,
    counts,
    nthreads,
    runs,
    stack,
    steps,
    union_of,
)
from ._paths import (
    EXPLAIN_LIMIT,
    METHODS,
    _check_progress,
    _hop_counts,
    explain,
)
from .blocks import verify_blocks
from .budget import budgets
from .report import Explanation, VerifyReport
from .schedule import ScheduleReport, verify_as_schedule
from .structured import offsets_of, structured_hops

__all__ = [
    "MODES", "METHODS", "VerifyReport", "Explanation", "verify", "explain", "hop_matrix",
    "HOP_MATRIX_LIMIT", "EXPLAIN_LIMIT",
]


#: Largest n for which :func:`hop_matrix` builds its dense (n, n) answer.
HOP_MATRIX_LIMIT = 4096
#: Work (word operations, roughly) above which ``depth="auto"`` skips the depth search.
DEPTH_BUDGET = 2e9


def _transposed_parts(pat: Pattern, heads: Sequence[int]):
    out = []
    for h in heads:
        t = pat.heads[h].T.tocsr()
        t.sort_indices()
        out.append(runs(t))
    return out


def _depth(pat: Pattern, p: int, mode: str, residual: bool, parts, want: bool | None):
    """Steps to full connectivity (periodic heads) or None; and whether it was computed."""
    n = pat.n
    if mode == "interleaved":
        used = list(range(p))
        P = p
    else:
        used = list(range(pat.num_heads))
        P = 1
    nruns = sum(int(parts[h][0][-1]) for h in used)
    nnz = sum(int(pat.heads[h].nnz) for h in used)
    work = float(n) * (P * n / 8.0 + nruns + nnz / 64.0)
    if want is False or (want is None and work > DEPTH_BUDGET):
        return None, False
    tparts = _transposed_parts(pat, used)
    if mode == "interleaved":
        stk = stack(tparts)
        base = np.arange(P, dtype=np.int64) * n
    else:
        stk = stack([union_of(tparts, n)])
        base = np.zeros(1, dtype=np.int64)
    with numba.parallel_chunksize(1):
        per = K.pick("depth_kernel", n)(n, P, base, stk[0], stk[1], stk[2], residual, pat.causal,
                                        nthreads())
    if (per < 0).any():
        return None, True
    return int(per.max()), True


def _structured(pat: Pattern, p: int, mode: str, residual: bool, depth: bool | None,
                cheap_only: bool) -> VerifyReport | None:
    """The structured check of a generated pattern of a covered family, else None.

    With ``cheap_only`` a bidirectional offset pattern whose band of boundary
    columns covers the sequence (``2 (p - 1) max|d| >= n``: strided, whose
    stride head reaches across it) goes to the generic check instead.
    """
    if pat.rule is None:
        return None
    if cheap_only and not pat.causal:
        try:
            offs = offsets_of(pat)
        except ValueError:
            offs = None
        if offs is not None:
            used = offs[:p] if mode == "interleaved" else offs
            reach = max((int(np.abs(d[np.abs(d) < pat.n]).max(initial=0)) for d in used), default=0)
            if 2 * (p - 1) * reach >= pat.n:
                return None
    return structured_hops(pat, p=p, mode=mode, residual=residual, depth=depth)


# ----------------------------------------------------------------------- verify
def verify(
    pattern: Pattern | BlockLayout | Sequence[Any],
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    progress: Callable[[int, int], None] | None = None,
    depth: bool | None = None,
    explain_failure: bool = False,
    method: str = "auto",
) -> VerifyReport | ScheduleReport:
    """Check the two factorization criteria exactly, for every target pair.

    Parameters
    ----------
    pattern : Pattern, BlockLayout, sequence of (n, n) matrices or bool array (H, n, n)
        The heads ``A^(1) .. A^(H)``. A :class:`BlockLayout` is checked at block
        granularity (see Notes). Plain matrices make a causal pattern when no
        entry lies above the diagonal.
        A pattern of packed documents (``params["documents"]``) is checked
        inside each document (targets are the pairs of one document; see
        :mod:`sparse_patterns.analysis.packed`).
        A list of Patterns is a schedule of layers: see
        :func:`~sparse_patterns.analysis.schedule.verify_schedule` (returns a
        ``ScheduleReport``).
    p : int, optional
        Number of attention steps; defaults to the number of heads. In
        ``interleaved`` mode step m uses head m, so ``p`` is at most the number
        of heads.
    mode : {"interleaved", "merged", "multihead"}
        ``interleaved``: step m uses head m; ``merged`` and ``multihead``: every
        step uses the union of the heads.
    residual : bool
        Add the identity to every step (a residual stream keeps what a
        position had).
    progress : callable, optional
        Called as ``progress(done, total)`` after every batch of output rows
        (rows are checked in 8 equal-work batches from n = 8192 when a callback
        is given, else in one). None (or False) reports nothing. The
        ``patterns verify`` command passes a rich progress bar.
    depth : bool, optional
        Search the number of steps full connectivity needs when a criterion
        fails (heads repeat with period p in interleaved mode). None searches
        when it is cheap enough; False never, True always.
    explain_failure : bool
        At token level, attach to the report the :func:`explain` of its
        counter-example (``report.explanation``), if it has one and the
        pattern holds its token CSR or ``n <= EXPLAIN_LIMIT`` (explaining
        builds the CSR); else the explanation stays None.
    method : {"auto", "generic", "structured"}
        ``structured``: decide it exactly from the heads' structure (see
        :mod:`sparse_patterns.analysis.structured`) without the token CSR;
        applies to generated (``pattern.rule`` set) strided, local, dilated and
        fixed patterns. ``generic``: check every row of the token CSR.
        ``auto``: structured where it applies and is cheap (not bidirectional
        offset heads reaching across the sequence), else generic. The report's
        ``method`` says which decided it; both give the same report.

    Returns
    -------
    VerifyReport

    Raises
    ------
    ValueError
        An empty pattern, ``p < 1``, ``p`` above the number of heads in
        interleaved mode, an unknown mode, heads of different n, an unknown
        method, ``method="structured"`` for a pattern it does not cover.

    See Also
    --------
    explain : a shortest path for one pair, or why none exists.
    hop_matrix : every pair's hop distance (small n).

    Notes
    -----
    Rows are outputs: ``R_1 = M_1`` and ``R_k(i) = U_{a in M_k(i)} R_{k-1}(a)``.
    Each output row is a bitset built by a backward layered BFS (one
    deduplicated layer per step), ORing runs of consecutive columns word by
    word; memory is O(threads * p * n) bits, never n x n.

    At block level (a :class:`BlockLayout`) a set block connects its block
    pairs; the criteria are checked on block pairs, ``certified`` tells
    whether they also hold through full blocks alone (then every token pair is
    proven connected) and ``partial_pairs`` counts the block pairs that rely on
    a partial block.

    References
    ----------
    R. Child, S. Gray, A. Radford, I. Sutskever, "Generating Long Sequences
    with Sparse Transformers", arXiv:1904.10509, 2019, section 4.1.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> r = verify(make("strided", 16, stride=4))
    >>> r.ok, r.hops, r.unreachable
    (True, {1: 70, 2: 66}, 0)
    >>> r = verify(make("local", 16, window=3), p=2, mode="merged")
    >>> r.ok, r.counterexample, r.depth, r.method
    (False, (7, 0), 5, 'structured-offsets')
    >>> verify(make("local", 16, window=3), p=2, mode="merged", method="generic").counterexample
    (7, 0)
    """
    if isinstance(pattern, (list, tuple)) and any(isinstance(x, Pattern) for x in pattern):
        return verify_as_schedule(pattern, p=p, mode=mode, residual=residual, progress=progress,
                                  depth=depth, explain_failure=explain_failure, method=method)
    method = check_choice("method", method, METHODS)
    if isinstance(pattern, BlockLayout):
        return verify_blocks(pattern, p=p, mode=mode, residual=residual)
    if isinstance(pattern, Pattern) and "documents" in pattern.params:
        from .packed import verify_documents  # noqa: PLC0415 - packed documents, one by one

        return verify_documents(pattern, verify, p=p, mode=mode, residual=residual,
                                progress=progress, depth=depth,
                                explain_failure=explain_failure, method=method)
    t0 = time.perf_counter()
    pat = as_pattern(pattern)
    p, mode, residual = check_common(p, mode, residual, pat.num_heads)
    if depth is not None:
        depth = check_bool("depth", depth)
    explain_failure = check_bool("explain_failure", explain_failure)
    progress = _check_progress(progress)
    res = None if method == "generic" else _structured(pat, p, mode, residual, depth,
                                                        cheap_only=method == "auto")
    if res is None and method == "structured":
        raise ValueError(
            f"method: 'structured' applies to generated strided, local, dilated and fixed "
            f"patterns, got {pat.name!r}{'' if pat.rule is not None else ' built from CSR'}; "
            "use method='generic' or 'auto'"
        )
    if res is not None:
        report = _structured_report(pat, res, t0)
        if progress is not None:
            progress(1, 1)
    else:
        report = _generic_report(pat, p, mode, residual, progress, depth, t0)
    if explain_failure and report.counterexample is not None and (
        pat.materialized or pat.n <= EXPLAIN_LIMIT
    ):
        i, j = report.counterexample
        report = replace(report, explanation=explain(pat, i, j, p=p, mode=mode, residual=residual))
    return report


def _structured_report(pat: Pattern, res: VerifyReport, t0: float) -> VerifyReport:
    """The report of a structured check, with the budgets from the row counts (no CSR)."""
    bud = tuple(budgets(pat, res.p))
    if all(b.nnz == 0 for b in bud[:-1]):
        raise ValueError("pattern: every head is empty (nnz = 0); nothing to verify")
    return replace(res, budgets=bud, name=pat.name, params=dict(pat.params),
                   seconds=time.perf_counter() - t0)


def _generic_report(pat: Pattern, p: int, mode: str, residual: bool, progress, depth,
                    t0: float) -> VerifyReport:
    """The generic check of every row of the token CSR."""
    heads = pat.heads
    if sum(int(h.nnz) for h in heads) == 0:
        raise ValueError("pattern: every head is empty (nnz = 0); nothing to verify")
    n = pat.n
    rows, parts, uni = counts(pat, want_union=mode != "interleaved")
    st = steps(parts if mode == "interleaved" else [uni], p, mode, n)
    hops, miss1, miss2, bad1, bad2 = _hop_counts(st, p, residual, pat.causal, progress)
    return VerifyReport.from_counts(
        hops, miss1, miss2, bad1, bad2, p=p, n=n, causal=pat.causal, started=t0,
        search_depth=lambda: _depth(pat, p, mode, residual, parts, depth),
        mode=mode, residual=residual, budgets=tuple(budgets(pat, p, counts=rows)),
        name=pat.name, params=dict(pat.params), method="generic",
    )


def hop_matrix(
    pattern: Pattern | Sequence[Any],
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
) -> np.ndarray:
    """Hop distance of every pair, as a dense ``int32 (n, n)`` array (small n only).

    Parameters
    ----------
    pattern : Pattern or sequence of (n, n) matrices
    p, mode, residual
        As in :func:`verify`.

    Returns
    -------
    numpy.ndarray
        ``int32 (n, n)``: 0 for pairs that are not targets (``j > i`` in a
        causal pattern), ``k >= 1`` the hop distance, -1 for a target pair not
        connected within p steps.

    Raises
    ------
    ValueError
        ``n > 4096`` (use :func:`verify`), or as :func:`verify`.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> hop_matrix(make("strided", 6, stride=2))
    array([[1, 0, 0, 0, 0, 0],
           [1, 1, 0, 0, 0, 0],
           [1, 1, 1, 0, 0, 0],
           [2, 1, 1, 1, 0, 0],
           [2, 2, 1, 1, 1, 0],
           [2, 2, 2, 1, 1, 1]], dtype=int32)
    """
    pat = as_pattern(pattern)
    if pat.n > HOP_MATRIX_LIMIT:
        raise ValueError(
            f"n: hop_matrix builds a dense (n, n) array for n <= {HOP_MATRIX_LIMIT}, got "
            f"n={pat.n}; use verify() for larger n"
        )
    p, mode, residual = check_common(p, mode, residual, pat.num_heads)
    n = pat.n
    parts = [runs(h) for h in pat.heads]
    st = steps(parts if mode == "interleaved" else [union_of(parts, n)], p, mode, n)
    mat = np.zeros((n, n), np.int32)
    _hop_counts(st, p, residual, pat.causal, None, mat=mat)
    return mat
