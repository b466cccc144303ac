"""The machine's FMA peak, measured: a register-only loop of independent vector FMAs.

``% of peak`` figures divide a kernel's throughput by what the cores can do at
most. A vendor's nominal figure (cores x FMA units x lanes x 2 x clock) is not what
a shared, frequency-scaled cloud core delivers, and torch's ``matmul`` reaches only
part of the peak, so a kernel can read "above 100 % of matmul". :func:`fma_peak`
instead times a loop that keeps
``_ACC`` independent accumulators in vector registers (enough to cover the FMA
latency on two FMA ports), touches no memory, and runs it on every numba thread at
once; it reports the best of a few short runs.

* ``float32``: ``vfmadd`` on 512-bit vectors where the CPU has AVX-512F, else
  256-bit: 2 FLOPs per lane.
* ``bfloat16``: ``vdpbf16ps`` (AVX512_BF16): 32 bf16 products summed pairwise into 16
  float32 lanes, 64 FLOPs per instruction. A CPU without AVX512_BF16 has no bf16
  arithmetic: its bf16 inputs are widened and computed in float32, so its bfloat16
  peak *is* the float32 one, and that is what is reported. Where one ``vdpbf16ps``
  issues every 2 cycles against two FMAs a cycle, bf16 products are no faster per FLOP
  than float32 ones and the kernel widens bf16 inputs instead (:mod:`._convert`);
  elsewhere it runs them on bf16 products (:func:`._bf16.bf16_applies`).
* ``bfloat16-amx``: AMX ``tdpbf16ps`` (:mod:`._amx`) on four independent 16 x 16
  float32 tiles, 16 x 16 x 32 products (16,384 FLOPs) per instruction, what the bf16
  forward and backward run on where :func:`._bf16.amx_applies`; the ``bfloat16`` peak
  on a CPU or process without AMX.

Figures measured on the CPUs so far are in ``docs/kernel-notes.md``.
"""

from __future__ import annotations

import functools
import time

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._amx import (
    _AMX,
    _tile_dot,
    _tile_load,
    _tile_store,
    _tile_zero,
    _tiles_begin,
    _tiles_end,
    amx_here,
)
from ._llvm import _AVX512, _AVX512_BF16, _bf16_dot

__all__ = ["fma_peak", "PEAK_DTYPES"]

#: what :func:`fma_peak` measures
PEAK_DTYPES = ("float32", "bfloat16", "bfloat16-amx")

_LANES = 16 if _AVX512 else 8  # float32 lanes of one vector register
_ACC = 12  # independent accumulators: latency 4 cycles x 2 FMA ports, and a margin


@intrinsic
def _fma_loop(typingctx, iters, x, kind):  # pragma: no cover - compiled
    """``_ACC`` vector accumulators, each updated ``iters`` times by one FMA
    (``kind == 0``) or one ``vdpbf16ps`` (``kind == 1``), or (``kind == 2``) four AMX
    tiles each by one ``tdpbf16ps``; returns a sum of lanes (or an element of a tile)
    so that nothing is dead code. ``x``: a float32 array of at least ``_AMX_WORDS``
    words of operands (read once, before the loop; the tiles' from word 0, one
    accumulator tile stored back from word 512)."""
    def codegen(context, builder, signature, args):
        iters_, x_, kind_ = args
        xp = context.make_array(signature.args[1])(context, builder, x_).data
        f32 = ir.FloatType()
        vt = ir.VectorType(f32, _LANES)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3),
                                             f"llvm.fma.v{_LANES}f32")
        a = builder.load(builder.bitcast(xp, vt.as_pointer()), align=4)
        b = builder.load(builder.bitcast(builder.gep(xp, [ir.IntType(64)(_LANES)]),
                                         vt.as_pointer()), align=4)
        acc = [cgutils.alloca_once(builder, vt) for _ in range(_ACC)]
        for i, slot in enumerate(acc):
            builder.store(ir.Constant(vt, [float(i)] * _LANES), slot)

        def loop(step):
            with cgutils.for_range(builder, iters_):
                for slot in acc:
                    builder.store(step(builder.load(slot)), slot)

        with builder.if_else(builder.icmp_signed("==", kind_, ir.Constant(kind_.type, 0))) as (
                plain, dot):
            with plain:
                loop(lambda s: builder.call(fma, [s, a, b]))
            with dot:
                one = builder.icmp_signed("==", kind_, ir.Constant(kind_.type, 1))
                with builder.if_else(one) as (vnni, tiles):
                    with vnni:
                        if _AVX512_BF16:
                            loop(lambda s: _bf16_dot(builder, s, a, b))
                    with tiles:
                        if _AMX:
                            _amx_loop(builder, iters_, xp, acc[0], vt)
        total = builder.load(acc[0])
        for slot in acc[1:]:
            total = builder.fadd(total, builder.load(slot))
        out = builder.extract_element(total, ir.IntType(32)(0))
        for i in range(1, _LANES):
            out = builder.fadd(out, builder.extract_element(total, ir.IntType(32)(i)))
        return out
    return types.float32(iters, x, kind), codegen


_AMX_WORDS = 768  # float32 words of operands (two 16 x 64-byte tiles) and one stored tile


def _amx_loop(builder, iters, xp, slot, vt) -> None:
    """IR: four independent accumulator tiles, each ``iters`` times ``+= A B`` (one
    ``tdpbf16ps``), operands from ``xp`` (words 0-255 and 256-511); accumulator 0 is
    stored from word 512 and its first row added into the vector ``slot``."""
    i64 = ir.IntType(64)
    _tiles_begin(builder)
    for t in range(4):
        _tile_zero(builder, t)
    for t in range(4, 8):
        _tile_load(builder, t, builder.gep(xp, [i64(256 * (t // 6))]), 64)
    with cgutils.for_range(builder, iters):
        for c in range(4):
            _tile_dot(builder, c, 4 + c % 2, 6 + c // 2)
    _tile_store(builder, 0, builder.gep(xp, [i64(512)]), 64)
    _tiles_end(builder)
    row = builder.load(builder.bitcast(builder.gep(xp, [i64(512)]), vt.as_pointer()), align=4)
    builder.store(builder.fadd(builder.load(slot), row), slot)


@numba.njit(parallel=True, cache=True)
def _run(threads, iters, x, kind):  # pragma: no cover - compiled
    sums = np.zeros(threads, np.float32)
    for t in prange(threads):
        sums[t] = _fma_loop(iters, x, kind)
    return sums.sum()


def _kind(dtype: str) -> int:
    """The loop that measures ``dtype``: 2 for AMX, 1 for ``vdpbf16ps``, 0 for float32 FMAs."""
    if dtype == "bfloat16-amx" and amx_here():
        return 2
    return 1 if dtype in ("bfloat16", "bfloat16-amx") and _AVX512_BF16 else 0


def fma_peak(dtype: str = "float32", threads: int | None = None, *, again: bool = False) -> float:
    """The FMA peak of ``threads`` cores (default: numba's thread count), in FLOP/s.

    Measured once per process and argument pair (``again=True`` measures anew: on a
    shared machine, a benchmark takes it beside its other figures, round by round):
    the best of five runs of about 40 ms each of a register-only loop (see the
    module's notes). An FMA counts as 2 FLOPs, a ``vdpbf16ps`` as 64.

    Parameters
    ----------
    dtype : {"float32", "bfloat16", "bfloat16-amx"}
        The arithmetic: float32 FMAs, bf16 pair products with float32
        accumulation (the float32 peak on a CPU without AVX512_BF16), or AMX's
        (the ``bfloat16`` peak where this process cannot run AMX).
    threads : int, optional
        Threads run at once, 1 to numba's thread count.
    again : bool
        Measure again rather than return this process's earlier figure.

    Examples
    --------
    >>> fma_peak("float32", threads=1) > 1e9
    True
    >>> fma_peak("bfloat16", threads=1) > 1e9
    True
    """
    if again:
        _measured.cache_clear()
    return _measured(dtype, threads)


@functools.lru_cache(maxsize=8)
def _measured(dtype: str, threads: int | None) -> float:
    if dtype not in PEAK_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(PEAK_DTYPES)}, got {dtype!r}")
    most = numba.get_num_threads()
    if threads is None:
        threads = most
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= most:
        raise ValueError(f"threads must be an integer from 1 to {most}, got {threads!r}")
    kind = _kind(dtype)
    x = np.full(_AMX_WORDS, 1e-8, np.float32)
    # operands: the tiles' bf16 1/128 (the vector loops' float32 words 0.0078): small,
    # no overflow in any loop's iterations
    x[:512].view(np.uint32)[:] = 0x3C003C00
    # FLOPs per loop iteration per thread
    per_iter = 4 * 16 * 16 * 32 * 2 if kind == 2 else _ACC * _LANES * (4 if kind else 2)
    _run(threads, 1000, x, kind)  # compile or load, and wake the cores
    iters = 1 << 21  # at least ~5 ms a run: a parallel launch's cost is noise next to it
    while True:  # about 40 ms a run
        t = time.perf_counter()
        _run(threads, iters, x, kind)
        took = time.perf_counter() - t
        if took > 0.04 or iters > 1 << 30:
            break
        iters *= 2
    best = took
    for _ in range(4):
        t = time.perf_counter()
        _run(threads, iters, x, kind)
        best = min(best, time.perf_counter() - t)
    return threads * iters * per_iter / best
