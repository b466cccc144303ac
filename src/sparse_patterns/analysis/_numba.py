"""Numba kernels of the exact verification (token level, depth, block level).

Connectivity matrices are stored as **runs**: every row is a sorted list of
maximal runs of consecutive columns ``[start, start + length)``. Several
matrices ("structures") are stacked: row ``a`` of structure ``s`` has runs
``rptr[s * n + a] .. rptr[s * n + a + 1]``. ``lptr``/``lst``/``lln`` copy the long
runs (``length >= LONG``) of every row, so a union can OR the long runs of a
whole layer first and stop as soon as the row is complete.

The token kernel (:func:`hop_kernel`) walks the output rows ``i`` in chunks
(``prange``); for every step ``k`` it builds the bitset of
``R_k(i) = U_{a in M_k(i)} R_{k-1}(a)`` by a backward layered BFS with one
deduplicated layer per step. When ``A_k(i)`` contains ``A_k(i-1)`` (checked by a
merge of the two run lists), the union of row ``i - 1`` is kept and only the new
``a`` are added. A schedule of layers runs the other way (:func:`reach_kernel`):
every ``R_k`` is built once from the rows of ``R_{k-1}``, so its work grows
linearly with the number of layers. Nothing here decides anything: the Python
side validates input and interprets the counts.
"""

from __future__ import annotations

import types

import numba
import numpy as np
from numba import njit, prange

from ..util.threads import refuse_uncompiled
from ._bits import _ALL, _ONE, ctz, first_zero, or_run, or_run_extract, popcount, set_bit
from ._block_level import block_count, block_step, bool_csr
from ._runs import LONG, count_runs, fill_runs, long_index, union_runs, union_sizes

__all__ = [
    "pick", "SERIAL_BELOW",
    "LONG", "count_runs", "fill_runs", "union_runs", "union_sizes", "long_index", "hop_kernel",
    "reach_kernel",
    "depth_kernel", "block_step", "block_count",
]


# ------------------------------------------------------------------ token kernel
@njit(cache=True)
def _emit_row(rptr, rst, rln, r, out):
    """All positions of stacked row ``r`` into ``out``; return their number."""
    m = 0
    for q in range(rptr[r], rptr[r + 1]):
        s = rst[q]
        for x in range(s, s + rln[q]):
            out[m] = x
            m += 1
    return m


@njit(cache=True)
def _new_elements(rptr, rst, rln, rprev, rcur, out):
    """Positions of row ``rcur`` missing from row ``rprev``, or -1 if ``rprev`` is not a subset."""
    pa = rptr[rprev]
    pe = rptr[rprev + 1]
    qa = rptr[rcur]
    qe = rptr[rcur + 1]
    q = qa
    for r in range(pa, pe):
        s0 = rst[r]
        e0 = s0 + rln[r]
        while q < qe and rst[q] + rln[q] <= s0:
            q += 1
        if q == qe or rst[q] > s0 or rst[q] + rln[q] < e0:
            return -1
    m = 0
    r = pa
    for q in range(qa, qe):
        pos = rst[q]
        ce = pos + rln[q]
        while pos < ce:
            while r < pe and rst[r] + rln[r] <= pos:
                r += 1
            if r < pe and rst[r] < ce:
                ps = rst[r]
                if ps > pos:
                    for x in range(pos, ps):
                        out[m] = x
                        m += 1
                pe_ = ps + rln[r]
                if pe_ > pos:
                    pos = pe_
            else:
                for x in range(pos, ce):
                    out[m] = x
                    m += 1
                pos = ce
    return m


@njit(cache=True)
def _bottom(bits, cnt, T, lst, m, base, rptr, rst, rln, lptr, lst_, lln_, residual):
    """bits |= U_{a in lst} (row a of the structure at ``base``, plus a if residual).

    Exact in any order; the order only decides how soon ``cnt == T`` stops it:
    the long runs of every row first, then the positions a themselves, then the
    short runs, the last listed (for a causal pattern, the nearest) rows first.
    """
    if cnt >= T:
        return cnt
    for t in range(m - 1, -1, -1):
        a = lst[t]
        for q in range(lptr[base + a], lptr[base + a + 1]):
            cnt += or_run(bits, lst_[q], lln_[q])
        if cnt >= T:
            return cnt
    if residual:
        for t in range(m):
            cnt += set_bit(bits, lst[t])
        if cnt >= T:
            return cnt
    for t in range(m - 1, -1, -1):
        a = lst[t]
        for r in range(rptr[base + a], rptr[base + a + 1]):
            ln = rln[r]
            if ln == 1:
                cnt += set_bit(bits, rst[r])
            elif ln < LONG:
                cnt += or_run(bits, rst[r], ln)
        if cnt >= T:
            return cnt
    return cnt


@njit(cache=True, inline="always")
def _next_layer(cur, cm, base, rptr, rst, rln, residual, seen, nxt):
    """One BFS layer: the rows ``base + a`` of ``cur[:cm]`` (and, with the residual, each
    ``a``), deduplicated through the bitset ``seen``, written to ``nxt``; returns their number."""
    nm = 0
    for u in range(cm):
        a = cur[u]
        for r in range(rptr[base + a], rptr[base + a + 1]):
            nm = or_run_extract(seen, rst[r], rln[r], nxt, nm)
        if residual and set_bit(seen, a):
            nxt[nm] = a
            nm += 1
    return nm


@njit(cache=True)
def _expand(bits, cnt, T, lst, m, k, step_base, rptr, rst, rln, lptr, lst_, lln_, residual, D, X,
            Y):
    """bits |= U_{a in lst} R_{k-1}(a) for k >= 2, one deduplicated layer per step."""
    cur = lst
    cm = m
    use_x = True
    for t in range(k - 1, 1, -1):
        base = step_base[t - 1]
        nxt = X if use_x else Y
        nm = _next_layer(cur, cm, base, rptr, rst, rln, residual, D, nxt)
        for u in range(nm):
            D[nxt[u] >> 6] = 0
        cur = nxt
        cm = nm
        use_x = not use_x
    return _bottom(bits, cnt, T, cur, cm, step_base[0], rptr, rst, rln, lptr, lst_, lln_,
                   residual)


@njit(cache=True, inline="always")
def _write_word(mat, i, w, x, value):
    """``mat[i, j] = value`` for every set bit j of word w (bits ``x``)."""
    while x:
        lsb = x & (~x + _ONE)
        mat[i, (w << 6) + popcount(lsb - _ONE)] = value
        x &= x - _ONE


@njit(cache=True)
def _write_bits(mat, i, bits, hw, value):
    for w in range(hw):
        _write_word(mat, i, w, bits[w], value)


def hop_kernel(n, p, step_base, rptr, rst, rln, lptr, lst_, lln_, residual, causal, row_lo, row_hi,
               chunk, nthr, want_mat, mat):
    """Exact hop-distance counts for output rows ``[row_lo, row_hi)``.

    Returns per chunk: ``hops (nc, p + 1)`` (column k = pairs whose hop distance
    is k), ``miss1 (nc,)`` target pairs outside ``R_p``, ``miss2 (nc,)`` target
    pairs with no hop distance, and the first failing pair of each criterion
    ``bad (nc, 4)`` = (i1, j1, i2, j2), -1 when none. With ``want_mat`` the hop
    distance of every target pair is written to ``mat[i, j]`` (-1: unreachable).
    """
    nrows = row_hi - row_lo
    nc = (nrows + chunk - 1) // chunk
    nw = (n + 63) >> 6
    hops = np.zeros((nc, p + 1), np.int64)
    miss1 = np.zeros(nc, np.int64)
    miss2 = np.zeros(nc, np.int64)
    bad = np.full((nc, 4), -1, np.int64)
    Rs = np.zeros((nthr, nw), np.uint64)
    Es = np.zeros((nthr, nw), np.uint64)
    Ds = np.zeros((nthr, nw), np.uint64)
    Bs = np.zeros((nthr, p + 1, nw), np.uint64)
    L0s = np.empty((nthr, n), np.int64)
    Xs = np.empty((nthr, n), np.int64)
    Ys = np.empty((nthr, n), np.int64)
    for c in prange(nc):
        tid = numba.get_thread_id()
        R = Rs[tid]
        E = Es[tid]
        D = Ds[tid]
        B = Bs[tid]
        L0 = L0s[tid]
        X = Xs[tid]
        Y = Ys[tid]
        B[:, :] = 0
        valid = np.zeros(p + 1, np.bool_)
        bcnt = np.zeros(p + 1, np.int64)
        i0 = row_lo + c * chunk
        i1 = min(i0 + chunk, row_hi)
        base1 = step_base[0]
        for i in range(i0, i1):
            if causal:
                T = i + 1
                hw = (i >> 6) + 1
            else:
                T = n
                hw = nw
            for w in range(hw):
                R[w] = 0
            rc = 0
            for r in range(rptr[base1 + i], rptr[base1 + i + 1]):
                rc += or_run(R, rst[r], rln[r])
            if residual:
                rc += set_bit(R, i)
            hops[c, 1] += rc
            if want_mat:
                _write_bits(mat, i, R, hw, 1)
            ec = rc
            if want_mat or not residual:
                for w in range(hw):
                    E[w] = R[w]
            last = R
            for k in range(2, p + 1):
                if residual and rc == T:
                    for kk in range(k, p + 1):
                        valid[kk] = False
                    break
                base = step_base[k - 1]
                Bk = B[k]
                m = -1
                if valid[k] and i > i0:
                    m = _new_elements(rptr, rst, rln, base + i - 1, base + i, L0)
                if m < 0:
                    for w in range(hw):
                        Bk[w] = 0
                    bcnt[k] = 0
                    m = _emit_row(rptr, rst, rln, base + i, L0)
                bcnt[k] = _expand(Bk, bcnt[k], T, L0, m, k, step_base, rptr, rst, rln, lptr,
                                  lst_, lln_, residual, D, X, Y)
                valid[k] = True
                new = 0
                if residual:
                    for w in range(hw):
                        x = Bk[w] & ~R[w]
                        if x:
                            new += popcount(x)
                            R[w] |= x
                    rc += new
                else:
                    for w in range(hw):
                        x = Bk[w] & ~E[w]
                        if x:
                            new += popcount(x)
                            E[w] |= x
                            if want_mat:
                                _write_word(mat, i, w, x, k)
                    ec += new
                    rc = bcnt[k]
                    last = Bk
                hops[c, k] += new
                if residual and want_mat:
                    # new bits of this step: R now minus what E (= R before) held
                    for w in range(hw):
                        _write_word(mat, i, w, R[w] & ~E[w], k)
                        E[w] = R[w]
            if residual:
                ec = rc
            miss1[c] += T - rc
            miss2[c] += T - ec
            if rc < T and bad[c, 0] < 0:
                bad[c, 0] = i
                bad[c, 1] = first_zero(last, T)
            if ec < T and bad[c, 2] < 0:
                bad[c, 2] = i
                bad[c, 3] = first_zero(R if residual else E, T)
            if want_mat and ec < T:
                got = R if residual else E
                for j in range(T):
                    if not (got[j >> 6] >> np.uint64(j & 63)) & _ONE:
                        mat[i, j] = -1
    return hops, miss1, miss2, bad


# ------------------------------------------------------------------ forward reach
@njit(cache=True, inline="always")
def _target_bits(i, c0, c1, causal):
    """Target columns of output row i inside the column chunk ``[c0, c1)`` (``j <= i`` if causal)."""
    if causal:
        return min(max(i + 1 - c0, 0), c1 - c0)
    return c1 - c0


@njit(cache=True)
def _count_row(row, f, lo, hi, tb):
    """Set bits below ``tb`` of a stored row: ones on words ``[0, f)``, ``row[lo:hi]``, else zero."""
    c = min(f << 6, tb)
    for w in range(lo, hi):
        b = w << 6
        if b >= tb:
            break
        x = row[w]
        if b + 64 > tb:
            x &= (_ONE << np.uint64(tb - b)) - _ONE
        c += popcount(x)
    return c


@njit(cache=True)
def _first_clear(row, f, lo, hi, tb):
    """Smallest column ``< tb`` clear in a stored row, or -1."""
    for w in range(f, (tb + 63) >> 6):
        x = _ALL
        if lo <= w < hi:
            x = ~row[w]
        if x:
            j = (w << 6) + ctz(x)
            return j if j < tb else -1
    return -1


@njit(cache=True)
def _settle(A, f, tlo, thi, out, st, i, tb):
    """Store the accumulated row (ones on words ``[0, f)``, ``A[tlo:thi]``) as row i of ``out``,
    trimmed, with ``st[i] = (f, lo, hi, target bits set)``; clear ``A``; return the count."""
    while f < thi and A[f] == _ALL:
        f += 1
    lo = max(tlo, f)
    hi = thi
    while lo < hi and A[lo] == 0:
        lo += 1
    while hi > lo and A[hi - 1] == 0:
        hi -= 1
    if lo >= hi:
        lo = hi = 0
    row = out[i]
    for w in range(lo, hi):
        row[w] = A[w]
    for w in range(tlo, thi):
        A[w] = 0
    c = _count_row(row, f, lo, hi, tb)
    st[i, 0] = f
    st[i, 1] = lo
    st[i, 2] = hi
    st[i, 3] = c
    return c


@njit(cache=True, inline="always")
def _or_row(A, buf, st, a, f, tlo, thi):
    """``A |= row a`` above the prefix ``max(f, prefix of a)``; returns that prefix and the touched
    word range. Words below the final prefix may be touched: they are ignored."""
    f = max(f, st[a, 0])
    wlo = max(st[a, 1], f)
    whi = st[a, 2]
    if wlo < whi:
        src = buf[a]
        for w in range(wlo, whi):
            A[w] |= src[w]
        tlo = min(tlo, wlo)
        thi = max(thi, whi)
    return f, tlo, thi


@njit(cache=True)
def _contains(rptr, rst, rln, r, x):
    """Whether stacked row ``r`` holds position ``x``."""
    for q in range(rptr[r + 1] - 1, rptr[r] - 1, -1):
        if rst[q] <= x:
            return x < rst[q] + rln[q]
    return False


@njit(cache=True)
def _reach_rows(i0, i1, k, last, c0, c1, alo, wc, base, rptr, rst, rln, residual, causal, buf, st,
                pbuf, pst, ebuf, est, A, L, bad):
    """Rows ``[i0, i1)`` of ``R_k`` (and ``E_k``) in the column chunk ``[c0, c1)``, in order.

    Returns the target pairs of these rows in ``R_k`` and those new in ``E_k``; at the last
    layer ``bad`` gets the first pair missing from each.
    """
    s_r = 0
    s_e = 0
    for i in range(i0, i1):
        tb = _target_bits(i, c0, c1, causal)
        f = 0
        tlo = wc
        thi = 0
        if k == 0:  # R_1 = M_1: the runs themselves
            for q in range(rptr[base + i], rptr[base + i + 1]):
                s = max(rst[q], c0)
                e = min(rst[q] + rln[q], c1)
                if s < e:
                    or_run(A, s - c0, e - s)
                    tlo = min(tlo, (s - c0) >> 6)
                    thi = max(thi, ((e - 1 - c0) >> 6) + 1)
            if residual and c0 <= i < c1:
                set_bit(A, i - c0)
                tlo = min(tlo, (i - c0) >> 6)
                thi = max(thi, ((i - c0) >> 6) + 1)
            c = _settle(A, f, tlo, thi, buf, st, i, tb)
        elif residual and pst[i, 3] == tb:  # complete: R_k(i) = R_{k-1}(i)
            for w in range(pst[i, 1], pst[i, 2]):
                buf[i, w] = pbuf[i, w]
            for x in range(4):
                st[i, x] = pst[i, x]
            c = tb
        else:
            m = -1
            if i > i0 and (not residual or _contains(rptr, rst, rln, base + i, i - 1)):
                m = _new_elements(rptr, rst, rln, base + i - 1, base + i, L)
            if m >= 0:  # M(i) holds M(i - 1): start from row i - 1 and add the new sources
                f, tlo, thi = _or_row(A, buf, st, i - 1, f, tlo, thi)
                for u in range(m):
                    if L[u] >= alo:
                        f, tlo, thi = _or_row(A, pbuf, pst, L[u], f, tlo, thi)
            else:
                for q in range(rptr[base + i], rptr[base + i + 1]):
                    for a in range(max(rst[q], alo), rst[q] + rln[q]):
                        f, tlo, thi = _or_row(A, pbuf, pst, a, f, tlo, thi)
            if residual:
                f, tlo, thi = _or_row(A, pbuf, pst, i, f, tlo, thi)
            c = _settle(A, f, tlo, thi, buf, st, i, tb)
        s_r += c
        if not residual:  # E_k(i) = E_{k-1}(i) | R_k(i)
            old = 0
            g, tlo, thi = _or_row(A, buf, st, i, 0, wc, 0)
            if k > 0:
                old = est[i, 3]
                g, tlo, thi = _or_row(A, ebuf, est, i, g, tlo, thi)
            s_e += _settle(A, g, tlo, thi, ebuf, est, i, tb) - old
        if last and c < tb and bad[0] < 0:
            bad[0] = i
            bad[1] = c0 + _first_clear(buf[i], st[i, 0], st[i, 1], st[i, 2], tb)
        if last and not residual and est[i, 3] < tb and bad[2] < 0:
            bad[2] = i
            bad[3] = c0 + _first_clear(ebuf[i], est[i, 0], est[i, 1], est[i, 2], tb)
    return s_r, s_e


def reach_kernel(n, P, step_base, rptr, rst, rln, residual, causal, block, bufs, sts, ebuf, est,
                 As, Ls):
    """Reachability after every layer of a schedule, propagated forward once.

    ``R_k(i) = U_{a in M_k(i)} R_{k-1}(a)`` (``M_k`` = step k plus the identity
    with the residual, ``R_0 = I``) is computed for every output row from the
    rows of ``R_{k-1}``, so the work per layer does not grow with k. Sources are
    processed ``64 * wc`` columns at a time: a chunk holds two bit matrices
    ``(n, wc)`` (and the union ``E_k`` of ``R_1 .. R_k`` without the residual).
    A stored row is ones on its first ``f`` words plus the words ``[lo, hi)``
    (zero elsewhere), so the cost of a row tracks what it adds, not n. A row
    whose ``M_k(i)`` contains ``M_k(i - 1)`` starts from row ``i - 1`` and adds
    the new sources; with the residual a complete row is copied, and a chunk
    whose rows are all complete stops.

    Returns ``reach (P,)`` target pairs in ``R_k``, ``hops (P + 1,)`` target
    pairs first in ``E_k`` at k (column 0 unused), and ``bad (4,)`` = (i1, j1,
    i2, j2): the first target pair, row by row, outside ``R_P`` and outside
    ``E_P`` (-1 when none). The caller allocates the work arrays:
    ``bufs uint64 (2, n, wc)``, ``sts int64 (2, n, 4)`` (a row's prefix, first
    and end word, count), ``ebuf uint64 (n or 0, wc)``, ``est int64 (n or 0, 4)``,
    ``As uint64 (threads, wc)`` zeroed, ``Ls int64 (threads, n)``.
    """
    nw = (n + 63) >> 6
    wc = bufs.shape[2]
    reach = np.zeros(P, np.int64)
    hops = np.zeros(P + 1, np.int64)
    bad = np.full(4, -1, np.int64)
    for ch in range((nw + wc - 1) // wc):
        c0 = (ch * wc) << 6
        c1 = min(n, c0 + (wc << 6))
        r0 = c0 if causal else 0  # causal: rows above c0 reach nothing in the chunk
        nb = (n - r0 + block - 1) // block
        bsum = np.zeros(nb, np.int64)
        esum = np.zeros(nb, np.int64)
        bbad = np.full((nb, 4), -1, np.int64)
        tgt = 0
        for x in range(r0, n):
            tgt += _target_bits(x, c0, c1, causal)
        had = 0
        for k in range(P):
            cur = k & 1
            base = step_base[k]
            for b in prange(nb):
                tid = numba.get_thread_id()
                i0 = r0 + b * block
                bsum[b], esum[b] = _reach_rows(
                    i0, min(n, i0 + block), k, k == P - 1, c0, c1, r0, wc, base, rptr, rst, rln,
                    residual, causal, bufs[cur], sts[cur], bufs[1 - cur], sts[1 - cur], ebuf, est,
                    As[tid], Ls[tid], bbad[b])
            got = 0
            new = 0
            for b in range(nb):
                got += bsum[b]
                new += esum[b]
            reach[k] += got
            hops[k + 1] += got - had if residual else new  # R_k nested with the residual
            had = got
            if residual and got == tgt:  # every row complete: later layers add nothing
                for kk in range(k + 1, P):
                    reach[kk] += tgt
                break
        for q in range(2):
            for b in range(nb):
                if bbad[b, 2 * q] >= 0:
                    i = bbad[b, 2 * q]
                    j = bbad[b, 2 * q + 1]
                    if bad[2 * q] < 0 or i < bad[2 * q] or (i == bad[2 * q] and j < bad[2 * q + 1]):
                        bad[2 * q] = i
                        bad[2 * q + 1] = j
                    break
    if residual:
        bad[2] = bad[0]
        bad[3] = bad[1]
    return reach, hops, bad


# ------------------------------------------------------------------------- depth
def depth_kernel(n, P, step_base, rptr, rst, rln, residual, causal, nthr):
    """Per input position j: the steps every target output needs, or -1 if one never connects.

    Forward BFS from ``(j, phase 0)`` over states ``(position, step mod P)`` of
    the periodic layered graph; ``step_base`` indexes the *transposed* step
    structures (row a lists the outputs that read a). Each state is expanded
    once, so the search ends after at most ``n * P`` levels.
    """
    nw = (n + 63) >> 6
    out = np.empty(n, np.int64)
    Vs = np.zeros((nthr, P, nw), np.uint64)
    Gs = np.zeros((nthr, nw), np.uint64)
    Fs = np.empty((nthr, n), np.int64)
    Ns = np.empty((nthr, n), np.int64)
    for j in prange(n):
        tid = numba.get_thread_id()
        V = Vs[tid]
        G = Gs[tid]
        F = Fs[tid]
        N = Ns[tid]
        V[:, :] = 0
        G[:] = 0
        T = n - j if causal else n
        F[0] = j
        cm = 1  # the start state is not marked: (j, j) needs a walk of >= 1 step
        K = 0
        reached = 0
        maxd = 0
        use_f = True
        while cm > 0 and reached < T:
            cur = F if use_f else N
            nxt = N if use_f else F
            base = step_base[K % P]
            nv = V[(K + 1) % P]
            nm = _next_layer(cur, cm, base, rptr, rst, rln, residual, nv, nxt)
            K += 1
            for u in range(nm):
                b = nxt[u]
                if (b >= j or not causal) and set_bit(G, b):
                    reached += 1
                    maxd = K
            cm = nm
            use_f = not use_f
        out[j] = maxd if reached == T else -1
    return out


# ---------------------------------------------------------------- compiled forms
def _compile(f):
    """A parallel and a serial compiled form of ``f`` (separate cache entries).

    Every parallel call wakes the thread pool, which costs milliseconds on a
    busy machine; small inputs take the serial form (``prange`` is ``range``).
    """
    name = f.__name__ + "_serial"
    g = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__qualname__ = name
    g.__doc__ = f.__doc__
    return njit(parallel=True, cache=True)(f), njit(cache=True)(g)


#: below this many rows the serial forms are used
SERIAL_BELOW = 2048

_FORMS = {}
for _f in (bool_csr, count_runs, fill_runs, union_runs, union_sizes, hop_kernel, reach_kernel,
           depth_kernel, block_step, block_count):
    _FORMS[_f.__name__] = _compile(_f)
del _f


def pick(name, n):
    """The compiled kernel ``name``: the parallel form for n >= SERIAL_BELOW, else the serial one."""
    refuse_uncompiled("the exact verification")
    par, ser = _FORMS[name]
    return par if n >= SERIAL_BELOW else ser
