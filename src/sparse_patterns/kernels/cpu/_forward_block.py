"""One query block of the CPU kernel's forward (:func:`_qblock`): its queries' online
softmax continued over chunks of key tiles, the work that :mod:`._forward`'s parallel
loops (a piece's work items, a pair of pieces block by block) hand each thread.

A block reads its rows where they lie or from a work item's buffers, transposes its
queries into ``Q^T``, runs the fused 32-token passes of :mod:`._llvm_fwd` (or BLAS and
:mod:`._softmax` on other tiles) chunk by chunk, keeps the running max and sum of each
row, and leaves the state in the rows of ``o1``, ``m1``, ``l1`` (or the output, from the
group's last piece).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._blas import _N, _T, _gemm
from ._convert import _narrow16, _widen16
from ._llvm import _BLOCK, _LOG2E, _copy, _prefetch, _transpose16, _wide, _zero
from ._llvm_fwd import (
    _PV_KEYS_BF16,
    _exp32,
    _exp32_bf16,
    _pv32_amx,
    _pv32_dense,
    _pv32_dense_bf16,
    _scores32,
    _scores32_amx,
    _scores32_bf16,
)
from ._pool import _ring_slots
from ._softmax import _exp_rows, _mask_tile_t, _softmax_cols

__all__ = ["FIRST", "LAST", "PREFETCH", "STATE_WORDS", "_qblock", "_no_keys"]

# what a block does beyond its tiles, as the bits of ``_qblock``'s ``how``: one int, not
# four bools, so that a constant at a call site compiles no specialization of its own
FIRST = 1  # the piece starts its softmax group
LAST = 2  # the piece ends it: normalize into the output
PREFETCH = 4  # a block in place asks for the next block's rows
STATE_WORDS = 8  # the state's output rows come as bf16 words from ``sws``


@numba.njit(cache=True, inline="always")
def _no_keys(o1, ow, m1, i, d):  # pragma: no cover - compiled
    """Row ``i`` saw no key: its output is 0 (in ``ow``'s words where there are any) and
    its log-sum-exp ``-inf``."""
    if ow.size > 0:
        _zero(ow, i * d, d)
    else:
        _zero(o1, i * d, d)
    m1[i] = -np.inf


@numba.njit(**_BLOCK)
def _qblock(q1, qbase, qrows, k1, v1, o1, ow, m1, l1, base, kbase, n, d, dw, bf, p, I, scale,
            how, qmap, kperm_used, kstart, kstep, tile_ptr, tile_col, tile_mask, masks, maskt,
            ranges, fused, block, chunk, precise, qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax,
            msub, csum, alpha, roff, sws):  # pragma: no cover - compiled
    """Query block ``I`` of piece ``p`` for one (batch, head): continues the online
    softmax of its queries over chunks of tiles. Position ``x`` of the piece's order
    is row ``qbase + qrows[x]`` of ``q1``, row ``base + qmap[x]`` of the state, and its key
    and value row ``kbase + kperm_used[x]``. Between pieces of one softmax group the state of each
    token lives in ``m1`` (running max), ``l1`` (running sum) and ``o1`` (unnormalized output);
    the first piece of a group (``how`` has :data:`FIRST`) starts it, the last one
    (:data:`LAST`) normalizes ``o1`` into the output in place, ``m1`` becoming the
    log-sum-exp.

    A row of ``q1, k1, v1`` is ``dw`` elements: ``d``, or with ``bf`` (bf16 inputs,
    :func:`._forward.forward_bf16`) ``d / 2`` float32 words each holding two bf16 (``P V`` pairs
    value rows in registers). Every chunk of a bf16 block is whole 32-token tiles (see
    :func:`._bf16.bf16_applies`). :data:`PREFETCH`: a block used in place asks for the next
    block's rows (software prefetch, a hint that changes no result). ``ow`` not empty (with
    :data:`LAST`): the output rows go there as bf16 words, row ``i`` at ``ow[i*d]``, and not
    to ``o1``. :data:`STATE_WORDS`: the state's output rows come as bf16 words from ``sws``
    (row ``i`` at ``sws[i*d]``), not from ``o1`` (see :func:`._forward._forward_piece`)."""
    _wide()
    first, last = (how & FIRST) != 0, (how & LAST) != 0
    pf, swin = (how & PREFETCH) != 0, (how & STATE_WORDS) != 0
    nb = (n + block - 1) // block
    ninf = -np.inf
    unit = 1.0 if precise else _LOG2E  # float32 scores in base-2 units (exp2 is cheaper)
    t0 = tile_ptr[p * nb + I]
    t1 = tile_ptr[p * nb + I + 1]
    if t0 == t1 and not first and not last:
        return
    rows = min(block, n - I * block)
    x0 = I * block
    # in place: where the block's rows are consecutive rows of the state and every
    # chunk is whole 32-token float32 tiles, P V (_pv32_dense) accumulates straight into
    # those rows of o1 and the last piece normalizes them there, with no copy to and
    # from ``obuf``
    inplace = fused and rows == 32 and d % 16 == 0 and t0 < t1
    if inplace:
        for r in range(1, rows):
            if qmap[x0 + r] != qmap[x0] + r:
                inplace = False
                break
        for t in range(t0, t1):
            if (tile_col[t] + 1) * block > n:
                inplace = False
                break
    # the output as words (``ow``): the last piece keeps the rows in ``obuf`` and rounds
    # them from there, so that the float32 rows of ``o1`` are read but never written
    words = inplace and last and ow.size > 0
    oo = (base + qmap[x0]) * d  # the block's first row in o1 (ow) where in place
    # bf16 words in and out of P V itself: where the block is one chunk of one P V key
    # block, which starts the softmax or continues the state's words (``swin``), P V reads
    # O from those words (or not at all) and writes the output's words, no pass before or
    # after (the same bits)
    direct = (words and bf == 1 and d % 32 == 0 and t1 - t0 <= chunk
              and (t1 - t0) * 32 <= _PV_KEYS_BF16 and (first or swin))
    if words:
        ob, ooff = obuf, 0
        if direct:  # P V reads the state's words (or nothing) and writes ow itself
            pass
        elif first:
            _zero(obuf, 0, rows * d)
        elif swin:
            _widen16(sws[oo:], obuf, 0, rows * d, True)
        else:
            _copy(obuf, 0, o1, oo, rows * d)
        # the words' lines, written at the end: asked for now, so that their misses do
        # not stall the stores
        _prefetch(ow, oo, rows * d)
    elif inplace:
        ob, ooff = o1, oo
        if first:
            _zero(o1, ooff, rows * d)
        elif swin:  # the state's bf16 rows widened into the rows of o1
            _widen16(sws[oo:], o1[oo:], 0, rows * d, True)
    else:
        ob, ooff = obuf, 0
    for r in range(rows):
        i = base + qmap[x0 + r]
        if first:
            mrow[r] = ninf
            lrow[r] = 0.0
            if not inplace:
                _zero(obuf, r * d, d)
        else:
            mrow[r] = m1[i]
            lrow[r] = l1[i]
            if not inplace and swin:
                _widen16(sws[i * d:], obuf[r * d:], 0, d, True)
            elif not inplace:
                _copy(obuf, r * d, o1, i * d, d)
    if t0 < t1:  # Q^T (d x rows): the score product is then a fast NN gemm
        if rows % 16 == 0 and d % 16 == 0:
            for r in range(rows):
                roff[r] = (qbase + qrows[x0 + r]) * dw
            for r0 in range(0, rows, 16):
                for c0 in range(0, dw, 16):
                    _transpose16(q1, roff, r0, c0, qbuf, c0 * rows + r0, rows)
        else:
            for r in range(rows):
                src = (qbase + qrows[x0 + r]) * d
                for c in range(d):
                    qbuf[c * rows + r] = q1[src + c]
    # with ``pf``, a block in place asks for the next block's rows (of a piece in token
    # order: the window's) while it computes, in three parts spread over the block: its
    # query rows now, its state after the scores, its last tile's keys and values after
    # P V
    nq, nrows = -1, 0  # the next block's first row and its rows
    if pf and inplace and I + 1 < nb:
        nq = base + qmap[x0 + block]
        nrows = min(block, n - (I + 1) * block)
        _prefetch(q1, (qbase + qrows[x0 + block]) * dw, nrows * dw)
    for c0 in range(t0, t1, chunk):
        c1 = min(t1, c0 + chunk)
        J0 = tile_col[c0]
        run = kstep[J0] == 1
        for t in range(c0 + 1, c1):
            J = tile_col[t]
            if J != J0 + (t - c0) or kstep[J] != 1 or kstart[J] != kstart[J0] + (J - J0) * block:
                run = False
        if run:  # contiguous key rows, used in place
            ka, va, koff = k1, v1, (kbase + kstart[J0]) * dw
            nk = min(n, (J0 + c1 - c0) * block) - J0 * block
        else:
            nk = 0
            for t in range(c0, c1):
                J = tile_col[t]
                cols = min(block, n - J * block)
                for x in range(cols):
                    src = (kbase + kperm_used[J * block + x]) * dw
                    _copy(kbuf, (nk + x) * dw, k1, src, dw)
                    _copy(vbuf, (nk + x) * dw, v1, src, dw)
                nk += cols
            ka, va, koff = kbuf, vbuf, 0
        # scores, transposed: st (nk keys x rows queries, row-major) = scale K Q^T
        st = sbuf[: nk * rows].reshape((nk, rows))
        whole = fused and rows == 32 and nk == 32 * (c1 - c0)  # whole 32 x 32 float32 tiles
        if whole:
            for r in range(rows):
                cmax[r] = mrow[r]
            if bf == 2:  # bf16 products by AMX; P stored as bf16 pairs
                _scores32_amx(ka, koff, qbuf, sbuf, c1 - c0, dw, scale * unit, tile_mask, c0,
                              maskt, cmax)
                _exp32_bf16(sbuf, nk, cmax, csum)
            elif bf:  # bf16 pair products (vdpbf16ps); P stored as bf16 pairs
                _scores32_bf16(ka, koff, qbuf, sbuf, c1 - c0, dw, scale * unit, tile_mask, c0,
                               maskt, cmax)
                _exp32_bf16(sbuf, nk, cmax, csum)
            else:
                _scores32(ka, koff, qbuf, sbuf, c1 - c0, d, scale * unit, tile_mask, c0, maskt,
                          cmax)
                _exp32(sbuf, nk, cmax, csum)
        else:
            _gemm(_N, _N, rows, nk, d, scale * unit, qbuf, 0, rows, ka, koff, d, 0.0, sbuf, 0, rows)
            off = 0
            for t in range(c0, c1):
                cols = min(block, n - tile_col[t] * block)
                if tile_mask[t] >= 0:
                    _mask_tile_t(st, off, cols, rows, masks, tile_mask[t])
                off += cols
            _softmax_cols(st, nk, rows, mrow, cmax, msub, csum, precise)
        if nq >= 0 and c0 == t0:  # the next block's state, the rows it reads or writes
            # (a group's first piece writing words reads no o1 row and writes none; one that
            # is first and last, no l1 entry: nothing to ask for there)
            if swin:
                _prefetch(sws, nq * d, nrows * d)
            elif not (first and words):
                _prefetch(o1, nq * d, nrows * d)
            _prefetch(m1, nq, nrows)
            if not (first and last):
                _prefetch(l1, nq, nrows)
        for r in range(rows):  # alpha = exp(old max - new max); 1 where nothing changes
            alpha[r] = mrow[r] - cmax[r] if cmax[r] != ninf else 0.0
        _exp_rows(alpha, rows, precise)
        for r in range(rows):
            lrow[r] = lrow[r] * alpha[r] + csum[r]
            if cmax[r] != ninf:
                mrow[r] = cmax[r]
        if whole and d % 16 == 0:
            # each group of 4 queries sees key rows lo .. hi of the chunk (from the
            # masks of its first and last tile that hold any of its queries); AMX
            # multiplies whole tiles and needs none
            lo, hi = roff[:8], roff[8:16]
            if bf != 2:
                cptr, crows = ranges  # see _schedule._chunk_ranges
                row = (cptr[p * nb + I] + (c0 - t0) // chunk) * 16
                for g in range(8):
                    lo[g] = crows[row + g]
                    hi[g] = crows[row + 8 + g]
            post = msub  # free in the fused path: 1, or 1 / l after the last chunk
            final = inplace and last and c1 == t1
            for r in range(rows):
                post[r] = 1.0
                if final and lrow[r] != 0.0:
                    post[r] = 1.0 / lrow[r]
            if bf == 2:  # its operands in the unused halves of the value and key buffers
                _ring_slots(roff[block + chunk:], roff[block:], va.ctypes.data // 4 + koff
                            if run else -1, roff[:0], c1 - c0, 32 * dw)
                _pv32_amx(va, koff, sbuf, ob, ooff, alpha, post, nk, d, vbuf[vbuf.size // 2:],
                          kbuf[kbuf.size // 2:], roff[block:], ob, ooff)
            elif direct and first:  # O is 0: not read
                _pv32_dense_bf16(va, koff, sbuf, obuf, 0, alpha, post, lo, hi, d, ow, oo, True)
            elif direct:
                _pv32_dense_bf16(va, koff, sbuf, sws, oo, alpha, post, lo, hi, d, ow, oo, False)
            elif bf:
                _pv32_dense_bf16(va, koff, sbuf, ob, ooff, alpha, post, lo, hi, d, ob, ooff,
                                 first and c0 == t0)
            else:
                _pv32_dense(va, koff, sbuf, ob, ooff, alpha, post, lo, hi, d, ob, ooff,
                            first and c0 == t0)  # in place (O is 0 in a group's first chunk)
            if bf and words and final and not direct:
                _narrow16(obuf, ow[oo:], 0, rows * d, True)
            if nq >= 0 and c0 == t0:  # the keys and values of the next block's last tile
                tn0, tn1 = tile_ptr[p * nb + I + 1], tile_ptr[p * nb + I + 2]
                if tn1 > tn0 and kstep[tile_col[tn1 - 1]] == 1:
                    Jn = tile_col[tn1 - 1]
                    kn = (kbase + kstart[Jn]) * dw
                    cn = min(block, n - Jn * block) * dw
                    _prefetch(k1, kn, cn)
                    _prefetch(v1, kn, cn)
        else:
            for r in range(rows):
                a = alpha[r]
                if a != 1.0:
                    orow = obuf[r * d: (r + 1) * d]  # a view: its loop vectorizes (see _copy)
                    for c in range(d):
                        orow[c] *= a
            # o (rows x d, row-major) += P V, with P^T = st
            _gemm(_N, _T, d, rows, nk, 1.0, va, koff, d, sbuf, 0, rows, 1.0, obuf, 0, d)
    if inplace:  # the rows of o1 hold the state, or the output if ``last``
        for r in range(rows):
            i = base + qmap[x0 + r]
            if not last:
                m1[i] = mrow[r]
                l1[i] = lrow[r]
            elif lrow[r] == 0.0:  # no key in this row (NaN scores leave l NaN, not 0)
                _no_keys(o1, ow, m1, i, d)
            else:
                m1[i] = mrow[r] / unit + math.log(lrow[r])
        return
    for r in range(rows):
        i = base + qmap[x0 + r]
        if last:
            li = lrow[r]
            if li == 0.0:  # no key in this row (NaN scores leave l NaN, not 0)
                _no_keys(o1, ow, m1, i, d)
            else:
                inv = 1.0 / li
                # views: a loop over two offsets into flat arrays is not vectorized
                dst = obuf[r * d: (r + 1) * d] if ow.size > 0 else o1[i * d: (i + 1) * d]
                src = obuf[r * d: (r + 1) * d]
                for c in range(d):
                    dst[c] = src[c] * inv
                if ow.size > 0:
                    _narrow16(obuf[r * d:], ow[i * d:], 0, d, True)
                m1[i] = mrow[r] / unit + math.log(li)
        else:
            _copy(o1, i * d, obuf, r * d, d)
            m1[i] = mrow[r]
            l1[i] = lrow[r]
