"""The CPU kernel (``impl="numba"``): fused sparse attention over an ExecutionPlan.

Forward: for every piece of the plan, the keys and values are first put in the
piece's key order (once per call), so that a chunk of consecutive key blocks is
a contiguous slice; then, in parallel over (batch x head, run of query blocks),
the scores of the query tile against a chunk of tiles are computed transposed
(keys x queries, one ``K @ Q^T`` product), the partial tiles masked, and an
online softmax (running max, running sum, rescaled accumulator) updated with
loops vectorized across the queries. The piece's normalized output and log-sum-exp are then merged
exactly into the output by log-sum-exp, so several pieces of one softmax (a
window in natural order, a stride in ``i mod l`` order) give one softmax. Nothing
of size ``n x n`` is ever allocated.

Backward: recomputes the probabilities from the saved log-sum-exp, in parallel
over (batch x head); for every piece and key block it gathers the query rows of
a chunk of the block's tiles, accumulates ``dk`` and ``dv`` in tile buffers and
adds ``dq`` into its rows (each thread owns whole heads: no write conflicts).

Three details decide the speed on a CPU without SVML:

* the exponential: ``math.exp`` inside a loop is scalar, so the float32 path uses
  Cephes' ``expf`` (Cody-Waite range reduction ``x = n ln2 + r``, a degree-7
  polynomial in ``r``, relative error below 1e-7) written so LLVM vectorizes it,
  building ``2**n`` with a bitcast; the float64 path keeps ``math.exp``;
* the row max: a float max reduction is not vectorized without fast-math (which
  would drop NaN semantics), so the forward keeps the scores transposed and takes
  elementwise maxima across the queries (the backward's helper uses an integer
  max over order-preserving keys of the float bit patterns);
* the matrix products are ``np.dot`` on contiguous buffers (BLAS ``gemm``), with
  the BLAS library held to one thread while the kernel runs, since every kernel
  thread calls it.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
from collections.abc import Iterator

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import types
from numba.extending import intrinsic, overload

__all__ = ["forward", "backward", "single_threaded_blas"]

_LOG2E = 1.4426950408889634
_CHUNK = 8  # tiles gathered per step (keys per score matrix: _CHUNK * block)
_FM = {"contract"}  # FMA contraction only: NaN and inf keep their IEEE meaning
_FM_RED = {"contract", "reassoc"}  # plain sums may be reordered (vectorized)


# --------------------------------------------------------------------- bit casts
@intrinsic
def _bits_to_f32(typingctx, x):  # pragma: no cover - compiled
    """The float32 whose bits are the low 32 bits of integer ``x``."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if x.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif x.bitwidth < 32:
            v = builder.sext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(x), codegen


@intrinsic
def _f32_to_bits(typingctx, x):  # pragma: no cover - compiled
    """The int32 whose bits are those of float32 ``x``."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(x), codegen


# --------------------------------------------------------------------- row helpers
@numba.njit(cache=True, fastmath=_FM)
def _exp_sub_row(s, r, ncol, m, precise):  # pragma: no cover - compiled
    """``s[r, c] = exp(s[r, c] - m)`` in place for ``c < ncol``.

    ``-inf`` gives exactly 0 and NaN stays NaN. ``precise`` uses ``math.exp``
    (the float64 path); otherwise the vectorizable float32 Cephes polynomial.
    """
    if precise:
        for c in range(ncol):
            s[r, c] = math.exp(s[r, c] - m)
        return
    F = np.float32
    mf = F(m)
    for c in range(ncol):
        x = F(s[r, c]) - mf
        xc = x if x > F(-87.0) else F(-87.0)
        nf = np.floor(xc * F(_LOG2E) + F(0.5))
        rr = xc - nf * F(0.693359375) - nf * F(-2.12194440e-4)
        z = rr * rr
        y = (((((F(1.9875691500e-4) * rr + F(1.3981999507e-3)) * rr + F(8.3334519073e-3)) * rr
               + F(4.1665795894e-2)) * rr + F(1.6666665459e-1)) * rr + F(5.0000001201e-1)) * z
        y = (y + rr + F(1.0)) * _bits_to_f32((np.int32(nf) + 127) << 23)
        s[r, c] = y if x >= F(-87.0) else (x if x != x else F(0.0))


def _row_max(s, r, ncol, m):  # pragma: no cover - replaced by the overload below
    """Max of ``m`` and ``s[r, :ncol]``; a NaN in the row makes it NaN."""
    raise NotImplementedError


def _row_max_f32(s, r, ncol, m):  # pragma: no cover - compiled
    best = np.int32(-2147483648)
    for c in range(ncol):
        b = _f32_to_bits(s[r, c])
        key = b ^ ((b >> 31) & np.int32(0x7FFFFFFF))
        best = key if key > best else best
    x = _bits_to_f32(best ^ ((best >> 31) & np.int32(0x7FFFFFFF)))
    return x if (x > m or x != x) else m


def _row_max_any(s, r, ncol, m):  # pragma: no cover - compiled
    for c in range(ncol):
        x = s[r, c]
        if x > m or x != x:
            m = x
    return m


@overload(_row_max, jit_options={"cache": True})
def _row_max_impl(s, r, ncol, m):  # pragma: no cover - typing
    return _row_max_f32 if s.dtype == types.float32 else _row_max_any


@numba.njit(cache=True, fastmath=_FM_RED)
def _row_sum(s, r, ncol):  # pragma: no cover - compiled
    tot = s.dtype.type(0.0)
    for c in range(ncol):
        tot += s[r, c]
    return tot


@numba.njit(cache=True)
def _mask_tile(s, r0, nrow, c0, ncol, masks, mi):  # pragma: no cover - compiled
    """``-inf`` where partial tile ``mi`` (at rows ``r0..``, columns ``c0..`` of ``s``) is unset."""
    W = masks.shape[2]
    ninf = s.dtype.type(-np.inf)
    for r in range(nrow):
        for w in range(W):
            bits = masks[mi, r, w]
            lo = w * 64
            hi = min(ncol, lo + 64)
            for c in range(lo, hi):
                keep = (bits >> np.uint64(c - lo)) & np.uint64(1)
                s[r0 + r, c0 + c] = s[r0 + r, c0 + c] if keep else ninf


@numba.njit(cache=True)
def _mask_tile_t(st, c0, ncol, nrow, masks, mi):  # pragma: no cover - compiled
    """``-inf`` where partial tile ``mi`` is unset, in transposed scores: tile
    column ``c`` (a key) is row ``c0 + c`` of ``st``, tile row ``r`` its column ``r``."""
    W = masks.shape[2]
    ninf = st.dtype.type(-np.inf)
    for w in range(W):
        lo = w * 64
        hi = min(ncol, lo + 64)
        for c in range(lo, hi):
            sh = np.uint64(c - lo)
            row = st[c0 + c]
            for r in range(nrow):  # contiguous in st and in masks[mi, :, w] (W = 1)
                keep = (masks[mi, r, w] >> sh) & np.uint64(1)
                row[r] = row[r] if keep else ninf


@numba.njit(cache=True, fastmath=_FM)
def _softmax_cols(st, nk, rows, mrow, cmax, msub, csum, precise):  # pragma: no cover - compiled
    """Online-softmax step on transposed scores ``st`` (``nk`` keys x ``rows``
    queries), vectorized across the queries: ``cmax`` = max of ``mrow`` and each
    column (NaN if the column has one), ``st = exp(st - cmax)`` (0 for a column
    whose max is ``-inf``), ``csum`` = the column sums."""
    F = st.dtype.type
    ninf = F(-np.inf)
    for r in range(rows):
        cmax[r] = mrow[r]
    for j in range(nk):
        for r in range(rows):
            x = st[j, r]
            m = cmax[r]
            cmax[r] = x if (x > m or x != x) else m
    for r in range(rows):
        msub[r] = cmax[r] if cmax[r] != ninf else F(0.0)
        csum[r] = F(0.0)
    if precise:
        for j in range(nk):
            for r in range(rows):
                y = math.exp(st[j, r] - msub[r])
                st[j, r] = y
                csum[r] += y
        return
    G = np.float32
    for j in range(nk):
        for r in range(rows):
            x = G(st[j, r]) - G(msub[r])
            xc = x if x > G(-87.0) else G(-87.0)
            nf = np.floor(xc * G(_LOG2E) + G(0.5))
            rr = xc - nf * G(0.693359375) - nf * G(-2.12194440e-4)
            z = rr * rr
            y = (((((G(1.9875691500e-4) * rr + G(1.3981999507e-3)) * rr
                    + G(8.3334519073e-3)) * rr + G(4.1665795894e-2)) * rr
                  + G(1.6666665459e-1)) * rr + G(5.0000001201e-1)) * z
            y = (y + rr + G(1.0)) * _bits_to_f32((np.int32(nf) + 127) << 23)
            y = y if x >= G(-87.0) else (x if x != x else G(0.0))
            st[j, r] = y
            csum[r] += y


# --------------------------------------------------------------------- forward
@numba.njit(cache=True, fastmath=_FM)
def _qblock(q2, kp1, vp1, o2, l1, base, n, p, I, scale, qperm, tile_ptr, tile_col,
            tile_mask, masks, block, chunk, precise, qt, kbuf, vbuf, sbuf, acc, pv, mrow,
            lrow, cmax, msub, csum):  # pragma: no cover - compiled
    """Query block ``I`` of piece ``p`` for one (batch, head), whose rows are
    ``base .. base + n`` of the flattened arrays: online softmax over chunks of
    tiles, then an exact log-sum-exp merge into ``o2`` and ``l1``.

    ``kp1``, ``vp1``: the keys and values already in the piece's key order,
    flattened; a chunk of consecutive key blocks is used in place, others are
    copied into ``kbuf``, ``vbuf``."""
    d = q2.shape[1]
    nb = (n + block - 1) // block
    ninf = -np.inf
    t0 = tile_ptr[p * nb + I]
    t1 = tile_ptr[p * nb + I + 1]
    if t0 == t1:
        return
    rows = min(block, n - I * block)
    qT = qt[: d * rows].reshape((d, rows))  # transposed: scores are keys x queries
    for r in range(rows):
        src = base + qperm[p, I * block + r]
        for c in range(d):
            qT[c, r] = q2[src, c] * scale
            acc[r, c] = 0.0
        mrow[r] = ninf
        lrow[r] = 0.0
    pvv = pv[: rows * d].reshape((rows, d))
    for c0 in range(t0, t1, chunk):
        c1 = min(t1, c0 + chunk)
        J0 = tile_col[c0]
        run = True
        for t in range(c0 + 1, c1):
            if tile_col[t] != J0 + (t - c0):
                run = False
        if run:
            lo = (base + J0 * block) * d
            nk = min(n, (J0 + c1 - c0) * block) - J0 * block
            kc = kp1[lo: lo + nk * d].reshape((nk, d))
            vc = vp1[lo: lo + nk * d].reshape((nk, d))
        else:
            nk = 0
            for t in range(c0, c1):
                J = tile_col[t]
                cols = min(block, n - J * block)
                lo = (base + J * block) * d
                kbuf[nk * d: (nk + cols) * d] = kp1[lo: lo + cols * d]
                vbuf[nk * d: (nk + cols) * d] = vp1[lo: lo + cols * d]
                nk += cols
            kc = kbuf[: nk * d].reshape((nk, d))
            vc = vbuf[: nk * d].reshape((nk, d))
        st = sbuf[: nk * rows].reshape((nk, rows))
        np.dot(kc, qT, st)
        off = 0
        for t in range(c0, c1):
            cols = min(block, n - tile_col[t] * block)
            if tile_mask[t] >= 0:
                _mask_tile_t(st, off, cols, rows, masks, tile_mask[t])
            off += cols
        _softmax_cols(st, nk, rows, mrow, cmax, msub, csum, precise)
        np.dot(st.T, vc, pvv)
        for r in range(rows):
            m = cmax[r]
            if m == ninf:
                continue
            alpha = math.exp(mrow[r] - m) if mrow[r] != ninf else 0.0
            lrow[r] = lrow[r] * alpha + csum[r]
            mrow[r] = m
            for c in range(d):
                acc[r, c] = acc[r, c] * alpha + pvv[r, c]
    for r in range(rows):
        if mrow[r] == ninf or lrow[r] == 0.0:
            continue  # no key of this piece in this row
        i = base + qperm[p, I * block + r]
        lp = mrow[r] + math.log(lrow[r])
        inv = 1.0 / lrow[r]
        old = l1[i]
        if old == ninf:
            for c in range(d):
                o2[i, c] = acc[r, c] * inv
            l1[i] = lp
        else:
            top = max(old, lp)
            new = top + math.log(math.exp(old - top) + math.exp(lp - top))
            a = math.exp(old - new)
            e = math.exp(lp - new) * inv
            for c in range(d):
                o2[i, c] = o2[i, c] * a + acc[r, c] * e
            l1[i] = new


@numba.njit(parallel=True, cache=True)
def _permute_rows(x2, perm, p, BH, out1):  # pragma: no cover - compiled
    """``out1`` (flattened ``(BH*n, d)``): the rows of every (batch, head) of ``x2``
    in the order ``perm[p]``."""
    d = x2.shape[1]
    n = perm.shape[1]
    R = 512  # rows per work item (the loop may be handed out in small chunks)
    for u in prange((BH * n + R - 1) // R):
        for w in range(u * R, min(BH * n, (u + 1) * R)):
            src = (w // n) * n + perm[p, w % n]
            out1[w * d: (w + 1) * d] = x2[src]


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _forward_piece(q2, kp1, vp1, o2, l1, BH, H, scale, G, g, p, qperm, tile_ptr,
                   tile_col, tile_mask, masks, block, chunk, seg,
                   precise):  # pragma: no cover - compiled
    """Piece ``p`` (softmax group ``g``) of every (batch, head) whose group is ``g``."""
    d = q2.shape[1]
    n = q2.shape[0] // BH
    nb = (n + block - 1) // block
    dt = q2.dtype
    nseg = (nb + seg - 1) // seg  # work items: (batch x head, run of `seg` query blocks)
    for w in prange(BH * nseg):
        bh = w // nseg
        if (bh % H) % G != g:
            continue
        qt = np.empty(block * d, dt)
        kbuf = np.empty(chunk * block * d, dt)
        vbuf = np.empty(chunk * block * d, dt)
        sbuf = np.empty(block * chunk * block, dt)
        acc = np.empty((block, d), dt)
        pv = np.empty(block * d, dt)
        mrow = np.empty(block, dt)
        lrow = np.empty(block, dt)
        cmax = np.empty(block, dt)
        msub = np.empty(block, dt)
        csum = np.empty(block, dt)
        I0 = (w % nseg) * seg
        for I in range(I0, min(nb, I0 + seg)):
            _qblock(q2, kp1, vp1, o2, l1, bh * n, n, p, I, scale, qperm, tile_ptr,
                    tile_col, tile_mask, masks, block, chunk, precise,
                    qt, kbuf, vbuf, sbuf, acc, pv, mrow, lrow, cmax, msub, csum)


def _forward(q2, k2, v2, o2, l1, BH, H, scale, G, piece_group, qperm, kperm, tile_ptr,
             tile_col, tile_mask, masks, block, chunk, seg, precise):
    """``q2, k2, v2, o2``: ``(B*H*n, d)``; ``l1``: ``(B*H*n,)``; head ``h`` uses group
    ``h % G``. Keys and values are put in each piece's key order once (one buffer
    pair reused by the pieces), so that the tiles read contiguous rows."""
    n = q2.shape[0] // BH
    l1[:] = -np.inf
    o2[:] = 0.0
    kp1 = vp1 = None
    ident = np.arange(n, dtype=kperm.dtype)
    for p in range(piece_group.size):
        if np.array_equal(kperm[p], ident):
            kq, vq = k2.reshape(-1), v2.reshape(-1)
        else:
            if kp1 is None:
                kp1, vp1 = np.empty(k2.size, k2.dtype), np.empty(v2.size, v2.dtype)
            _permute_rows(k2, kperm, p, BH, kp1)
            _permute_rows(v2, kperm, p, BH, vp1)
            kq, vq = kp1, vp1
        _forward_piece(q2, kq, vq, o2, l1, BH, H, scale, G, int(piece_group[p]), p, qperm,
                       tile_ptr, tile_col, tile_mask, masks, block, chunk, seg, precise)


# --------------------------------------------------------------------- backward
@numba.njit(cache=True, fastmath=_FM)
def _kblock(q2, k2, v2, do2, l1, delta, dq, dk, dv, base, n, p, J, scale, qperm, kperm,
            col_ptr, col_tile, tile_row, tile_mask, masks, block, chunk, precise, kc, vc, qc, doc, lc,
            dc, sbuf, dpbuf, dkacc, dvacc, dqc, rowsrc):  # pragma: no cover - compiled
    """Key block ``J`` of piece ``p`` for one (batch, head): dk, dv of its keys and the
    dq contributions of every query row of its tiles, from the saved log-sum-exp."""
    d = q2.shape[1]
    nb = (n + block - 1) // block
    ninf = -np.inf
    u0 = col_ptr[p * nb + J]
    u1 = col_ptr[p * nb + J + 1]
    if u0 == u1:
        return
    cols = min(block, n - J * block)
    kv = kc[: cols * d].reshape((cols, d))
    vv = vc[: cols * d].reshape((cols, d))
    dka = dkacc[: cols * d].reshape((cols, d))
    dva = dvacc[: cols * d].reshape((cols, d))
    for x in range(cols):
        src = base + kperm[p, J * block + x]
        for c in range(d):
            kv[x, c] = k2[src, c]
            vv[x, c] = v2[src, c]
            dka[x, c] = 0.0
            dva[x, c] = 0.0
    for a0 in range(u0, u1, chunk):
        a1 = min(u1, a0 + chunk)
        m = 0
        for a in range(a0, a1):
            I = tile_row[col_tile[a]]
            rows = min(block, n - I * block)
            for r in range(rows):
                src = base + qperm[p, I * block + r]
                rowsrc[m + r] = src
                for c in range(d):
                    qc[(m + r) * d + c] = q2[src, c] * scale
                    doc[(m + r) * d + c] = do2[src, c]
                lc[m + r] = l1[src]
                dc[m + r] = delta[src - base]
            m += rows
        qv = qc[: m * d].reshape((m, d))
        dov = doc[: m * d].reshape((m, d))
        s = sbuf[: m * cols].reshape((m, cols))
        dp = dpbuf[: m * cols].reshape((m, cols))
        np.dot(qv, kv.T, s)
        off = 0
        for a in range(a0, a1):
            t = col_tile[a]
            rows = min(block, n - tile_row[t] * block)
            mi = tile_mask[t]
            if mi >= 0:
                _mask_tile(s, off, rows, 0, cols, masks, mi)
            off += rows
        for r in range(m):
            if lc[r] == ninf:
                for c in range(cols):
                    s[r, c] = 0.0
            else:
                _exp_sub_row(s, r, cols, lc[r], precise)
        # s now holds P; dv += P^T dO, dP = dO V^T, dS = P (dP - delta)
        np.dot(s.T, dov, dqc[: cols * d].reshape((cols, d)))
        tmp = dqc[: cols * d].reshape((cols, d))
        for x in range(cols):
            for c in range(d):
                dva[x, c] += tmp[x, c]
        np.dot(dov, vv.T, dp)
        for r in range(m):
            dr = dc[r]
            for c in range(cols):
                s[r, c] = s[r, c] * (dp[r, c] - dr)
        # dk += dS^T (q * scale); dq += scale * dS K
        np.dot(s.T, qv, tmp)
        for x in range(cols):
            for c in range(d):
                dka[x, c] += tmp[x, c]
        dqv = dqc[: m * d].reshape((m, d))
        np.dot(s, kv, dqv)
        for r in range(m):
            dst = rowsrc[r]
            for c in range(d):
                dq[dst, c] += dqv[r, c] * scale
    for x in range(cols):
        dst = base + kperm[p, J * block + x]
        for c in range(d):
            dk[dst, c] += dka[x, c]
            dv[dst, c] += dva[x, c]


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _backward(q2, k2, v2, o2, do2, l1, dq, dk, dv, BH, H, scale, G, piece_group, qperm, kperm,
              col_ptr, col_tile, tile_row, tile_mask, masks, block, chunk,
              precise):  # pragma: no cover - compiled
    d = q2.shape[1]
    n = q2.shape[0] // BH
    nb = (n + block - 1) // block
    P = piece_group.size
    dt = q2.dtype
    for bh in prange(BH):
        base = bh * n
        g = (bh % H) % G
        dl = np.empty(n, dt)
        for i in range(n):
            acc = 0.0
            for c in range(d):
                acc += do2[base + i, c] * o2[base + i, c]
            dl[i] = acc
            for c in range(d):
                dq[base + i, c] = 0.0
                dk[base + i, c] = 0.0
                dv[base + i, c] = 0.0
        kc = np.empty(block * d, dt)
        vc = np.empty(block * d, dt)
        qc = np.empty(chunk * block * d, dt)
        doc = np.empty(chunk * block * d, dt)
        lc = np.empty(chunk * block, dt)
        dc = np.empty(chunk * block, dt)
        sbuf = np.empty(chunk * block * block, dt)
        dpbuf = np.empty(chunk * block * block, dt)
        dkacc = np.empty(block * d, dt)
        dvacc = np.empty(block * d, dt)
        dqc = np.empty(chunk * block * d, dt)
        rowsrc = np.empty(chunk * block, np.int64)
        for p in range(P):
            if piece_group[p] != g:
                continue
            for J in range(nb):
                _kblock(q2, k2, v2, do2, l1, dl, dq, dk, dv, base, n, p, J, scale, qperm,
                        kperm, col_ptr, col_tile, tile_row, tile_mask, masks, block, chunk,
                        precise, kc, vc, qc, doc, lc, dc, sbuf, dpbuf, dkacc, dvacc, dqc,
                        rowsrc)


# --------------------------------------------------------------------- BLAS threads
def _openblas_controls() -> list[tuple]:
    """``(set, get)`` thread-count functions of every OpenBLAS loaded in this process."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return found
    for path in sorted(paths):
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("", "64_"):
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                    found.append((setter, getter))
                    break
            else:
                continue
            break
    return found


_CONTROLS: list[tuple] | None = None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Hold every loaded OpenBLAS to one thread, then restore its setting.

    The kernels call BLAS from each of their own threads; a multi-threaded BLAS
    inside would oversubscribe the cores (and OpenBLAS warns about OpenMP loops).

    Examples
    --------
    >>> with single_threaded_blas():
    ...     pass
    """
    global _CONTROLS
    import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls this BLAS)

    if _CONTROLS is None:
        _CONTROLS = _openblas_controls()
    saved = [(setter, getter()) for setter, getter in _CONTROLS]
    for setter, _ in saved:
        setter(1)
    try:
        yield
    finally:
        for setter, old in saved:
            setter(old)


_SMALL_FLOPS = 5e7  # below this (about a millisecond), one thread beats waking up more


@contextlib.contextmanager
def _threads_for(flops: float) -> Iterator[None]:
    """Run small problems on one thread (a parallel region costs more than they do);
    larger ones hand out loop iterations in small chunks, so that a thread slowed down
    (by uneven rows, or by a busy machine) does not hold the others up."""
    before = numba.get_num_threads()
    chunk = numba.get_parallel_chunksize()
    if flops < _SMALL_FLOPS:
        numba.set_num_threads(1)
    else:
        numba.set_parallel_chunksize(2)
    try:
        yield
    finally:
        numba.set_num_threads(before)
        numba.set_parallel_chunksize(chunk)


# --------------------------------------------------------------------- wrappers
def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, plan, *, scale: float,
            chunk: int = _CHUNK, seg: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Forward kernel on C-contiguous float32 or float64 ``(B, H, n, d)`` arrays.

    Inputs are assumed validated (:func:`sparse_patterns.kernels.attention` does it).

    Returns
    -------
    out : numpy.ndarray
        Like ``q``. A row with no keys is 0.
    lse : numpy.ndarray
        ``(B, H, n)`` in ``q``'s dtype: the natural-log log-sum-exp of each row's
        scaled scores; ``-inf`` for a row with no keys.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 16, stride=4)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 8))
    >>> o, lse = forward(x, x, x, sps.plan(pat, block=4), scale=0.35)
    >>> o.shape, lse.dtype
    ((1, 2, 16, 8), dtype('float64'))
    """
    B, H, n, d = q.shape
    out = np.empty_like(q)
    lse = np.empty(q.shape[:3], dtype=q.dtype)
    with single_threaded_blas(), _threads_for(plan.flops(B, H, d)[1]):
        _forward(_flat(q), _flat(k), _flat(v), _flat(out), lse.reshape(-1), B * H, H,
                 q.dtype.type(scale), plan.num_groups, plan.piece_group, plan.qperm,
                 plan.kperm, plan.tile_ptr, plan.tile_col, plan.tile_mask, plan.masks,
                 plan.block, int(chunk), int(seg), q.dtype == np.float64)
    return out, lse


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
             do: np.ndarray, plan, *, scale: float,
             chunk: int = _CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` recomputed from the saved ``lse`` (no ``n x n`` storage).

    All arrays C-contiguous, one float dtype; ``lse`` ``(B, H, n)`` as returned
    by :func:`forward`.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pl = sps.plan(sps.make("strided", 16, stride=4), block=4)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 8))
    >>> o, lse = forward(x, x, x, pl, scale=0.35)
    >>> [g.shape for g in backward(x, x, x, o, lse, np.ones_like(o), pl, scale=0.35)]
    [(1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8)]
    """
    B, H, n, d = q.shape
    dq, dk, dv = np.empty_like(q), np.empty_like(q), np.empty_like(q)
    col_ptr, col_tile = plan.column_index()
    tile_row = plan.tile_rows()
    with single_threaded_blas(), _threads_for(2.5 * plan.flops(B, H, d)[1]):
        _backward(_flat(q), _flat(k), _flat(v), _flat(o), _flat(do), lse.reshape(-1),
                  _flat(dq), _flat(dk), _flat(dv), B * H, H, q.dtype.type(scale),
                  plan.num_groups, plan.piece_group, plan.qperm, plan.kperm, col_ptr,
                  col_tile, tile_row, plan.tile_mask, plan.masks, plan.block, int(chunk),
                  q.dtype == np.float64)
    return dq, dk, dv
