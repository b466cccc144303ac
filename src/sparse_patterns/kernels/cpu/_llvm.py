"""Vector primitives of the CPU kernel: row copies, 16 x 16 transposes, the float32
exponential (:func:`_exp2f` and its LLVM-IR twin) and the register-blocked passes
over 32-token float32 tiles (:func:`_scores32`, :func:`_exp32`, :func:`_exp_rows32`,
:func:`_pv32`), most of them numba intrinsics written in LLVM IR, which
:mod:`._forward` and :mod:`._backward` call from their ``@njit`` loops.

What they buy, on a CPU without SVML (each measured, A/B in one process):

* the exponential: ``math.exp`` inside a loop is scalar, so the float32 forward
  scales its scores by ``log2 e`` (in the score product) and uses Cephes'
  ``exp2f`` (``x = n + r``, a degree-6 polynomial in ``r``, relative error below
  2e-7) written so LLVM vectorizes it, building ``2**n`` with a bitcast (the
  backward does the same with the saved log-sum-exp); float64 keeps ``math.exp``;
* for 32-token float32 tiles the score product, the masks and the running column
  max are one register-blocked pass (:func:`_scores32`, written in LLVM IR:
  8 keys x 32 queries in 16 vector registers, a partial tile's mask applied as
  vector lane masks from transposed query bits), as fast as the BLAS call alone,
  and the exponentials another (:func:`_exp32`, sums kept in registers; on
  AVX-512 ``2**n`` applied by ``vscalefps``); the backward masks and exponentiates
  its 32-key rows in one pass too (:func:`_exp_rows32`);
* moving rows: tiles are transposed 16 x 16 in vector registers
  (:func:`_transpose16`, 6x faster than a scalar loop), rows are copied with
  ``memcpy`` (:func:`_copy`; numba's slice assignment of a 256-byte row is about
  15x slower), and the hot loops ask LLVM for 512-bit vectors (:func:`_wide`),
  which its tuning for AVX-512 CPUs otherwise avoids;
* ``P V`` of 32-token float32 tiles is query-major (:func:`_pv32`): each group of 4
  queries only over the key rows it sees (a band's first and last tiles are half
  masked), with the online-softmax rescale, and the final normalization, in the same
  pass, straight into the state or output rows where a block's rows are consecutive;
  a chunk of full tiles only takes blocks of 8 queries x 32 columns
  (:func:`_pv32_dense`), which read each value row half as often.

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
    "_FM", "_LOG2E", "_AVX512", "_AVX512_BF16", "_bf16_dot", "_EXP2_POLY", "_wide", "_copy", "_copy_nt",
    "_zero",
    "_bits_to_f32", "_exp2f", "_transpose16", "_exp32", "_exp_rows32", "_pv32", "_pv32_dense", "_scores32",
    "_exp32_bf16", "_pack_bf16", "_cat_bf16", "_pv32_bf16", "_pv32_dense_bf16", "_scores32_bf16", "_pair_rows",
]

_LOG2E = 1.4426950408889634
_FM = {"contract"}  # FMA contraction only: NaN and inf keep their IEEE meaning


# --------------------------------------------------------------------- vector width
@intrinsic
def _wide(typingctx):  # pragma: no cover - compiled
    """Let LLVM vectorize the calling function with 512-bit vectors (``zmm``) on a CPU
    that has them. LLVM's default tuning for AVX-512 CPUs prefers 256-bit vectors;
    the softmax, masking and rescaling loops run about 20% faster with 512. A no-op
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
    strided copy, about 15x slower for a 256-byte row."""
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

    features = config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    return "+" + feature in features.split(",")


_AVX512 = _has_avx512()
_AVX512_BF16 = _has_avx512("avx512bf16")
# Cephes' degree-6 polynomial for 2**r on [-1/2, 1/2], highest power first
_EXP2_POLY = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
              5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1, 1.0)


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
    in four butterfly stages, 16 stores), about 6x faster than a scalar loop, whose
    strided stores LLVM cannot vectorize well."""
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
        for j in range(16):
            ptr = builder.gep(dp, [builder.add(doff_, builder.mul(dld_, i64(j)))])
            builder.store(rows[j], builder.bitcast(ptr, vt.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.none(src, roff, i0, c0, dst, doff, dld), codegen


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


def _bf16_ok(context, array_type) -> bool:
    """Whether a bf16 pass can be generated for ``array_type``: float32 (bf16 pair
    containers) on a CPU with AVX512_BF16. Elsewhere the pass compiles to nothing: its
    callers compile it into the float64 path too, and on a CPU without AVX512_BF16,
    where :func:`._forward.bf16_applies` never lets it be reached."""
    return _AVX512_BF16 and context.get_value_type(array_type.dtype) == ir.FloatType()


def _emit_exp2(builder, x):
    """IR for :func:`_exp2f` on a vector of 16 float32 ``x``: the same operations, so
    the same bits. On AVX-512, ``vscalefps`` applies ``2**n`` (one instruction for
    the four of the bit construction, the same single rounding) and propagates NaN
    itself. The clamp stays at -126: an exponent that underflows (2**-150 for a
    masked score) costs a microcode assist per vector, which made the strided
    forward 1.5x slower."""
    vt = x.type
    mod = builder.module
    i32 = ir.IntType(32)
    it = ir.VectorType(i32, 16)
    fma = cgutils.get_or_insert_function(mod, ir.FunctionType(vt, [vt] * 3), "llvm.fma.v16f32")
    rint = cgutils.get_or_insert_function(mod, ir.FunctionType(vt, [vt]), "llvm.rint.v16f32")

    def const(v):
        return ir.Constant(vt, [float(v)] * 16)

    lo = const(-126.0)
    below = builder.fcmp_ordered("<", x, lo)
    xc = builder.select(below, lo, x)  # NaN stays NaN
    nf = builder.call(rint, [xc])
    r = builder.fsub(xc, nf)
    y = const(_EXP2_POLY[0])
    for c in _EXP2_POLY[1:]:
        y = builder.call(fma, [y, r, const(c)])
    if _AVX512:
        scalef = cgutils.get_or_insert_function(
            mod, ir.FunctionType(vt, [vt, vt, vt, ir.IntType(16), i32]),
            "llvm.x86.avx512.mask.scalef.ps.512")
        y = builder.call(scalef, [y, nf, const(0.0), ir.IntType(16)(-1), i32(4)])
        return builder.select(below, const(0.0), y)
    e = builder.shl(builder.add(builder.fptosi(nf, it), ir.Constant(it, [127] * 16)),
                    ir.Constant(it, [23] * 16))
    y = builder.fmul(y, builder.bitcast(e, vt))
    other = builder.select(builder.fcmp_unordered("uno", x, x), x, const(0.0))
    return builder.select(builder.fcmp_ordered(">=", x, lo), y, other)


def _pack_bf16(builder, lo, hi):
    """16 words of bf16 pairs from two vectors of 16 float32: word ``i`` holds
    ``lo[i]`` rounded to bf16 in its low half and ``hi[i]`` in its high half (ties to
    even; ``vcvtne2ps2bf16`` and one word shuffle), as a ``<16 x float>`` container."""
    ht = ir.VectorType(ir.IntType(16), 16)
    bt = ir.VectorType(_BFloat(), 16)
    a, b = (builder.bitcast(builder.fptrunc(x, bt), ht) for x in (lo, hi))
    mask = [x for i in range(16) for x in (i, 16 + i)]
    both = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 32), mask))
    return builder.bitcast(both, lo.type)


def _cat_bf16(builder, lo, hi):
    """16 words of bf16 from two vectors of 16 float32, in order: ``lo`` rounded to bf16
    in elements 0-15, ``hi`` in 16-31 (word ``i`` holds elements ``2i, 2i + 1``)."""
    ht = ir.VectorType(ir.IntType(16), 16)
    bt = ir.VectorType(_BFloat(), 16)
    a, b = (builder.bitcast(builder.fptrunc(x, bt), ht) for x in (lo, hi))
    both = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(32))))
    return builder.bitcast(both, lo.type)


def _exp_codegen(pack: bool):
    """The IR of :func:`_exp32` and, ``pack``, of :func:`_exp32_bf16`."""

    def codegen(context, builder, signature, args):
        if pack and not _bf16_ok(context, signature.args[0]):
            return context.get_dummy_value()
        st_, nk_, cm_, cs_ = args
        sp, cp, op = (context.make_array(signature.args[i])(context, builder, v).data
                      for i, v in ((0, st_), (2, cm_), (3, cs_)))
        vt = ir.VectorType(ir.FloatType(), 16)
        vp = vt.as_pointer()
        i64 = ir.IntType(64)

        def const(x):
            return ir.Constant(vt, [float(x)] * 16)

        def vec(ptr, off):
            return builder.bitcast(builder.gep(ptr, [off]), vp)

        msub, acc = [], []
        for h in range(2):
            m = builder.load(vec(cp, i64(16 * h)), align=4)
            msub.append(builder.select(builder.fcmp_ordered("==", m, const(float("-inf"))), const(0.0), m))
            a = cgutils.alloca_once(builder, vt)
            builder.store(const(0.0), a)
            acc.append(a)
        rows = 2 if pack else 1  # key rows a step: a pair where they are packed
        with cgutils.for_range(builder, builder.sdiv(nk_, i64(rows))) as loop:
            ys = [[None, None] for _ in range(rows)]
            for jr in range(rows):
                row = builder.mul(builder.add(builder.mul(loop.index, i64(rows)), i64(jr)), i64(32))
                for h in range(2):
                    ptr = vec(sp, builder.add(row, i64(16 * h)))
                    y = _emit_exp2(builder, builder.fsub(builder.load(ptr, align=4), msub[h]))
                    if not pack:
                        builder.store(y, ptr, align=4)
                    builder.store(builder.fadd(builder.load(acc[h]), y), acc[h])
                    ys[jr][h] = y
            if pack:  # rows 2p, 2p + 1 -> 32 words at p*32, over rows already read
                for h in range(2):
                    ptr = vec(sp, builder.add(builder.mul(loop.index, i64(32)), i64(16 * h)))
                    builder.store(_pack_bf16(builder, ys[0][h], ys[1][h]), ptr, align=4)
        for h in range(2):
            builder.store(builder.load(acc[h]), vec(op, i64(16 * h)), align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _exp32(typingctx, st, nk, cmax, csum):  # pragma: no cover - compiled
    """:func:`_exp_cols` for 32 float32 queries, the shifts and sums kept in registers:
    ``st[j*32 + r] = 2**(st[j*32 + r] - cmax[r])`` (0 where ``cmax[r]`` is ``-inf``),
    ``csum[r]`` = column sums. The same bits as :func:`_exp2f` (see :func:`_emit_exp2`)."""
    return types.none(st, nk, cmax, csum), _exp_codegen(False)


@intrinsic
def _exp32_bf16(typingctx, st, nk, cmax, csum):  # pragma: no cover - compiled
    """:func:`_exp32` whose probabilities are stored as bf16 pairs for
    :func:`_pv32_bf16`: word ``p*32 + r`` of ``st`` holds query ``r``'s
    probabilities of keys ``2p`` (low half) and ``2p + 1``, rounded to bf16, for
    ``p < nk / 2`` (``nk`` even), written over the float32 rows already read. The
    sums ``csum`` are of the float32 probabilities, before rounding."""
    return types.none(st, nk, cmax, csum), _exp_codegen(True)


@intrinsic
def _exp_rows32(typingctx, s, m, lc, bits):  # pragma: no cover - compiled
    """The backward's probabilities for ``m`` rows of 32 float32 scores (row-major
    ``s``): ``s[r*32 + c] = 2**(s[r*32 + c] - lc[r])`` where bit ``c`` of ``bits[r]``
    is set, else 0 (a masked key, or a row with no key, ``bits[r] = 0``). What the
    mask and :func:`_exp2f` loops do, in one pass with the same bits (masked scores
    there are ``-inf``, whose exponential is 0). Float32 only: for another dtype (a
    call the caller never reaches, but which numba still compiles) it does nothing."""
    def codegen(context, builder, signature, args):
        s_, m_, lc_, b_ = args
        if context.get_value_type(signature.args[0].dtype) != ir.FloatType():
            return context.get_dummy_value()
        sp, lp, bp = (context.make_array(signature.args[i])(context, builder, v).data
                      for i, v in ((0, s_), (2, lc_), (3, b_)))
        vt = ir.VectorType(ir.FloatType(), 16)
        i64 = ir.IntType(64)
        zero = ir.Constant(vt, [0.0] * 16)
        with cgutils.for_range(builder, m_) as loop:
            r = loop.index
            lr = builder.load(builder.gep(lp, [r]))
            lr = builder.select(builder.fcmp_ordered("==", lr, ir.Constant(lr.type, float("-inf"))),
                                ir.Constant(lr.type, 0.0), lr)  # such a row's bits are 0
            shift = _splat(builder, lr, vt)
            w = builder.load(builder.gep(bp, [r]))
            for h in range(2):
                ptr = builder.bitcast(builder.gep(sp, [builder.add(builder.mul(r, i64(32)), i64(16 * h))]),
                                      vt.as_pointer())
                y = _emit_exp2(builder, builder.fsub(builder.load(ptr, align=4), shift))
                keep = builder.trunc(builder.lshr(w, ir.Constant(w.type, 16 * h)), ir.IntType(16))
                y = builder.select(builder.bitcast(keep, ir.VectorType(ir.IntType(1), 16)), y, zero)
                builder.store(y, ptr, align=4)
        return context.get_dummy_value()
    return types.none(s, m, lc, bits), codegen


def _pv_codegen(G: int, C: int, bf16: bool = False):
    """The IR of :func:`_pv32` (``G = 4`` queries x ``C = 4`` vectors) and of
    :func:`_pv32_dense` (8 x 2): ``G`` queries x ``C`` vectors of a value row in
    16 accumulators; ``bf16``: of :func:`_pv32_bf16` and :func:`_pv32_dense_bf16`,
    a step being a pair of keys (one ``vdpbf16ps`` per accumulator)."""

    def codegen(context, builder, signature, args):
        if bf16 and not _bf16_ok(context, signature.args[2]):
            return context.get_dummy_value()
        va_, ko_, st_, ob_, oo_, al_, po_, lo_, hi_, d_, db_, do_ = args

        def data(i, v):
            return context.make_array(signature.args[i])(context, builder, v).data

        vp_, sp, ap, pp, lp, hp = (data(0, va_), data(2, st_), data(5, al_), data(6, po_),
                                   data(7, lo_), data(8, hi_))
        op = builder.gep(data(3, ob_), [oo_])
        dp = builder.gep(data(10, db_), [do_])
        et = context.get_value_type(signature.args[0].dtype)
        L = 16 if isinstance(et, ir.FloatType) else 8  # lanes of a 512-bit vector
        vt = ir.VectorType(et, L)
        i64 = ir.IntType(64)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3),
                                             f"llvm.fma.v{L}{'f32' if L == 16 else 'f64'}")

        def vec(ptr, off):
            return builder.bitcast(builder.gep(ptr, [off]), vt.as_pointer())

        acc = [[cgutils.alloca_once(builder, vt) for c in range(C)] for u in range(G)]

        def bound(g, ptr, pick):  # the widest key range of the block's groups of 4
            x = None
            for s in range(G // 4):
                y = builder.load(builder.gep(ptr, [builder.add(builder.mul(g, i64(G // 4)), i64(s))]))
                x = y if x is None else builder.select(builder.icmp_signed(pick, y, x), y, x)
            return x

        def columns(c0, W):  # columns c0 .. c0 + L W of every query block
            with cgutils.for_range(builder, i64(32 // G)) as gl:
                g = gl.index
                orows = [builder.add(builder.mul(builder.add(builder.mul(g, i64(G)), i64(u)), d_), c0)
                         for u in range(G)]
                for u in range(G):
                    a = _splat(builder, builder.load(builder.gep(ap, [builder.add(builder.mul(g, i64(G)), i64(u))])), vt)
                    for c in range(W):
                        x = builder.load(vec(op, builder.add(orows[u], i64(L * c))), align=4)
                        builder.store(builder.fmul(x, a), acc[u][c])
                j0 = bound(g, lp, "<")
                j1 = bound(g, hp, ">")
                if bf16:  # key pairs: the pair of the first key .. of the last one
                    j0 = builder.ashr(j0, i64(1))
                    j1 = builder.ashr(builder.add(j1, i64(1)), i64(1))
                with cgutils.for_range(builder, builder.sub(j1, j0)) as jl:
                    j = builder.add(j0, jl.index)  # a key row, or a pair's (d words)
                    vrow = builder.add(builder.add(ko_, builder.mul(j, d_)), c0)
                    v = [builder.load(vec(vp_, builder.add(vrow, i64(L * c))), align=4)
                         for c in range(W)]
                    srow = builder.add(builder.mul(j, i64(32)), builder.mul(g, i64(G)))
                    for u in range(G):
                        pu = _splat(builder, builder.load(builder.gep(sp, [builder.add(srow, i64(u))])), vt)
                        for c in range(W):
                            a = builder.load(acc[u][c])
                            a = (_bf16_dot(builder, a, pu, v[c]) if bf16
                                 else builder.call(fma, [pu, v[c], a]))
                            builder.store(a, acc[u][c])
                for u in range(G):
                    s = _splat(builder, builder.load(builder.gep(pp, [builder.add(builder.mul(g, i64(G)), i64(u))])), vt)
                    for c in range(W):
                        builder.store(builder.fmul(builder.load(acc[u][c]), s),
                                      vec(dp, builder.add(orows[u], i64(L * c))), align=4)

        whole = builder.sdiv(d_, i64(C * L))
        with cgutils.for_range(builder, whole) as cl:
            columns(builder.mul(cl.index, i64(C * L)), C)
        rest = builder.srem(d_, i64(C * L))
        for W in range(C - 1, 0, -1):
            with builder.if_then(builder.icmp_signed("==", rest, i64(L * W))):
                columns(builder.mul(whole, i64(C * L)), W)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _pv32(typingctx, va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff):  # pragma: no cover - compiled
    """``O = diag(post) (diag(alpha) O + P V)`` for 32 queries, query-major, each
    group of 4 queries over only the key rows it can see (the rescale of the online
    softmax, the product and the final normalization in one pass).

    ``O``: 32 x ``d`` row-major, read from ``obuf[ooff]`` and written to ``dbuf[doff]``
    (the same place, or the output when ``post`` normalizes); ``st``: ``P^T`` (key ``j``, query ``r`` at
    ``j*32 + r``); value row ``j`` at ``va[koff + j*d]``; group ``g`` (queries
    ``4g .. 4g+3``) adds key rows ``lo[g] <= j < hi[g]``, outside which its ``P`` is 0.
    ``O`` rows are accumulated in 16 vector registers, 4 queries x 4 vectors (64
    float32 columns) at a time, then 3, 2 or 1 vectors for the rest of ``d``, which
    must be a multiple of the vector (16 float32, 8 float64);
    a value row is loaded once per group and each ``P`` entry broadcast. Where a
    tile is partial (the band's first and last tiles, a diagonal tile) this skips
    the rows that a BLAS ``gemm`` over the whole chunk multiplies by zero.
    """
    return types.none(va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff), _pv_codegen(4, 4)


@intrinsic
def _pv32_dense(typingctx, va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff):  # pragma: no cover - compiled
    """:func:`_pv32` in blocks of 8 queries x 2 vectors (32 float32 columns): each
    value row is read from the cache half as many times (4 instead of 8 per chunk),
    for a chunk whose tiles are all full (the fixed forward at n = 16,384 about 2%
    faster, A/B). A block of 8 queries adds the key rows that either of its groups of
    4 sees (``min lo .. max hi``): ``P`` must be 0 outside each group's range, as
    it is for masked keys."""
    return types.none(va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff), _pv_codegen(8, 2)


@intrinsic
def _pv32_bf16(typingctx, va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff):  # pragma: no cover - compiled
    """:func:`_pv32` on bf16 probabilities and values: ``st`` as :func:`_exp32_bf16`
    leaves it (word ``p*32 + r``: query ``r``'s pair of keys ``2p, 2p + 1``), ``va``
    a float32 container of value rows interleaved by key pairs (:func:`_pair_rows`:
    the ``d`` words at ``va[koff + p*d]`` hold column ``c`` of keys ``2p`` and
    ``2p + 1`` in word ``c``). ``lo, hi`` are key rows as there, widened to whole
    pairs (``P`` is 0 for the extra key). ``O``, ``alpha``, ``post``: float32."""
    return (types.none(va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff),
            _pv_codegen(4, 4, True))


@intrinsic
def _pv32_dense_bf16(typingctx, va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff):  # pragma: no cover - compiled
    """:func:`_pv32_bf16` in blocks of 8 queries x 2 vectors, as :func:`_pv32_dense`."""
    return (types.none(va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff),
            _pv_codegen(8, 2, True))


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
        lo = ir.Constant(ir.VectorType(ir.IntType(32), 32), [x for i in range(16) for x in (i, 32 + i)])
        hi = ir.Constant(ir.VectorType(ir.IntType(32), 32), [x for i in range(16, 32) for x in (i, 32 + i)])
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


_KEYS = 8  # keys per register block of _scores32 (16 vector accumulators)


def _scores_codegen(bf16: bool):
    """The IR of :func:`_scores32` (float32 or float64 FMAs) and of
    :func:`_scores32_bf16` (``bf16``: ``vdpbf16ps`` on pairs of bf16 words)."""

    def codegen(context, builder, signature, args):
        if bf16 and not _bf16_ok(context, signature.args[3]):
            return context.get_dummy_value()
        k_, koff_, qt_, st_, nt_, d_, alpha_, tm_, t0_, mt_, cm_ = args

        def data(i, v):
            return context.make_array(signature.args[i])(context, builder, v).data

        kp, qp, sp, tp, mp, cp = (data(0, k_), data(2, qt_), data(3, st_), data(7, tm_),
                                  data(9, mt_), data(10, cm_))
        et = context.get_value_type(signature.args[3].dtype)
        vt = ir.VectorType(et, 16)
        vp = vt.as_pointer()
        i64 = ir.IntType(64)
        name = "llvm.fma.v16f32" if isinstance(et, ir.FloatType) else "llvm.fma.v16f64"
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3), name)
        ninf = ir.Constant(vt, [float("-inf")] * 16)
        av = _splat(builder, builder.fptrunc(alpha_, et) if alpha_.type != et else alpha_, vt)

        def vec(ptr, off):
            return builder.bitcast(builder.gep(ptr, [off]), vp)

        cm = [cgutils.alloca_once(builder, vt) for h in range(2)]
        for h in range(2):
            builder.store(builder.load(vec(cp, i64(16 * h)), align=4), cm[h])
        acc = [[cgutils.alloca_once(builder, vt) for h in range(2)] for jj in range(_KEYS)]
        with cgutils.for_range(builder, nt_) as tl:
            t = tl.index
            mi = builder.sext(builder.load(builder.gep(tp, [builder.add(t0_, t)])), i64)
            full = builder.icmp_signed("<", mi, i64(0))
            mbase = builder.select(full, i64(0), builder.mul(mi, i64(32)))
            for g in range(32 // _KEYS):
                jb = builder.add(builder.mul(t, i64(32)), i64(g * _KEYS))
                for jj in range(_KEYS):
                    for h in range(2):
                        builder.store(ir.Constant(vt, [0.0] * 16), acc[jj][h])

                def products(halves, jb=jb):  # the d-loop for the query halves given
                    with cgutils.for_range(builder, d_) as cl:
                        qrow = builder.mul(cl.index, i64(32))
                        q = {h: builder.load(vec(qp, builder.add(qrow, i64(16 * h))), align=4)
                             for h in halves}
                        for jj in range(_KEYS):
                            row = builder.mul(builder.add(jb, i64(jj)), d_)
                            kv = builder.load(builder.gep(kp, [builder.add(koff_, builder.add(row, cl.index))]))
                            kv = _splat(builder, kv, vt)
                            for h in halves:
                                a = builder.load(acc[jj][h])
                                a = (_bf16_dot(builder, a, kv, q[h]) if bf16
                                     else builder.call(fma, [kv, q[h], a]))
                                builder.store(a, acc[jj][h])

                # a half (16 queries) that none of the 8 keys is seen by in a partial tile
                # (a diagonal tile's corner) is not computed: its scores are all masked
                seen = None
                for jj in range(_KEYS):
                    w = builder.load(builder.gep(mp, [builder.add(mbase, i64(g * _KEYS + jj))]))
                    seen = w if seen is None else builder.or_(seen, w)
                wt = seen.type
                half = [builder.or_(full, builder.icmp_unsigned("!=", builder.and_(seen, ir.Constant(wt, m)),
                                                                ir.Constant(wt, 0)))
                        for m in (0xFFFF, 0xFFFF0000)]
                with builder.if_else(builder.and_(half[0], half[1])) as (both, one):
                    with both:
                        products((0, 1))
                    with one:
                        with builder.if_else(half[0]) as (low, high):
                            with low:
                                products((0,))
                            with high:
                                with builder.if_then(half[1]):
                                    products((1,))
                def finish(masked, g=g, jb=jb):  # scale, mask (partial tiles only), max, store
                    for jj in range(_KEYS):
                        row = builder.mul(builder.add(jb, i64(jj)), i64(32))
                        if masked:
                            w = builder.load(builder.gep(mp, [builder.add(mbase, i64(g * _KEYS + jj))]))
                        for h in range(2):
                            s = builder.fmul(builder.load(acc[jj][h]), av)
                            if masked:
                                bits = builder.trunc(builder.lshr(w, ir.Constant(w.type, 16 * h)),
                                                     ir.IntType(16))
                                s = builder.select(builder.bitcast(bits, ir.VectorType(ir.IntType(1), 16)),
                                                   s, ninf)
                            m = builder.load(cm[h])
                            # one vmaxps: m > s ? m : s, so s where either is NaN
                            builder.store(builder.select(builder.fcmp_ordered(">", m, s), m, s), cm[h])
                            builder.store(s, vec(sp, builder.add(row, i64(16 * h))), align=4)

                with builder.if_else(full) as (whole, partial):
                    with whole:
                        finish(False)
                    with partial:
                        finish(True)
        for h in range(2):
            builder.store(builder.load(cm[h]), vec(cp, i64(16 * h)), align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _scores32(typingctx, k, koff, qt, st, ntile, d, alpha, tmask, t0, maskt,
              cmax):  # pragma: no cover - compiled
    """Masked, transposed scores of 32 queries against ``ntile`` tiles of 32 keys, and
    their running column max, in one register-blocked pass (what the score ``gemm``,
    the masking and the max pass of :func:`_softmax_cols` do in three).

    ``st[j*32 + r] = alpha * sum_c k[koff + j*d + c] * qt[c*32 + r]`` (``qt``: ``Q^T``,
    ``d x 32``), accumulated for 8 keys x 32 queries in 16 vector registers; ``-inf``
    where tile ``t``'s transposed mask (bit ``r`` of ``maskt[tmask[t0 + t]*32 + key]``)
    is unset, ``tmask < 0`` meaning a full tile (no mask applied); ``cmax[r]`` = max
    of itself and column ``r``, one ``vmaxps`` per vector. In a partial tile, the
    products of a group of 8 keys with a half of the queries (16) that none of those
    keys is seen by are skipped (a diagonal or band tile's corners: a quarter of a
    triangle's tile; the strided forward at n = 16,384 about 1.5% faster, A/B). Unlike
    :func:`_softmax_cols`, a NaN score need not leave a NaN max (``vmaxps`` keeps the
    later operand): the row still ends NaN, as the NaN score's exponential is NaN.
    """
    return types.none(k, koff, qt, st, ntile, d, alpha, tmask, t0, maskt, cmax), _scores_codegen(False)


@intrinsic
def _scores32_bf16(typingctx, k, koff, qt, st, ntile, dw, alpha, tmask, t0, maskt,
                   cmax):  # pragma: no cover - compiled
    """:func:`_scores32` on bf16 inputs: ``k`` and ``qt`` are float32 arrays used as
    containers of bf16 pairs (word ``c`` of a key row holds its elements ``2c`` and
    ``2c + 1``), ``dw = d / 2`` words a row; ``qt`` is ``Q^T`` by words (``dw x 32``,
    word ``c`` of query ``r`` at ``c*32 + r``). Each product step is one
    ``vdpbf16ps`` (a key's pair broadcast against 16 queries' pairs, float32
    accumulation), half as many steps as float32 FMAs; the scores, masks and max are
    float32 as there."""
    return types.none(k, koff, qt, st, ntile, dw, alpha, tmask, t0, maskt, cmax), _scores_codegen(True)

