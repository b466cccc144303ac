"""The backward of the CPU kernel: gradients ``(dq, dk, dv)`` over an ExecutionPlan,
recomputed from the forward's saved log-sum-exp, with no ``n x n`` storage.

In parallel over (batch x head), for every piece and key block, it takes the query
rows of a chunk of the block's tiles, accumulates ``dk`` and ``dv`` in tile buffers
and adds ``dq`` into its rows (each thread owns whole heads). A ``residue(s)`` piece
runs in work items (block ranges that its tiles do not leave,
:func:`._schedule._backward_items`): each item's rows are copied once into buffers in
the piece's order, where every block is a run used in place, and its gradients added
back once. The pieces in work items run first (:func:`._schedule._backward_order`):
their first writes of a row store it, and the pieces in token order, whose reads the
hardware prefetcher follows, add to it.

Two implementations of a key block share that frame:

* float32 with 32-token tiles and ``d`` a multiple of 16
  (:func:`._backward_block._kblock32`): fused,
  as the forward is. Three register-blocked passes per chunk of 3 tiles
  (:mod:`._llvm_bwd`): ``S = Q K^T`` and ``dP = dO V^T`` together, with
  ``P = 2**(S log2 e scale - lse log2 e)`` (the forward's exponential, base-2 units),
  the mask and ``dS = scale P (dP - delta)`` applied in registers; then
  ``dV += P^T dO`` and ``dK += dS^T Q`` for 4 keys at a time, and ``dQ += dS K`` for
  4 queries at a time, read and written in ``dq``'s rows, each over only the rows
  (keys) of a partial tile that can be nonzero. Query rows are used in place through
  a table of row offsets where a tile's block is a run of 32 consecutive rows, else
  gathered (zero rows pad the last block); keys and values are read, and ``dk``,
  ``dv`` written, in their rows (a work item copies only q and dO). No BLAS call.
  Gradient rows are set on first use instead of zeroed first, the first ``dk``, ``dv``
  writes are non-temporal, and 16-key halves that no row of a 4-row group sees are
  skipped. While a key block computes it asks for the next one's rows (software
  prefetch, at two points of the block). Key blocks take the query blocks 64 at a time
  (``_QRANGE``: 512 KB of each of q, dO, dq at d = 64), all key blocks for the first 64,
  then the next: a long column (fixed's summary keys) otherwise streams a head's rows
  once per key block.
* bf16 inputs where :func:`._bf16.bf16_applies` (:func:`backward_bf16`): the fused
  path on bf16 products, the ``_bf16`` passes of :mod:`._llvm_bwd` (``P`` and ``dS``
  rounded to bf16 between them, the rows of ``q`` and ``dO`` that ``dV`` and ``dK`` sum
  over interleaved by pairs in registers, the gradients rounded to bf16 as the head
  finishes them; 5 tiles a chunk); where :func:`._bf16.amx_applies`, the products by
  AMX (the ``_amx`` passes: ``P``, ``dS`` and the rows of ``dO`` and ``Q`` put in
  ``tdpbf16ps``'s operand layouts per chunk).
* anything else (float64, the exact path that gradcheck uses; other tile sizes;
  other ``d``): :func:`._backward_blas._kblock`, BLAS ``?gemm`` per chunk of tiles
  (:mod:`._blas`) with the probabilities recomputed between the calls.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ._backward_blas import _kblock
from ._backward_block import _kblock32
from ._bf16 import _check_products
from ._blas import _threads_for, single_threaded_blas
from ._llvm import (
    _FM,
    _copy,
    _wide,
    _zero,
)
from ._llvm_bwd import (
    _tile_ranges,
)
from ._pool import _aligned, _buffer
from ._rows import _delta_bf16, _delta_rows, _narrow_rows, _stats32
from ._schedule import _CHUNK, _backward_items, _backward_order, _block_steps, _finished_blocks

__all__ = ["backward", "backward_bf16"]

_CHUNK32 = 3  # tiles per chunk of the fused float32 path (P and dS, 24 KB, in L1)
# ... of bf16 products (P and dS rounded to bf16: 5 tiles in 20 KB), which takes a strided
# window's whole key block (5 tiles) in one chunk
_CHUNK16 = 5
#: Query blocks per pass of the key blocks over a head's rows (fused path, pieces without
#: work items): 64 blocks of 32 rows are 512 KB of each of q, dO and dq at d = 64.
_QRANGE = 64


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _backward(q2, k2, v2, o2, do2, l1, dq, dk, dv, BH, H, scale, G, piece_group, qperm, kperm,
              col_ptr, col_tile, tile_row, tile_mask, masks, block, chunk, precise, fused,
              ranges, qstart, qstep, item_ptr, items, item_order, item_rows,
              T, bf, qrange, dq16, dk16, dv16, porder):  # pragma: no cover - compiled
    """Every (batch, head) in parallel. A piece with work items (``items[item_ptr[p]:
    item_ptr[p + 1]]``, ranges of its blocks that its tiles do not leave, see
    :func:`_backward_items`) has each item's q, dO, k, v rows (``fused``: q and dO
    rows) and softmax statistics copied into buffers in the piece's order (the
    positions taken in the order ``item_order``, as the forward's copies), its
    gradients accumulated there in place (every block a run; ``fused``: dq, while dk
    and dv go to their rows from each key block) and added back to their rows once;
    the others read (``fused``) or gather (:func:`_kblock`) the query rows of each
    chunk of tiles. ``T``: numba's thread count (one set of item buffers each).
    ``bf``: bf16 inputs as in :func:`._backward_block._kblock32` (``q2, k2, v2, o2, do2``: words).
    ``qrange``: the fused path, over a piece's whole order, runs every key block on
    query blocks ``[r0, r0 + qrange)`` before the next ``r0`` (0: all at once).
    ``dq16``, ``dk16``, ``dv16`` (bf16 inputs; empty: not
    taken): the gradients narrowed to bf16 words (flat), a head's rows as its last piece
    finishes them (:func:`._rows._narrow_rows`) or when it is done; ``dq``, ``dk``, ``dv``
    then hold ``T`` heads' rows, one for each thread, reused from head to head.
    ``porder``: the order in which a head runs the pieces (:func:`._schedule._backward_order`)."""
    d = dq.shape[1]
    n = q2.shape[0] // BH
    nb = (n + block - 1) // block
    # the piece's order inside an item's buffers: position x is row x - x0
    ident = np.arange(n, dtype=qperm.dtype).reshape((1, n))
    istart = (np.arange(nb, dtype=qstart.dtype) * block).reshape((1, nb))
    istep = np.ones((1, nb), dtype=qstep.dtype)
    # item buffers of each thread: q, dO, dq (fused) or q, dO, k, v, dq, dk, dv rows
    A = 3 if fused else 7
    items_ib = _aligned(T * A * item_rows * d, q2).reshape((T, A, item_rows, d))
    ins, grads, words = (q2, k2, v2, o2, do2, l1), (dq, dk, dv), (dq16, dk16, dv16)
    tiles32 = (col_ptr, col_tile, tile_row, tile_mask, masks, ranges)  # (_kblock32's)
    orders = (piece_group, qperm, kperm, qstart, qstep, porder, ident, istart, istep)
    work = (item_ptr, items, item_order, items_ib)
    for bh in prange(BH):  # the loop's body a function: parallel lowering of a small loop
        _backward_head(np.int64(bh), BH, H, G, scale, block, chunk, precise, fused, bf, qrange,
                       ins, grads, words, tiles32, orders, work)


@numba.njit(cache=True, fastmath=_FM)
def _backward_head(bh, BH, H, G, scale, block, chunk, precise, fused, bf, qrange, ins, grads,
                   words, tiles32, orders, work):  # pragma: no cover - compiled
    """(batch x head) ``bh`` of :func:`_backward`, by the calling thread; tuples, unpacked
    at compile time: ``ins`` (``q2, k2, v2, o2, do2, l1``), ``grads`` (``dq, dk, dv``),
    ``words`` (``dq16, dk16, dv16``), ``tiles32`` (``col_ptr, col_tile, tile_row,
    tile_mask, masks, ranges``), ``orders`` (``piece_group, qperm, kperm, qstart, qstep,
    porder`` and the identity order of an item's buffers ``ident, istart, istep``),
    ``work`` (``item_ptr, items, item_order`` and the threads' item buffers)."""
    _wide()
    q2, k2, v2, o2, do2, l1 = ins
    dq, dk, dv = grads
    dq16, dk16, dv16 = words
    col_ptr, col_tile, tile_row, tile_mask, masks, ranges = tiles32
    piece_group, qperm, kperm, qstart, qstep, porder, ident, istart, istep = orders
    item_ptr, items, item_order, items_ib = work
    d = dq.shape[1]
    dw = d // 2 if bf else d
    n = q2.shape[0] // BH
    narrow = dq16.size > 0
    nb = (n + block - 1) // block
    dt = q2.dtype
    R = items_ib.shape[2]
    A = items_ib.shape[1]
    # the head's rows, from row 0 of each array (its gradients: the thread's rows
    # when they are narrowed afterwards)
    h0 = bh * n
    t0 = numba.get_thread_id() * n  # the thread's rows of its scratch arrays
    g0 = t0 if narrow else h0
    hq, hk, hv, ho, hdo = (q2[h0:h0 + n], k2[h0:h0 + n], v2[h0:h0 + n], o2[h0:h0 + n],
                           do2[h0:h0 + n])
    hl1 = l1[h0:h0 + n]
    hdq, hdk, hdv = dq[g0:g0 + n], dk[g0:g0 + n], dv[g0:g0 + n]
    qf, dof, dqf = hq.reshape(hq.size), hdo.reshape(hdo.size), hdq.reshape(hdq.size)
    dkf, dvf = hdk.reshape(hdk.size), hdv.reshape(hdv.size)
    dl = np.empty(n, dt)
    if bf:
        _delta_bf16(dof, ho.reshape(ho.size), n, dw, dl)
    else:
        _delta_rows(hdo, ho, 0, n, dl, precise)
    g = (bh % H) % G
    l2 = np.empty(n if fused else 0, dt)  # the fused path's statistics (see _kblock32)
    ok = np.empty(n if fused else 0, np.uint32)
    _stats32(hl1, 0, 0, n, l2, ok)
    qnew = np.ones(n if fused else 0, np.uint8)  # fused: rows set on first use
    knew = np.ones(n if fused else 0, np.uint8)
    if not fused:
        _zero(dqf, 0, n * d)
        _zero(dkf, 0, n * d)
        _zero(dvf, 0, n * d)
    # buffers of the fused path (float32, 32-token tiles), or of _kblock's BLAS calls
    c32 = chunk * 32 if fused else 1
    kc = _aligned((3 if fused else 2) * block * d, q2)
    vc = _aligned(block * d, q2)
    qc = _aligned(max(chunk * block, c32) * d, q2)
    doc = _aligned(max(chunk * block, c32) * d, q2)
    lc = _aligned(max(chunk * block, c32), q2)
    mbits = np.empty(max(chunk * block, c32), np.uint32)
    dc = _aligned(max(chunk * block, c32), q2)
    sbuf = _aligned(chunk * block * block, q2)
    dpbuf = _aligned(chunk * block * block, q2)
    dkacc = _aligned(block * d, q2)
    dvacc = _aligned(block * d, q2)
    dqc = _aligned(max(chunk * block, c32) * d, q2)
    rowsrc = np.empty(max(chunk * block, c32, block), np.int64)
    roff = np.empty(c32, np.int64)
    roffd = np.empty(c32, np.int64)
    skeys = _aligned((c32 * 16 + (c32 * (16 + d) if bf == 2 else 0)) if bf else 0, q2)
    rng, ring = np.empty(c32, np.int64), np.full(2 * chunk, -1, np.int64)  # ring: AMX's
    scratch32 = (kc, qc, doc, dqc, lc, dc, mbits, sbuf, dpbuf, dkacc, dvacc, roff, roffd,
                 rowsrc, rng, skeys, ring)
    ib = items_ib[numba.get_thread_id()]
    iq = 2 if fused else 4  # where the gradients start
    lq, ldo, ldq = ib[0], ib[1], ib[iq]
    lk, lv, ldk, ldv = ib[2 % A], ib[3 % A], ib[5 % A], ib[6 % A]  # (_kblock only)
    ll = _aligned(R, q2)
    ldl = np.empty(n, dt)
    ll2 = np.empty(n if fused else 0, dt)
    noflags = np.zeros(0, np.uint8)
    lok = np.empty(n if fused else 0, np.uint32)
    # narrowed: the head's last piece, where it runs over ranges of query blocks, rounds
    # the rows each range finishes (while they are in the cache); the others at the end
    last, nd = -1, n if narrow else 0
    for p in porder:
        last = p if piece_group[p] == g else last
    inc = narrow and qrange > 0 and last >= 0 and item_ptr[last + 1] == item_ptr[last]
    qdone, kdone = np.zeros(nd, np.uint8), np.zeros(nd, np.uint8)
    jn = 0  # the last piece's key blocks rounded so far
    for p in porder:
        if piece_group[p] != g:
            continue
        nit = item_ptr[p + 1] - item_ptr[p]
        perm = qperm[p]  # = kperm[p] for a piece with items
        for u in range(max(nit, 1)):  # the piece's work items, or its whole order
            # the head's rows, or an item's (one call site per kernel: compiled once)
            wq, wdo, wdq, wk, wv, wdk, wdv = hq, hdo, hdq, hk, hv, hdk, hdv
            wl1, wl2, wdl, wok, wqnew = hl1, l2, dl, ok, qnew
            wqperm, wkperm, wpp, wstart, wstep = qperm, kperm, p, qstart, qstep
            wqf, wdof, wdqf = qf, dof, dqf
            wbase, J0, J1 = 0, 0, nb
            if nit > 0:
                ring[:chunk] = -1  # the item's rows, new in its buffers
                it = item_ptr[p] + u
                b0, b1, o0 = items[it, 0], items[it, 1], items[it, 2]
                x0 = b0 * block
                x1 = min(n, b1 * block)
                # one array at a time (interleaving them thrashes the L1 sets); fused:
                # keys and values are read, dk and dv added, in their rows
                for a in range(2 if fused else 4):
                    src = qf if a == 0 else (dof if a == 1 else (
                        hk.reshape(hk.size) if a == 2 else hv.reshape(hv.size)))
                    dst = ib[a].reshape(R * d)
                    for t in range(o0, o0 + x1 - x0):
                        x = item_order[t]
                        _copy(dst, (x - x0) * dw, src, perm[x] * dw, dw)
                for t in range(o0, o0 + x1 - x0):
                    x = item_order[t]
                    ll[x - x0] = hl1[perm[x]]
                    ldl[x] = dl[perm[x]]
                _stats32(ll, -x0, x0, x1, ll2, lok)
                _zero(ldq.reshape(R * d), 0, (x1 - x0) * d)
                if not fused:
                    _zero(ldk.reshape(R * d), 0, (x1 - x0) * d)
                    _zero(ldv.reshape(R * d), 0, (x1 - x0) * d)
                wq, wdo, wdq, wbase, J0, J1 = lq, ldo, ldq, -x0, b0, b1
                wl1, wl2, wdl, wok, wqnew = ll, ll2, ldl, lok, noflags
                wqperm, wpp, wstart, wstep = ident, 0, istart, istep
                wqf, wdof, wdqf = lq.reshape(R * d), ldo.reshape(R * d), ldq.reshape(R * d)
                if not fused:
                    wk, wv, wdk, wdv, wkperm = lk, lv, ldk, ldv, ident
            # fused, over the head's whole order: the key blocks take the query blocks
            # ``qrange`` at a time, so that those rows of q, dO and dq stay in the cache
            # from one key block to the next (a long column, fixed's summaries, reads
            # every later row; the head's rows outgrow the cache that 2 threads share)
            nr = qrange if fused and nit == 0 and qrange > 0 else nb
            for r0 in range(0, nb, nr):
                for J in range(J0, J1):
                    if fused:
                        c0, c1 = col_ptr[p * nb + J], col_ptr[p * nb + J + 1]
                        if c0 == c1 or (nr < nb and (tile_row[col_tile[c1 - 1]] < r0 or
                                                     tile_row[col_tile[c0]] >= r0 + nr)):
                            continue  # no tile of this key block in these query blocks
                        _kblock32(wq, wdo, wdq, wbase, wqperm[wpp], wstep[wpp], wl2, wdl,
                                  wok, hk, hv, hdk, hdv, kperm[p], n, p, J, scale, tiles32,
                                  chunk, scratch32, wqnew, knew, bf, dw, r0, r0 + nr)
                    else:
                        _kblock(wq, wk, wv, wdo, wl1, wdl, wdq, wdk, wdv, wbase, n, p, wpp,
                                J, scale, wqperm, wkperm, col_ptr, col_tile, tile_row,
                                tile_mask, masks, block, chunk, precise, kc, vc, qc, doc, lc,
                                mbits, dc, sbuf, dpbuf, dkacc, dvacc, dqc, rowsrc, wstart,
                                wstep, wqf, wdof, wdqf)
                if inc and p == last:  # the rows this range of query blocks finished
                    I1 = min(nb, r0 + nr)
                    _narrow_rows(perm, r0 * block, min(n, I1 * block), qnew, qdone, d, bf,
                                 h0 * d, dqf, dq16, dqf[:0], dq16)
                    j0, jn = jn, _finished_blocks(col_ptr, col_tile, tile_row, p, nb, jn, I1)
                    _narrow_rows(kperm[p], j0 * block, min(n, jn * block), knew, kdone, d,
                                 bf, h0 * d, dkf, dk16, dvf, dv16)
            if nit == 0:
                continue
            for a in range(1 if fused else 3):  # the gradients added to their rows
                g2 = hdq if a == 0 else (hdk if a == 1 else hdv)
                lg = ib[iq + a]
                for t in range(o0, o0 + x1 - x0):
                    x = item_order[t]
                    grow, lrow = g2[perm[x]], lg[x - x0]  # row views: vectorized
                    if a == 0 and fused and qnew[perm[x]]:
                        qnew[perm[x]] = 0
                        for c in range(d):
                            grow[c] = lrow[c]
                    else:
                        for c in range(d):
                            grow[c] += lrow[c]
    if narrow:  # the rest of the head's gradients to bf16 words (the rows free again)
        _narrow_rows(ident[0], 0, n, qnew, qdone, d, bf, h0 * d, dqf, dq16, dqf[:0], dq16)
        _narrow_rows(ident[0], 0, n, knew, kdone, d, bf, h0 * d, dkf, dk16, dvf, dv16)
    else:
        for i in range(qnew.size):  # rows that no tile reaches
            if qnew[i]:
                _zero(dqf, i * d, d)
            if knew[i]:
                _zero(dkf, i * d, d)
                _zero(dvf, i * d, d)

def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


_NO_RANGES = np.zeros((1, 32), np.int64)
_NO_WORDS = np.zeros(0, np.uint16)


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
             do: np.ndarray, plan, *, scale: float,
             chunk: int = _CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` recomputed from the saved ``lse`` (no ``n x n`` storage).

    All arrays C-contiguous, one float dtype; ``lse`` ``(B, H, n)`` as returned
    by :func:`forward`. ``chunk``: tiles per BLAS product (float64 and the general
    path); the fused float32 path of 32-token tiles takes ``_CHUNK32``.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> from sparse_patterns.kernels.cpu import forward
    >>> pl = sps.plan(sps.make("strided", 16, stride=4), block=4)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 8))
    >>> o, lse = forward(x, x, x, pl, scale=0.35)
    >>> [g.shape for g in backward(x, x, x, o, lse, np.ones_like(o), pl, scale=0.35)]
    [(1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8)]
    """
    B, H, n, d = q.shape
    dq, dk, dv = (_buffer(q.shape, q.dtype) for _ in range(3))
    col_ptr, col_tile = plan.column_index()
    tile_row = plan.tile_rows()
    fused = q.dtype == np.float32 and plan.block == 32 and d % 16 == 0
    ranges = plan.memo("cpu.tile_ranges", lambda: _tile_ranges(plan.masks)) if fused else _NO_RANGES
    with single_threaded_blas(), _threads_for(2.5 * plan.flops(B, H, d)[1]):
        _backward(_flat(q), _flat(k), _flat(v), _flat(o), _flat(do), lse.reshape(-1),
                  _flat(dq), _flat(dk), _flat(dv), B * H, H, q.dtype.type(scale),
                  plan.num_groups, plan.piece_group, plan.qperm, plan.kperm, col_ptr,
                  col_tile, tile_row, plan.tile_mask, plan.masks, plan.block,
                  _CHUNK32 if fused else int(chunk), q.dtype == np.float64, fused, ranges,
                  *plan.memo("cpu.qsteps", lambda: _block_steps(plan.qperm, plan.block)),
                  *plan.memo("cpu.backward_items", lambda: _backward_items(plan)),
                  numba.get_num_threads(), 0, _QRANGE,  # bf: an int, as backward_bf16's
                  _NO_WORDS, _NO_WORDS, _NO_WORDS,
                  plan.memo("cpu.backward_order", lambda: _backward_order(plan)))
    return dq, dk, dv


def backward_bf16(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
                  do: np.ndarray, plan, *, scale: float, words: bool = False,
                  amx: bool | None = None) -> tuple[np.ndarray, ...]:
    """:func:`backward` on bf16 inputs with bf16 products, where
    :func:`._bf16.amx_applies` or :func:`._bf16.bf16_applies`: ``q, k, v, o, do`` are the
    bf16 words (C-contiguous ``int16`` or ``uint16`` ``(B, H, n, d)`` arrays), ``lse``
    float32. ``S``, ``dP``, ``dV``, ``dK`` and ``dQ`` are ``vdpbf16ps`` products or, with
    ``amx`` (None: where :func:`._bf16.amx_applies`), AMX ``tdpbf16ps``
    (:func:`._llvm_bwd._dscores32_amx`, :func:`._llvm_bwd._dkv32_amx`,
    :func:`._llvm_bwd._dq32_amx`), with float32 accumulation; ``P`` and ``dS`` are
    rounded to bf16 between them (``delta``, the exponentials and ``dS`` itself are
    float32).

    ``words``: return the gradients as bf16 words, each head's accumulated in float32
    rows that its thread reuses from head to head and rounded (to nearest even) as the
    head's last piece finishes them, else when the head is done; no float32 gradient of
    the whole call is kept. The words equal :func:`._convert.narrow` of the float32
    gradients. The window piece (last) rounds the rows as it finishes each range of query
    blocks, while they are in the cache, instead of all at the head's end.

    Returns
    -------
    dq, dk, dv : numpy.ndarray
        float32, like :func:`backward`'s; ``uint16`` bf16 words with ``words``.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> from sparse_patterns.kernels.cpu import bf16_applies, forward_bf16
    >>> pl = sps.plan(sps.make("strided", 64, stride=8), block=32)
    >>> w = (np.random.default_rng(0).standard_normal((1, 1, 64, 32), np.float32)
    ...      .view(np.uint32) >> 16).astype(np.uint16)  # bf16 words (truncated)
    >>> if bf16_applies(pl, 32):
    ...     o, lse = forward_bf16(w, w, w, pl, scale=0.18)
    ...     o16 = (o.view(np.uint32) >> 16).astype(np.uint16)
    ...     shapes = [g.shape for g in backward_bf16(w, w, w, o16, lse, w, pl, scale=0.18)]
    ... else:
    ...     shapes = [w.shape] * 3
    >>> shapes
    [(1, 1, 64, 32), (1, 1, 64, 32), (1, 1, 64, 32)]
    """
    B, H, n, d = q.shape
    amx = _check_products(plan, n, d, amx)
    w = [np.ascontiguousarray(a).reshape(-1).view(np.float32).reshape(B * H * n, d // 2)
         for a in (q, k, v, o, do)]
    col_ptr, col_tile = plan.column_index()
    ranges = plan.memo("cpu.tile_ranges", lambda: _tile_ranges(plan.masks))
    with single_threaded_blas(), _threads_for(2.5 * plan.flops(B, H, d)[1]):
        T = numba.get_num_threads()
        rows = T * n if words else B * H * n  # float32 gradient rows: the threads' or all
        dq, dk, dv = (_buffer((rows, d), np.float32) for _ in range(3))
        out = [_buffer((B * H * n * d,), np.uint16) if words else _NO_WORDS for _ in range(3)]
        _backward(*w, lse.reshape(-1).astype(np.float32, copy=False), dq, dk, dv, B * H, H,
                  np.float32(scale), plan.num_groups, plan.piece_group,
                  plan.qperm, plan.kperm, col_ptr, col_tile, plan.tile_rows(),
                  plan.tile_mask, plan.masks, plan.block, _CHUNK16, False, True, ranges,
                  *plan.memo("cpu.qsteps", lambda: _block_steps(plan.qperm, plan.block)),
                  *plan.memo("cpu.backward_items", lambda: _backward_items(plan)),
                  T, 2 if amx else 1, _QRANGE, *out,
                  plan.memo("cpu.backward_order", lambda: _backward_order(plan)))
    grads = out if words else (dq, dk, dv)
    return tuple(g.reshape(q.shape) for g in grads)
