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
numba kernels of :mod:`._kernels`; :func:`explain` gives a shortest path or the
reason none exists; :func:`hop_matrix` gives every pair's hop distance for
small n.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp

from .._validate import check_bool, check_choice, check_int
from ..pattern import BlockLayout, Pattern
from . import _kernels as K
from .budget import HeadBudget, block_budgets, budgets

__all__ = [
    "MODES", "VerifyReport", "Explanation", "verify", "explain", "hop_matrix", "HOP_MATRIX_LIMIT",
]

#: How heads combine across steps.
MODES = ("interleaved", "merged", "multihead")
#: Largest n for which :func:`hop_matrix` builds its dense (n, n) answer.
HOP_MATRIX_LIMIT = 4096
#: Work (word operations, roughly) above which ``depth="auto"`` skips the depth search.
DEPTH_BUDGET = 2e9
#: Largest number of blocks per side for block-level verification.
MAX_BLOCKS = 32768


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes
    ----------
    ok : bool
        Both criteria hold.
    criterion1 : bool
        Every target pair is in ``R_p`` (connected across the p steps).
    criterion2 : bool
        Every target pair has a hop distance ``<= p`` (a path of at most p + 1
        positions). With the residual the two coincide.
    hops : dict of int to int
        ``k -> number of target pairs whose hop distance is k``, for k = 1..p.
    unreachable : int
        Target pairs with no hop distance (criterion 2 failures).
    not_in_last : int
        Target pairs outside ``R_p`` (criterion 1 failures).
    counterexample : tuple of int, or None
        A pair ``(i, j)`` breaking criterion 2 if it fails, else one breaking
        criterion 1, else None (the smallest i, then the smallest j).
    counterexample1, counterexample2 : tuple of int, or None
        The smallest pair breaking criterion 1, respectively criterion 2.
    p, mode, residual : int, str, bool
        What was checked.
    n : int
        Sequence length (tokens).
    causal : bool
        Targets are ``j <= i`` (causal) or every pair.
    targets : int
        Number of target pairs (block pairs at block level).
    budgets : tuple of HeadBudget
        ``|A_i|`` figures per head and for the union (see :func:`budgets`).
    depth : int or None
        Steps full connectivity needs (heads repeating with period p in
        interleaved mode), or None when it never connects or was not computed
        (see ``depth_checked``).
    depth_checked : bool
        Whether ``depth`` is known.
    level : {"token", "block"}
        Granularity; at block level pairs, hops and counter-examples are block pairs.
    block : int or None
        Block size at block level.
    certified : bool or None
        Block level: the criteria hold through full blocks alone, which proves
        them for every token pair.
    partial_pairs : int
        Block level: target block pairs connected only through partial blocks.
    seconds : float
        Wall time of the check.
    """

    ok: bool
    criterion1: bool
    criterion2: bool
    hops: dict[int, int]
    unreachable: int
    not_in_last: int
    counterexample: tuple[int, int] | None
    counterexample1: tuple[int, int] | None
    counterexample2: tuple[int, int] | None
    p: int
    mode: str
    residual: bool
    n: int
    causal: bool
    targets: int
    budgets: tuple[HeadBudget, ...]
    depth: int | None
    depth_checked: bool
    name: str = "custom"
    params: dict[str, Any] = field(default_factory=dict)
    level: str = "token"
    block: int | None = None
    certified: bool | None = None
    partial_pairs: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (hop keys become strings in JSON)."""
        d = asdict(self)
        d["budgets"] = [b.to_dict() for b in self.budgets]
        d["hops"] = {int(k): int(v) for k, v in self.hops.items()}
        for key in ("counterexample", "counterexample1", "counterexample2"):
            d[key] = list(d[key]) if d[key] is not None else None
        d["params"] = {k: v for k, v in self.params.items()}
        return d

    def summary(self) -> str:
        """One line: pass/fail and the failing pair."""
        what = "blocks" if self.level == "block" else "pairs"
        head = (
            f"{self.name} n={self.n} p={self.p} {self.mode}"
            f"{'' if self.residual else ' no-residual'}: "
        )
        if self.ok:
            return head + f"both criteria hold for all {self.targets:,} target {what}"
        bad = []
        if not self.criterion1:
            bad.append(f"criterion 1 fails for {self.not_in_last:,} {what}")
        if not self.criterion2:
            bad.append(f"criterion 2 fails for {self.unreachable:,} {what}")
        return head + "; ".join(bad) + f"; e.g. (i, j) = {self.counterexample}"


@dataclass(frozen=True)
class Explanation:
    """A shortest path from input ``j`` to output ``i``, or why none exists.

    ``path`` lists the positions ``(j, a, ..., i)``, one per step boundary: the
    pair is in ``R_k`` with ``k = len(path) - 1 = hops``, step m going from
    ``path[m - 1]`` to ``path[m]`` through ``steps[m - 1]`` (a head name, or
    ``"residual"`` for the identity). ``in_last`` says whether the pair is in
    ``R_p`` (criterion 1).
    """

    i: int
    j: int
    path: tuple[int, ...] | None
    steps: tuple[str, ...]
    hops: int | None
    in_last: bool
    reason: str

    def __str__(self) -> str:
        if self.path is None:
            return self.reason
        out = str(self.path[0])
        for a, s in zip(self.path[1:], self.steps, strict=True):
            out += f" -[{s}]-> {a}"
        return out


# ----------------------------------------------------------------------- input
def _as_pattern(pattern: Any) -> Pattern:
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


def _check_p(p: Any, heads: int, mode: str) -> int:
    if p is None:
        return heads
    if mode == "interleaved":
        return check_int("p", p, 1, heads)
    return check_int("p", p, 1)


def _check_common(p, mode, residual, heads):
    mode = check_choice("mode", mode, MODES)
    residual = check_bool("residual", residual)
    p = _check_p(p, heads, mode)
    return p, mode, residual


# ------------------------------------------------------------------ structures
def _runs(m: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = m.shape[0]
    with numba.parallel_chunksize(max(1, n // 256)):
        cnt = K.pick("count_runs", n)(m.indptr, m.indices, n)
        ptr = np.zeros(n + 1, np.int64)
        np.cumsum(cnt, out=ptr[1:])
        rst = np.empty(int(ptr[-1]), np.int64)
        rln = np.empty(int(ptr[-1]), np.int64)
        K.pick("fill_runs", n)(m.indptr, m.indices, n, ptr, rst, rln)
    return ptr, rst, rln


def _stack(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    ptrs, offs = [], 0
    for ptr, _, _ in parts:
        ptrs.append(ptr[:-1] + offs)
        offs += int(ptr[-1])
    rptr = np.concatenate([*ptrs, np.array([offs], np.int64)])
    rst = np.concatenate([x[1] for x in parts]) if parts else np.empty(0, np.int64)
    rln = np.concatenate([x[2] for x in parts]) if parts else np.empty(0, np.int64)
    return rptr, rst, rln


def _union_of(parts, n):
    if len(parts) == 1:
        return parts[0]
    rptr, rst, rln = _stack(parts)
    return K.pick("union_runs", n)(rptr, rst, rln, n, len(parts))


def _row_sizes(ptr: np.ndarray, rln: np.ndarray) -> np.ndarray:
    csum = np.zeros(rln.size + 1, np.int64)
    np.cumsum(rln, out=csum[1:])
    return csum[ptr[1:]] - csum[ptr[:-1]]


def _counts(pat: Pattern, want_union: bool = True):
    """Row counts ``(heads + 1, n)`` (the union's from runs, no CSR union), head runs, union runs.

    The union's runs are built only when ``want_union`` (else None).
    """
    n = pat.n
    heads = pat.heads
    parts = [_runs(h) for h in heads]
    counts = np.empty((len(heads) + 1, n), dtype=np.int64)
    for k, h in enumerate(heads):
        counts[k] = np.diff(h.indptr)
    uni = None
    if want_union or len(parts) == 1:
        uni = _union_of(parts, n)
        counts[-1] = _row_sizes(uni[0], uni[2])
    else:
        rptr, rst, rln = _stack(parts)
        counts[-1] = K.pick("union_sizes", n)(rptr, rst, rln, n, len(parts))
    return counts, parts, uni


@dataclass
class _Steps:
    """Stacked run structures and which one each step uses."""

    n: int
    rptr: np.ndarray
    rst: np.ndarray
    rln: np.ndarray
    lptr: np.ndarray
    lst: np.ndarray
    lln: np.ndarray
    step_base: np.ndarray  # int64 (p,): structure index * n of every step


def _steps(parts, p: int, mode: str, n: int) -> _Steps:
    if mode == "interleaved":
        used = parts[:p]
        base = np.arange(p, dtype=np.int64) * n
    else:
        used = [_union_of(parts, n)]
        base = np.zeros(p, dtype=np.int64)
    rptr, rst, rln = _stack(used)
    lptr, lst, lln = K.long_index(rptr, rst, rln, len(used) * n)
    return _Steps(n, rptr, rst, rln, lptr, lst, lln, base)


def _nthreads() -> int:
    return int(numba.config.NUMBA_NUM_THREADS)


def _chunk(n: int) -> int:
    return int(min(256, max(16, n // 512)))


class _Bar:
    """A rich progress bar (units: equal-work batches) shown after ``delay`` seconds on a terminal."""

    def __init__(self, total: int, progress: bool | None, label: str, delay: float = 1.0):
        self.total = total
        self.allowed = self.may_show(progress)
        self.delay = 0.0 if progress is True else delay
        self.start = time.perf_counter()
        self.bar = None
        self.task = None
        self.label = label

    @staticmethod
    def may_show(progress: bool | None) -> bool:
        return progress is True or (progress is None and sys.stdout.isatty())

    def update(self, done: int) -> None:
        if not self.allowed or done >= self.total:
            if self.bar is not None:
                self.bar.update(self.task, completed=done)
            return
        if self.bar is None and time.perf_counter() - self.start >= self.delay:
            from rich.progress import Progress  # noqa: PLC0415

            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _hop_counts(st: _Steps, p: int, residual: bool, causal: bool, progress, mat=None):
    n = st.n
    want = mat is not None
    out_mat = mat if want else np.zeros((1, 1), np.int32)
    # every parallel call costs a thread wake-up, so split the rows only when a bar may show
    nb = 8 if (_Bar.may_show(progress) and n >= 8192 and not want) else 1
    bar = _Bar(nb, progress, "verifying")
    # causal rows cost about i: equal-work batches have edges at n * sqrt(b / nb)
    edges = (n * np.sqrt(np.arange(nb + 1) / nb)).round().astype(np.int64)
    hops = np.zeros(p + 1, np.int64)
    miss1 = miss2 = 0
    bad1 = bad2 = None
    try:
        with numba.parallel_chunksize(1):
            for b in range(nb):
                lo, hi = int(edges[b]), int(edges[b + 1])
                if hi <= lo:
                    continue
                h, m1, m2, bad = K.pick("hop_kernel", n)(
                    n, p, st.step_base, st.rptr, st.rst, st.rln, st.lptr, st.lst, st.lln, residual,
                    causal, lo, hi, _chunk(n), _nthreads(), want, out_mat,
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
                bar.update(b + 1)
    finally:
        bar.close()
    return hops, miss1, miss2, bad1, bad2


def _transposed_parts(pat: Pattern, heads: Sequence[int]):
    out = []
    for h in heads:
        t = pat.heads[h].T.tocsr()
        t.sort_indices()
        out.append(_runs(t))
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
    runs = sum(int(parts[h][0][-1]) for h in used)
    nnz = sum(int(pat.heads[h].nnz) for h in used)
    work = float(n) * (P * n / 8.0 + runs + nnz / 64.0)
    if want is False or (want is None and work > DEPTH_BUDGET):
        return None, False
    tparts = _transposed_parts(pat, used)
    if mode == "interleaved":
        stack = _stack(tparts)
        base = np.arange(P, dtype=np.int64) * n
    else:
        stack = _stack([_union_of(tparts, n)])
        base = np.zeros(1, dtype=np.int64)
    with numba.parallel_chunksize(1):
        per = K.pick("depth_kernel", n)(n, P, base, stack[0], stack[1], stack[2], residual, pat.causal,
                             _nthreads())
    if (per < 0).any():
        return None, True
    return int(per.max()), True


# ----------------------------------------------------------------------- verify
def verify(
    pattern: Pattern | BlockLayout | Sequence[Any],
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    progress: bool | None = None,
    depth: bool | None = None,
) -> VerifyReport:
    """Check the two factorization criteria exactly, for every target pair.

    Parameters
    ----------
    pattern : Pattern, BlockLayout, sequence of (n, n) matrices or bool array (H, n, n)
        The heads ``A^(1) .. A^(H)``. A :class:`BlockLayout` is checked at block
        granularity (see Notes). Plain matrices make a causal pattern when no
        entry lies above the diagonal.
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
    progress : bool, optional
        Show a rich progress bar: None shows one on runs longer than a second
        when stdout is a terminal.
    depth : bool, optional
        Search the number of steps full connectivity needs when a criterion
        fails (heads repeat with period p in interleaved mode). None searches
        when it is cheap enough; False never, True always.

    Returns
    -------
    VerifyReport

    Raises
    ------
    ValueError
        An empty pattern, ``p < 1``, ``p`` above the number of heads in
        interleaved mode, an unknown mode, heads of different n.

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
    >>> r.ok, r.counterexample, r.depth
    (False, (7, 0), 5)
    """
    if isinstance(pattern, BlockLayout):
        return _verify_blocks(pattern, p=p, mode=mode, residual=residual)
    t0 = time.perf_counter()
    pat = _as_pattern(pattern)
    p, mode, residual = _check_common(p, mode, residual, pat.num_heads)
    if depth is not None:
        depth = check_bool("depth", depth)
    heads = pat.heads
    if sum(int(h.nnz) for h in heads) == 0:
        raise ValueError("pattern: every head is empty (nnz = 0); nothing to verify")
    n = pat.n
    counts, parts, uni = _counts(pat, want_union=mode != "interleaved")
    st = _steps(parts if mode == "interleaved" else [uni], p, mode, n)
    hops, miss1, miss2, bad1, bad2 = _hop_counts(st, p, residual, pat.causal, progress)
    c1 = miss1 == 0
    c2 = miss2 == 0
    targets = n * (n + 1) // 2 if pat.causal else n * n
    if c2:
        ks = [k for k in range(1, p + 1) if hops[k] > 0]
        dep, checked = (max(ks) if ks else None), True
    else:
        dep, checked = _depth(pat, p, mode, residual, parts, depth)
    return VerifyReport(
        ok=c1 and c2,
        criterion1=c1,
        criterion2=c2,
        hops={k: int(hops[k]) for k in range(1, p + 1)},
        unreachable=int(miss2),
        not_in_last=int(miss1),
        counterexample=bad2 if bad2 is not None else bad1,
        counterexample1=bad1,
        counterexample2=bad2,
        p=p,
        mode=mode,
        residual=residual,
        n=n,
        causal=pat.causal,
        targets=targets,
        budgets=tuple(budgets(pat, p, counts=counts)),
        depth=dep,
        depth_checked=checked,
        name=pat.name,
        params=dict(pat.params),
        seconds=time.perf_counter() - t0,
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
    pat = _as_pattern(pattern)
    if pat.n > HOP_MATRIX_LIMIT:
        raise ValueError(
            f"n: hop_matrix builds a dense (n, n) array for n <= {HOP_MATRIX_LIMIT}, got "
            f"n={pat.n}; use verify() for larger n"
        )
    p, mode, residual = _check_common(p, mode, residual, pat.num_heads)
    n = pat.n
    parts = [_runs(h) for h in pat.heads]
    st = _steps(parts if mode == "interleaved" else [_union_of(parts, n)], p, mode, n)
    mat = np.zeros((n, n), np.int32)
    _hop_counts(st, p, residual, pat.causal, False, mat=mat)
    return mat


# ---------------------------------------------------------------------- explain
def _step_mats(pat: Pattern, p: int, mode: str) -> tuple[list[sp.csr_matrix], list[str]]:
    if mode == "interleaved":
        return list(pat.heads[:p]), list(pat.head_names[:p])
    return [pat.union()] * p, ["union"] * p


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
    pat = _as_pattern(pattern)
    p, mode, residual = _check_common(p, mode, residual, pat.num_heads)
    n = pat.n
    i = check_int("i", i, 0, n - 1)
    j = check_int("j", j, 0, n - 1)
    if pat.causal and j > i:
        return Explanation(i, j, None, (), None, False,
                           f"({i}, {j}) is not a target pair: j > i in a causal pattern")
    mats, names = _step_mats(pat, p, mode)
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


# ------------------------------------------------------------------- block level
def _block_csr(lay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return K.pick("bool_csr", lay.shape[0])(np.ascontiguousarray(lay))


def _block_reach(mats, p, residual, causal, singles):
    """Hop counts over block pairs; returns (hops, have_last, E, first misses)."""
    nb = mats[0][0].size - 1
    W = (nb + 63) >> 6
    prev = np.zeros((nb, W), np.uint64)
    cur = np.zeros((nb, W), np.uint64)
    E = np.zeros((nb, W), np.uint64)
    hops = np.zeros(p + 1, np.int64)
    have = miss = None
    for k in range(1, p + 1):
        bptr, bidx = mats[k - 1]
        K.pick("block_step", nb)(nb, bptr, bidx, prev, k == 1 or residual, residual, cur)
        if k == 1 and residual and singles.size:
            cur[singles, singles >> 6] |= np.left_shift(np.uint64(1), (singles & 63).astype(np.uint64))
        new, have, miss = K.pick("block_count", nb)(nb, cur, E, causal, True)
        hops[k] = new.sum()
        prev, cur = cur, prev
    return hops, have, miss, E


def _verify_blocks(bl: BlockLayout, *, p, mode, residual) -> VerifyReport:
    t0 = time.perf_counter()
    p, mode, residual = _check_common(p, mode, residual, bl.num_heads)
    nb = bl.nb
    if nb > MAX_BLOCKS:
        raise ValueError(f"block: the layout has nb={nb} blocks per side; block-level "
                         f"verification handles nb <= {MAX_BLOCKS} (use a larger block)")
    if not bl.layout.any():
        raise ValueError("pattern: every head of the block layout is empty; nothing to verify")
    any_set = bl.layout.any(axis=0)
    rows = np.flatnonzero(any_set.any(axis=1))
    # causal when no block lies above the diagonal: the last set block of every row is <= the row
    last = any_set.shape[1] - 1 - np.argmax(any_set[rows, ::-1], axis=1)
    causal = bool((last <= rows).all())
    if mode == "interleaved":
        sets = [bl.layout[h] for h in range(p)]
        fulls = [bl.full[h] for h in range(p)]
    else:
        sets = [any_set] * p
        fulls = [bl.full.any(axis=0)] * p
    sizes = np.full(nb, bl.block, np.int64)
    sizes[-1] = bl.n - bl.block * (nb - 1)
    singles = np.flatnonzero(sizes == 1).astype(np.int64)
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def csr(k, a):
        if k not in cache:
            cache[k] = _block_csr(a)
        return cache[k]

    if mode == "interleaved":
        set_mats = [csr(("set", h), sets[h]) for h in range(p)]
        full_mats = [csr(("full", h), fulls[h]) for h in range(p)]
    else:
        set_mats = [csr("set", sets[0])] * p
        full_mats = [csr("full", fulls[0])] * p
    hops, have, miss, E = _block_reach(set_mats, p, residual, causal, singles)
    fh, fhave, _, fE = _block_reach(full_mats, p, residual, causal, singles)
    T = np.arange(1, nb + 1, dtype=np.int64) if causal else np.full(nb, nb, np.int64)
    targets = int(T.sum())
    miss1 = int((T - have).sum())
    miss2 = targets - int(hops.sum())
    bad1 = bad2 = None
    rows = np.flatnonzero(have < T)
    if rows.size:
        bad1 = (int(rows[0]), int(miss[rows[0]]))
    if miss2:
        _, ehave, emiss = K.pick("block_count", nb)(nb, E, np.zeros_like(E), causal, False)
        rows = np.flatnonzero(ehave < T)
        bad2 = (int(rows[0]), int(emiss[rows[0]]))
    fmiss1 = int((T - fhave).sum())
    fmiss2 = targets - int(fh.sum())
    c1, c2 = miss1 == 0, miss2 == 0
    certified = c1 and c2 and fmiss1 == 0 and fmiss2 == 0
    ks = [k for k in range(1, p + 1) if hops[k] > 0]
    return VerifyReport(
        ok=c1 and c2,
        criterion1=c1,
        criterion2=c2,
        hops={k: int(hops[k]) for k in range(1, p + 1)},
        unreachable=miss2,
        not_in_last=miss1,
        counterexample=bad2 if bad2 is not None else bad1,
        counterexample1=bad1,
        counterexample2=bad2,
        p=p,
        mode=mode,
        residual=residual,
        n=bl.n,
        causal=causal,
        targets=targets,
        budgets=tuple(block_budgets(bl, p)),
        depth=(max(ks) if ks else None) if c2 else None,
        depth_checked=bool(c2),
        name="blocks",
        params={"block": bl.block, "nb": nb},
        level="block",
        block=bl.block,
        certified=certified,
        partial_pairs=fmiss2 - miss2,
        seconds=time.perf_counter() - t0,
    )
