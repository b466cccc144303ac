"""Exact verification of structured heads from their rule, without the token CSR.

The generic check (:func:`sparse_patterns.analysis.verify`) walks the token
CSR, which grows like n^1.5. Two kinds of heads have a structure that decides
the paper's criteria (Child et al. 2019, arXiv:1904.10509, section 4.1)
exactly, pair by pair, from a few bitsets of length about n.

**Offset heads** (strided's two heads, local, dilated): head m is
``A_i = {i - d : d in D_m} ∩ [0, n)``. A path ``j = a_0, a_1, .., a_k = i`` has
``a_{t-1} in M_t(a_t)``, i.e. ``a_t - a_{t-1} in D'_t`` (``D'_t`` = the offsets of
step t, ``∪ {0}`` with the residual), and all ``a_t in [0, n)``.

* Causal (``D >= 0``): the path is non-decreasing, so every ``a_t`` lies in
  ``[j, i] ⊂ [0, n)`` and the range condition never binds. Hence
  ``(i, j) in R_k`` iff ``i - j in S_k = D'_1 + .. + D'_k`` (sumset, cut to
  ``[0, n)``; cutting is harmless since partial sums only grow): the hop
  distance depends on ``delta = i - j`` alone and ``delta`` occurs in
  ``n - delta`` pairs. So ``hops[k] = sum (n - delta)`` over the deltas first in
  ``S_k``, criterion 1 fails for ``delta not in S_p``, and the smallest failing
  pair is ``(min failing delta, 0)``. The same argument holds for any number of
  steps, so the depth (heads repeating with period p) is a BFS over states
  ``(delta, step mod period)`` from ``(0, 0)``.
* Bidirectional: let ``B = (p - 1) max|d|``. For ``j in [B, n - 1 - B]`` every
  intermediate ``a_t`` (t <= p - 1) satisfies ``|a_t - j| <= B``, so it is in
  range and, as above, ``(i, j) in R_k`` (k <= p) iff ``i - j in S_k``, sumsets
  over deltas in ``[-(n-1), n-1]`` (every partial sum stays there). Columns
  outside that band are checked one by one with the same bitset steps cut to
  ``[0, n)`` (exact by definition), so this pays off when ``B`` is small
  (local, dilated; not strided, whose stride head has ``max|d| ~ n``). The
  depth needs every column (searched when cheap, see ``depth``).

**Fixed** (a block head ``A1`` of block length ``l`` and summary heads ``A2.h``,
positions with ``j mod l in [l - (h+1)c, l - hc)``): membership is invariant
when i and j move by a multiple of l (both in range).

* Causal: paths stay in ``[j, i]``, so ``(i, j)`` with ``j = bl + r`` behaves as
  ``(i - bl, r)``: one forward BFS from each source ``r in [0, min(l, n))`` over
  positions ``e >= r`` gives every hop, ``e`` standing for
  ``floor((n - 1 - e) / l) + 1`` pairs; the smallest failing pair is the
  smallest failing ``(e, r)`` (block 0).
* Bidirectional: from a source j every reached set is a union of ``{j}``, the
  block of j and ``[0, n)`` (A1 maps ``{j}`` or the block to the block and
  ``[0, n)`` to itself; a summary head maps a set meeting its positions to
  ``[0, n)``, else to nothing). So all sources ``bl + r`` in full blocks share
  the hop counts of ``r`` (own block <-> own block by the shift, outside <->
  outside, all alike), counted ``n // l`` times; sources in the last partial
  block are searched one by one. If the outside fails for ``r``, ``(0, l + r)``
  fails too (when there are two full blocks).

Without the residual the sets ``S_k`` are not nested: each is kept exactly, the
hop distance is the first k with the pair in ``S_k``, criterion 1 reads ``S_p``.
Every BFS step is a few shift-ORs of bitsets (an offset set is split into
arithmetic progressions, each added by doubling: ``O(log count)`` shifts; a
fixed head is one pass over the words), so causal strided (l = 1024) and fixed
(l = 1024, c = 32) at n = 2^20 take well under a second in under 300 MB. The
checks return a :class:`~sparse_patterns.analysis.VerifyReport` built by its
one constructor path (same target pairs, ``i == j`` included; no budgets).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..pattern import MODES, Pattern
from ..util.checks import check_bool, check_choice, check_int
from ._structured_numba import DEPTH, TALLY, offset_sets, run, runs_of
from .report import VerifyReport

__all__ = ["StructuredResult", "offset_hops", "fixed_hops", "offsets_of", "structured_hops"]

#: Work (word operations, roughly) above which ``depth=None`` skips a bidirectional depth search.
DEPTH_BUDGET = 2e9


#: What the structured checks return: a :class:`VerifyReport` (no budgets, name ``"custom"``).
StructuredResult = VerifyReport


def _progressions(sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stacked progressions of every set (each progression all >= 0 or all < 0) and their ptr."""
    parts = []
    for d in sets:
        parts.append(runs_of(np.ascontiguousarray(d[d >= 0])))
        parts.append(runs_of(np.ascontiguousarray(d[d < 0][::-1])))
    pptr = np.zeros(len(sets) + 1, np.int64)
    for k in range(len(sets)):
        pptr[k + 1] = pptr[k] + parts[2 * k].shape[0] + parts[2 * k + 1].shape[0]
    progs = np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)
    return np.ascontiguousarray(progs, dtype=np.int64), pptr


def _check_common(n, p, mode, residual, causal, heads):
    n = check_int("n", n, 1)
    mode = check_choice("mode", mode, MODES)
    residual = check_bool("residual", residual)
    causal = check_bool("causal", causal)
    p = heads if p is None else check_int("p", p, 1, heads if mode == "interleaved" else None)
    return n, p, mode, residual, causal


def _first_pair(cands: list[tuple[int, int]]) -> tuple[int, int] | None:
    return min(cands) if cands else None


def _result(n, p, mode, residual, causal, hist, miss1, miss2, ce1, ce2, depth_fn, method, t0):
    """The report of the counts; ``depth_fn()`` searches the depth when criterion 2 fails."""
    return VerifyReport.from_counts(
        np.asarray(hist, np.int64), miss1, miss2, ce1, ce2, p=p, n=n, causal=causal, started=t0,
        search_depth=depth_fn, mode=mode, residual=residual, budgets=(),
        method=f"structured-{method}",
    )


def _depth_of(per: np.ndarray) -> tuple[int | None, bool]:
    return (None if (per < 0).any() else int(per.max())), True


def _pack(bits: np.ndarray, nw: int) -> np.ndarray:
    out = np.zeros(nw * 8, np.uint8)
    packed = np.packbits(bits, bitorder="little")
    out[: packed.size] = packed
    return out.view("<u8").astype(np.uint64)


def _delta_hops(sets: np.ndarray, nbits: int, weight: np.ndarray):
    """Weighted hop histogram and the criterion 2 / criterion 1 failure masks of bitsets ``S_1 .. S_p``.

    ``weight[x]`` counts the pairs position x stands for.
    """
    p = sets.shape[0]
    hop = np.zeros(nbits, np.int8 if p < 127 else np.int64)
    hist = np.zeros(p + 1, np.int64)
    for k in range(p):
        row = np.unpackbits(sets[k].astype("<u8").view(np.uint8), bitorder="little")[:nbits]
        new = (hop == 0) & row.view(bool)
        hop[new] = k + 1
        hist[k + 1] = int(weight[new].sum())
    return hist, (hop == 0) & (weight > 0), (row == 0) & (weight > 0)


def _smallest(i: np.ndarray, j: np.ndarray) -> tuple[int, int] | None:
    if i.size == 0:
        return None
    t = np.lexsort((j, i))[0]
    return int(i[t]), int(j[t])


def _tally_pairs(sources, fail, col):
    """Smallest failing pair ``(first failing position, source)`` over the sources."""
    m = fail[:, col] >= 0
    return _smallest(fail[m, col], sources[m])


_NO_SEL = np.zeros((1, 1), np.bool_)
_NO_SUMM = np.zeros((0, 1), np.uint64)
_NO_PTR = np.zeros(2, np.int64)
_NO_PROGS = np.zeros((0, 3), np.int64)


# -------------------------------------------------------------------- offset heads
def offset_hops(
    n: int,
    offsets: Sequence[Any],
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    causal: bool = True,
    depth: bool | None = None,
) -> VerifyReport:
    """Exact criteria and hop histogram of translation-invariant heads, from their offsets.

    Head m is ``A_i = {i - d : d in offsets[m]} ∩ [0, n)`` (and ``j <= i``, i.e.
    offsets ``>= 0``, when causal). The pairs, hops and counter-examples are
    those of :func:`sparse_patterns.analysis.verify` on the same heads (see the
    module docstring for the proof).

    Parameters
    ----------
    n : int
        Sequence length, ``>= 1``.
    offsets : sequence of 1-D integer arrays
        ``D_m`` per head; offsets with ``|d| >= n`` are ignored.
    p, mode, residual
        As in :func:`sparse_patterns.analysis.verify`.
    causal : bool
        Targets ``j <= i`` and offsets ``>= 0``; False: every pair, offsets of both signs.
    depth : bool, optional
        When a criterion fails, search the steps full connectivity needs: always
        for causal heads (cheap); bidirectional: None searches when cheap enough,
        True always, False never.

    Returns
    -------
    VerifyReport
        ``method="structured-offsets"``, no ``budgets``.

    Raises
    ------
    ValueError
        No head, every head empty, a negative offset in a causal head, or as ``verify``.

    Examples
    --------
    >>> import numpy as np
    >>> r = offset_hops(16, [np.arange(5), np.arange(0, 16, 4)])  # strided(16, stride=4)
    >>> r.ok, r.hops, r.method
    (True, {1: 70, 2: 66}, 'structured-offsets')
    >>> r = offset_hops(16, [np.arange(4)], p=2, mode="merged")  # local(16, window=3)
    >>> r.ok, r.counterexample, r.depth
    (False, (7, 0), 5)
    """
    t0 = time.perf_counter()
    heads = list(offsets)
    if not heads:
        raise ValueError("offsets: needs at least one head, got an empty sequence")
    n, p, mode, residual, causal = _check_common(n, p, mode, residual, causal, len(heads))
    sets = []
    for k, d in enumerate(heads):
        a = np.asarray(d)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"offsets: heads[{k}] must be a 1-D integer array, got shape {a.shape} "
                             f"dtype {a.dtype}")
        a = np.unique(a.astype(np.int64))
        if causal and a.size and a[0] < 0:
            raise ValueError(f"offsets: heads[{k}] has offset {int(a[0])} < 0; causal heads need "
                             f"offsets >= 0 (pass causal=False)")
        sets.append(a[np.abs(a) < n])
    if all(s.size == 0 for s in sets):
        raise ValueError(f"offsets: every head is empty (no offset with |d| < n={n}); nothing to verify")
    used = sets[:p] if mode == "interleaved" else [np.unique(np.concatenate(sets))]
    if residual:
        used = [np.union1d(s, np.zeros(1, np.int64)) for s in used]
    progs, pptr = _progressions(used)
    P = len(used)
    if causal:
        return _offsets_causal(n, p, mode, residual, P, pptr, progs, depth, t0)
    return _offsets_bidirectional(n, p, mode, residual, used, P, pptr, progs, depth, t0)


def _offsets_causal(n, p, mode, residual, P, pptr, progs, depth, t0):
    """One delta BFS from 0: delta stands for ``n - delta`` pairs, the first failing pair is (delta, 0)."""
    w = n - np.arange(n, dtype=np.int64)
    hist, bad2, bad1 = _delta_hops(offset_sets(0, n, p, P, pptr, progs), n, w)
    f2 = np.flatnonzero(bad2)
    f1 = np.flatnonzero(bad1)

    def depth_fn():
        if depth is False:
            return None, False
        zero = np.zeros(1, np.int64)
        return _depth_of(run(DEPTH, n, 0, zero, zero, n, P, pptr, progs, _NO_SEL, 1, _NO_SUMM, True,
                              False))

    return _result(n, p, mode, residual, True, hist, int(w[f1].sum()), int(w[f2].sum()),
                   (int(f1[0]), 0) if f1.size else None, (int(f2[0]), 0) if f2.size else None,
                   depth_fn, "offsets", t0)


def _offsets_bidirectional(n, p, mode, residual, used, P, pptr, progs, depth, t0):
    """Columns ``[B, n-1-B]`` by one delta BFS, the others one column at a time."""
    args = (P, pptr, progs, _NO_SEL, 1, _NO_SUMM, False, False)
    B = (p - 1) * max((int(np.abs(s).max()) for s in used if s.size), default=0)
    hist = np.zeros(p + 1, np.int64)
    miss = [0, 0]  # criterion 1, criterion 2
    ce: list[list[tuple[int, int]]] = [[], []]
    cols = np.arange(n, dtype=np.int64)
    if B <= n - 1 - B:
        nb2 = 2 * n - 1
        delta = np.arange(nb2, dtype=np.int64) - (n - 1)
        jlo = np.maximum(B, -delta)
        cnt = np.maximum(0, np.minimum(n - 1 - B, n - 1 - delta) - jlo + 1)
        hist, bad2, bad1 = _delta_hops(offset_sets(n - 1, nb2, p, P, pptr, progs), nb2, cnt)
        for q, bad in enumerate((bad1, bad2)):
            miss[q] += int(cnt[bad].sum())
            pair = _smallest(jlo[bad] + delta[bad], jlo[bad])
            if pair is not None:
                ce[q].append(pair)
        cols = np.concatenate([cols[:B], cols[n - B:]])
    if cols.size:
        zeros = np.zeros(cols.size, np.int64)
        hs, fail = run(TALLY, cols.size * n, 0, cols, zeros, zeros + 1, n, 0, p, *args)
        hist += hs.sum(axis=0)
        for q, col in enumerate((0, 3)):
            miss[q] += int(fail[:, col].sum())
            pair = _tally_pairs(cols, fail, col + 1)
            if pair is not None:
                ce[q].append(pair)

    def depth_fn():
        work = float(n) * ((n + 63) >> 6) * max(1, progs.shape[0]) * 8
        if depth is False or (depth is None and work > DEPTH_BUDGET):
            return None, False
        every = np.arange(n, dtype=np.int64)
        return _depth_of(run(DEPTH, n * n, 0, every, np.zeros(n, np.int64), n, *args))

    return _result(n, p, mode, residual, False, hist, miss[0], miss[1], _first_pair(ce[0]),
                   _first_pair(ce[1]), depth_fn, "offsets", t0)


# -------------------------------------------------------------------------- fixed
def fixed_hops(
    n: int,
    stride: int,
    c: int | None = None,
    summary_heads: int = 1,
    *,
    causal: bool = True,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    depth: bool | None = None,
) -> VerifyReport:
    """Exact criteria and hop histogram of ``fixed(n, stride, c, summary_heads, causal)``.

    The heads are those of :func:`sparse_patterns.patterns.fixed.fixed` (``A1``,
    then ``A2.0 .. A2.{k-1}``), never built: one bitset BFS per residue of the
    block length (see the module docstring), O(l * p * n / 64) word operations.

    Parameters
    ----------
    n, stride, c, summary_heads, causal
        As in ``fixed``.
    p, mode, residual
        As in :func:`sparse_patterns.analysis.verify`.
    depth : bool, optional
        When a criterion fails, search the steps full connectivity needs: None
        when cheap enough, True always, False never.

    Returns
    -------
    VerifyReport
        ``method="structured-periodic"``, no ``budgets``.

    Raises
    ------
    ValueError
        Parameters out of range (as ``fixed``), or as ``verify``.

    Examples
    --------
    >>> r = fixed_hops(16, 4, c=1)
    >>> r.ok, r.hops, r.method
    (True, {1: 40, 2: 96}, 'structured-periodic')
    >>> r = fixed_hops(16, 4, c=1, residual=False)  # (0, 0): no summary position <= 0
    >>> r.criterion1, r.criterion2, r.counterexample
    (False, True, (0, 0))
    """
    t0 = time.perf_counter()
    n = check_int("n", n, 1)
    stride = check_int("stride", stride, 1)
    c = max(1, stride // 8) if c is None else c
    c = check_int("c", c, 1, stride)
    k = check_int("summary_heads", summary_heads, 1)
    if k * c > stride:
        raise ValueError(
            f"summary_heads: k * c must be <= stride ({stride}); got k={k}, c={c} (k * c = {k * c})"
        )
    n, p, mode, residual, causal = _check_common(n, p, mode, residual, causal, k + 1)
    nw = (n + 63) >> 6
    res = np.arange(n, dtype=np.int64) % stride
    summ = np.zeros((k, nw), np.uint64)
    for h in range(k):
        summ[h] = _pack((res >= stride - (h + 1) * c) & (res < stride - h * c), nw)
    if mode == "interleaved":
        P, sel = p, np.eye(p, k + 1, dtype=np.bool_)
    else:
        P, sel = 1, np.ones((1, k + 1), np.bool_)
    nfull = n // stride
    if causal:
        sources = np.arange(min(stride, n), dtype=np.int64)
        lts, mults, wl = sources, np.ones_like(sources), stride
    else:
        full = np.arange(stride if nfull else 0, dtype=np.int64)
        sources = np.concatenate([full, np.arange(nfull * stride, n, dtype=np.int64)])
        lts, wl = np.zeros_like(sources), 0
        mults = np.concatenate([np.full(full.size, nfull, np.int64), np.ones(sources.size - full.size, np.int64)])
    args = (P, _NO_PTR, _NO_PROGS, sel, stride, summ, causal, residual)
    hs, fail = run(TALLY, sources.size * n, 1, sources, lts, mults, n, wl, p, *args)
    cands: list[list[tuple[int, int]]] = [[], []]
    for q, col in enumerate((1, 4)):
        pair = _tally_pairs(sources, fail, col)
        if pair is not None:
            cands[q].append(pair)
        if not causal and nfull >= 2:  # the outside of block 0 fails: so does i = 0 for block 1
            out = (fail[:, col + 1] >= stride) & (np.arange(sources.size) < stride)
            if out.any():
                cands[q].append((0, stride + int(sources[np.flatnonzero(out)[0]])))

    def depth_fn():
        cost = float(sources.size) * (nw + n // stride + 1) * (k + 1) * 64
        if depth is False or (depth is None and cost > DEPTH_BUDGET):
            return None, False
        return _depth_of(run(DEPTH, sources.size * n, 1, sources, lts, n, *args))

    return _result(n, p, mode, residual, causal, hs.sum(axis=0), int(fail[:, 0].sum()),
                   int(fail[:, 3].sum()), _first_pair(cands[0]), _first_pair(cands[1]), depth_fn,
                   "periodic", t0)


# ----------------------------------------------------------------------- patterns
_OFFSET_FAMILIES = ("strided", "local", "dilated")


def offsets_of(pattern: Pattern) -> list[np.ndarray]:
    """The offset sets ``D_m`` of a generated strided, local or dilated pattern.

    Parameters
    ----------
    pattern : Pattern
        Made by its family's generator (``pattern.rule`` is not None).

    Returns
    -------
    list of numpy.ndarray
        ``int64`` offsets per head: ``A_i = {i - d : d in D} ∩ [0, n)``.

    Raises
    ------
    ValueError
        A pattern without a rule, or of another family.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> [d.tolist() for d in offsets_of(make("strided", 8, stride=3))]
    [[0, 1, 2, 3], [0, 3, 6]]
    """
    if (not isinstance(pattern, Pattern) or pattern.rule is None or pattern.name not in _OFFSET_FAMILIES
            or "documents" in pattern.params):
        raise ValueError(f"pattern: offsets are known for generated {', '.join(_OFFSET_FAMILIES)} "
                         f"patterns, got {getattr(pattern, 'name', type(pattern).__name__)!r}")
    n, q, causal = pattern.n, pattern.params, pattern.causal

    def prog(w: int, step: int = 1) -> np.ndarray:
        return np.arange(0 if causal else -w, w + 1, dtype=np.int64) * step

    if pattern.name == "strided":
        s = int(q["stride"])
        w = s if q["window"] == "paper" else s - 1
        return [prog(w), prog((n - 1) // s, s)]
    if pattern.name == "local":
        return [prog(int(q["window"]))]
    return [prog(int(q["window"]), int(q["dilation"]))]


def structured_hops(
    pattern: Pattern,
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    depth: bool | None = None,
) -> VerifyReport | None:
    """The structured check of a generated pattern whose family has one, else None.

    Strided, local and dilated go to :func:`offset_hops`, fixed to
    :func:`fixed_hops`; a pattern without a rule (a user layout, a file) or of
    another family gives None (use the generic ``verify``).

    Examples
    --------
    >>> from sparse_patterns import make
    >>> structured_hops(make("fixed", 16, stride=4, c=1)).hops
    {1: 40, 2: 96}
    >>> structured_hops(make("bigbird", 16)) is None
    True
    """
    if not isinstance(pattern, Pattern) or pattern.rule is None or "documents" in pattern.params:
        return None  # packed documents: the generic check (or verify_schedule, per document)
    kw = {"p": p, "mode": mode, "residual": residual, "depth": depth}
    if pattern.name in _OFFSET_FAMILIES:
        return offset_hops(pattern.n, offsets_of(pattern), causal=pattern.causal, **kw)
    if pattern.name == "fixed":
        q = pattern.params
        return fixed_hops(pattern.n, q["stride"], q["c"], q["summary_heads"], causal=pattern.causal, **kw)
    return None
