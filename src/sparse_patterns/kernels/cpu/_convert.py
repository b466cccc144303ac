"""Half-precision inputs and outputs of the CPU kernel: bf16 and fp16 bits widened to
float32 and narrowed back, in parallel vector passes.

The kernel computes float16 inputs, and bfloat16 ones where bf16 products do not
apply (neither :func:`._bf16.amx_applies` nor :func:`._bf16.bf16_applies`: a CPU
without AMX whose ``vdpbf16ps`` peak is less than 1.3x its float32 FMA peak, measured
by :func:`._peak.fma_peak`; other tile
sizes), in float32 (products on float32 FMAs, float32 softmax statistics): there the
halved bytes are the only saving, and this pass is what the half inputs cost on top of
float32 ones. It reads the 16-bit words (a torch tensor's storage viewed as
``int16``, or a NumPy ``float16`` array viewed so), writes float32 into arrays
recycled by the calling thread (:func:`._pool._buffer`), and narrows the output with
round-to-nearest-even (NaN stays NaN). It replaces torch's own ``.to(torch.float32)``,
whose cost is comparable to a strided forward's.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._llvm import _AVX512_BF16, _BFloat
from ._pool import _buffer

__all__ = ["widen", "narrow", "HALF_KINDS"]

#: the 16-bit float formats, by the name torch and NumPy give their dtype
HALF_KINDS = ("bfloat16", "float16")

_V = 16  # float32 lanes of one pass step
_STEP = 1 << 16  # elements per parallel work item


@intrinsic
def _widen16(typingctx, src, dst, off, count, bf):  # pragma: no cover - compiled
    """``dst[off + i] = float32(word src[off + i])`` for ``i < count`` (a multiple of
    16), the words bf16 (``bf``) or IEEE half."""
    def codegen(context, builder, signature, args):
        src_, dst_, off_, count_, bf_ = args
        sp = context.make_array(signature.args[0])(context, builder, src_).data
        dp = context.make_array(signature.args[1])(context, builder, dst_).data
        wt = ir.VectorType(ir.IntType(16), _V)
        ft = ir.VectorType(ir.FloatType(), _V)
        step = ir.Constant(count_.type, _V)
        with builder.if_else(bf_) as (brain, ieee):
            for is_bf, arm in ((True, brain), (False, ieee)):
                with arm, cgutils.for_range(builder, builder.sdiv(count_, step)) as loop:
                    at = builder.add(off_, builder.mul(loop.index, step))
                    w = builder.load(builder.bitcast(builder.gep(sp, [at]), wt.as_pointer()),
                                     align=2)
                    if is_bf:
                        x = builder.shl(builder.zext(w, ir.VectorType(ir.IntType(32), _V)),
                                        ir.Constant(ir.VectorType(ir.IntType(32), _V), [16] * _V))
                        f = builder.bitcast(x, ft)
                    else:
                        f = builder.fpext(builder.bitcast(w, ir.VectorType(ir.HalfType(), _V)), ft)
                    builder.store(f, builder.bitcast(builder.gep(dp, [at]), ft.as_pointer()),
                                  align=4)
        return context.get_dummy_value()
    return types.none(src, dst, off, count, bf), codegen


def _round_bf16(builder, f):
    """bf16 words nearest float32 vector ``f`` (ties to even, NaN quieted) in integer
    operations: LLVM lowers ``fptrunc`` to ``bfloat`` to ``vcvtneps2bf16`` on a CPU
    with AVX512_BF16, elsewhere to a library call that numba's JIT does not link."""
    it = ir.VectorType(ir.IntType(32), _V)

    def const(x):
        return ir.Constant(it, [x] * _V)

    bits = builder.bitcast(f, it)
    odd = builder.and_(builder.lshr(bits, const(16)), const(1))
    rounded = builder.lshr(builder.add(builder.add(bits, const(0x7FFF)), odd), const(16))
    quiet = builder.or_(builder.lshr(bits, const(16)), const(0x40))
    w = builder.select(builder.fcmp_unordered("uno", f, f), quiet, rounded)
    return builder.trunc(w, ir.VectorType(ir.IntType(16), _V))


@intrinsic
def _narrow16(typingctx, src, dst, off, count, bf):  # pragma: no cover - compiled
    """``dst[off + i]`` = the bf16 (``bf``) or IEEE-half word nearest float32
    ``src[off + i]`` (ties to even; NaN stays NaN), ``count`` a multiple of 16."""
    def codegen(context, builder, signature, args):
        src_, dst_, off_, count_, bf_ = args
        sp = context.make_array(signature.args[0])(context, builder, src_).data
        dp = context.make_array(signature.args[1])(context, builder, dst_).data
        wt = ir.VectorType(ir.IntType(16), _V)
        ft = ir.VectorType(ir.FloatType(), _V)
        step = ir.Constant(count_.type, _V)
        if bf_.type != ir.IntType(1):  # an integer flag (the backward's bf: 1 or 2)
            bf_ = builder.icmp_unsigned("!=", bf_, ir.Constant(bf_.type, 0))
        with builder.if_else(bf_) as (brain, ieee):
            for half_t, arm in ((_BFloat(), brain), (ir.HalfType(), ieee)):
                with arm, cgutils.for_range(builder, builder.sdiv(count_, step)) as loop:
                    at = builder.add(off_, builder.mul(loop.index, step))
                    f = builder.load(builder.bitcast(builder.gep(sp, [at]), ft.as_pointer()),
                                     align=4)
                    if half_t == _BFloat() and not _AVX512_BF16:
                        w = _round_bf16(builder, f)
                    else:
                        w = builder.bitcast(builder.fptrunc(f, ir.VectorType(half_t, _V)), wt)
                    builder.store(w, builder.bitcast(builder.gep(dp, [at]), wt.as_pointer()),
                                  align=2)
        return context.get_dummy_value()
    return types.none(src, dst, off, count, bf), codegen


@numba.njit(parallel=True, cache=True)
def _convert(src, dst, bf, up):  # pragma: no cover - compiled
    """``dst`` = ``src`` widened (``up``: 16-bit words to float32) or narrowed, in
    parallel runs of ``_STEP`` elements, each run's tail through one padded vector."""
    n = src.size
    for u in prange((n + _STEP - 1) // _STEP):
        a = u * _STEP
        m = min(_STEP, n - a)
        body = m - m % _V
        pad = np.zeros(_V, src.dtype)
        out = np.zeros(_V, dst.dtype)
        for i in range(body, m):
            pad[i - body] = src[a + i]
        for whole in (True, False):
            x, y, off, count = (src, dst, a, body) if whole else (pad, out, 0, _V)
            if whole or body < m:
                if up:
                    _widen16(x, y, off, count, bf)
                else:
                    _narrow16(x, y, off, count, bf)
        for i in range(body, m):
            dst[a + i] = out[i - body]


def widen(words: np.ndarray, kind: str) -> np.ndarray:
    """The float32 values of 16-bit float words, in a recycled array shaped like ``words``.

    Parameters
    ----------
    words : numpy.ndarray
        C-contiguous ``int16``, ``uint16`` or ``float16`` array: the bits of the values.
    kind : {"bfloat16", "float16"}
        Their format.

    Examples
    --------
    >>> w = np.array([0x3F80, 0xC000, 0x7FC0], np.uint16)  # bf16 1.0, -2.0, NaN
    >>> widen(w, "bfloat16")
    array([ 1., -2., nan], dtype=float32)
    >>> widen(np.array([0.5, 65504.0], np.float16), "float16")
    array([5.0000e-01, 6.5504e+04], dtype=float32)
    """
    bits = np.ascontiguousarray(words).view(np.uint16)
    out = _buffer(words.shape, np.float32)
    _convert(bits.reshape(-1), out.reshape(-1), kind == "bfloat16", True)
    return out


def narrow(values: np.ndarray, kind: str, out: np.ndarray | None = None) -> np.ndarray:
    """The 16-bit words nearest float32 ``values`` (ties to even), as ``uint16``.

    ``out``: a C-contiguous 2-byte array shaped like ``values`` to write into (a torch
    tensor's storage viewed as ``int16``), else a new array.

    Examples
    --------
    >>> narrow(np.array([1.0, 1.00390625, -3.4e38, np.nan], np.float32), "bfloat16")
    array([16256, 16256, 65408, 32704], dtype=uint16)
    >>> narrow(np.array([1.0, 70000.0], np.float32), "float16").view(np.float16)
    array([ 1., inf], dtype=float16)
    """
    src = np.ascontiguousarray(values, dtype=np.float32)
    dst = np.empty(src.shape, np.uint16) if out is None else out
    _convert(src.reshape(-1), dst.reshape(-1).view(np.uint16), kind == "bfloat16", False)
    return dst.view(np.uint16) if out is None else out
