"""One key block of the CPU kernel's fused backward (:func:`_kblock32`): float32 (or bf16
words) with 32-token tiles and ``d`` a multiple of 16, the register-blocked passes of
:mod:`._llvm_bwd` on chunks of the block's tiles, what :mod:`._backward`'s loop over a
head's pieces and key blocks hands each thread (see that module for the method)."""

from __future__ import annotations

import numba
import numpy as np

from ._llvm import (
    _BLOCK,
    _LOG2E,
    _copy,
    _copy_nt,
    _pair_rows,
    _prefetch,
    _transpose16,
    _wide,
    _zero,
)
from ._llvm_bwd import (
    _dkv32,
    _dkv32_amx,
    _dkv32_bf16,
    _dq32,
    _dq32_amx,
    _dq32_bf16,
    _dscores32,
    _dscores32_amx,
    _dscores32_bf16,
)
from ._pool import _ring_slots

__all__ = ["_kblock32"]


@numba.njit(**_BLOCK)
def _kblock32(q2, do2, dq, base, qp, qstep, l2, delta, ok, k2, v2, dk, dv, kp, n, p, J, scale,
              tiles, chunk, scratch, qnew, knew, bf, dw, ilo, ihi):  # pragma: no cover - compiled
    """Key block ``J`` of piece ``p`` for float32, 32-token tiles and ``d`` a multiple of
    16 (of 32 for bf16): the register-blocked passes of :mod:`._llvm_bwd` on chunks of
    ``chunk`` tiles. Tuples, unpacked at compile time: ``tiles``, the plan's tiles by key
    block (``col_ptr, col_tile, tile_row, tile_mask, masks, ranges``); ``scratch``, the
    thread's buffers (``kc, qc, doc, dqc, lc, dc, mbits, pbuf, sbuf, dkacc, dvacc, roff,
    roffd, rowsrc, rng, skeys, ring``).

    Keys: position ``x`` of the piece's order is row ``kp[x]`` of ``k2``, ``v2``,
    ``dk``, ``dv``; the block's ``K`` rows (``kc[:32 d]``), ``K^T`` and ``V^T`` are put in
    ``kc`` once (zero-padded to 32 keys), its ``dk`` and ``dv`` accumulated in
    ``dkacc``, ``dvacc`` and added to their rows at the end. Queries: position ``x`` is
    row ``base + qp[x]`` of ``q2``, ``do2``, ``dq``, with its statistics at ``qp[x]`` of
    ``l2`` (the log-sum-exp in base-2 units, 0 for a row without keys), ``delta`` and
    ``ok`` (all ones, or 0 for a row without keys). A chunk's query rows are read in
    place (offsets ``roff``) where every tile's block is 32 consecutive rows
    (``qstep`` 1), else gathered into ``qc``, ``doc`` (zero-padded to 32 rows) with
    ``dq`` added back from ``dqc``. ``ranges``: :func:`._llvm_bwd._tile_ranges`.

    Gradient rows are set on first use, not zeroed in a pass over the whole arrays
    first: a ``dq`` row whose flag ``qnew[qp[x]]`` is set (``qnew`` empty: none is) is
    zeroed just before the chunk that first adds to it (or written by a gathered
    chunk), and a ``dk``, ``dv`` row whose flag ``knew[kp[x]]`` is set is written rather
    than added to, with non-temporal stores where rows are whole cache lines (not read
    from memory first); each flag is cleared then.

    ``bf`` (bf16 inputs, :func:`backward_bf16`): ``q2, do2, k2, v2`` hold bf16 pairs in
    float32 words (``dw = d / 2`` of them a row; ``dw = d`` otherwise); the products are
    ``vdpbf16ps`` (:func:`._llvm_bwd._dscores32_bf16` and the ``_bf16`` passes), ``P``
    and ``dS`` rounded to bf16 between them, ``dS`` by keys in ``skeys``; the
    gradients float32. ``roff`` then counts words, ``roffd`` the float32 ``dq`` rows.
    Only the tiles of query blocks ``ilo <= I < ihi`` are taken. While the block computes,
    it asks for the next key block's rows (software prefetch, a hint that changes no
    result)."""
    _wide()
    col_ptr, col_tile, tile_row, tile_mask, masks, ranges = tiles
    (kc, qc, doc, dqc, lc, dc, mbits, pbuf, sbuf, dkacc, dvacc, roff, roffd, rowsrc, rng, skeys,
     ring) = scratch
    d = dq.shape[1]
    qf, dof, dqf = q2.reshape(q2.size), do2.reshape(do2.size), dq.reshape(dq.size)
    nb = (n + 31) // 32
    u0 = col_ptr[p * nb + J]
    u1 = col_ptr[p * nb + J + 1]
    while u0 < u1 and tile_row[col_tile[u0]] < ilo:  # only the tiles of query blocks
        u0 += 1  # ilo <= I < ihi (a column's tiles are by query block)
    e = u0
    while e < u1 and tile_row[col_tile[e]] < ihi:
        e += 1
    u1 = e
    if u0 == u1:
        return
    full = ranges.shape[0] - 1
    cols = min(32, n - J * 32)
    colbits = np.uint32(0xFFFFFFFF) if cols == 32 else np.uint32((1 << cols) - 1)
    kv = kc[: 32 * d]
    kt = kc[32 * d: 64 * d]  # K^T and V^T (d x 32): row-major score products
    vt = kc[64 * d: 96 * d]
    for x in range(cols):
        src = kp[J * 32 + x]
        if not bf:
            _copy(kv, x * d, k2, src * d, d)
        elif x % 2 == 0:  # key rows by pairs, for dQ += dS K (cols is 32)
            _pair_rows(kv, x * dw, k2, src * dw, kp[J * 32 + x + 1] * dw, dw)
        rowsrc[x] = src * dw
    if cols == 32:
        for x0 in range(0, 32, 16):
            for c0 in range(0, dw, 16):
                _transpose16(k2, rowsrc, x0, c0, kt, c0 * 32 + x0, 32)
                _transpose16(v2, rowsrc, x0, c0, vt, c0 * 32 + x0, 32)
    else:
        _zero(kc, cols * d, (32 - cols) * d)
        _zero(kc, 32 * d, 64 * d)
        for x in range(cols):
            src = kp[J * 32 + x]
            for c in range(d):
                kt[c * 32 + x] = k2[src, c]
                vt[c * 32 + x] = v2[src, c]
    _zero(dkacc, 0, 32 * d)
    _zero(dvacc, 0, 32 * d)
    alpha = np.float32(scale * _LOG2E)
    # the next key block's rows, asked for while this one computes: its keys and values
    # now, the rows of its last tile's queries (q, dO and dq) after this block's first
    # chunk
    nI = -1
    if J + 1 < nb and col_ptr[p * nb + J + 2] > col_ptr[p * nb + J + 1]:
        kf, vf = k2.reshape(k2.size), v2.reshape(v2.size)
        for x in range(min(32, n - (J + 1) * 32)):
            src = kp[(J + 1) * 32 + x] * dw
            _prefetch(kf, src, dw)
            _prefetch(vf, src, dw)
        nI = tile_row[col_tile[col_ptr[p * nb + J + 2] - 1]]
        if nI < ilo or nI >= ihi or qstep[nI] != 1 or (nI + 1) * 32 > n:
            nI = -1  # not in this range of query blocks, or gathered
        elif not 0 <= base + qp[nI * 32] <= q2.shape[0] - 32:
            nI = -1  # past a work item's rows (its buffers hold only those)
    for a0 in range(u0, u1, chunk):
        a1 = min(u1, a0 + chunk)
        nt = a1 - a0
        gather = False
        for a in range(a0, a1):
            I = tile_row[col_tile[a]]
            if qstep[I] != 1 or (I + 1) * 32 > n:
                gather = True
        for a in range(a0, a1):
            t = col_tile[a]
            I = tile_row[t]
            mi = tile_mask[t]
            x0 = (a - a0) * 32
            rows = min(32, n - I * 32)
            if not gather:  # 32 consecutive rows from row base + s0: loops that vectorize
                s0 = qp[I * 32]
                for r in range(32):
                    roff[x0 + r] = (base + s0 + r) * dw
                    roffd[x0 + r] = (base + s0 + r) * d
                    lc[x0 + r] = l2[s0 + r]
                    dc[x0 + r] = delta[s0 + r]
                if qnew.size > 0:
                    for r in range(32):
                        if qnew[s0 + r]:
                            _zero(dqf, (base + s0 + r) * d, d)
                            qnew[s0 + r] = 0
                if mi >= 0:
                    for r in range(32):
                        mbits[x0 + r] = (np.uint32(masks[mi, r, 0] & np.uint64(0xFFFFFFFF))
                                         & colbits & ok[s0 + r])
                else:
                    for r in range(32):
                        mbits[x0 + r] = colbits & ok[s0 + r]
            else:
                for r in range(32):
                    x = x0 + r
                    roff[x] = x * dw
                    roffd[x] = x * d
                    if r >= rows:  # padding of the last block: zero rows, no keys
                        lc[x] = 0.0
                        dc[x] = 0.0
                        mbits[x] = 0
                        _zero(qc, x * dw, dw)
                        _zero(doc, x * dw, dw)
                        continue
                    s = qp[I * 32 + r]
                    bits = (np.uint32(masks[mi, r, 0] & np.uint64(0xFFFFFFFF)) if mi >= 0
                            else np.uint32(0xFFFFFFFF))
                    lc[x] = l2[s]
                    dc[x] = delta[s]
                    mbits[x] = bits & colbits & ok[s]
                    _copy(qc, x * dw, q2, (base + s) * dw, dw)
                    _copy(doc, x * dw, do2, (base + s) * dw, dw)
                    rowsrc[x] = s
            sel = mi if mi >= 0 else full
            for e in range(32):
                rng[x0 + e] = ranges[sel, e]
        if gather:
            qa, doa, dqa = qc, doc, dqc
            _zero(dqc, 0, nt * 32 * d)
        else:
            qa, doa, dqa = qf, dof, dqf
        if bf == 2:  # by AMX; its operands built past dS's rows in skeys
            _dscores32_amx(qa, doa, roff, kt, vt, nt * 32, dw, alpha, lc, dc, mbits,
                           np.float32(scale), pbuf, sbuf, skeys)
            # the query tiles' paired q and dO rows: kept from one key block to the next
            # where the rows are read in place, made again where they are gathered
            slots = ring[chunk:]
            _ring_slots(ring[:chunk], slots, -1 if gather else qa.ctypes.data // 4, roff, nt,
                        16 * d)
            for w in range(2):
                _dkv32_amx(pbuf if w == 0 else sbuf, doa if w == 0 else qa, roff,
                           dvacc if w == 0 else dkacc, nt, d, skeys[chunk * 512:],
                           skeys[chunk * (1024 + 16 * d * w):], slots)
            _dq32_amx(skeys, kv, dqa, roffd, nt, d)
        elif bf:
            _dscores32_bf16(qa, doa, roff, kt, vt, nt * 32, dw, alpha, lc, dc, mbits,
                            np.float32(scale), pbuf, sbuf, skeys)
            for w in range(2):  # q and dO rows interleaved by pairs in registers
                _dkv32_bf16(pbuf if w == 0 else sbuf, doa if w == 0 else qa, roff,
                            dvacc if w == 0 else dkacc, nt, rng, d)
            _dq32_bf16(skeys, kv, dqa, roffd, nt, rng, d)
        else:
            _dscores32(qa, doa, roff, kt, vt, nt * 32, d, alpha, lc, dc, mbits,
                       np.float32(scale), pbuf, sbuf)
            for w in range(2):  # dV += P^T dO, dK += dS^T Q (one call site: compiled once)
                _dkv32(pbuf if w == 0 else sbuf, doa if w == 0 else qa, roff,
                       dvacc if w == 0 else dkacc, nt, rng, d)
            _dq32(sbuf, kv, dqa, roffd, nt, rng, d)
        if nI >= 0 and a0 == u0:  # the next key block's last query rows (``dw = d`` for floats)
            s0 = base + qp[nI * 32]
            _prefetch(qf, s0 * dw, 32 * dw)
            _prefetch(dof, s0 * dw, 32 * dw)
            _prefetch(dqf, s0 * d, 32 * d)
        if gather:
            for a in range(a0, a1):
                x0 = (a - a0) * 32
                for r in range(min(32, n - tile_row[col_tile[a]] * 32)):
                    s = rowsrc[x0 + r]
                    grow, lrow = dq[base + s], dqc[(x0 + r) * d: (x0 + r + 1) * d]
                    if qnew.size > 0 and qnew[s]:
                        qnew[s] = 0
                        for c in range(d):
                            grow[c] = lrow[c]
                    else:
                        for c in range(d):
                            grow[c] += lrow[c]
    # a row's first write goes straight to memory where rows are whole cache lines (the
    # next piece that adds to it reads it from memory either way)
    whole = (d * dk.itemsize) % 64 == 0 and dk.ctypes.data % 64 == 0 and dv.ctypes.data % 64 == 0
    dkf, dvf = dk.reshape(dk.size), dv.reshape(dv.size)
    for x in range(cols):
        j = kp[J * 32 + x]
        krow, vrow = dk[j], dv[j]  # row views: vectorized
        ka, va = dkacc[x * d: (x + 1) * d], dvacc[x * d: (x + 1) * d]
        if knew[j]:
            knew[j] = 0
            if whole:
                _copy_nt(dkf, j * d, dkacc, x * d, d)
                _copy_nt(dvf, j * d, dvacc, x * d, d)
            else:
                for c in range(d):
                    krow[c] = ka[c]
                    vrow[c] = va[c]
        else:
            for c in range(d):
                krow[c] += ka[c]
                vrow[c] += va[c]
