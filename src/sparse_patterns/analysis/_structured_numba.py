"""The compiled searches behind :mod:`sparse_patterns.analysis.structured`.

Bitset helpers, one BFS step for offset and for periodic (fixed) heads, and the
tally / depth kernels in a parallel and a serial form (a parallel call wakes
threads, so small work runs serially). Numba functions take only arrays and
scalars; the proofs of what they compute are in ``structured``'s docstring.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

__all__ = ["TALLY", "DEPTH", "run", "runs_of", "offset_sets", "PARALLEL_ABOVE"]

#: Sources times positions above which the kernels run in parallel (a parallel call wakes threads).
PARALLEL_ABOVE = 1 << 22

_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


# -------------------------------------------------------------------- bit helpers
@njit(cache=True)
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return np.int64((x * _H01) >> np.uint64(56))


@njit(cache=True)
def _ctz(x):
    return _popcount((x & (~x + _ONE)) - _ONE)


@njit(cache=True)
def _hibit(x):
    b = 63
    while not (x >> np.uint64(b)) & _ONE:
        b -= 1
    return b


@njit(cache=True)
def _low(b):
    """Bits ``[0, b)`` of a word, b in [1, 64]."""
    return _ALL if b >= 64 else (_ONE << np.uint64(b)) - _ONE


@njit(cache=True)
def _tmask(w, lt, nw, last):
    """Target bits (positions >= lt, < nbits) of word w."""
    lw = lt >> 6
    if w < lw:
        return _ZERO
    m = _ALL
    if w == lw:
        m = _ALL << np.uint64(lt & 63)
    if w == nw - 1:
        m &= last
    return m


@njit(cache=True)
def _wcount(x, w, wl, nbits, mult):
    """Weighted popcount: position e weighs ``mult`` (wl == 0) or ``(nbits-1-e)//wl + 1``."""
    if x == 0:
        return 0
    if wl == 0:
        return mult * _popcount(x)
    base = nbits - 1
    e0 = w << 6
    a = (base - e0) // wl
    if e0 + 63 <= base and (base - e0 - 63) // wl == a:
        return (a + 1) * _popcount(x)
    s = 0
    while x:
        s += (base - e0 - _ctz(x)) // wl + 1
        x &= x - _ONE
    return s


@njit(cache=True)
def _misses(x, lt, nw, last, wl, nbits, mult):
    """Weighted count, first and last position of the targets missing from x."""
    cnt = 0
    fmin = -1
    fmax = -1
    for w in range(lt >> 6, nw):
        v = ~x[w] & _tmask(w, lt, nw, last)
        if v:
            cnt += _wcount(v, w, wl, nbits, mult)
            if fmin < 0:
                fmin = (w << 6) + _ctz(v)
            fmax = (w << 6) + _hibit(v)
    return cnt, fmin, fmax


@njit(cache=True)
def _fill(y, s, e):
    """Set bits ``[s, e)``."""
    if e <= s:
        return
    ws = s >> 6
    we = (e - 1) >> 6
    lo = _ALL << np.uint64(s & 63)
    hi = _low(((e - 1) & 63) + 1)
    if ws == we:
        y[ws] |= lo & hi
        return
    y[ws] |= lo
    for w in range(ws + 1, we):
        y[w] = _ALL
    y[we] |= hi


@njit(cache=True)
def _first(x, s, e):
    """First set bit in ``[s, e)``, or -1."""
    if e <= s:
        return -1
    ws = s >> 6
    we = (e - 1) >> 6
    for w in range(ws, we + 1):
        v = x[w]
        if w == ws:
            v &= _ALL << np.uint64(s & 63)
        if w == we:
            v &= _low(((e - 1) & 63) + 1)
        if v:
            return (w << 6) + _ctz(v)
    return -1


@njit(cache=True)
def _shift_or(dst, src, lo, hi, sh, nw):
    """``dst |= src << sh`` over src words ``[lo, hi)`` (sh < 0 shifts down); in place is safe.

    Returns the word span written. Bits below 0 drop out; the caller masks the last word.
    """
    if sh >= 0:
        q = sh >> 6
        r = sh & 63
        ur = np.uint64(r)
        ul = np.uint64(64 - r) if r else np.uint64(0)
        for w in range(hi - 1, lo - 1, -1):
            x = src[w]
            if x == 0:
                continue
            t = w + q
            if t < nw:
                dst[t] |= x << ur
                if r and t + 1 < nw:
                    dst[t + 1] |= x >> ul
        return min(lo + q, nw), min(hi + q + 1, nw)
    s = -sh
    q = s >> 6
    r = s & 63
    ur = np.uint64(r)
    ul = np.uint64(64 - r) if r else np.uint64(0)
    for w in range(lo, hi):
        x = src[w]
        if x == 0:
            continue
        t = w - q
        if t >= 0:
            dst[t] |= x >> ur
        if r and t - 1 >= 0:
            dst[t - 1] |= x << ul
    return max(lo - q - 1, 0), max(hi - q, 0)


# ------------------------------------------------------------------------- steps
@njit(cache=True)
def _offset_step(src, slo, shi, progs, r0, r1, dst, z, nw, last):
    """``dst |= src + D`` with D the progressions ``progs[r0:r1]`` (start, step, count); z is zero scratch."""
    olo = nw
    ohi = 0
    for r in range(r0, r1):
        a = progs[r, 0]
        s = progs[r, 1]
        cnt = progs[r, 2]
        for w in range(slo, shi):
            z[w] = src[w]
        zlo = slo
        zhi = shi
        top = 0
        while (cnt >> (top + 1)) > 0:
            top += 1
        c = 1
        for b in range(top - 1, -1, -1):  # z = src + {0, s, .., (c-1)s}, doubling c
            lo2, hi2 = _shift_or(z, z, zlo, zhi, c * s, nw)
            zlo = min(zlo, lo2)
            zhi = max(zhi, hi2)
            c *= 2
            if (cnt >> b) & 1:
                lo2, hi2 = _shift_or(z, src, slo, shi, c * s, nw)
                zlo = min(zlo, lo2)
                zhi = max(zhi, hi2)
                c += 1
        if zhi == nw:
            z[nw - 1] &= last
        lo2, hi2 = _shift_or(dst, z, zlo, zhi, a, nw)
        olo = min(olo, lo2)
        ohi = max(ohi, hi2)
        for w in range(zlo, zhi):
            z[w] = 0
    if ohi == nw:
        dst[nw - 1] &= last
    return olo, ohi


@njit(cache=True)
def _fixed_step(x, y, sel, n, nw, l, summ, causal, residual):
    """``y |= step(x)`` for fixed heads: sel[0] the block head, sel[1 + h] summary head h."""
    if residual:
        for w in range(nw):
            y[w] |= x[w]
    if sel[0]:
        for s in range(0, n, l):
            e = min(s + l, n)
            f = _first(x, s, e)
            if f >= 0:
                _fill(y, f if causal else s, e)
    for h in range(summ.shape[0]):
        if sel[1 + h]:
            m = summ[h]
            for w in range(nw):
                v = x[w] & m[w]
                if v:
                    _fill(y, ((w << 6) + _ctz(v)) if causal else 0, n)
                    break


@njit(cache=True)
def _step(kind, cur, lo, hi, nxt, z, st, pptr, progs, sel, n, nw, last, l, summ, causal, residual):
    if kind == 0:
        return _offset_step(cur, lo, hi, progs, pptr[st], pptr[st + 1], nxt, z, nw, last)
    _fixed_step(cur, nxt, sel[st], n, nw, l, summ, causal, residual)
    return 0, nw


# ----------------------------------------------------------------------- kernels
@njit(cache=True)
def _tally_one(t, kind, sources, lts, mults, nbits, wl, p, P, pptr, progs, sel, l, summ, causal,
               residual, b, hist, fail):
    """Source t: weighted hop counts into ``hist[t]``, failures into ``fail[t]``; b is scratch (4, nw)."""
    nw = (nbits + 63) >> 6
    last = _low(((nbits - 1) & 63) + 1)
    cur, nxt, e, z = b[0], b[1], b[2], b[3]
    cur[:] = 0
    e[:] = 0
    src = sources[t]
    lt = lts[t]
    cur[src >> 6] = _ONE << np.uint64(src & 63)
    lo = src >> 6
    hi = lo + 1
    for k in range(1, p + 1):
        nxt[:] = 0
        lo, hi = _step(kind, cur, lo, hi, nxt, z, (k - 1) % P, pptr, progs, sel, nbits, nw, last,
                       l, summ, causal, residual)
        got = 0
        for w in range(lo, hi):
            v = nxt[w] & ~e[w]
            if v:
                e[w] |= v
                got += _wcount(v & _tmask(w, lt, nw, last), w, wl, nbits, mults[t])
        hist[t, k] = got
        cur, nxt = nxt, cur
    fail[t, 0], fail[t, 1], fail[t, 2] = _misses(cur, lt, nw, last, wl, nbits, mults[t])
    fail[t, 3], fail[t, 4], fail[t, 5] = _misses(e, lt, nw, last, wl, nbits, mults[t])


@njit(cache=True, parallel=True)
def _tally_par(kind, sources, lts, mults, nbits, wl, p, P, pptr, progs, sel, l, summ, causal,
               residual, nthr):
    """Per source (in parallel): weighted hop counts ``hist (S, p + 1)`` and ``fail (S, 6)``.

    ``fail[t]`` = (criterion 1 misses, first, last failing position; the same for criterion 2).
    """
    ns = sources.size
    hist = np.zeros((ns, p + 1), np.int64)
    fail = np.zeros((ns, 6), np.int64)
    bufs = np.zeros((nthr, 4, (nbits + 63) >> 6), np.uint64)
    for t in prange(ns):
        _tally_one(t, kind, sources, lts, mults, nbits, wl, p, P, pptr, progs, sel, l, summ, causal,
                   residual, bufs[numba.get_thread_id()], hist, fail)
    return hist, fail


@njit(cache=True)
def _tally_ser(kind, sources, lts, mults, nbits, wl, p, P, pptr, progs, sel, l, summ, causal,
               residual, nthr):
    """:func:`_tally_par` in one thread (a parallel call wakes the thread pool)."""
    ns = sources.size
    hist = np.zeros((ns, p + 1), np.int64)
    fail = np.zeros((ns, 6), np.int64)
    b = np.zeros((4, (nbits + 63) >> 6), np.uint64)
    for t in range(ns):
        _tally_one(t, kind, sources, lts, mults, nbits, wl, p, P, pptr, progs, sel, l, summ, causal,
                   residual, b, hist, fail)
    return hist, fail


@njit(cache=True)
def _depth_one(t, kind, sources, lts, nbits, P, pptr, progs, sel, l, summ, causal, residual, b, v,
               out):
    """Source t: the step at which the last target is first reached, or -1 if one never is.

    Frontier BFS over states ``(position, step mod P)`` (visited: v, ``(P, nw)``);
    the start state is not marked, so the source itself needs a walk of >= 1 step.
    """
    nw = (nbits + 63) >> 6
    last = _low(((nbits - 1) & 63) + 1)
    f, nx, g, z = b[0], b[1], b[2], b[3]
    f[:] = 0
    nx[:] = 0
    g[:] = 0
    v[:, :] = 0
    src = sources[t]
    lt = lts[t]
    f[src >> 6] = _ONE << np.uint64(src & 63)
    flo = src >> 6
    fhi = flo + 1
    need = nbits - lt
    reached = 0
    maxd = 0
    k = 0
    while fhi > flo and reached < need:
        lo, hi = _step(kind, f, flo, fhi, nx, z, k % P, pptr, progs, sel, nbits, nw, last, l,
                       summ, causal, residual)
        vp = v[(k + 1) % P]
        nlo = nw
        nhi = 0
        new = 0
        for w in range(lo, hi):
            x = nx[w] & ~vp[w]
            nx[w] = x
            if x:
                vp[w] |= x
                if nlo == nw:
                    nlo = w
                nhi = w + 1
                y = x & ~g[w] & _tmask(w, lt, nw, last)
                if y:
                    g[w] |= y
                    new += _popcount(y)
        k += 1
        if new:
            reached += new
            maxd = k
        for w in range(flo, fhi):
            f[w] = 0
        f, nx = nx, f
        flo, fhi = nlo, nhi
    out[t] = maxd if reached == need else -1


@njit(cache=True, parallel=True)
def _depth_par(kind, sources, lts, nbits, P, pptr, progs, sel, l, summ, causal, residual, nthr):
    """:func:`_depth_one` for every source, in parallel."""
    nw = (nbits + 63) >> 6
    out = np.empty(sources.size, np.int64)
    bufs = np.zeros((nthr, 4, nw), np.uint64)
    vis = np.zeros((nthr, P, nw), np.uint64)
    for t in prange(sources.size):
        tid = numba.get_thread_id()
        _depth_one(t, kind, sources, lts, nbits, P, pptr, progs, sel, l, summ, causal, residual,
                   bufs[tid], vis[tid], out)
    return out


@njit(cache=True)
def _depth_ser(kind, sources, lts, nbits, P, pptr, progs, sel, l, summ, causal, residual, nthr):
    """:func:`_depth_one` for every source, in one thread."""
    nw = (nbits + 63) >> 6
    out = np.empty(sources.size, np.int64)
    b = np.zeros((4, nw), np.uint64)
    v = np.zeros((P, nw), np.uint64)
    for t in range(sources.size):
        _depth_one(t, kind, sources, lts, nbits, P, pptr, progs, sel, l, summ, causal, residual, b,
                   v, out)
    return out


@njit(cache=True)
def offset_sets(source, nbits, p, P, pptr, progs):
    """The bitsets ``S_1 .. S_p`` (``uint64 (p, nw)``) of walks from ``source`` (offset steps)."""
    nw = (nbits + 63) >> 6
    last = _low(((nbits - 1) & 63) + 1)
    out = np.zeros((p + 1, nw), np.uint64)
    z = np.zeros(nw, np.uint64)
    out[0, source >> 6] = _ONE << np.uint64(source & 63)
    lo = source >> 6
    hi = lo + 1
    for k in range(1, p + 1):
        lo, hi = _offset_step(out[k - 1], lo, hi, progs, pptr[(k - 1) % P], pptr[(k - 1) % P + 1],
                              out[k], z, nw, last)
    return out[1:]


TALLY = (_tally_par, _tally_ser)
DEPTH = (_depth_par, _depth_ser)


def run(forms, work, *args):
    """Call a kernel with ``args`` and the thread count: serial when ``work`` (sources x positions) is small."""
    par, ser = forms
    if work >= PARALLEL_ABOVE:
        return par(*args, int(numba.config.NUMBA_NUM_THREADS))
    return ser(*args, 1)


@njit(cache=True)
def runs_of(seq):
    """Greedy split of a monotone sequence into arithmetic progressions ``(start, step, count)``."""
    m = seq.size
    out = np.empty((m, 3), np.int64)
    r = 0
    i = 0
    while i < m:
        if i + 1 < m:
            s = seq[i + 1] - seq[i]
            j = i + 1
            while j + 1 < m and seq[j + 1] - seq[j] == s:
                j += 1
            out[r, 0], out[r, 1], out[r, 2] = seq[i], s, j - i + 1
            i = j + 1
        else:
            out[r, 0], out[r, 1], out[r, 2] = seq[i], 1, 1
            i += 1
        r += 1
    return out[:r]
