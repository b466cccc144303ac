"""Vector primitives of the CPU kernel: row copies and pairs, 16 x 16 transposes, the
float32 exponential (:func:`_exp2f` and its LLVM-IR twin :func:`_emit_exp2`) and the bf16
building blocks (:func:`_bf16_dot`, :func:`_pack_bf16`, :func:`_cat_bf16`), most of them
numba intrinsics written in LLVM IR or IR emitters, which the tile passes
(:mod:`._llvm_fwd`, :mod:`._llvm_bwd`) and the ``@njit`` loops of :mod:`._forward` and
:mod:`._backward` use.

What they are for, on a CPU without SVML:

* the exponential: ``math.exp`` inside a loop is scalar, so the float32 forward
  scales its scores by ``log2 e`` (in the score product) and uses Cephes'
  ``exp2f`` (``x = n + r``, a degree-6 polynomial in ``r``, relative error below
  2e-7) written so LLVM vectorizes it, building ``2**n`` with a bitcast (the
  backward does the same with the saved log-sum-exp); float64 keeps ``math.exp``;
  on AVX-512 the IR twin applies ``2**n`` by ``vscalefps``; the bf16 forward, whose
  probabilities are rounded to bf16 right after, takes a degree-4 polynomial
  (:data:`_EXP2_POLY_BF16`, relative error below 2.7e-6) in the fraction ``x - floor(x)``
  by ``vreduceps``, no clamp, ``vscalefps`` masked;
* moving rows: tiles are transposed 16 x 16 in vector registers
  (:func:`_transpose16`, not a scalar loop), rows are copied with ``memcpy``
  (:func:`_copy`, not numba's slice assignment), bf16 rows are interleaved by pairs in
  vector shuffles (:func:`_pair_rows`), and the hot loops ask LLVM for 512-bit vectors
  (:func:`_wide`), which its tuning for AVX-512 CPUs otherwise avoids;
* the next rows asked for while the current ones compute (:func:`_prefetch`, into L2).

The measurements behind these choices are in ``docs/kernel-notes.md``.

An intrinsic's IR is generated into each function that calls it, and numba's cache
of a function is invalidated only by a change to its own file: after editing this
module, delete the ``__pycache__/*.nbi`` and ``*.nbc`` files of the package (see
:mod:`sparse_patterns.kernels.cpu`).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = [
    "_BLOCK", "_FM", "_LOG2E", "_AVX512", "_AVX512_BF16", "_WIDE", "_wide_blocks", "_EXP2_POLY", "_EXP2_POLY_BF16", "_wide",
    "_copy", "_copy_nt", "_zero", "_prefetch", "_pair_rows", "_dot_bf16", "_bits_to_f32", "_exp2f",
    "_transpose16", "_splat", "_BFloat", "_bf16_dot", "_mac", "_bf16_ok", "_emit_exp2",
    "_pack_bf16", "_cat_bf16", "_row_pairs", "_lane_order", "_transpose_regs",
]

_LOG2E = 1.4426950408889634
_FM = {"contract"}  # FMA contraction only: NaN and inf keep their IEEE meaning
# the options of the functions that the parallel loops call once a block (_forward_block._qblock,
# _backward_block._kblock32): no reference counting (numba's ``_nrt=False``: they allocate nothing,
# and the views they take end with the call): with it, each call takes and drops a reference
# on each of its two dozen arrays, atomic adds on counters that the threads share
_BLOCK = {"cache": True, "fastmath": _FM, "_nrt": False}


# --------------------------------------------------------------------- vector width
@intrinsic
def _wide(typingctx):  # pragma: no cover - compiled
    """Let LLVM vectorize the calling function with 512-bit vectors (``zmm``) on a CPU
    that has them. LLVM's default tuning for AVX-512 CPUs prefers 256-bit vectors,
    which halves the width of the softmax, masking and rescaling loops. A no-op
    elsewhere (LLVM caps the width at what the CPU has)."""
    def codegen(context, builder, signature, args):
        attrs = builder.function.attributes
        try:  # a string attribute, which llvmlite's whitelist does not list
            set.add(attrs, '"prefer-vector-width"="512"')
        except TypeError:  # pragma: no cover - a future llvmlite without set semantics
            pass
        return context.get_dummy_value()
    return types.none(), codegen


# --------------------------------------------------------------------- row copies
@intrinsic
def _copy(typingctx, dst, doff, src, soff, count):  # pragma: no cover - compiled
    """``count`` elements from ``src`` (from element ``soff``) to ``dst`` (from
    ``doff``), C-contiguous arrays of one dtype, as one ``memcpy``. A row copied by
    slice assignment (``a[i*d:(i+1)*d] = b[...]``) goes through numba's generic
    strided copy, an element at a time."""
    def codegen(context, builder, signature, args):
        dst_, doff_, src_, soff_, count_ = args
        dty, sty = signature.args[0], signature.args[2]
        dp = context.make_array(dty)(context, builder, dst_).data
        sp = context.make_array(sty)(context, builder, src_).data
        size = context.get_abi_sizeof(context.get_value_type(dty.dtype))
        cgutils.raw_memcpy(builder, builder.gep(dp, [doff_]), builder.gep(sp, [soff_]),
                           count_, size)
        return context.get_dummy_value()
    return types.none(dst, doff, src, soff, count), codegen


@intrinsic
def _copy_nt(typingctx, dst, doff, src, soff, count):  # pragma: no cover - compiled
    """:func:`_copy` with non-temporal stores: ``count`` elements, a multiple of a
    64-byte vector, to ``dst + doff``, which must start on a cache line. The lines are
    written whole, without first being read into the cache (a normal store reads
    each line it writes), and are not kept there."""
    def codegen(context, builder, signature, args):
        dst_, doff_, src_, soff_, count_ = args
        dty, sty = signature.args[0], signature.args[2]
        et = context.get_value_type(dty.dtype)
        lanes = 64 // context.get_abi_sizeof(et)
        vp = ir.VectorType(et, lanes).as_pointer()
        dp = builder.gep(context.make_array(dty)(context, builder, dst_).data, [doff_])
        sp = builder.gep(context.make_array(sty)(context, builder, src_).data, [soff_])
        nontemporal = builder.module.add_metadata([ir.IntType(32)(1)])
        step = ir.Constant(count_.type, lanes)
        with cgutils.for_range(builder, builder.sdiv(count_, step)) as loop:
            off = builder.mul(loop.index, step)
            v = builder.load(builder.bitcast(builder.gep(sp, [off]), vp), align=4)
            store = builder.store(v, builder.bitcast(builder.gep(dp, [off]), vp), align=64)
            store.set_metadata("nontemporal", nontemporal)
        return context.get_dummy_value()
    return types.none(dst, doff, src, soff, count), codegen


@intrinsic
def _zero(typingctx, dst, doff, count):  # pragma: no cover - compiled
    """``dst[doff: doff + count] = 0`` as one ``memset`` (a float zero is all-zero bytes)."""
    def codegen(context, builder, signature, args):
        dst_, doff_, count_ = args
        dty = signature.args[0]
        dp = context.make_array(dty)(context, builder, dst_).data
        size = context.get_abi_sizeof(context.get_value_type(dty.dtype))
        nbytes = builder.mul(count_, ir.Constant(count_.type, size))
        cgutils.memset(builder, builder.gep(dp, [doff_]), nbytes, 0)
        return context.get_dummy_value()
    return types.none(dst, doff, count), codegen



@intrinsic
def _prefetch(typingctx, arr, off, count):  # pragma: no cover - compiled
    """Ask for the cache lines of ``arr[off: off + count]`` (one ``prefetcht1`` a 64-byte
    line, into L2): a hint, nothing is read or changed."""
    def codegen(context, builder, signature, args):
        arr_, off_, count_ = args
        aty = signature.args[0]
        size = context.get_abi_sizeof(context.get_value_type(aty.dtype))
        ap = builder.gep(context.make_array(aty)(context, builder, arr_).data, [off_])
        i8p = ir.IntType(8).as_pointer()
        pf = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p] + [ir.IntType(32)] * 3),
            "llvm.prefetch.p0")
        base = builder.bitcast(ap, i8p)
        nbytes = builder.mul(count_, ir.Constant(count_.type, size))
        lines = builder.sdiv(builder.add(nbytes, ir.Constant(count_.type, 63)),
                             ir.Constant(count_.type, 64))
        with cgutils.for_range(builder, lines) as loop:
            at = builder.gep(base, [builder.mul(loop.index, ir.Constant(count_.type, 64))])
            builder.call(pf, [at, ir.IntType(32)(0), ir.IntType(32)(2), ir.IntType(32)(1)])
        return context.get_dummy_value()
    return types.none(arr, off, count), codegen


def _pair_masks() -> tuple[ir.Constant, ir.Constant]:
    """The shuffle masks that interleave two vectors of 32 bf16 words ``a``, ``b`` by
    element: ``a0 b0 a1 b1 ... a15 b15``, then ``a16 b16 ... a31 b31``."""
    return tuple(ir.Constant(ir.VectorType(ir.IntType(32), 32),
                             [y for i in range(h, h + 16) for y in (i, 32 + i)])
                 for h in (0, 16))


@intrinsic
def _pair_rows(typingctx, dst, doff, src, sa, sb, dw):  # pragma: no cover - compiled
    """Two rows of bf16 pairs interleaved by element: the ``2 dw`` words at
    ``dst[doff]`` get, in word ``c``, element ``c`` of the row at ``src[sa]`` (low
    half) and element ``c`` of the row at ``src[sb]`` (high half); a row is ``dw``
    words (``2 dw`` bf16, a multiple of 32). ``dst`` and ``src`` are float32 arrays
    used as word containers; bits are moved, never computed on."""
    def codegen(context, builder, signature, args):
        dst_, doff_, src_, sa_, sb_, dw_ = args
        dp = builder.gep(context.make_array(signature.args[0])(context, builder, dst_).data, [doff_])
        sp = context.make_array(signature.args[2])(context, builder, src_).data
        ht = ir.VectorType(ir.IntType(16), 32)
        i64 = ir.IntType(64)
        lo, hi = _pair_masks()
        pa, pb = (builder.gep(sp, [x]) for x in (sa_, sb_))
        with cgutils.for_range(builder, builder.sdiv(dw_, i64(16))) as loop:
            off = builder.mul(loop.index, i64(16))
            a, b = (builder.load(builder.bitcast(builder.gep(p, [off]), ht.as_pointer()), align=4)
                    for p in (pa, pb))
            for h, mask in enumerate((lo, hi)):
                out = builder.gep(dp, [builder.add(builder.mul(off, i64(2)), i64(16 * h))])
                builder.store(builder.shuffle_vector(a, b, mask), builder.bitcast(out, ht.as_pointer()),
                              align=4)
        return context.get_dummy_value()
    return types.none(dst, doff, src, sa, sb, dw), codegen


@intrinsic
def _dot_bf16(typingctx, a, aoff, b, boff, dw):  # pragma: no cover - compiled
    """The float32 dot product of two rows of bf16 pairs: ``dw`` words (a multiple of
    16) from ``a[aoff]`` and ``b[boff]`` (float32 arrays used as word containers), each
    half widened exactly to float32 in registers (a shift, a mask) and the products
    summed by fused multiply-adds in 16 lanes, then the lanes in a fixed tree: the same
    bits on any CPU, denormals kept."""
    def codegen(context, builder, signature, args):
        a_, aoff_, b_, boff_, dw_ = args
        i32v, f32v = ir.VectorType(ir.IntType(32), 16), ir.VectorType(ir.FloatType(), 16)
        pa, pb = (builder.gep(context.make_array(signature.args[i])(context, builder, x).data,
                              [off]) for i, x, off in ((0, a_, aoff_), (2, b_, boff_)))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32v, [f32v] * 3),
                                             "llvm.fma.v16f32")
        sixteen, high = (ir.Constant(i32v, [x] * 16) for x in (16, 0xFFFF0000))
        acc_ptr = cgutils.alloca_once_value(builder, ir.Constant(f32v, [0.0] * 16))
        with cgutils.for_range(builder, builder.sdiv(dw_, ir.Constant(dw_.type, 16))) as loop:
            off = builder.mul(loop.index, ir.Constant(dw_.type, 16))
            x, y = (builder.load(builder.bitcast(builder.gep(p, [off]), i32v.as_pointer()),
                                 align=4) for p in (pa, pb))
            acc = builder.load(acc_ptr)
            for half in (lambda v: builder.shl(v, sixteen), lambda v: builder.and_(v, high)):
                acc = builder.call(fma, [builder.bitcast(half(x), f32v),
                                         builder.bitcast(half(y), f32v), acc])
            builder.store(acc, acc_ptr)
        acc = builder.load(acc_ptr)
        for width in (8, 4, 2, 1):  # lanes i and i + width
            idx = ir.VectorType(ir.IntType(32), 16)
            top = builder.shuffle_vector(acc, acc, ir.Constant(
                idx, [i + width if i < width else i for i in range(16)]))
            acc = builder.fadd(acc, top)
        return builder.extract_element(acc, ir.IntType(32)(0))
    return types.float32(a, aoff, b, boff, dw), codegen


# --------------------------------------------------------------------- bit casts
@intrinsic
def _bits_to_f32(typingctx, x):  # pragma: no cover - compiled
    """The float32 whose bits are the low 32 bits of integer ``x``."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if x.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif x.bitwidth < 32:
            v = builder.sext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(x), codegen



# --------------------------------------------------------------------- exp2
def _has_avx512(feature: str = "avx512f") -> bool:
    """Whether numba compiles for a CPU with ``feature`` (AVX-512F by default): its
    configured features (``NUMBA_CPU_FEATURES``), else the host's."""
    import llvmlite.binding as llvm
    from numba.core import config

    features = config.CPU_FEATURES  # "" for NUMBA_CPU_NAME=generic: no AVX-512 at all
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    return "+" + feature in features.split(",")


_AVX512 = _has_avx512()
_AVX512_BF16 = _has_avx512("avx512bf16")
_AVX512_DQ = _has_avx512("avx512dq")  # vreduceps (_emit_exp2's ``floor``)
# The register blocks of the float32 passes (._llvm_fwd, ._llvm_bwd) keep their sums in half
# the vector registers: 16 values of 16 floats, 16 of AVX-512's 32 registers. Without
# AVX-512F, 4 such values: on AVX2 (16 registers of 256 bits, a value two of them) 8
# registers, where the AVX-512 blocks spill their sums to the stack at every step; narrower
# targets get these blocks too. Read as a pass compiles (a test compiles both).
_WIDE = _AVX512


def _wide_blocks() -> bool:
    """:data:`_WIDE` as it is now (a test sets it before compiling a pass)."""
    return _WIDE


# Cephes' degree-6 polynomial for 2**r on [-1/2, 1/2], highest power first
_EXP2_POLY = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
              5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1, 1.0)
# degree 4 for 2**r on [0, 1) (r = x - floor(x); sqrt(2) times a fit on [-1/2, 1/2] shifted
# by 1/2, for relative error: at most 2.7e-6 evaluated in float32): the bf16 passes'
# probabilities, which are rounded to bf16 (2**-8) right after; see _emit_exp2's ``floor``.
# Two FMAs less per element than _EXP2_POLY
_EXP2_POLY_BF16 = (1.3534159223518348e-2, 5.201148244297174e-2, 2.4144273977319353e-1,
                   6.930038390650679e-1, 1.0000025930750152)


@numba.njit(cache=True, fastmath=_FM, inline="always")
def _exp2f(x):  # pragma: no cover - compiled
    """``2**x`` in float32, written so that a loop around it vectorizes: ``x = n + r``
    with ``n`` the nearest integer, Cephes' degree-6 polynomial for ``2**r`` on
    ``[-1/2, 1/2]`` (relative error below 2e-7), ``2**n`` from the exponent bits.
    ``-inf`` (and anything below ``-126``) gives 0; NaN stays NaN."""
    G = np.float32
    xc = x if x > G(-126.0) else G(-126.0)
    nf = np.rint(xc)
    r = xc - nf
    P = _EXP2_POLY
    y = ((((((G(P[0]) * r + G(P[1])) * r + G(P[2])) * r + G(P[3])) * r + G(P[4])) * r
          + G(P[5])) * r + G(P[6]))
    y = y * _bits_to_f32((np.int32(nf) + 127) << 23)
    return y if x >= G(-126.0) else (x if x != x else G(0.0))


# --------------------------------------------------------------------- tiles
@intrinsic
def _transpose16(typingctx, src, roff, i0, c0, dst, doff, dld):  # pragma: no cover - compiled
    """``dst[doff + c * dld + r] = src[roff[i0 + r] + c0 + c]`` for ``r, c < 16``: a
    16 x 16 tile transposed in vector registers (16 row loads, 64 two-vector shuffles
    in four butterfly stages, 16 stores), instead of a scalar loop, whose strided
    stores LLVM cannot vectorize well."""
    def codegen(context, builder, signature, args):
        src_, roff_, i0_, c0_, dst_, doff_, dld_ = args
        sty, rty = signature.args[:2]
        dty = signature.args[4]
        sp = context.make_array(sty)(context, builder, src_).data
        rp = context.make_array(rty)(context, builder, roff_).data
        dp = context.make_array(dty)(context, builder, dst_).data
        vt = ir.VectorType(context.get_value_type(sty.dtype), 16)
        i64 = ir.IntType(64)
        rows = []
        for i in range(16):
            o = builder.load(builder.gep(rp, [builder.add(i0_, i64(i))]))
            ptr = builder.gep(sp, [builder.add(o, c0_)])
            rows.append(builder.load(builder.bitcast(ptr, vt.as_pointer()), align=4))
        rows = _transpose_regs(builder, rows)
        for j in range(16):
            ptr = builder.gep(dp, [builder.add(doff_, builder.mul(dld_, i64(j)))])
            builder.store(rows[j], builder.bitcast(ptr, vt.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.none(src, roff, i0, c0, dst, doff, dld), codegen


def _transpose_regs(builder, rows: list) -> list:
    """IR: 16 vectors of 16 lanes transposed (lane ``c`` of vector ``r`` to lane ``r``
    of vector ``c``) in four butterfly stages of two-vector shuffles."""
    h = 8
    while h >= 1:  # rows i and i + h exchange blocks of h lanes
        lo = [m + t for m in range(0, 16, 2 * h) for t in (*range(h), *range(16, 16 + h))]
        hi = [x + h for x in lo]
        masks = [ir.Constant(ir.VectorType(ir.IntType(32), 16), x) for x in (lo, hi)]
        new = list(rows)
        for i in range(16):
            if not i & h:
                new[i] = builder.shuffle_vector(rows[i], rows[i + h], masks[0])
                new[i + h] = builder.shuffle_vector(rows[i], rows[i + h], masks[1])
        rows = new
        h //= 2
    return rows


def _splat(builder, x, vt):
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), x, ir.IntType(32)(0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), vt.count),
                                                    [0] * vt.count))


class _BFloat(ir.types._BaseFloatType):
    """LLVM's ``bfloat`` (llvmlite's IR builder has no such type): the operand type of
    the AVX512_BF16 intrinsics."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"


_BFloat._create_instance()


def _bf16_dot(builder, acc, a, b):
    """``vdpbf16ps``: ``acc[i] + a[2i] b[2i] + a[2i+1] b[2i+1]`` for 16 float32 lanes
    ``acc`` and the 32 bf16 halves of 512-bit vectors ``a`` and ``b`` (any 512-bit
    vector type: their bits are reinterpreted). AVX512_BF16 only."""
    bt = ir.VectorType(_BFloat(), 32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(acc.type, [acc.type, bt, bt]),
                                        "llvm.x86.avx512bf16.dpbf16ps.512")
    return builder.call(fn, [acc, builder.bitcast(a, bt), builder.bitcast(b, bt)])


def _mac(builder, fma, bf16: bool, acc, a, b):
    """``acc + a b``: one FMA (``fma``, float vectors), or with ``bf16`` one ``vdpbf16ps``
    (:func:`_bf16_dot`: ``a`` and ``b`` hold bf16 pairs) - the step of every register-blocked
    pass, generated for both arithmetics."""
    return _bf16_dot(builder, acc, a, b) if bf16 else builder.call(fma, [a, b, acc])


def _bf16_ok(context, array_type) -> bool:
    """Whether a bf16 pass can be generated for ``array_type``: float32 (bf16 pair
    containers) on a CPU with AVX512_BF16. Elsewhere the pass compiles to nothing: its
    callers compile it into the float64 path too, and on a CPU without AVX512_BF16,
    where :func:`._bf16.bf16_applies` never lets it be reached."""
    return _AVX512_BF16 and context.get_value_type(array_type.dtype) == ir.FloatType()


def _emit_exp2(builder, x, poly=_EXP2_POLY, floor=False):
    """IR for :func:`_exp2f` on a vector of 16 float32 ``x``: the same operations, so
    the same bits (``poly``: the polynomial in the fraction, highest power first). On
    AVX-512, ``vscalefps`` applies ``2**n`` (one instruction for
    the four of the bit construction, the same single rounding) and propagates NaN
    itself. The clamp stays at -126: an exponent that underflows (2**-150 for a
    masked score) costs a microcode assist per vector.

    ``floor`` (with :data:`_EXP2_POLY_BF16`, a polynomial on ``[0, 1)``): ``x = n + r``
    with ``n = floor(x)``, other bits than :func:`_exp2f`'s. On AVX-512 that is two
    instructions fewer a vector (7, not 9): ``r`` by one ``vreduceps`` (0 for an
    infinite ``x``, so no clamp), ``2**n`` by ``vscalefps`` on ``x`` itself (it takes
    the floor of its exponent), computed only where ``x >= -126`` or NaN, 0 elsewhere
    (a masked lane raises no assist)."""
    vt = x.type
    mod = builder.module
    i32 = ir.IntType(32)
    it = ir.VectorType(i32, 16)
    fma = cgutils.get_or_insert_function(mod, ir.FunctionType(vt, [vt] * 3), "llvm.fma.v16f32")

    def const(v):
        return ir.Constant(vt, [float(v)] * 16)

    def polynomial(r):
        y = const(poly[0])
        for c in poly[1:]:
            y = builder.call(fma, [y, r, const(c)])
        return y

    lo = const(-126.0)
    if _AVX512:
        scalef = cgutils.get_or_insert_function(
            mod, ir.FunctionType(vt, [vt, vt, vt, ir.IntType(16), i32]),
            "llvm.x86.avx512.mask.scalef.ps.512")
    if floor and _AVX512 and _AVX512_DQ:
        reduce = cgutils.get_or_insert_function(
            mod, ir.FunctionType(vt, [vt, i32, vt, ir.IntType(16), i32]),
            "llvm.x86.avx512.mask.reduce.ps.512")
        # imm 9: x - floor(x) (rounding down, precision exception suppressed)
        r = builder.call(reduce, [x, i32(9), const(0.0), ir.IntType(16)(-1), i32(4)])
        keep = builder.bitcast(builder.fcmp_unordered(">=", x, lo), ir.IntType(16))
        return builder.call(scalef, [polynomial(r), x, const(0.0), keep, i32(4)])
    below = builder.fcmp_ordered("<", x, lo)
    xc = builder.select(below, lo, x)  # NaN stays NaN
    rounding = cgutils.get_or_insert_function(mod, ir.FunctionType(vt, [vt]),
                                              "llvm.floor.v16f32" if floor else "llvm.rint.v16f32")
    nf = builder.call(rounding, [xc])
    y = polynomial(builder.fsub(xc, nf))
    if _AVX512:
        y = builder.call(scalef, [y, nf, const(0.0), ir.IntType(16)(-1), i32(4)])
        return builder.select(below, const(0.0), y)
    e = builder.shl(builder.add(builder.fptosi(nf, it), ir.Constant(it, [127] * 16)),
                    ir.Constant(it, [23] * 16))
    y = builder.fmul(y, builder.bitcast(e, vt))
    other = builder.select(builder.fcmp_unordered("uno", x, x), x, const(0.0))
    return builder.select(builder.fcmp_ordered(">=", x, lo), y, other)


def _lane_masks() -> tuple[ir.Constant, ir.Constant]:
    """The masks of :func:`_pair_masks` within each 128-bit lane (``vpunpcklwd`` and
    ``vpunpckhwd``): lane ``L`` of the first holds ``a b`` of elements ``8L .. 8L+3``, of
    the second ``8L+4 .. 8L+7``: the pairs of :data:`_LANE_COLUMNS`' columns."""
    return tuple(ir.Constant(ir.VectorType(ir.IntType(32), 32),
                             [y for i in _LANE_COLUMNS[h] for y in (i, 32 + i)])
                 for h in (0, 1))


#: the columns (of 32) that float32 lanes 0-15 of the two vectors of :func:`_lane_masks`'
#: pairs hold: lane ``k`` of the first, column ``8 (k // 4) + k % 4``, of the second 4 more
_LANE_COLUMNS = tuple(tuple(8 * (k // 4) + 4 * h + k % 4 for k in range(16)) for h in (0, 1))


def _lane_order(builder, x, y, back: bool = False):
    """Two vectors of 16 float32 (columns 0-15 and 16-31 of a row) in the column order of
    :data:`_LANE_COLUMNS` (one two-source shuffle each: LLVM emits ``vshuff64x2`` one way,
    ``vpermt2pd`` the other), or ``back`` from it to columns in order."""
    i32 = ir.IntType(32)
    if not back:
        return [builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, 16), list(cols)))
                for cols in _LANE_COLUMNS]
    where = {c: 16 * h + k for h in (0, 1) for k, c in enumerate(_LANE_COLUMNS[h])}
    return [builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, 16),
                                                     [where[c] for c in range(16 * h, 16 * h + 16)]))
            for h in (0, 1)]


def _row_pairs(builder, sp, ra, rb, c0, W, vt, lanes: bool = False):
    """IR: ``W`` vectors (of type ``vt``) of columns ``c0 .. c0 + 16 W`` (``W`` 1 or even;
    ``c0`` a multiple of 16, of 32 when ``W > 1``) of two rows of bf16 words that start at word
    offsets ``ra`` and ``rb`` of ``sp``, interleaved: lane ``c`` holds column ``c0 + c``
    of the first row, then of the second, the operand of a ``vdpbf16ps`` whose pairs run
    over the two rows. 32 columns are one 64-byte load from each row and two shuffles
    (:func:`_pair_rows`'s), in registers instead of a pass that writes paired rows.
    ``lanes`` (``W`` even): the shuffles are in-lane unpacks (:func:`_lane_masks`), and
    each 32 columns' two vectors hold them in :data:`_LANE_COLUMNS`' order (the sums'
    columns then are too: :func:`_lane_order` puts them back), not ``vpermt2w``, which on
    some CPUs shares a port with half of each ``vdpbf16ps``."""
    i64 = ir.IntType(64)
    ht = ir.VectorType(ir.IntType(16), 32)
    masks = _lane_masks() if lanes and W > 1 else _pair_masks()
    out = []
    for c in range(0, W, 2) if W > 1 else [0]:
        col = builder.add(c0, i64(16 * c))
        half = builder.srem(col, i64(32))  # 16: the upper half of a 32-column load
        word = builder.sdiv(builder.sub(col, half), i64(2))
        a, b = (builder.load(builder.bitcast(builder.gep(sp, [builder.add(row, word)]),
                                             ht.as_pointer()), align=4) for row in (ra, rb))
        lo, hi = (builder.bitcast(builder.shuffle_vector(a, b, m), vt) for m in masks)
        if W > 1:
            out += [lo, hi]
        else:
            out.append(builder.select(builder.icmp_signed("!=", half, i64(0)), hi, lo))
    return out


def _bf16_both(builder, lo, hi):
    """``<32 x i16>``: ``lo`` (16 float32) rounded to bf16 in elements 0-15 and ``hi`` in
    16-31, ties to even, NaN kept: one ``vcvtne2ps2bf16`` (AVX512_BF16, which every pass
    that packs bf16 requires: see :func:`_bf16_ok`)."""
    ht = ir.VectorType(ir.IntType(16), 32)
    bt = ir.VectorType(_BFloat(), 32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(bt, [lo.type] * 2),
                                        "llvm.x86.avx512bf16.cvtne2ps2bf16.512")
    return builder.bitcast(builder.call(fn, [hi, lo]), ht)  # the second operand goes low


def _pack_bf16(builder, lo, hi):
    """16 words of bf16 pairs from two vectors of 16 float32: word ``i`` holds
    ``lo[i]`` rounded to bf16 in its low half and ``hi[i]`` in its high half (ties to
    even; ``vcvtne2ps2bf16`` and one word shuffle), as a ``<16 x float>`` container."""
    both = _bf16_both(builder, lo, hi)
    mask = [x for i in range(16) for x in (i, 16 + i)]
    pairs = builder.shuffle_vector(both, both, ir.Constant(ir.VectorType(ir.IntType(32), 32), mask))
    return builder.bitcast(pairs, lo.type)


def _cat_bf16(builder, lo, hi):
    """16 words of bf16 from two vectors of 16 float32, in order: ``lo`` rounded to bf16
    in elements 0-15, ``hi`` in 16-31 (word ``i`` holds elements ``2i, 2i + 1``)."""
    return builder.bitcast(_bf16_both(builder, lo, hi), lo.type)
