"""The numba-cuda kernels of ``impl="cuda"``, compiled per tile size, head dim and precision.

Forward: for every piece of the plan one launch, with one thread block per
(batch, head, query tile) and one thread per query row. The block stages the
keys and values of each of its tiles (gathered through the piece's key
permutation) in shared memory, ``ks`` keys at a time; each thread keeps its
scaled query row, its accumulator and its running max and sum in registers
(an online softmax), tests a partial tile's token mask bit by bit and skips the
pairs outside it. At the end the thread merges its piece's normalized row into
the output exactly by log-sum-exp, as the CPU kernel does, so the pieces of one
softmax (a window in natural order, a stride in ``i mod l`` order) give one
softmax. Launches of one call run in order on one stream, and inside a launch a
token belongs to one query tile, so no two threads write the same row.

Backward (recomputation from the saved log-sum-exp, as in FlashAttention-2):
one launch computes ``delta_i = do_i . o_i`` and clears the gradients; per
piece, a row kernel (thread block per query tile) accumulates ``dq`` and a
column kernel (thread block per key tile, one thread per key, using the plan's
:meth:`~sparse_patterns.kernels.ExecutionPlan.column_index`) accumulates
``dk`` and ``dv``. No atomics: every row has one owner per launch.
"""

from __future__ import annotations

import math
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import numpy as np

from ._detect import load

__all__ = ["kernels", "MAX_BLOCK", "MAX_HEAD_DIM"]

#: Largest tile size: one thread per query row, and a CUDA block has at most 1024 threads.
MAX_BLOCK = 1024
#: Largest head dimension: each thread keeps a few rows of ``d`` values in registers / local memory.
MAX_HEAD_DIM = 1024

_SHARED_BYTES = 32 * 1024  # shared memory for the two staged (ks, d) tiles of a block

# ``numba.cuda``, bound by :func:`kernels` before it compiles anything. The kernels below
# look it up as a module global on purpose: the CUDA simulator runs a kernel by swapping
# the globals that refer to ``numba.cuda`` for its fake module, which a closure variable
# would escape.
cuda: Any = None


def _sub_tile(block: int, d: int, itemsize: int) -> int:
    """Keys staged at once: two ``(ks, d)`` tiles fit in ``_SHARED_BYTES``; a power of 2."""
    ks = 1
    while ks * 2 <= block and 2 * (ks * 2) * d * itemsize <= _SHARED_BYTES:
        ks *= 2
    return ks


@lru_cache(maxsize=32)
def kernels(BLOCK: int, D: int, KS: int, fp64: bool) -> SimpleNamespace:
    """Compile (lazily, at first launch) the kernels for one tile size, head dim and precision.

    ``BLOCK``, ``D`` and ``KS`` are compile-time constants (shared and local array shapes).
    The namespace holds ``init_fwd``, ``forward``, ``init_bwd``, ``backward_dq`` and
    ``backward_dkdv``.
    """
    global cuda
    cuda = c = load()
    dt = np.float64 if fp64 else np.float32
    dev = _device_functions(c, BLOCK, D)
    return SimpleNamespace(**_forward_kernels(c, dev, BLOCK, D, KS, dt),
                           **_backward_kernels(c, dev, BLOCK, D, KS, dt))


def _constants(dt) -> tuple[Any, Any, Any, Any]:
    """``-inf``, 0, 1 and NaN in the compute dtype (frozen into the kernels as constants)."""
    return dt(-np.inf), dt(0.0), dt(1.0), dt(np.nan)


def _device_functions(c, BLOCK: int, D: int) -> SimpleNamespace:
    """The steps the forward and backward kernels share, as device functions (inlined).

    ``row_of``: the ``(b, h, i)`` row of thread ``t`` of a row-wise kernel. ``tile_of``:
    the ``(tile, b, h)`` of this thread block in the 1-D grid of a per-piece launch.
    ``stage``: the block's threads copy ``count`` rows ``perm[p, base + r]`` of ``x``
    (times ``sx``) and ``y`` into the shared tiles ``xs``, ``ys``. ``mask_bit``: whether
    column ``cc`` of a tile is in row ``r`` of its token mask (``mi < 0``: a full tile),
    reading the row's next 32 bits into ``word`` at the first column and every 32nd.
    """
    jit = c.jit(device=True, inline="always")

    @jit
    def row_of(t, H, n):  # pragma: no cover - device code
        return t // (H * n), (t // n) % H, t % n

    @jit
    def tile_of(g, G, Hg, nb):  # pragma: no cover - device code
        bh = cuda.blockIdx.x // nb  # a 1-D grid: (b, head of the group, tile) flattened
        return cuda.blockIdx.x % nb, bh // Hg, g + G * (bh % Hg)

    @jit
    def stage(x, y, xs, ys, sx, b, h, perm, p, base, count, tid):  # pragma: no cover
        e = tid
        while e < count * D:
            rx = e // D
            cx = e - rx * D
            i = perm[p, base + rx]
            xs[rx, cx] = x[b, h, i, cx] * sx
            ys[rx, cx] = y[b, h, i, cx]
            e += BLOCK

    @jit
    def mask_bit(masks, mi, r, cc, word):  # pragma: no cover - device code
        if mi < 0:
            return True, word
        if word < 0 or (cc & 31) == 0:
            word = masks[mi, r, cc >> 5]
        return ((word >> (cc & 31)) & 1) != 0, word

    return SimpleNamespace(row_of=row_of, tile_of=tile_of, stage=stage, mask_bit=mask_bit)


def _forward_kernels(c, dev, BLOCK: int, D: int, KS: int, dt) -> dict[str, Any]:
    """``init_fwd`` (clear ``out`` and ``lse``) and ``forward`` (one piece, one launch)."""
    NEG, ZERO, ONE, NAN = _constants(dt)
    row_of, tile_of, stage, mask_bit = dev.row_of, dev.tile_of, dev.stage, dev.mask_bit

    @c.jit
    def init_fwd(out, lse):  # pragma: no cover - device code
        """out = 0, lse = -inf; one thread per (b, h, i) row."""
        B, H, n, d = out.shape
        t = cuda.grid(1)
        if t < B * H * n:
            b, h, i = row_of(t, H, n)
            lse[b, h, i] = NEG
            for x in range(D):
                out[b, h, i, x] = ZERO

    @c.jit
    def forward(q, k, v, out, lse, scale, p, g, G, Hg, nb, qperm, kperm, tile_ptr,
                tile_col, tile_mask, masks):  # pragma: no cover - device code
        """One block per (batch b, head h of group g, query tile I); thread r = query row."""
        B, H, n, d = q.shape
        I, b, h = tile_of(g, G, Hg, nb)
        r = cuda.threadIdx.x
        ksh = cuda.shared.array((KS, D), dt)
        vsh = cuda.shared.array((KS, D), dt)
        qv = cuda.local.array(D, dt)
        acc = cuda.local.array(D, dt)
        sc = cuda.local.array(KS, dt)
        active = r < min(BLOCK, n - I * BLOCK)
        i = 0
        if active:
            i = qperm[p, I * BLOCK + r]
            for x in range(D):
                qv[x] = q[b, h, i, x] * scale
                acc[x] = ZERO
        m = NEG
        lsum = ZERO
        bad = False  # a NaN score: the whole row is NaN, as in torch
        for t in range(tile_ptr[p * nb + I], tile_ptr[p * nb + I + 1]):
            J = tile_col[t]
            mi = tile_mask[t]
            cols = min(BLOCK, n - J * BLOCK)
            for x0 in range(0, cols, KS):
                nk = min(KS, cols - x0)
                cuda.syncthreads()  # the previous sub-tile is consumed
                stage(k, v, ksh, vsh, ONE, b, h, kperm, p, J * BLOCK + x0, nk, r)
                cuda.syncthreads()
                if active:
                    cm = m
                    word = -1
                    for kx in range(nk):
                        keep, word = mask_bit(masks, mi, r, x0 + kx, word)
                        s = NEG
                        if keep:
                            s = ZERO
                            for x in range(D):
                                s += qv[x] * ksh[kx, x]
                            if s > cm:
                                cm = s
                            elif s != s:
                                bad = True
                        sc[kx] = s
                    if cm > NEG:  # at least one key so far
                        alpha = ZERO
                        if m > NEG:
                            alpha = math.exp(m - cm)
                        lsum *= alpha
                        for x in range(D):
                            acc[x] *= alpha
                        for kx in range(nk):
                            if sc[kx] > NEG:
                                pe = math.exp(sc[kx] - cm)
                                lsum += pe
                                for x in range(D):
                                    acc[x] += pe * vsh[kx, x]
                        m = cm
        if active:
            old = lse[b, h, i]
            if bad or lsum != lsum:
                for x in range(D):
                    out[b, h, i, x] = NAN
                lse[b, h, i] = NAN
            elif old != old:
                pass  # NaN from an earlier piece stays
            elif m > NEG and lsum > ZERO:
                lp = m + math.log(lsum)
                inv = ONE / lsum
                if old > NEG:
                    hi = max(old, lp)
                    new = hi + math.log(math.exp(old - hi) + math.exp(lp - hi))
                    a = math.exp(old - new)
                    w = math.exp(lp - new) * inv
                    for x in range(D):
                        out[b, h, i, x] = out[b, h, i, x] * a + acc[x] * w
                    lse[b, h, i] = new
                else:
                    for x in range(D):
                        out[b, h, i, x] = acc[x] * inv
                    lse[b, h, i] = lp

    return {"init_fwd": init_fwd, "forward": forward}


def _backward_kernels(c, dev, BLOCK: int, D: int, KS: int, dt) -> dict[str, Any]:
    """``init_bwd`` (``delta``, clear the gradients), ``backward_dq`` and ``backward_dkdv``."""
    NEG, ZERO, ONE, _NAN = _constants(dt)
    row_of, tile_of, stage, mask_bit = dev.row_of, dev.tile_of, dev.stage, dev.mask_bit

    @c.jit
    def init_bwd(o, do, delta, dq, dk, dv):  # pragma: no cover - device code
        """delta = rowsum(do * o); dq = dk = dv = 0; one thread per (b, h, i) row."""
        B, H, n, d = o.shape
        t = cuda.grid(1)
        if t < B * H * n:
            b, h, i = row_of(t, H, n)
            s = ZERO
            for x in range(D):
                s += do[b, h, i, x] * o[b, h, i, x]
                dq[b, h, i, x] = ZERO
                dk[b, h, i, x] = ZERO
                dv[b, h, i, x] = ZERO
            delta[b, h, i] = s

    @c.jit
    def backward_dq(q, k, v, do, lse, delta, dq, scale, p, g, G, Hg, nb, qperm, kperm,
                    tile_ptr, tile_col, tile_mask, masks):  # pragma: no cover - device code
        """dq += scale * sum_j p_ij (dp_ij - delta_i) k_j over the piece; thread = query row."""
        B, H, n, d = q.shape
        I, b, h = tile_of(g, G, Hg, nb)
        r = cuda.threadIdx.x
        ksh = cuda.shared.array((KS, D), dt)
        vsh = cuda.shared.array((KS, D), dt)
        qv = cuda.local.array(D, dt)
        dov = cuda.local.array(D, dt)
        acc = cuda.local.array(D, dt)
        active = r < min(BLOCK, n - I * BLOCK)
        i = 0
        L = NEG
        dl = ZERO
        if active:
            i = qperm[p, I * BLOCK + r]
            L = lse[b, h, i]
            dl = delta[b, h, i]
            for x in range(D):
                qv[x] = q[b, h, i, x] * scale
                dov[x] = do[b, h, i, x]
                acc[x] = ZERO
        for t in range(tile_ptr[p * nb + I], tile_ptr[p * nb + I + 1]):
            J = tile_col[t]
            mi = tile_mask[t]
            cols = min(BLOCK, n - J * BLOCK)
            for x0 in range(0, cols, KS):
                nk = min(KS, cols - x0)
                cuda.syncthreads()
                stage(k, v, ksh, vsh, ONE, b, h, kperm, p, J * BLOCK + x0, nk, r)
                cuda.syncthreads()
                if active and L > NEG:
                    word = -1
                    for kx in range(nk):
                        keep, word = mask_bit(masks, mi, r, x0 + kx, word)
                        if keep:
                            s = ZERO
                            dp = ZERO
                            for x in range(D):
                                s += qv[x] * ksh[kx, x]
                                dp += dov[x] * vsh[kx, x]
                            ds = math.exp(s - L) * (dp - dl)
                            for x in range(D):
                                acc[x] += ds * ksh[kx, x]
        if active and L > NEG:
            for x in range(D):
                dq[b, h, i, x] += acc[x] * scale

    @c.jit
    def backward_dkdv(q, k, v, do, lse, delta, dk, dv, scale, p, g, G, Hg, nb, qperm,
                      kperm, tile_row, tile_mask, col_ptr, col_tile,
                      masks):  # pragma: no cover - device code
        """dk, dv of one key tile J over the query tiles of its column; thread = key."""
        B, H, n, d = q.shape
        J, b, h = tile_of(g, G, Hg, nb)
        cl = cuda.threadIdx.x
        qsh = cuda.shared.array((KS, D), dt)
        dosh = cuda.shared.array((KS, D), dt)
        lsh = cuda.shared.array(KS, dt)
        dlsh = cuda.shared.array(KS, dt)
        kv = cuda.local.array(D, dt)
        vv = cuda.local.array(D, dt)
        dka = cuda.local.array(D, dt)
        dva = cuda.local.array(D, dt)
        active = cl < min(BLOCK, n - J * BLOCK)
        j = 0
        if active:
            j = kperm[p, J * BLOCK + cl]
            for x in range(D):
                kv[x] = k[b, h, j, x]
                vv[x] = v[b, h, j, x]
                dka[x] = ZERO
                dva[x] = ZERO
        word = cl >> 5
        bit = cl & 31
        for u in range(col_ptr[p * nb + J], col_ptr[p * nb + J + 1]):
            t = col_tile[u]
            I = tile_row[t]
            mi = tile_mask[t]
            rows = min(BLOCK, n - I * BLOCK)
            for x0 in range(0, rows, KS):
                nr = min(KS, rows - x0)
                cuda.syncthreads()
                stage(q, do, qsh, dosh, scale, b, h, qperm, p, I * BLOCK + x0, nr, cl)
                if cl < nr:
                    i = qperm[p, I * BLOCK + x0 + cl]
                    lsh[cl] = lse[b, h, i]
                    dlsh[cl] = delta[b, h, i]
                cuda.syncthreads()
                if active:
                    for rx in range(nr):
                        keep = lsh[rx] > NEG
                        if keep and mi >= 0:
                            keep = ((masks[mi, x0 + rx, word] >> bit) & 1) != 0
                        if keep:
                            s = ZERO
                            dp = ZERO
                            for x in range(D):
                                s += qsh[rx, x] * kv[x]
                                dp += dosh[rx, x] * vv[x]
                            pr = math.exp(s - lsh[rx])
                            ds = pr * (dp - dlsh[rx])
                            for x in range(D):
                                dva[x] += pr * dosh[rx, x]
                                dka[x] += ds * qsh[rx, x]
        if active:
            for x in range(D):
                dk[b, h, j, x] += dka[x]
                dv[b, h, j, x] += dva[x]

    return {"init_bwd": init_bwd, "backward_dq": backward_dq, "backward_dkdv": backward_dkdv}
