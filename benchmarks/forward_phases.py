"""Where a query block's time goes in the float32 forward (issue 19, item 4: what limits it).

Usage::

    .venv/bin/python benchmarks/forward_phases.py

One thread, d = 64, 32-token tiles, the default plan (``mode="merged"``). Prints:

* the machine's one-core fp32 FMA peak (:func:`sparse_patterns.kernels.cpu.fma_peak`);
* the fused passes alone on whole tiles (no masks) held in L1, as a share of that peak:
  the scores (``_scores32``: ``K Q^T``, masks and column max) and ``P V``
  (``_pv32_dense``), for 1, 5 and 24 tiles of 32 keys;
* one query block of the strided window (l = 128: 5 key tiles, the first and last half
  masked), its rows in the cache: each pass alone (``Q^T``, scores, exponentials,
  ``P V``) on the block's own tiles, masks and key ranges, then the whole block
  (:func:`sparse_patterns.kernels.cpu._forward_block._qblock`, one piece that starts and
  ends the softmax), whose excess over the passes is its bookkeeping;
* the forward at n = 16,384, H = 8 (rows from memory), in microseconds per 32 queries
  and as useful GFLOP/s: the window alone (``local``, l = 128), strided, fixed, and
  ``full`` in 128-token documents (causal 128 x 128 blocks: the shape of strided's
  residue classes, whose piece runs as slowly per FLOP).

Where the CPU has AVX512_BF16, the same for bf16 inputs on ``vdpbf16ps`` (the passes'
``_bf16`` twins, the block's words as :func:`sparse_patterns.kernels.cpu.forward_bf16`
takes them), as a share of the one-core bf16 peak: what the products, the exponentials
(which take as long as in float32) and the bookkeeping leave of the 2x that bf16
products could give.

Timings are the best of several repeats of a loop of calls. Nothing is asserted.
"""

from __future__ import annotations

import time

import numba
import numpy as np

import sparse_patterns as sps
from sparse_patterns.kernels.cpu import _forward as fwd
from sparse_patterns.kernels.cpu import amx_products_here, fma_peak, forward, forward_bf16
from sparse_patterns.kernels.cpu._forward_block import FIRST, LAST, _qblock
from sparse_patterns.kernels.cpu._llvm import _AVX512_BF16, _transpose16, _wide
from sparse_patterns.kernels.cpu._llvm_fwd import (
    _exp32,
    _exp32_bf16,
    _pv32_dense,
    _pv32_dense_bf16,
    _scores32,
    _scores32_bf16,
)
from sparse_patterns.kernels.cpu._pool import _thread_buffers, _views
from sparse_patterns.kernels.cpu._schedule import (
    _CHUNK_FUSED,
    _chunk_ranges,
    _group_rows,
    _masks_t,
)

__all__: list[str] = []

D = 64
SCALE = np.float32(0.125)


@numba.njit(fastmath={"contract"})
def _passes(reps, what, bf, q, roffq, k, koff, v, t0, nt, tile_mask, maskt, bufs, lo, hi):
    """``reps`` calls of one pass on thread 0's buffers: 0 ``Q^T``, 1 scores, 2
    exponentials, 3 ``P V`` (``nt`` tiles from ``k``, ``v`` at ``koff``); ``bf``: the
    bf16 passes, on rows of ``D / 2`` words."""
    _wide()
    qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax, msub, csum, alpha, roff = _views(bufs, 0)
    dw = D // 2 if bf else D
    for r in range(32):
        alpha[r] = 1.0
        msub[r] = 1.0
    for _ in range(reps):
        if what == 0:
            for r0 in range(0, 32, 16):
                for c0 in range(0, dw, 16):
                    _transpose16(q, roffq, r0, c0, qbuf, c0 * 32 + r0, 32)
        elif what == 1:
            for r in range(32):
                cmax[r] = -np.inf
            if bf:
                _scores32_bf16(k, koff, qbuf, sbuf, nt, dw, SCALE, tile_mask, t0, maskt, cmax)
            else:
                _scores32(k, koff, qbuf, sbuf, nt, D, SCALE, tile_mask, t0, maskt, cmax)
        elif what == 2:
            if bf:
                _exp32_bf16(sbuf, nt * 32, cmax, csum)
            else:
                _exp32(sbuf, nt * 32, cmax, csum)
        elif bf:
            _pv32_dense_bf16(v, koff, sbuf, obuf, 0, alpha, msub, lo, hi, D, obuf, 0, False)
        else:
            _pv32_dense(v, koff, sbuf, obuf, 0, alpha, msub, lo, hi, D, obuf, 0, False)


@numba.njit(fastmath={"contract"})
def _block(reps, I, bf, q, k, v, o1, ow, m1, l1, qp, kperm, kstart, kstep, tile_ptr, tile_col,
           tile_mask, masks, maskt, ranges, bufs):
    """``reps`` calls of the whole query block ``I`` (piece 0, first and last); ``bf``:
    bf16 inputs (rows of ``D / 2`` words) on bf16 products."""
    _wide()
    qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax, msub, csum, alpha, roff = _views(bufs, 0)
    n = m1.shape[0]
    dw = D // 2 if bf else D
    for _ in range(reps):
        _qblock(q, 0, qp, k, v, o1, ow, m1, l1, 0, 0, n, D, dw, bf, 0,
                I, SCALE, FIRST | LAST, qp, kperm, kstart, kstep, tile_ptr, tile_col,
                tile_mask, masks, maskt, ranges, True, 32, _CHUNK_FUSED, False,
                qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax, msub, csum, alpha, roff, ow)


def words(x: np.ndarray) -> np.ndarray:
    """float32 values truncated to bf16, as float32 words of two (the kernel's bf16 rows)."""
    return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.float32)


def computed(tmask: np.ndarray, maskt: np.ndarray, lo: np.ndarray,
             hi: np.ndarray) -> tuple[float, float]:
    """FLOPs that ``_scores32`` and ``_pv32_dense`` run on a block's tiles: the scores
    skip a 16-query half of 8 keys that none of them is seen by in a partial tile, ``P V``
    runs each 8 queries over the widest key range of their two groups of 4."""
    scores = 0
    for mi in tmask:
        for g in range(4):
            for half in (0xFFFF, 0xFFFF0000):
                seen = mi < 0 or any(int(maskt[mi * 32 + g * 8 + j]) & half for j in range(8))
                scores += 8 * 16 * D if seen else 0
    pv = sum(8 * D * max(0, max(hi[2 * b: 2 * b + 2]) - min(lo[2 * b: 2 * b + 2]))
             for b in range(4))
    return 2.0 * scores, 2.0 * pv


def clock(fn, reps: int, repeats: int = 5) -> float:
    """Seconds per call: the best of ``repeats`` runs of ``fn(reps)``."""
    fn(2)
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn(reps)
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def in_l1(bf: int, peak: float, bufs, maskt, rng) -> None:
    """The scores and ``P V`` passes on whole tiles held in L1, % of ``peak``."""
    kf = rng.standard_normal(24 * 32 * D).astype(np.float32)
    k = words(kf) if bf else kf
    q = words(rng.standard_normal(32 * D).astype(np.float32)) if bf else kf[:32 * D]
    roffq = np.arange(32, dtype=np.int64) * (D // 2 if bf else D)
    full = np.full(24, -1, np.int32)
    cells = []
    for nt in (1, 5, 24):
        lo, hi = np.zeros(8, np.int64), np.full(8, 32 * nt, np.int64)
        args = (bf, q, roffq, k, 0, k, 0, nt, full, maskt, bufs, lo, hi)
        for w in range(3):  # Q^T, then scores and probabilities for P V to read
            _passes(1, w, *args)
        rate = [2 * 32 * 32 * D * nt / clock(lambda r, w=w, a=args: _passes(r, w, *a),
                                             200000 // nt) for w in (1, 3)]
        cells.append(f"{nt} tiles {rate[0] / peak:.0%} / {rate[1] / peak:.0%}")
    print(f"{'bf16' if bf else 'fp32'} passes on whole tiles in L1, % of the peak (scores / "
          "P V): " + ", ".join(cells))


def window_block(bf: int, peak: float, bufs, pl, maskt, rng) -> None:
    """One query block of the strided window in the cache: each pass on its own tiles,
    then the whole block."""
    n = pl.n
    dw = D // 2 if bf else D
    ranges = _chunk_ranges(pl, _group_rows(maskt), _CHUNK_FUSED)
    steps = fwd._forward_steps(pl, 8)
    p, kt, ks, kperm = steps[0][0], steps[0][6], steps[0][7], steps[0][8]
    q, k, v = (rng.standard_normal(n * D).astype(np.float32) for _ in range(3))
    if bf:
        q, k, v = words(q), words(k), words(v)
    o1, m1, l1 = np.empty(n * D, np.float32), np.empty(n, np.float32), np.empty(n, np.float32)
    I = 20
    t0, t1 = int(pl.tile_ptr[p * pl.nb + I]), int(pl.tile_ptr[p * pl.nb + I + 1])
    bargs = (bf, q, k, v, o1, np.empty(0, np.uint16), m1, l1, pl.qperm[p], kperm, kt, ks,
             pl.tile_ptr, pl.tile_col, pl.tile_mask, pl.masks, maskt, ranges, bufs)
    t_block = clock(lambda r: _block(r, I, *bargs), 20000)
    # the block's own key ranges (lo, hi: the first 16 row offsets _qblock leaves),
    # its Q^T and probabilities, from one more call
    _block(1, I, *bargs)
    lo, hi = bufs[4][0, :8].copy(), bufs[4][0, 8:16].copy()
    koff = int(pl.tile_col[t0]) * 32 * dw
    roffq = np.arange(32, dtype=np.int64) * dw
    args = (bf, q, roffq + I * 32 * dw, k, koff, v, t0, t1 - t0, pl.tile_mask, maskt, bufs,
            lo, hi)
    names = ("Q^T", "scores", "exponentials", "P V")
    each = [clock(lambda r, w=w: _passes(r, w, *args), 20000) for w in range(4)]
    scores, pv = computed(pl.tile_mask[t0:t1], maskt, lo, hi)
    print(f"{'bf16' if bf else 'fp32'} strided window block ({t1 - t0} tiles of 32 keys, masks "
          f"{pl.tile_mask[t0:t1].tolist()}; -1: whole), in the cache: "
          + ", ".join(f"{nm} {t * 1e6:.2f} us" for nm, t in zip(names, each, strict=True))
          + f"; the products at {scores / each[1] / peak:.0%} and {pv / each[3] / peak:.0%} of "
          "the peak (the FMAs they run: masked corners skipped)")
    rest = t_block - sum(each)
    print(f"    the whole block (_qblock): {t_block * 1e6:.2f} us; the passes "
          f"{sum(each) * 1e6:.2f} us, the rest {rest * 1e6:.2f} us ({rest / t_block:.0%}): "
          "the softmax state, row offsets, key ranges, the rescale and the log-sum-exp")


def forwards(bf: int, peak: float, rng) -> None:
    """The forward at n = 16,384, rows from memory, per 32 queries."""
    n, H = 16384, 8
    w = [rng.standard_normal((1, H, n, D), dtype=np.float32) for _ in range(3)]
    if bf:
        w = [(x.view(np.uint32) >> 16).astype(np.uint16) for x in w]
    run = forward_bf16 if bf else forward
    cells = []
    for name, pat in (("window (local 128)", sps.make("local", n, window=128)),
                      ("strided 128", sps.make("strided", n, stride=128)),
                      ("128-token documents", sps.make("full", n, documents=[128] * (n // 128))),
                      ("fixed 128/16", sps.make("fixed", n, stride=128, c=16))):
        plx = sps.plan(pat, mode="merged", block=32)
        t = clock(lambda r, plx=plx: [run(*w, plx, scale=0.125) for _ in range(r)], 1, 3)
        useful = plx.flops(1, H, D)[0]
        cells.append(f"{name} {t / (H * n / 32) * 1e6:.1f} us ({useful / t / peak:.0%})")
    print(f"{'bf16' if bf else 'fp32'} forward at n = {n}, H = {H}, per 32 queries (useful "
          "FLOPs, % of the one-core peak): " + ", ".join(cells))


def main() -> None:
    numba.set_num_threads(1)
    kinds = [(0, fma_peak("float32", threads=1, again=True))]
    if _AVX512_BF16 and not amx_products_here():
        kinds.append((1, fma_peak("bfloat16", threads=1, again=True)))
    print("one-core FMA peak: " + ", ".join(f"{'bf16 (vdpbf16ps)' if bf else 'fp32'} "
                                            f"{pk / 1e9:.0f} GFLOP/s" for bf, pk in kinds)
          + f"; one thread, d = {D}, 32-token tiles; microseconds are the best of 5 loops of calls")
    rng = np.random.default_rng(0)
    bufs = _thread_buffers(1, 32, _CHUNK_FUSED, D, np.zeros(1, np.float32))
    n = 1024  # the strided window's block below: a local window of 128, block 20
    pl = sps.plan(sps.make("local", n, window=128), mode="merged", block=32)
    maskt = _masks_t(pl)
    for bf, peak in kinds:
        in_l1(bf, peak, bufs, maskt, rng)
    for bf, peak in kinds:
        window_block(bf, peak, bufs, pl, maskt, rng)
    for bf, peak in kinds:
        forwards(bf, peak, rng)


if __name__ == "__main__":
    main()
