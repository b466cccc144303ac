"""The backward's general path: one key block with a BLAS ``?gemm`` per chunk of tiles
(:mod:`._blas`) and the probabilities recomputed between the calls (:func:`_kblock`),
for what the fused float32 path of :mod:`._backward` does not take: float64 (the exact
path that ``gradcheck`` uses), other tile sizes, other ``d``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ._blas import _N, _T, _gemm
from ._llvm import _FM, _LOG2E, _copy, _exp2f, _transpose16, _wide, _zero
from ._llvm_bwd import _exp_rows32

__all__ = ["_kblock"]


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
                elif precise:  # a masked key (-inf) gives 0, also where lse is NaN
                    for c in range(cols):
                        x = s[r, c]
                        s[r, c] = math.exp(x - lr) if x != ninf else 0.0
                else:
                    for c in range(cols):
                        x = s[r, c]
                        s[r, c] = _exp2f(np.float32(x - lr)) if x != ninf else 0.0
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
