"""The backward of the CPU kernel: gradients ``(dq, dk, dv)`` over an ExecutionPlan,
recomputed from the forward's saved log-sum-exp, with no ``n x n`` storage.

It recomputes the probabilities from the saved log-sum-exp, in parallel
over (batch x head); for every piece and key block it takes the query rows of a
chunk of the block's tiles, accumulates ``dk`` and ``dv`` in tile buffers (BLAS
with ``beta = 1``) and adds ``dq`` into its rows (each thread owns whole heads: no
write conflicts). A ``residue(s)`` piece runs in work items (block ranges that its
tiles do not leave, :func:`._schedule._backward_items`): each item's rows are copied
once into buffers in the piece's order, where every block is a run used in place,
and its gradients added back once. Float32 exponentiates as the forward does
(:mod:`._llvm`: base-2 units, :func:`._llvm._exp_rows32` for rows of 32 keys).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ._blas import _N, _T, _gemm, _threads_for, single_threaded_blas
from ._llvm import _FM, _LOG2E, _copy, _exp2f, _exp_rows32, _transpose16, _wide, _zero
from ._pool import _aligned, _buffer
from ._schedule import _CHUNK, _backward_items, _block_steps

__all__ = ["backward"]


# --------------------------------------------------------------------- row helpers
@numba.njit(cache=True)
def _mask_tile(s, r0, nrow, c0, ncol, masks, mi):  # pragma: no cover - compiled
    """``-inf`` where partial tile ``mi`` (at rows ``r0..``, columns ``c0..`` of ``s``) is unset."""
    _wide()
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



@numba.njit(cache=True, fastmath=_FM)
def _kblock(q2, k2, v2, do2, l1, delta, dq, dk, dv, base, n, p, pp, J, scale, qperm, kperm,
            col_ptr, col_tile, tile_row, tile_mask, masks, block, chunk, precise, kc, vc, qc, doc, lc, mbits,
            dc, sbuf, dpbuf, dkacc, dvacc, dqc, rowsrc, qstart, qstep, qf, dof,
            dqf):  # pragma: no cover - compiled
    """Key block ``J`` of piece ``p`` for one (batch, head): dk, dv of its keys and the
    dq contributions of every query row of its tiles, from the saved log-sum-exp.
    Position ``x`` of the piece's order is row ``base + kperm[pp, x]`` (keys) and
    ``base + qperm[pp, x]`` (queries) of the arrays; ``delta`` is indexed by
    ``row - base``.

    Row-major buffers, BLAS ``gemm`` in column-major terms (``C^T = B^T A^T``): the
    products accumulate into ``dk`` and ``dv`` with ``beta = 1`` and carry the score
    scale in ``alpha``. Float32 recomputes ``P = 2**(s log2 e - lse log2 e)``."""
    _wide()
    d = q2.shape[1]
    nb = (n + block - 1) // block
    ninf = -np.inf
    unit = 1.0 if precise else _LOG2E
    u0 = col_ptr[p * nb + J]
    u1 = col_ptr[p * nb + J + 1]
    if u0 == u1:
        return
    cols = min(block, n - J * block)
    kv = kc[: cols * d]
    kt = kc[cols * d: 2 * cols * d]  # K^T and V^T (d x cols): NN score products
    vt = vc[: cols * d]
    for x in range(cols):
        src = base + kperm[pp, J * block + x]
        _copy(kv, x * d, k2, src * d, d)
        rowsrc[x] = src * d  # (row offsets for the transposes; rowsrc is reused below)
    if cols % 16 == 0 and d % 16 == 0:
        for x0 in range(0, cols, 16):
            for c0 in range(0, d, 16):
                _transpose16(k2, rowsrc, x0, c0, kt, c0 * cols + x0, cols)
                _transpose16(v2, rowsrc, x0, c0, vt, c0 * cols + x0, cols)
    else:
        for x in range(cols):
            src = base + kperm[pp, J * block + x]
            for c in range(d):
                kt[c * cols + x] = k2[src, c]
                vt[c * cols + x] = v2[src, c]
    _zero(dkacc, 0, cols * d)
    _zero(dvacc, 0, cols * d)
    for a0 in range(u0, u1, chunk):
        a1 = min(u1, a0 + chunk)
        # the chunk's query rows: used in place when its query blocks are one run of
        # consecutive tokens (a natural-order piece), else gathered
        I0 = tile_row[col_tile[a0]]
        run = qstep[pp, I0] == 1
        for a in range(a0 + 1, a1):
            I = tile_row[col_tile[a]]
            if (I != I0 + (a - a0) or qstep[pp, I] != 1
                    or qstart[pp, I] != qstart[pp, I0] + (I - I0) * block):
                run = False
        m = 0
        for a in range(a0, a1):
            I = tile_row[col_tile[a]]
            rows = min(block, n - I * block)
            for r in range(rows):
                src = base + qperm[pp, I * block + r]
                rowsrc[m + r] = src
                if not run:
                    _copy(qc, (m + r) * d, q2, src * d, d)
                    _copy(doc, (m + r) * d, do2, src * d, d)
                lc[m + r] = l1[src] * unit
                dc[m + r] = delta[src - base]
            m += rows
        if run:
            qa, doa, qoff = qf, dof, (base + qstart[pp, I0]) * d
        else:
            qa, doa, qoff = qc, doc, 0
        # s (m x cols) = scale Q K^T, in base-2 units for float32
        _gemm(_N, _N, cols, m, d, scale * unit, kt, 0, cols, qa, qoff, d, 0.0, sbuf, 0, cols)
        s = sbuf[: m * cols].reshape((m, cols))
        if cols == 32 and not precise:  # float32 rows of 32 keys: mask and exponential in one pass
            off = 0
            for a in range(a0, a1):
                t = col_tile[a]
                rows = min(block, n - tile_row[t] * block)
                mi = tile_mask[t]
                for r in range(rows):
                    mbits[off + r] = (np.uint32(masks[mi, r, 0] & np.uint64(0xFFFFFFFF)) if mi >= 0
                                      else np.uint32(0xFFFFFFFF))
                    if lc[off + r] == ninf:
                        mbits[off + r] = 0
                off += rows
            _exp_rows32(sbuf, m, lc, mbits)
        else:
            off = 0
            for a in range(a0, a1):
                t = col_tile[a]
                rows = min(block, n - tile_row[t] * block)
                mi = tile_mask[t]
                if mi >= 0:
                    _mask_tile(s, off, rows, 0, cols, masks, mi)
                off += rows
            for r in range(m):
                lr = lc[r]
                if lr == ninf:
                    for c in range(cols):
                        s[r, c] = 0.0
                elif precise:
                    for c in range(cols):
                        s[r, c] = math.exp(s[r, c] - lr)
                else:
                    for c in range(cols):
                        s[r, c] = _exp2f(np.float32(s[r, c] - lr))
        # s now holds P: dv += P^T dO (cols x d)
        _gemm(_N, _T, d, cols, m, 1.0, doa, qoff, d, sbuf, 0, cols, 1.0, dvacc, 0, d)
        # dP (m x cols) = dO V^T; dS = P (dP - delta)
        _gemm(_N, _N, cols, m, d, 1.0, vt, 0, cols, doa, qoff, d, 0.0, dpbuf, 0, cols)
        dp = dpbuf[: m * cols].reshape((m, cols))
        for r in range(m):
            dr = dc[r]
            for c in range(cols):
                s[r, c] = s[r, c] * (dp[r, c] - dr)
        # dk += scale dS^T Q (cols x d); dq += scale dS K (m x d)
        _gemm(_N, _T, d, cols, m, scale, qa, qoff, d, sbuf, 0, cols, 1.0, dkacc, 0, d)
        if run:  # dq rows in place too: accumulated by the gemm (beta = 1)
            _gemm(_N, _N, d, m, cols, scale, kv, 0, d, sbuf, 0, cols, 1.0, dqf, qoff, d)
        else:
            _gemm(_N, _N, d, m, cols, scale, kv, 0, d, sbuf, 0, cols, 0.0, dqc, 0, d)
            for r in range(m):
                dst = rowsrc[r]
                for c in range(d):
                    dq[dst, c] += dqc[r * d + c]
    for x in range(cols):
        dst = base + kperm[pp, J * block + x]
        for c in range(d):
            dk[dst, c] += dkacc[x * d + c]
            dv[dst, c] += dvacc[x * d + c]


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _backward(q2, k2, v2, o2, do2, l1, dq, dk, dv, BH, H, scale, G, piece_group, qperm, kperm,
              col_ptr, col_tile, tile_row, tile_mask, masks, block, chunk, precise,
              qstart, qstep, item_ptr, items, item_order, item_rows):  # pragma: no cover - compiled
    """Every (batch, head) in parallel. A piece with work items (``items[item_ptr[p]:
    item_ptr[p + 1]]``, ranges of its blocks that its tiles do not leave, see
    :func:`_backward_items`) has each item's q, dO, k, v rows and softmax statistics
    copied into buffers in the piece's order (the positions taken in the order
    ``item_order``, as the forward's copies), its gradients accumulated there in
    place (every block a run) and added back to their rows once; the others gather
    the query rows of each chunk of tiles."""
    _wide()
    d = q2.shape[1]
    qf, dof, dqf = q2.reshape(q2.size), do2.reshape(do2.size), dq.reshape(dq.size)
    kf, vf = k2.reshape(k2.size), v2.reshape(v2.size)
    n = q2.shape[0] // BH
    nb = (n + block - 1) // block
    P = piece_group.size
    dt = q2.dtype
    # the piece's order inside an item's buffers: position x is row x - x0
    ident = np.arange(n, dtype=qperm.dtype).reshape((1, n))
    istart = (np.arange(nb, dtype=qstart.dtype) * block).reshape((1, nb))
    istep = np.ones((1, nb), dtype=qstep.dtype)
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
        kc = _aligned(2 * block * d, q2)
        vc = _aligned(block * d, q2)
        qc = _aligned(chunk * block * d, q2)
        doc = _aligned(chunk * block * d, q2)
        lc = _aligned(chunk * block, q2)
        mbits = np.empty(chunk * block, np.uint32)
        dc = _aligned(chunk * block, q2)
        sbuf = _aligned(chunk * block * block, q2)
        dpbuf = _aligned(chunk * block * block, q2)
        dkacc = _aligned(block * d, q2)
        dvacc = _aligned(block * d, q2)
        dqc = _aligned(chunk * block * d, q2)
        rowsrc = np.empty(chunk * block, np.int64)
        # item buffers: q, dO, k, v, dq, dk, dv rows, lse and delta of one item
        R = item_rows
        ib = _aligned(7 * R * d, q2).reshape((7, R, d))
        lq, ldo, lk, lv, ldq, ldk, ldv = ib[0], ib[1], ib[2], ib[3], ib[4], ib[5], ib[6]
        ll = _aligned(R, q2)
        ldl = np.empty(n, dt)
        for p in range(P):
            if piece_group[p] != g:
                continue
            if item_ptr[p] == item_ptr[p + 1]:
                for J in range(nb):
                    _kblock(q2, k2, v2, do2, l1, dl, dq, dk, dv, base, n, p, p, J, scale, qperm,
                            kperm, col_ptr, col_tile, tile_row, tile_mask, masks, block, chunk,
                            precise, kc, vc, qc, doc, lc, mbits, dc, sbuf, dpbuf, dkacc, dvacc, dqc,
                            rowsrc, qstart, qstep, qf, dof, dqf)
                continue
            perm = qperm[p]  # = kperm[p] for a piece with items
            for it in range(item_ptr[p], item_ptr[p + 1]):
                b0, b1, o0 = items[it, 0], items[it, 1], items[it, 2]
                x0 = b0 * block
                x1 = min(n, b1 * block)
                # one array at a time (interleaving the four thrashes the L1 sets)
                for a in range(4):
                    src = qf if a == 0 else (dof if a == 1 else (kf if a == 2 else vf))
                    dst = ib[a].reshape(R * d)
                    for t in range(o0, o0 + x1 - x0):
                        x = item_order[t]
                        _copy(dst, (x - x0) * d, src, (base + perm[x]) * d, d)
                for t in range(o0, o0 + x1 - x0):
                    x = item_order[t]
                    ll[x - x0] = l1[base + perm[x]]
                    ldl[x] = dl[perm[x]]
                _zero(ldq.reshape(R * d), 0, (x1 - x0) * d)
                _zero(ldk.reshape(R * d), 0, (x1 - x0) * d)
                _zero(ldv.reshape(R * d), 0, (x1 - x0) * d)
                for J in range(b0, b1):
                    _kblock(lq, lk, lv, ldo, ll, ldl, ldq, ldk, ldv, -x0, n, p, 0, J, scale,
                            ident, ident, col_ptr, col_tile, tile_row, tile_mask, masks, block,
                            chunk, precise, kc, vc, qc, doc, lc, mbits, dc, sbuf, dpbuf, dkacc, dvacc,
                            dqc, rowsrc, istart, istep, lq.reshape(R * d), ldo.reshape(R * d),
                            ldq.reshape(R * d))
                for a in range(3):  # the gradients added to their rows, one array at a time
                    g2 = dq if a == 0 else (dk if a == 1 else dv)
                    lg = ib[4 + a]
                    for t in range(o0, o0 + x1 - x0):
                        x = item_order[t]
                        grow, lrow = g2[base + perm[x]], lg[x - x0]  # row views: vectorized
                        for c in range(d):
                            grow[c] += lrow[c]



def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
             do: np.ndarray, plan, *, scale: float,
             chunk: int = _CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` recomputed from the saved ``lse`` (no ``n x n`` storage).

    All arrays C-contiguous, one float dtype; ``lse`` ``(B, H, n)`` as returned
    by :func:`forward`.

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
    with single_threaded_blas(), _threads_for(2.5 * plan.flops(B, H, d)[1]):
        _backward(_flat(q), _flat(k), _flat(v), _flat(o), _flat(do), lse.reshape(-1),
                  _flat(dq), _flat(dk), _flat(dv), B * H, H, q.dtype.type(scale),
                  plan.num_groups, plan.piece_group, plan.qperm, plan.kperm, col_ptr,
                  col_tile, tile_row, plan.tile_mask, plan.masks, plan.block, int(chunk),
                  q.dtype == np.float64,
                  *plan.memo("cpu.qsteps", lambda: _block_steps(plan.qperm, plan.block)),
                  *plan.memo("cpu.backward_items", lambda: _backward_items(plan)))
    return dq, dk, dv
