"""The forward of the CPU kernel: fused sparse attention over an ExecutionPlan, one
online softmax per token continued across the pieces of its softmax group.

The pieces of one softmax group continue a single online softmax per
token (running max ``m``, running sum ``l``, unnormalized output), so no
log-sum-exp merge is needed between them: the first piece of a group starts the
state, the last one normalizes it into the output; in between, the unnormalized
output rows live in the output's own rows. The output and the backward's gradients
are arrays recycled by the calling thread once nothing references them
(:func:`._pool._buffer`), not new pages each call. In parallel over (batch x head, run of
query blocks), the scores of a query tile against a chunk of key tiles are
computed transposed (keys x queries), the partial tiles masked, the online softmax
updated with loops vectorized across the queries, and ``P V`` added into the
tile's output rows. A piece whose blocks are not runs of consecutive tokens (a
``residue(s)`` order) has each work item copy its keys, values and softmax state
into buffers of its own, one array at a time in the order of a per-plan schedule
(:func:`._schedule._copy_orders`: runs of grid rows, class by class), its queries read
where they are into each block's ``Q^T``; if a work item's keys span much more than its
queries (summary keys put first), the used key blocks are put in the piece's order once
per call instead.
Two consecutive pieces of a group with the same query order that copy nothing (fixed's
blocks and its summary keys) run block by block in one pass (:func:`_forward_pair`),
so that a block's state passes from one to the other in the cache; pieces that neither
pair nor reorder (strided's residue classes, then its window) run over every head at
once, a thread taking a head through both (:func:`_forward_two`), a work item's state
stored with non-temporal stores. While a block or work item computes, it asks for the
next one's rows (software prefetch, a hint that changes no result). Nothing of size
``n x n`` is ever allocated.

A query block's work is :mod:`._forward_block`'s (:func:`._forward_block._qblock`);
this module holds the parallel loops that hand out the blocks, the order of the pieces
and the entry points. The fused 32-token tile passes are :mod:`._llvm_fwd`'s, the
softmax loops of other tiles :mod:`._softmax`'s, whole-array row moves :mod:`._rows`'s,
the matrix products :mod:`._blas`'s, and bf16 inputs run here where :mod:`._bf16` says."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange
from numba.np.linalg import ensure_blas

from ._bf16 import _check_products
from ._blas import _threads_for, single_threaded_blas
from ._convert import _narrow16
from ._forward_block import FIRST, LAST, PREFETCH, STATE_WORDS, _qblock
from ._llvm import (
    _BLOCK,
    _FM,
    _copy,
    _copy_nt,
    _prefetch,
    _wide,
)
from ._pool import _aligned, _buffer, _thread_buffers, _views
from ._rows import _permute_residue, _permute_rows
from ._schedule import (
    _CHUNK,
    _CHUNK_FUSED,
    _LOCAL_ROWS,
    _NO_MASKS,
    _NO_RANGES,
    _chunk_ranges,
    _forward_steps,
    _group_rows,
    _identity,
    _masks_t,
    _share,
    _state_words,
)

__all__ = ["forward", "forward_bf16"]


@numba.njit(cache=True)
def _item_buffers(n, block, chunk, d, T, span, seg, sw, q1, o1, sws, local):  # pragma: no cover - compiled
    """What the work items of a piece (:func:`_piece_item`) share, allocated once a call:
    the identity orders of a copying item's buffers (``local``: the identity permutation,
    read-only as the plan's orders are), each thread's buffers (on cache lines,
    not per work item; each thread's slices too where ``block`` is a multiple of 16), those
    of ``seg`` query blocks and ``span`` key blocks where ``span > 0``, each thread's scratch
    row of words (``sw == 1``), and whether a state row is stored as whole lines."""
    nb = (n + block - 1) // block
    lstart = np.arange(nb, dtype=np.int64) * block
    lstep = np.ones(nb, dtype=np.int64)
    bufs = _thread_buffers(T, block, chunk, d, q1)
    nkl = span * block if span > 0 else 0
    nql = seg * block if span > 0 else 0
    wkl = _aligned(T * 2 * nkl * d, q1).reshape((T, 2, nkl * d))
    wol = _aligned(T * nql * d, q1).reshape((T, nql * d))
    wml = _aligned(T * 2 * nql, q1).reshape((T, 2, nql))
    # a work item's state goes back to rows of ``o1`` scattered in runs of a few, which
    # the next piece reads from memory either way: where each row is whole cache lines,
    # stored without reading them first (non-temporal stores)
    whole_lines = (d * o1.itemsize) % 64 == 0 and o1.ctypes.data % 64 == 0
    dpad = (d + 31) // 32 * 32
    wsw = _aligned(T * dpad if sw == 1 else 0, sws)  # each thread's scratch row of words
    if sw == 1:
        whole_lines = (d * sws.itemsize) % 64 == 0 and sws.ctypes.data % 64 == 0
    return bufs, (local, lstart, lstep, wkl, wol, wml, wsw, whole_lines)


@numba.njit(**_BLOCK)
def _piece_item(w, wend, bh, q1, k1, v1, o1, ow, m1, l1, n, nb, nseg, d, dw, bf, scale, p, how,
                qperm, kperm_used, kstart, kstep, span, copies, tile_ptr, tile_col, tile_mask,
                masks, maskt, ranges, fused, block, chunk, seg, precise, sw, sws, bufs, own,
                tid):  # pragma: no cover - compiled
    """Work item ``w`` of piece ``p`` (:func:`_forward_piece`) on (batch x head) ``bh``, by
    thread ``tid`` with its buffers (``own``: :func:`_item_buffers`); it asks for item
    ``w + 1``'s rows where ``w + 1 < wend``. ``how``: the piece's :data:`FIRST` and
    :data:`LAST` bits (:func:`._forward_block._qblock`)."""
    first, last = (how & FIRST) != 0, (how & LAST) != 0
    local, lstart, lstep, wkl, wol, wml, wsw, whole_lines = own
    qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax, msub, csum, alpha, roff = _views(bufs, tid)
    I0 = (w % nseg) * seg
    I1 = min(nb, I0 + seg)
    base = bh * n
    if span > 0:
        # this work item's keys, values and softmax state, copied into buffers of its
        # own (one array at a time: see _copy_orders); its query rows are transposed
        # into Q^T from where they are, block by block (each row is read once either
        # way: a copy first would only add a pass)
        kx0, kptr, korder, qptr, qorder = copies
        it = w % nseg
        roff[block + chunk:] = -1  # the ring's tiles: vl gets new rows
        x0, kl, vl = kx0[it], wkl[tid, 0], wkl[tid, 1]
        for t in range(kptr[it], kptr[it + 1]):
            x = korder[t]
            _copy(kl, (x - x0) * dw, k1, (base + kperm_used[x]) * dw, dw)
        for t in range(kptr[it], kptr[it + 1]):
            x = korder[t]
            _copy(vl, (x - x0) * dw, v1, (base + kperm_used[x]) * dw, dw)
        y0 = I0 * block
        qp, ol, ml, ll = qperm[p], wol[tid], wml[tid, 0], wml[tid, 1]
        if not first:
            for t in range(qptr[it], qptr[it + 1]):
                y = qorder[t]
                i = base + qp[y]
                _copy(ol, (y - y0) * d, o1, i * d, d)
                ml[y - y0] = m1[i]
                ll[y - y0] = l1[i]
        # the next work item's rows of q, k and v, asked for into L2 (software prefetch,
        # a hint) a share at a time over this one's query blocks
        w2 = w + 1
        pf_on = w2 < wend
        it2 = w2 % nseg
        base2 = (bh + w2 // nseg - w // nseg) * n
        for I in range(I0, I1):
            if pf_on:  # block u of the item's I1 - I0 asks for share u of the rows
                u, nbk = I - I0, I1 - I0
                for t in range(_share(kptr, it2, u, nbk), _share(kptr, it2, u + 1, nbk)):
                    src = (base2 + kperm_used[korder[t]]) * dw
                    _prefetch(k1, src, dw)
                    _prefetch(v1, src, dw)
                for t in range(_share(qptr, it2, u, nbk), _share(qptr, it2, u + 1, nbk)):
                    _prefetch(q1, (base2 + qp[qorder[t]]) * dw, dw)
            _qblock(q1, base, qp, kl, vl, ol, ow[:0], ml, ll, -y0, -x0, n, d, dw, bf, p, I,
                    scale, how, local, local, lstart, lstep, tile_ptr, tile_col, tile_mask,
                    masks, maskt, ranges, fused, block, chunk, precise, qbuf, kbuf, vbuf, sbuf,
                    obuf, mrow, lrow, cmax, msub, csum, alpha, roff, sws)
        for t in range(qptr[it], qptr[it + 1]):
            y = qorder[t]
            i = base + qp[y]
            if last and ow.size > 0:
                _narrow16(ol[(y - y0) * d:], ow[i * d:], 0, d, True)
            elif sw == 1 and whole_lines:  # rounded in a scratch row, stored whole
                dpad = (d + 31) // 32 * 32
                tw = wsw[tid * dpad: tid * dpad + d]
                _narrow16(ol[(y - y0) * d:], tw, 0, d, True)
                _copy_nt(sws, i * d, tw, 0, d)
            elif sw == 1:
                _narrow16(ol[(y - y0) * d:], sws[i * d:], 0, d, True)
            elif whole_lines:
                _copy_nt(o1, i * d, ol, (y - y0) * d, d)
            else:
                _copy(o1, i * d, ol, (y - y0) * d, d)
            m1[i] = ml[y - y0]
            l1[i] = ll[y - y0]
    else:
        how_in_place = how | PREFETCH | (STATE_WORDS if sw == 2 else 0)
        for I in range(I0, I1):
            _qblock(q1, base, qperm[p], k1, v1, o1, ow, m1, l1, base, base, n, d, dw, bf, p, I,
                    scale, how_in_place, qperm[p], kperm_used, kstart, kstep, tile_ptr,
                    tile_col, tile_mask, masks, maskt, ranges, fused, block, chunk, precise,
                    qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax, msub, csum, alpha, roff, sws)


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _forward_piece(q1, k1, v1, o1, ow, m1, l1, BH, H, d, dw, bf, scale, G, g, p, how, qperm,
                   kperm_used, kstart, kstep, span, copies, tile_ptr, tile_col, tile_mask, masks,
                   maskt, ranges, fused, block, chunk, seg, precise, T, sw, local,
                   sws):  # pragma: no cover - compiled
    """Piece ``p`` (softmax group ``g``) of every (batch, head) ``bh < BH`` whose group is
    ``g``; ``how``: its :data:`FIRST` and :data:`LAST` bits.

    ``span > 0``: the key blocks of a work item's tiles lie within ``span``
    consecutive blocks of the piece's order; each work item then copies those key
    and value rows (token ``kperm_used[x]`` for position ``x``), and its softmax state,
    into buffers of its own, in which the piece's order is contiguous; its query rows are
    read where they are, once a block (into ``Q^T``). ``copies`` (from
    :func:`_copy_orders`) lists, per work item, the positions to copy in the order that
    moves rows fastest. ``dw, bf`` and ``ow`` (the output's bf16 words, written where the
    piece is the group's last): as in :func:`._forward_block._qblock`.
    A work item stores its state back with non-temporal stores. ``sw`` (bf16
    inputs, a piece whose state the next one reads from memory; see :func:`_forward`): 1,
    a work item stores its state's output rows as bf16 words to ``sws`` instead of
    ``o1``; 2, the blocks read them from there."""
    _wide()
    n = m1.shape[0] // BH
    nb = (n + block - 1) // block
    nseg = (nb + seg - 1) // seg  # work items: (batch x head, run of `seg` query blocks)
    bufs, own = _item_buffers(n, block, chunk, d, T, span, seg, sw, q1, o1, sws, local)
    for w in prange(BH * nseg):
        bh = w // nseg
        if (bh % H) % G != g:
            continue
        # int64 indices, as _forward_two's (prange's are unsigned): one compiled _piece_item
        _piece_item(np.int64(w), BH * nseg, np.int64(bh), q1, k1, v1, o1, ow, m1, l1, n, nb,
                    nseg, d, dw, bf, scale, p, how, qperm, kperm_used, kstart, kstep, span,
                    copies, tile_ptr, tile_col, tile_mask, masks, maskt, ranges, fused, block,
                    chunk, seg, precise, sw, sws, bufs, own, numba.get_thread_id())


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _forward_two(q1, k1, v1, o1, ow, m1, l1, BH, H, d, dw, bf, scale, G, g, pa, pb, qperm, kpa,
                 kta, ksa, span, copies, sega, kpb, ktb, ksb, segb, tile_ptr, tile_col,
                 tile_mask, masks, maskt, ranges, fused, block, chunk, precise, T, swa, swb,
                 local, sws):  # pragma: no cover - compiled
    """The two pieces ``pa`` (copied: ``span > 0``; it starts the group) then ``pb`` (in
    place; it ends it) of softmax group ``g``, head by head: a thread runs every work item of
    ``pa`` on one (batch, head), then those of ``pb``, what two :func:`_forward_piece` calls
    compute, without the threads waiting for each other between the pieces.
    ``kpa, kta, ksa, sega`` (``kpb, ktb, ksb, segb``): ``pa``'s (``pb``'s) ``kperm_used,
    kstart, kstep`` and query blocks a work item; ``span, copies``: ``pa``'s; ``swa, swb``:
    the pieces' ``sw``. ``pa`` stores its state with non-temporal stores, as
    :func:`_forward_piece` does."""
    _wide()
    n = m1.shape[0] // BH
    nb = (n + block - 1) // block
    na = (nb + sega - 1) // sega
    nbb = (nb + segb - 1) // segb
    bufs, own = _item_buffers(n, block, chunk, d, T, span, sega, swa, q1, o1, sws, local)
    # np.int64: values, not literals, so that these calls compile no _piece_item of their own
    first, last, in_place = np.int64(FIRST), np.int64(LAST), np.int64(0)
    for bh in prange(BH):
        if (bh % H) % G != g:
            continue
        tid = numba.get_thread_id()
        for it in range(na):
            _piece_item(it, na, np.int64(bh), q1, k1, v1, o1, ow, m1, l1, n, nb, na, d, dw, bf,
                        scale, pa, first, qperm, kpa, kta, ksa, span, copies, tile_ptr, tile_col,
                        tile_mask, masks, maskt, ranges, fused, block, chunk, sega, precise, swa,
                        sws, bufs, own, tid)
        for it in range(nbb):
            _piece_item(it, nbb, np.int64(bh), q1, k1, v1, o1, ow, m1, l1, n, nb, nbb, d, dw, bf,
                        scale, pb, last, qperm, kpb, ktb, ksb, in_place, copies, tile_ptr,
                        tile_col, tile_mask, masks, maskt, ranges, fused, block, chunk, segb,
                        precise, swb, sws, bufs, own, tid)


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _forward_pair(q1, ka, va, kb, vb, o1, ow, m1, l1, BH, H, d, dw, bf, scale, G, g, pa, pb,
                  how_a, how_b, qperm, kpa, kta, ksa, kpb, ktb, ksb, tile_ptr, tile_col, tile_mask,
                  masks, maskt, ranges, fused, block, chunk, seg, precise, T):  # pragma: no cover - compiled
    """Pieces ``pa`` then ``pb`` of softmax group ``g``, one after the other on each
    query block, for two pieces with the same query order that copy nothing: what two
    :func:`_forward_piece` calls compute, but a block's state (its rows of ``o1``,
    ``m1``, ``l1``) goes from one piece to the next while still in the cache, instead
    of through memory a whole call later. ``pa`` reads keys and values ``ka, va`` (its
    ``kperm_used, kstart, kstep``: ``kpa, kta, ksa``), ``pb`` reads ``kb, vb`` (``kpb,
    ktb, ksb``); ``how_a``, ``how_b``: the pieces' bits (:data:`FIRST` where ``pa`` starts
    the group, :data:`LAST` where ``pb`` ends it, :data:`PREFETCH`). ``dw, bf``: as in
    :func:`._forward_block._qblock`."""
    _wide()
    n = m1.shape[0] // BH
    nb = (n + block - 1) // block
    nseg = (nb + seg - 1) // seg
    bufs = _thread_buffers(T, block, chunk, d, q1)
    for w in prange(BH * nseg):
        bh = w // nseg
        if (bh % H) % G != g:
            continue
        own = _views(bufs, numba.get_thread_id())
        base = bh * n
        for I in range((w % nseg) * seg, min(nb, (w % nseg + 1) * seg)):
            _qblock(q1, base, qperm[pa], ka, va, o1, ow, m1, l1, base, base, n, d, dw, bf, pa, I,
                    scale, how_a, qperm[pa], kpa, kta, ksa, tile_ptr, tile_col, tile_mask, masks,
                    maskt, ranges, fused, block, chunk, precise, *own, ow[:0])
            _qblock(q1, base, qperm[pb], kb, vb, o1, ow, m1, l1, base, base, n, d, dw, bf, pb, I,
                    scale, how_b, qperm[pb], kpb, ktb, ksb, tile_ptr, tile_col, tile_mask, masks,
                    maskt, ranges, fused, block, chunk, precise, *own, ow[:0])


def _forward(q1, k1, v1, o1, m1, BH, H, d, scale, plan, chunk, seg, precise, bf=0,
             ow=None):
    """``q1, k1, v1, o1``: flattened ``(B*H*n*d,)``; ``m1``: ``(B*H*n,)`` (becomes the
    log-sum-exp); head ``h`` uses group ``h % G``. The pieces of a group continue one
    online softmax per token, in the order of :func:`_forward_steps`; between them the
    unnormalized output lives in ``o1``'s rows, which the last piece normalizes.
    ``bf`` (an int, 0 for float inputs, as the bf16 paths' 1 or 2: one type, one compiled
    kernel): ``q1, k1, v1`` are bf16, as float32 words of two (see :func:`._forward_block._qblock`);
    ``ow`` (with ``bf``): the output's bf16 words, ``o1`` then only holding the state.
    With ``bf``, a copied piece whose state the group's last piece reads next, a whole call
    later (strided's residue classes, then its window; :func:`._schedule._state_words`),
    hands over its rows of the unnormalized output as bf16 words, in ``ow`` itself where
    the output is words: half the bytes through memory, for one more rounding to bf16 of
    that partial sum. The rows are rounded in a scratch row and stored whole, so that
    their lines are not read first."""
    ensure_blas()
    ow = np.empty(0, np.uint16) if ow is None else ow
    n, G, block = plan.n, plan.num_groups, plan.block
    dw = d // 2 if bf else d  # elements of an input row
    groups = [int(g) for g in plan.piece_group]
    if len(set(groups)) < G:  # a group without pieces: its rows have no keys
        H_ = np.arange(BH) % H % G
        empty = ~np.isin(H_, groups)
        (ow if ow.size else o1).reshape(BH, -1)[empty] = 0
        m1.reshape(BH, -1)[empty] = -np.inf
    l1 = np.empty_like(m1)
    kp1 = vp1 = None
    # 32-token float32 tiles: scores, masks and column max in one pass (_scores32)
    fused = block == 32 and not precise
    maskt = plan.memo("cpu.masks_t", lambda: _masks_t(plan)) if fused else _NO_MASKS
    ranges = (plan.memo(("cpu.chunk_ranges", chunk),
                        lambda: _chunk_ranges(plan, _group_rows(maskt), chunk))
              if fused else _NO_RANGES)
    rows = 2 * _LOCAL_ROWS if bf else _LOCAL_ROWS  # a copying item's queries (bf16: half the bytes)
    steps = plan.memo(("cpu.forward", seg, rows), lambda: _forward_steps(plan, seg, rows))
    local = _identity(plan)
    T = numba.get_num_threads()
    sw = _state_words(steps, groups) if bf else [0] * len(steps)
    sws = (ow if ow.size else _buffer((o1.size,), np.uint16)) if 1 in sw else ow[:0]
    # one group of two pieces (the first starts it, the second ends it), the first copied
    # (so neither reordered nor paired), the second in place (strided's residue classes,
    # then its window), every head at once: a thread takes a head through both
    a, b = steps if len(steps) == 2 else (None, None)
    if (a is not None and groups[a[0]] == groups[b[0]] and a[3] > 0 and b[3] == 0
            and b[5] is None):
        _forward_two(q1, k1, v1, o1, ow, m1, l1, BH, H, d, dw, bf, scale, G, groups[a[0]], a[0],
                     b[0], plan.qperm, a[8], a[6], a[7], a[3], a[9], a[4], b[8], b[6], b[7], b[4],
                     plan.tile_ptr, plan.tile_col, plan.tile_mask, plan.masks, maskt, ranges,
                     fused, block, chunk, precise, T, sw[0], sw[1], local, sws)
        return
    pending = None  # a piece held back to run together with the next one (_forward_pair)
    for x, (p, first, last, span, items, reorder, kt, ks, kperm_used, copies,
            pair) in enumerate(steps):
        kq, vq = k1, v1
        if reorder is not None:  # the used key blocks put in the piece's order
            if kp1 is None:  # one buffer pair reused by the pieces
                kp1, vp1 = _buffer(k1.shape, k1.dtype), _buffer(v1.shape, v1.dtype)
            s, rows = reorder
            if s > 0:
                _permute_residue(k1, s, BH, n, dw, kp1)
            else:
                _permute_rows(k1, plan.kperm, p, BH, rows, dw, kp1)
            if s > 0:
                _permute_residue(v1, s, BH, n, dw, vp1)
            else:
                _permute_rows(v1, plan.kperm, p, BH, rows, dw, vp1)
            kq, vq = kp1, vp1
        if pair:
            pending = (p, first, kperm_used, kt, ks, kq, vq)
            continue
        if pending is not None:
            pa, pfirst, kpa, kta, ksa, ka, va = pending
            pending = None
            _forward_pair(q1, ka, va, kq, vq, o1, ow, m1, l1, BH, H, d, dw, bf, scale, G,
                          groups[p], pa, p, FIRST * pfirst | PREFETCH, LAST * last | PREFETCH,
                          plan.qperm, kpa, kta, ksa, kperm_used,
                          kt, ks, plan.tile_ptr, plan.tile_col, plan.tile_mask, plan.masks, maskt,
                          ranges, fused, block, chunk, items, precise, T)
            continue
        _forward_piece(q1, kq, vq, o1, ow, m1, l1, BH, H, d, dw, bf, scale, G, groups[p], p,
                       FIRST * first | LAST * last, plan.qperm, kperm_used, kt, ks, span, copies,
                       plan.tile_ptr, plan.tile_col, plan.tile_mask, plan.masks, maskt, ranges,
                       fused, block, chunk, items, precise, T, sw[x], local, sws)


def forward_bf16(q: np.ndarray, k: np.ndarray, v: np.ndarray, plan, *, scale: float,
                 chunk: int = _CHUNK_FUSED, seg: int = 8, words: bool = False,
                 amx: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`forward` on bf16 inputs with bf16 products: ``q, k, v`` are the bf16
    words (C-contiguous ``int16`` or ``uint16`` ``(B, H, n, d)`` arrays) where
    :func:`._bf16.amx_applies` or :func:`._bf16.bf16_applies`. Scores and ``P V`` are
    ``vdpbf16ps`` or, with ``amx`` (None: where :func:`._bf16.amx_applies`), AMX's
    (:mod:`._amx`): pairs of bf16 products summed in float32, the
    probabilities rounded to bf16 before ``P V`` (as FlashAttention does); the softmax
    statistics, the accumulation and the outputs are float32 (except the partial output
    that a softmax group's pieces hand on through memory, strided's from its residue
    classes to its window: rounded to bf16 once, see :func:`_forward`), or with ``words`` the
    output rounded to bf16 as each block finishes: the last piece keeps a block's rows in
    its thread's scratch rows and rounds them from there, and never writes the float32
    rows (faster than rows through the float32 output, or :func:`._convert.narrow` after).

    Returns
    -------
    out, lse : numpy.ndarray
        float32, as :func:`forward`'s; ``out`` as bf16 words (``uint16``) with ``words``,
        bit for bit :func:`._convert.narrow` of the float32 one.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> from sparse_patterns.kernels.cpu import bf16_applies
    >>> pl = sps.plan(sps.make("strided", 64, stride=8), block=32)
    >>> w = (np.random.default_rng(0).standard_normal((1, 1, 64, 32), np.float32)
    ...      .view(np.uint32) >> 16).astype(np.uint16)  # bf16 words (truncated)
    >>> o, lse = forward_bf16(w, w, w, pl, scale=0.18) if bf16_applies(pl, 32) else (w, w)
    >>> o.shape
    (1, 1, 64, 32)
    """
    B, H, n, d = q.shape
    amx = _check_products(plan, n, d, amx)
    out = _buffer(q.shape, np.float32)
    ow = _buffer(q.shape, np.uint16) if words else None
    lse = np.empty(q.shape[:3], dtype=np.float32)
    w = [np.ascontiguousarray(a).reshape(-1).view(np.float32) for a in (q, k, v)]
    with single_threaded_blas(), _threads_for(plan.flops(B, H, d)[1]):
        _forward(*w, out.reshape(-1), lse.reshape(-1), B * H, H, d, np.float32(scale), plan,
                 int(chunk), int(seg), False, bf=2 if amx else 1,
                 ow=None if ow is None else ow.reshape(-1))
    return (out if ow is None else ow), lse


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, plan, *, scale: float,
            chunk: int | None = None, seg: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Forward kernel on C-contiguous float32 or float64 ``(B, H, n, d)`` arrays.

    Inputs are assumed validated (:func:`sparse_patterns.kernels.attention` does it).
    The output comes from arrays that the calling thread recycles once nothing
    references them (:func:`release_workspace` frees those it keeps).

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
    if chunk is None:  # tiles per step: more where they are fused 32-token float32 tiles
        chunk = _CHUNK_FUSED if plan.block == 32 and q.dtype == np.float32 else _CHUNK
    out = _buffer(q.shape, q.dtype)
    lse = np.empty(q.shape[:3], dtype=q.dtype)
    with single_threaded_blas(), _threads_for(plan.flops(B, H, d)[1]):
        _forward(q.reshape(-1), k.reshape(-1), v.reshape(-1), out.reshape(-1), lse.reshape(-1),
                 B * H, H, d, q.dtype.type(scale), plan, int(chunk), int(seg),
                 q.dtype == np.float64)
    return out, lse

