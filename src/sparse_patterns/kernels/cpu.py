"""The CPU kernel (``impl="numba"``): fused sparse attention over an ExecutionPlan.

Forward: the pieces of one softmax group continue a single online softmax per
token (running max ``m``, running sum ``l``, unnormalized output), so no
log-sum-exp merge is needed between them: the first piece of a group starts the
state, the last one normalizes it into the output; in between, the unnormalized
output rows live in the output's own rows. The output and the backward's gradients
are arrays recycled by the calling thread once nothing references them
(:func:`_buffer`), not new pages each call. In parallel over (batch x head, run of
query blocks), the scores of a query tile against a chunk of key tiles are
computed transposed (keys x queries), the partial tiles masked, the online softmax
updated with loops vectorized across the queries, and ``P V`` added into the
tile's output rows. A piece whose blocks are not runs of consecutive tokens (a
``residue(s)`` order) has each work item copy its queries, keys, values and
softmax state into buffers of its own, one array at a time in
the order of a per-plan schedule (:func:`_copy_orders`: runs of grid rows, class by
class); if a work item's keys span much more than its queries (summary keys put
first), the used key blocks are put in the piece's order once per call instead.
Nothing of size ``n x n`` is ever allocated.

Backward: recomputes the probabilities from the saved log-sum-exp, in parallel
over (batch x head); for every piece and key block it takes the query rows of a
chunk of the block's tiles, accumulates ``dk`` and ``dv`` in tile buffers (BLAS
with ``beta = 1``) and adds ``dq`` into its rows (each thread owns whole heads: no
write conflicts). A ``residue(s)`` piece runs in work items (block ranges that its
tiles do not leave, :func:`_backward_items`): each item's rows are copied once into
buffers in the piece's order, where every block is a run used in place, and its
gradients added back once.

What decides the speed on a CPU without SVML (each measured, A/B in one process):

* the exponential: ``math.exp`` inside a loop is scalar, so the float32 forward
  scales its scores by ``log2 e`` (in the score product) and uses Cephes'
  ``exp2f`` (``x = n + r``, a degree-6 polynomial in ``r``, relative error below
  2e-7) written so LLVM vectorizes it, building ``2**n`` with a bitcast (the
  backward does the same with the saved log-sum-exp); float64 keeps ``math.exp``;
* the row max: a float max reduction is not vectorized without fast-math (which
  would drop NaN semantics), so the forward keeps the scores transposed and takes
  elementwise maxima across the queries;
* the matrix products call BLAS ``?gemm`` directly (numba's own entry point,
  the one ``np.dot`` uses) with leading dimensions, scale and ``beta``, in the
  ``NN``/``NT`` forms that OpenBLAS's small-matrix kernels run fastest (a ``TN``
  score product was 1.5x slower; rows 32 KB apart, as a stride-128 head's keys
  are in natural order, 2-3x slower: hence the copies above), with the BLAS
  library held to one thread while the kernel runs, since every kernel thread
  calls it;
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
* work buffers, outputs and gradients start on 64-byte boundaries
  (:func:`_aligned`, :func:`_buffer`), so vector accesses do not straddle cache
  lines; outputs and gradients are recycled arrays (:func:`_buffer`: a new 32 MiB
  array costs its page faults, 5-6% of the strided forward here); a residue work
  item stores its state back with non-temporal stores (:func:`_copy_nt`);
* ``P V`` of 32-token float32 tiles is query-major (:func:`_pv32`): each group of 4
  queries only over the key rows it sees (a band's first and last tiles are half
  masked), with the online-softmax rescale, and the final normalization, in the same
  pass, straight into the state or output rows where a block's rows are consecutive;
* what the forward derives from the plan alone (piece order, block steps, copy
  schedules, transposed masks) is computed once per plan
  (:meth:`ExecutionPlan.memo`).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import threading
from collections.abc import Iterator

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils, types
from numba.extending import intrinsic
from numba.np.linalg import ensure_blas

__all__ = ["forward", "backward", "release_workspace", "single_threaded_blas"]

_LOG2E = 1.4426950408889634
_CHUNK = 8  # tiles gathered per step (keys per score matrix: _CHUNK * block)
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


@numba.njit(cache=True)
def _aligned(size, like):  # pragma: no cover - compiled
    """An uninitialized 1-D array of ``size`` elements of ``like``'s dtype starting on a
    64-byte boundary. numba's ``np.empty`` aligns to 32 bytes: a buffer that starts 32
    bytes into a cache line makes every 16-float vector access straddle two lines,
    which costs the forward about 4% (measured A/B, both offsets forced)."""
    per = 64 // like.itemsize
    raw = np.empty(size + per, like.dtype)
    off = (-(raw.ctypes.data // like.itemsize)) % per
    return raw[off: off + size]


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


@numba.njit(cache=True)
def _mask_tile_t(st, c0, ncol, nrow, masks, mi):  # pragma: no cover - compiled
    """``-inf`` where partial tile ``mi`` is unset, in transposed scores: tile
    column ``c`` (a key) is row ``c0 + c`` of ``st``, tile row ``r`` its column ``r``."""
    _wide()
    W = masks.shape[2]
    ninf = st.dtype.type(-np.inf)
    for w in range(W):
        lo = w * 64
        hi = min(ncol, lo + 64)
        for c in range(lo, hi):
            sh = np.uint64(c - lo)
            row = st[c0 + c]
            for r in range(nrow):  # contiguous in st and in masks[mi, :, w] (W = 1)
                keep = (masks[mi, r, w] >> sh) & np.uint64(1)
                row[r] = row[r] if keep else ninf


def _has_avx512() -> bool:
    """Whether numba compiles for a CPU with AVX-512F (its configured features, else
    the host's)."""
    import llvmlite.binding as llvm
    from numba.core import config

    features = config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    return "+avx512f" in features.split(",")


_AVX512 = _has_avx512()
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


@numba.njit(cache=True, fastmath=_FM)
def _softmax_cols(st, nk, rows, mrow, cmax, msub, csum, precise):  # pragma: no cover - compiled
    """Online-softmax step on transposed scores ``st`` (``nk`` keys x ``rows``
    queries), vectorized across the queries: ``cmax`` = max of ``mrow`` and each
    column (NaN if the column has one), ``st = exp(st - cmax)`` (0 for a column
    whose max is ``-inf``), ``csum`` = the column sums. ``precise`` (float64):
    natural units and ``math.exp``; otherwise the scores are in base-2 units
    (scaled by ``log2 e``) and the exponential is :func:`_exp2f`."""
    _wide()
    for r in range(rows):
        cmax[r] = mrow[r]
    for j in range(nk):
        for r in range(rows):
            x = st[j, r]
            m = cmax[r]
            cmax[r] = x if (x > m or x != x) else m
    _exp_cols(st, nk, rows, cmax, msub, csum, precise)


@numba.njit(cache=True, fastmath=_FM)
def _exp_cols(st, nk, rows, cmax, msub, csum, precise):  # pragma: no cover - compiled
    """Second half of :func:`_softmax_cols`, given the column maxima ``cmax``:
    ``st = exp(st - cmax)`` (0 for a column whose max is ``-inf``), ``csum`` = the
    column sums."""
    _wide()
    F = st.dtype.type
    ninf = F(-np.inf)
    for r in range(rows):
        msub[r] = cmax[r] if cmax[r] != ninf else F(0.0)
        csum[r] = F(0.0)
    if precise:
        for j in range(nk):
            for r in range(rows):
                y = math.exp(st[j, r] - msub[r])
                st[j, r] = y
                csum[r] += y
        return
    G = np.float32
    for j in range(nk):
        for r in range(rows):
            y = _exp2f(G(st[j, r]) - G(msub[r]))
            st[j, r] = y
            csum[r] += y


# --------------------------------------------------------------------- BLAS
@intrinsic
def _gemm(typingctx, ta, tb, m, n, k, alpha, a, aoff, lda, b, boff, ldb, beta, c, coff,
          ldc):  # pragma: no cover - compiled
    """Column-major ``C = alpha op(A) op(B) + beta C`` (BLAS ``?gemm``) on flat arrays.

    ``a``, ``b``, ``c``: 1-D arrays of one float dtype; the matrices start at
    element offsets ``aoff``, ``boff``, ``coff`` with leading dimensions ``lda``,
    ``ldb``, ``ldc`` (in elements), so strided row sets are used in place.
    ``ta``, ``tb``: ``ord("N")`` or ``ord("T")``. Calls numba's own BLAS entry
    (``numba_xxgemm``, scipy's BLAS), the one ``np.dot`` uses.
    """
    if not (isinstance(a, types.Array) and a.ndim == 1 and a.dtype in (types.float32, types.float64)):
        return None
    dt = a.dtype
    sig = types.int32(ta, tb, m, n, k, alpha, a, aoff, lda, b, boff, ldb, beta, c, coff, ldc)

    def codegen(context, builder, signature, args):
        (ta_, tb_, m_, n_, k_, al_, a_, ao_, lda_, b_, bo_, ldb_, be_, c_, co_, ldc_) = args
        ty = signature.args
        ll_char = ir.IntType(8)
        intp = context.get_value_type(types.intp)
        vp = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [ll_char, ll_char, ll_char, intp, intp, intp,
                                                vp, vp, intp, vp, intp, vp, vp, intp])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")

        def num(v, t, to=types.intp):
            return context.cast(builder, v, t, to)

        def ptr(v, t, off, offt):
            ary = context.make_array(t)(context, builder, v)
            return builder.bitcast(builder.gep(ary.data, [num(off, offt)]), vp)

        def slot(v, t):
            return builder.bitcast(cgutils.alloca_once_value(builder, num(v, t, dt)), vp)

        kind = ir.Constant(ll_char, ord("s" if dt == types.float32 else "d"))
        return builder.call(fn, (
            kind, builder.trunc(num(ta_, ty[0]), ll_char), builder.trunc(num(tb_, ty[1]), ll_char),
            num(m_, ty[2]), num(n_, ty[3]), num(k_, ty[4]), slot(al_, ty[5]),
            ptr(a_, ty[6], ao_, ty[7]), num(lda_, ty[8]), ptr(b_, ty[9], bo_, ty[10]),
            num(ldb_, ty[11]), slot(be_, ty[12]), ptr(c_, ty[13], co_, ty[14]), num(ldc_, ty[15])))

    return sig, codegen


_N, _T = ord("N"), ord("T")


# --------------------------------------------------------------------- forward
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


@intrinsic
def _exp32(typingctx, st, nk, cmax, csum):  # pragma: no cover - compiled
    """:func:`_exp_cols` for 32 float32 queries, the shifts and sums kept in registers:
    ``st[j*32 + r] = 2**(st[j*32 + r] - cmax[r])`` (0 where ``cmax[r]`` is ``-inf``),
    ``csum[r]`` = column sums. The same bits as :func:`_exp2f` (see :func:`_emit_exp2`)."""
    def codegen(context, builder, signature, args):
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
        with cgutils.for_range(builder, nk_) as loop:
            row = builder.mul(loop.index, i64(32))
            for h in range(2):
                ptr = vec(sp, builder.add(row, i64(16 * h)))
                y = _emit_exp2(builder, builder.fsub(builder.load(ptr, align=4), msub[h]))
                builder.store(y, ptr, align=4)
                builder.store(builder.fadd(builder.load(acc[h]), y), acc[h])
        for h in range(2):
            builder.store(builder.load(acc[h]), vec(op, i64(16 * h)), align=4)
        return context.get_dummy_value()
    return types.none(st, nk, cmax, csum), codegen


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


_PV_QUERIES = 4  # queries per register block of _pv32 (x 4 vectors = 16 accumulators)


@intrinsic
def _pv32(typingctx, va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff):  # pragma: no cover - compiled
    """``O = diag(post) (diag(alpha) O + P V)`` for 32 queries, query-major, each
    group of ``_PV_QUERIES`` queries over only the key rows it can see (the rescale
    of the online softmax, the product and the final normalization in one pass).

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
    G = _PV_QUERIES

    def codegen(context, builder, signature, args):
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

        acc = [[cgutils.alloca_once(builder, vt) for c in range(4)] for u in range(G)]

        def columns(c0, W):  # columns c0 .. c0 + L W of every query group
            with cgutils.for_range(builder, i64(32 // G)) as gl:
                g = gl.index
                orows = [builder.add(builder.mul(builder.add(builder.mul(g, i64(G)), i64(u)), d_), c0)
                         for u in range(G)]
                for u in range(G):
                    a = _splat(builder, builder.load(builder.gep(ap, [builder.add(builder.mul(g, i64(G)), i64(u))])), vt)
                    for c in range(W):
                        x = builder.load(vec(op, builder.add(orows[u], i64(L * c))), align=4)
                        builder.store(builder.fmul(x, a), acc[u][c])
                j0 = builder.load(builder.gep(lp, [g]))
                with cgutils.for_range(builder, builder.sub(builder.load(builder.gep(hp, [g])), j0)) as jl:
                    j = builder.add(j0, jl.index)
                    vrow = builder.add(builder.add(ko_, builder.mul(j, d_)), c0)
                    v = [builder.load(vec(vp_, builder.add(vrow, i64(L * c))), align=4)
                         for c in range(W)]
                    srow = builder.add(builder.mul(j, i64(32)), builder.mul(g, i64(G)))
                    for u in range(G):
                        pu = _splat(builder, builder.load(builder.gep(sp, [builder.add(srow, i64(u))])), vt)
                        for c in range(W):
                            builder.store(builder.call(fma, [pu, v[c], builder.load(acc[u][c])]),
                                          acc[u][c])
                for u in range(G):
                    s = _splat(builder, builder.load(builder.gep(pp, [builder.add(builder.mul(g, i64(G)), i64(u))])), vt)
                    for c in range(W):
                        builder.store(builder.fmul(builder.load(acc[u][c]), s),
                                      vec(dp, builder.add(orows[u], i64(L * c))), align=4)

        whole = builder.sdiv(d_, i64(4 * L))
        with cgutils.for_range(builder, whole) as cl:
            columns(builder.mul(cl.index, i64(4 * L)), 4)
        rest = builder.srem(d_, i64(4 * L))
        for W in (3, 2, 1):
            with builder.if_then(builder.icmp_signed("==", rest, i64(L * W))):
                columns(builder.mul(whole, i64(4 * L)), W)
        return context.get_dummy_value()
    return types.none(va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff), codegen


_KEYS = 8  # keys per register block of _scores32 (16 vector accumulators)


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
    of itself and column ``r``, one ``vmaxps`` per vector. Unlike
    :func:`_softmax_cols`, a NaN score need not leave a NaN max (``vmaxps`` keeps the
    later operand): the row still ends NaN, as the NaN score's exponential is NaN.
    """
    def codegen(context, builder, signature, args):
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
                with cgutils.for_range(builder, d_) as cl:
                    qrow = builder.mul(cl.index, i64(32))
                    q = [builder.load(vec(qp, builder.add(qrow, i64(16 * h))), align=4)
                         for h in range(2)]
                    for jj in range(_KEYS):
                        row = builder.mul(builder.add(jb, i64(jj)), d_)
                        kv = builder.load(builder.gep(kp, [builder.add(koff_, builder.add(row, cl.index))]))
                        kv = _splat(builder, kv, vt)
                        for h in range(2):
                            builder.store(builder.call(fma, [kv, q[h], builder.load(acc[jj][h])]),
                                          acc[jj][h])
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
    return types.none(k, koff, qt, st, ntile, d, alpha, tmask, t0, maskt, cmax), codegen


@numba.njit(cache=True)
def _block_steps(perm, block):  # pragma: no cover - compiled
    """``(start, step)`` int64 ``(P, nb)``: block ``J`` of piece ``p`` is the tokens
    ``start + step * x`` (``x < block``) when they form such a progression with
    ``step >= 1``; ``step = 0`` marks a block that must be gathered."""
    P, n = perm.shape
    nb = (n + block - 1) // block
    start = np.empty((P, nb), np.int64)
    step = np.zeros((P, nb), np.int64)
    for p in range(P):
        for J in range(nb):
            x0 = J * block
            x1 = min(n, x0 + block)
            start[p, J] = perm[p, x0]
            s = 1 if x1 - x0 == 1 else perm[p, x0 + 1] - perm[p, x0]
            ok = s >= 1
            for x in range(x0 + 1, x1):
                if perm[p, x] - perm[p, x - 1] != s:
                    ok = False
                    break
            step[p, J] = s if ok else 0
    return start, step


@numba.njit(cache=True, fastmath=_FM)
def _exp_rows(x, rows, precise):  # pragma: no cover - compiled
    """``x[:rows] = exp(x[:rows])`` (``precise``) or ``2**x[:rows]`` (float32, vectorized);
    ``-inf`` gives 0, NaN stays NaN."""
    _wide()
    if precise:
        for r in range(rows):
            x[r] = math.exp(x[r])
        return
    for r in range(rows):
        x[r] = _exp2f(np.float32(x[r]))


@numba.njit(cache=True, fastmath=_FM)
def _qblock(q1, k1, v1, o1, m1, l1, base, kbase, n, d, p, I, scale, first, last, qmap, kperm_used,
            kstart, kstep, tile_ptr, tile_col, tile_mask, masks, maskt, grows, fused, block, chunk,
            precise, qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax, msub, csum, alpha, roff):  # pragma: no cover - compiled
    """Query block ``I`` of piece ``p`` for one (batch, head): continues the online
    softmax of its queries over chunks of tiles. Position ``x`` of the piece's order
    is row ``base + qmap[x]`` of ``q1`` and of the state, and its key and value row
    ``kbase + kperm_used[x]``. Between pieces of one softmax group the state of each
    token lives in ``m1`` (running max), ``l1`` (running sum) and ``o1`` (unnormalized output);
    the ``first`` piece of a group starts it, the ``last`` one normalizes ``o1`` into the
    output in place, ``m1`` becoming the log-sum-exp."""
    _wide()
    nb = (n + block - 1) // block
    ninf = -np.inf
    unit = 1.0 if precise else _LOG2E  # float32 scores in base-2 units (exp2 is cheaper)
    t0 = tile_ptr[p * nb + I]
    t1 = tile_ptr[p * nb + I + 1]
    if t0 == t1 and not first and not last:
        return
    rows = min(block, n - I * block)
    x0 = I * block
    # in place: where the block's rows are consecutive rows of the state and every
    # chunk is whole 32-token float32 tiles, P V (_pv32) accumulates straight into
    # those rows of o1 and the last piece normalizes them there, with no copy to and
    # from ``obuf``
    inplace = fused and rows == 32 and d % 16 == 0 and t0 < t1
    if inplace:
        for r in range(1, rows):
            if qmap[x0 + r] != qmap[x0] + r:
                inplace = False
                break
        for t in range(t0, t1):
            if (tile_col[t] + 1) * block > n:
                inplace = False
                break
    if inplace:
        ob, ooff = o1, (base + qmap[x0]) * d
        if first:
            _zero(o1, ooff, rows * d)
    else:
        ob, ooff = obuf, 0
    for r in range(rows):
        i = base + qmap[x0 + r]
        if first:
            mrow[r] = ninf
            lrow[r] = 0.0
            if not inplace:
                _zero(obuf, r * d, d)
        else:
            mrow[r] = m1[i]
            lrow[r] = l1[i]
            if not inplace:
                _copy(obuf, r * d, o1, i * d, d)
    if t0 < t1:  # Q^T (d x rows): the score product is then a fast NN gemm
        if rows % 16 == 0 and d % 16 == 0:
            for r in range(rows):
                roff[r] = (base + qmap[x0 + r]) * d
            for r0 in range(0, rows, 16):
                for c0 in range(0, d, 16):
                    _transpose16(q1, roff, r0, c0, qbuf, c0 * rows + r0, rows)
        else:
            for r in range(rows):
                src = (base + qmap[x0 + r]) * d
                for c in range(d):
                    qbuf[c * rows + r] = q1[src + c]
    for c0 in range(t0, t1, chunk):
        c1 = min(t1, c0 + chunk)
        J0 = tile_col[c0]
        run = kstep[J0] == 1
        for t in range(c0 + 1, c1):
            J = tile_col[t]
            if J != J0 + (t - c0) or kstep[J] != 1 or kstart[J] != kstart[J0] + (J - J0) * block:
                run = False
        if run:  # contiguous key rows, used in place
            ka, va, koff = k1, v1, (kbase + kstart[J0]) * d
            nk = min(n, (J0 + c1 - c0) * block) - J0 * block
        else:
            nk = 0
            for t in range(c0, c1):
                J = tile_col[t]
                cols = min(block, n - J * block)
                for x in range(cols):
                    src = (kbase + kperm_used[J * block + x]) * d
                    _copy(kbuf, (nk + x) * d, k1, src, d)
                    _copy(vbuf, (nk + x) * d, v1, src, d)
                nk += cols
            ka, va, koff = kbuf, vbuf, 0
        # scores, transposed: st (nk keys x rows queries, row-major) = scale K Q^T
        st = sbuf[: nk * rows].reshape((nk, rows))
        whole = fused and rows == 32 and nk == 32 * (c1 - c0)  # whole 32 x 32 float32 tiles
        if whole:
            for r in range(rows):
                cmax[r] = mrow[r]
            _scores32(ka, koff, qbuf, sbuf, c1 - c0, d, scale * unit, tile_mask, c0, maskt, cmax)
            _exp32(sbuf, nk, cmax, csum)
        else:
            _gemm(_N, _N, rows, nk, d, scale * unit, qbuf, 0, rows, ka, koff, d, 0.0, sbuf, 0, rows)
            off = 0
            for t in range(c0, c1):
                cols = min(block, n - tile_col[t] * block)
                if tile_mask[t] >= 0:
                    _mask_tile_t(st, off, cols, rows, masks, tile_mask[t])
                off += cols
            _softmax_cols(st, nk, rows, mrow, cmax, msub, csum, precise)
        for r in range(rows):  # alpha = exp(old max - new max); 1 where nothing changes
            alpha[r] = mrow[r] - cmax[r] if cmax[r] != ninf else 0.0
        _exp_rows(alpha, rows, precise)
        for r in range(rows):
            lrow[r] = lrow[r] * alpha[r] + csum[r]
            if cmax[r] != ninf:
                mrow[r] = cmax[r]
        if whole and d % 16 == 0:
            # each group of 4 queries sees key rows lo .. hi of the chunk (from the
            # masks of its first and last tile that hold any of its queries)
            full = grows.size // 16 - 1
            lo, hi = roff[:8], roff[8:16]
            for g in range(8):
                lo[g] = 0
                hi[g] = 0
                for t in range(c0, c1):
                    mi = tile_mask[t] if tile_mask[t] >= 0 else full
                    if grows[mi * 16 + 2 * g] < 32:
                        lo[g] = (t - c0) * 32 + grows[mi * 16 + 2 * g]
                        break
                for t in range(c1 - 1, c0 - 1, -1):
                    mi = tile_mask[t] if tile_mask[t] >= 0 else full
                    if grows[mi * 16 + 2 * g + 1] > 0:
                        hi[g] = (t - c0) * 32 + grows[mi * 16 + 2 * g + 1]
                        break
            post = msub  # free in the fused path: 1, or 1 / l after the last chunk
            final = inplace and last and c1 == t1
            for r in range(rows):
                post[r] = 1.0
                if final and lrow[r] != 0.0:
                    post[r] = 1.0 / lrow[r]
            _pv32(va, koff, sbuf, ob, ooff, alpha, post, lo, hi, d, ob, ooff)  # in place
        else:
            for r in range(rows):
                a = alpha[r]
                if a != 1.0:
                    orow = obuf[r * d: (r + 1) * d]  # a view: its loop vectorizes (see _copy)
                    for c in range(d):
                        orow[c] *= a
            # o (rows x d, row-major) += P V, with P^T = st
            _gemm(_N, _T, d, rows, nk, 1.0, va, koff, d, sbuf, 0, rows, 1.0, obuf, 0, d)
    if inplace:  # the rows of o1 hold the state, or the output if ``last``
        for r in range(rows):
            i = base + qmap[x0 + r]
            if not last:
                m1[i] = mrow[r]
                l1[i] = lrow[r]
            elif lrow[r] == 0.0:  # no key in this row (NaN scores leave l NaN, not 0)
                _zero(o1, i * d, d)
                m1[i] = ninf
            else:
                m1[i] = mrow[r] / unit + math.log(lrow[r])
        return
    for r in range(rows):
        i = base + qmap[x0 + r]
        if last:
            li = lrow[r]
            if li == 0.0:  # no key in this row (NaN scores leave l NaN, not 0)
                _zero(o1, i * d, d)
                m1[i] = ninf
            else:
                inv = 1.0 / li
                dst = o1[i * d: (i + 1) * d]  # views: a loop over two offsets into flat
                src = obuf[r * d: (r + 1) * d]  # arrays is not vectorized, ~10x slower
                for c in range(d):
                    dst[c] = src[c] * inv
                m1[i] = mrow[r] / unit + math.log(li)
        else:
            _copy(o1, i * d, obuf, r * d, d)
            m1[i] = mrow[r]
            l1[i] = lrow[r]


@numba.njit(parallel=True, cache=True)
def _permute_rows(x1, perm, p, BH, rows, d, out1):  # pragma: no cover - compiled
    """``out1`` (flattened ``(BH*n, d)``): rows ``0 .. rows`` of every (batch, head)
    set to the rows of ``x1`` in the order ``perm[p]``."""
    _wide()
    n = perm.shape[1]
    R = 512  # rows per work item (the loop may be handed out in small chunks)
    for u in prange((BH * rows + R - 1) // R):
        for w in range(u * R, min(BH * rows, (u + 1) * R)):
            bh = w // rows
            x = w % rows
            src = (bh * n + perm[p, x]) * d
            dst = (bh * n + x) * d
            _copy(out1, dst, x1, src, d)


@numba.njit(parallel=True, cache=True)
def _permute_residue(x1, s, BH, n, d, out1):  # pragma: no cover - compiled
    """``out1``: the rows of every (batch, head) of ``x1`` grouped by ``i mod s`` (each
    group in increasing ``i``), the order of a ``residue(s)`` piece. Copied in tiles of
    ``16 x 16`` grid cells (token ``g*s + r`` goes to ``offset[r] + g``), so that reads and
    writes are both runs of consecutive rows."""
    _wide()
    ng = (n + s - 1) // s
    off = np.empty(s + 1, np.int64)
    off[0] = 0
    for r in range(s):
        off[r + 1] = off[r] + (n - r + s - 1) // s
    T = 16
    ngb = (ng + T - 1) // T
    nrb = (s + T - 1) // T
    for w in prange(BH * ngb * nrb):
        bh = w // (ngb * nrb)
        gb = (w // nrb) % ngb
        rb = w % nrb
        base = bh * n
        for g in range(gb * T, min(ng, gb * T + T)):
            for r in range(rb * T, min(s, rb * T + T)):
                t = g * s + r
                if t < n:
                    src = (base + t) * d
                    dst = (base + off[r] + g) * d
                    _copy(out1, dst, x1, src, d)


@numba.njit(parallel=True, cache=True, fastmath=_FM)
def _forward_piece(q1, k1, v1, o1, m1, l1, BH, H, d, scale, G, g, p, first, last, qperm,
                   kperm_used, kstart, kstep, span, copies, tile_ptr, tile_col, tile_mask, masks,
                   maskt, grows, fused, block, chunk, seg, precise, T):  # pragma: no cover - compiled
    """Piece ``p`` (softmax group ``g``) of every (batch, head) whose group is ``g``.

    ``span > 0``: the key blocks of a work item's tiles lie within ``span``
    consecutive blocks of the piece's order; each work item then copies those key
    and value rows (token ``kperm_used[x]`` for position ``x``), and its query rows
    and softmax state, into buffers of its own, in which the piece's order is
    contiguous. ``copies`` (from :func:`_copy_orders`) lists, per work item, the
    positions to copy in the order that moves rows fastest."""
    _wide()
    n = m1.shape[0] // BH
    nb = (n + block - 1) // block
    nseg = (nb + seg - 1) // seg  # work items: (batch x head, run of `seg` query blocks)
    local = np.arange(n, dtype=kperm_used.dtype)
    lstart = np.arange(nb, dtype=kstart.dtype) * block
    lstep = np.ones(nb, dtype=kstep.dtype)
    # buffers per thread (``T`` threads), allocated once, not per work item
    # on cache lines; each thread's slices too where block is a multiple of 16 (the default 32)
    wq = _aligned(T * 2 * block * d, q1).reshape((T, 2, block * d))
    wkv = _aligned(T * 2 * chunk * block * d, q1).reshape((T, 2, chunk * block * d))
    ws = _aligned(T * block * chunk * block, q1).reshape((T, block * chunk * block))
    wr = _aligned(T * 6 * block, q1).reshape((T, 6, block))
    wi = np.empty((T, block), np.int64)
    nkl = span * block if span > 0 else 0
    nql = seg * block if span > 0 else 0
    wkl = _aligned(T * 2 * nkl * d, q1).reshape((T, 2, nkl * d))
    wql = _aligned(T * 2 * nql * d, q1).reshape((T, 2, nql * d))
    wml = _aligned(T * 2 * nql, q1).reshape((T, 2, nql))
    # a work item's state goes back to rows of ``o1`` scattered in runs of a few:
    # where each row is whole cache lines, stored without reading them first (the
    # strided forward at n = 16,384 2.3% faster, A/B; the next piece reads it again
    # from memory either way)
    whole_lines = (d * o1.itemsize) % 64 == 0 and o1.ctypes.data % 64 == 0
    for w in prange(BH * nseg):
        bh = w // nseg
        if (bh % H) % G != g:
            continue
        tid = numba.get_thread_id()
        qbuf, obuf = wq[tid, 0], wq[tid, 1]
        kbuf, vbuf = wkv[tid, 0], wkv[tid, 1]
        sbuf = ws[tid]
        mrow, lrow, cmax, msub, csum, alpha = wr[tid, 0], wr[tid, 1], wr[tid, 2], wr[tid, 3], wr[tid, 4], wr[tid, 5]
        I0 = (w % nseg) * seg
        I1 = min(nb, I0 + seg)
        base = bh * n
        if span > 0:
            # this work item's keys, values, queries and softmax state, copied into
            # buffers of its own (one array at a time: see _copy_orders)
            kx0, kptr, korder, qptr, qorder = copies
            it = w % nseg
            x0 = kx0[it]
            kl, vl = wkl[tid, 0], wkl[tid, 1]
            for t in range(kptr[it], kptr[it + 1]):
                x = korder[t]
                _copy(kl, (x - x0) * d, k1, (base + kperm_used[x]) * d, d)
            for t in range(kptr[it], kptr[it + 1]):
                x = korder[t]
                _copy(vl, (x - x0) * d, v1, (base + kperm_used[x]) * d, d)
            y0 = I0 * block
            qp = qperm[p]
            ql, ol = wql[tid, 0], wql[tid, 1]
            ml, ll = wml[tid, 0], wml[tid, 1]
            for t in range(qptr[it], qptr[it + 1]):
                y = qorder[t]
                _copy(ql, (y - y0) * d, q1, (base + qp[y]) * d, d)
            if not first:
                for t in range(qptr[it], qptr[it + 1]):
                    y = qorder[t]
                    i = base + qp[y]
                    _copy(ol, (y - y0) * d, o1, i * d, d)
                    ml[y - y0] = m1[i]
                    ll[y - y0] = l1[i]
            for I in range(I0, I1):
                _qblock(ql, kl, vl, ol, ml, ll, -y0, -x0, n, d, p, I, scale, first, last,
                        local, local, lstart, lstep, tile_ptr, tile_col, tile_mask, masks,
                        maskt, grows, fused,
                        block, chunk, precise, qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax,
                        msub, csum, alpha, wi[tid])
            for t in range(qptr[it], qptr[it + 1]):
                y = qorder[t]
                i = base + qp[y]
                if whole_lines:
                    _copy_nt(o1, i * d, ol, (y - y0) * d, d)
                else:
                    _copy(o1, i * d, ol, (y - y0) * d, d)
                m1[i] = ml[y - y0]
                l1[i] = ll[y - y0]
        else:
            for I in range(I0, I1):
                _qblock(q1, k1, v1, o1, m1, l1, base, base, n, d, p, I, scale, first, last,
                        qperm[p], kperm_used, kstart, kstep, tile_ptr, tile_col, tile_mask, masks,
                        maskt, grows, fused,
                        block, chunk, precise, qbuf, kbuf, vbuf, sbuf, obuf, mrow, lrow, cmax,
                        msub, csum, alpha, wi[tid])


_LOCAL_ROWS = 2048


def _item_span(ptr: np.ndarray, tile_col: np.ndarray, seg: int) -> int:
    """Most key blocks (first to last) that the tiles of one work item (``seg`` query
    blocks) of a piece span; ``ptr``: the piece's slice of ``tile_ptr``."""
    nb = ptr.size - 1
    idx = np.arange(0, nb, seg)
    starts, ends = ptr[idx], ptr[np.minimum(idx + seg, nb)]
    cols = tile_col[ptr[0]: ptr[-1]]
    keep = ends > starts
    if not keep.any():
        return 0
    lo = np.minimum.reduceat(cols, starts[keep] - ptr[0])
    hi = np.maximum.reduceat(cols, starts[keep] - ptr[0])
    return int((hi - lo).max()) + 1


_COPY_RUN = 8  # rows of one residue class copied together (see _copy_orders)


def _copy_order(x: np.ndarray, perm: np.ndarray, s: int) -> np.ndarray:
    """Positions ``x`` of a piece in the order to copy their rows (tokens ``perm[x]``):
    as given, except in a ``residue(s)`` piece (``s`` > 0), where they are taken
    ``_COPY_RUN`` grid rows at a time and by position within those (see
    :func:`_copy_orders`)."""
    if s <= 0:
        return x
    return x[np.lexsort((x, perm[x] // (_COPY_RUN * s)))]


def _copy_orders(plan, p: int, items: int, kperm_used: np.ndarray, s: int) -> tuple:
    """For piece ``p`` split in work items of ``items`` query blocks: what each item
    copies, ``(kx0, kptr, korder, qptr, qorder)``: item ``w``'s key positions are
    ``korder[kptr[w]: kptr[w + 1]]`` (its key blocks start at position ``kx0[w]``), its
    query positions ``qorder[qptr[w]: qptr[w + 1]]``, each list in the order to copy.

    That order is the tokens' order, except in a ``residue(s)`` piece (``s`` > 0):
    there an item's rows are a few residue classes over the whole sequence, and
    copying them in token order writes each run of consecutive source rows to rows
    ``n / s`` apart in the buffer, which all fall in one set of the L1 cache. So the
    tokens are taken ``_COPY_RUN`` grid rows (``_COPY_RUN * s`` tokens) at a time, and
    within those by class: the source rows of a step stay in L1 and every class
    writes a run of ``_COPY_RUN`` consecutive rows (measured on 64 residue items of
    q, k, v at n = 16,384: 10 ms instead of 16 ms; scattering the state back: 4.0
    instead of 5.8 ms)."""
    n, nb, block = plan.n, plan.nb, plan.block
    ptr = plan.tile_ptr[p * nb: (p + 1) * nb + 1]
    qperm = plan.qperm[p]
    kx0, kptr, korder, qptr, qorder = [], [0], [], [0], []
    for I0 in range(0, nb, items):
        I1 = min(nb, I0 + items)
        cols = plan.tile_col[ptr[I0]: ptr[I1]]
        x0 = int(cols.min()) * block if cols.size else 0
        x1 = min(n, (int(cols.max()) + 1) * block) if cols.size else 0
        for lo, hi, perm, order, pointer in ((x0, x1, kperm_used, korder, kptr),
                                              (I0 * block, min(n, I1 * block), qperm, qorder, qptr)):
            order.append(_copy_order(np.arange(lo, hi), perm, s))
            pointer.append(pointer[-1] + hi - lo)
        kx0.append(x0)
    return tuple(np.asarray(a, np.int64) for a in (kx0, kptr, np.concatenate(korder), qptr,
                                                    np.concatenate(qorder)))


_NO_COPIES = (np.zeros(1, np.int64),) * 5


def _forward_steps(plan, seg: int) -> list[tuple]:
    """What the forward derives from the plan alone, once per plan (see
    :meth:`ExecutionPlan.memo`): the pieces in the order they run, each as
    ``(p, first, last, span, items, reorder, kstart, kstep, kperm_used, copies)``.

    Pieces whose query blocks are not runs of tokens run first: they then only write
    the state of their rows, which the pieces in natural order read back
    sequentially. Key rows are used in place where a piece's key blocks are runs of
    consecutive tokens; otherwise each work item (about ``_LOCAL_ROWS`` queries, so
    that its copies read runs of rows: 16 rows per run for a stride-128 head's order)
    copies the rows it needs (``span`` > 0: the key blocks one item spans) or, if
    that would copy much more than it uses, ``reorder`` says how the used key blocks
    are put in the piece's order once per call: ``(s, rows)``, ``s`` > 0 for a
    ``residue(s)`` order, else ``kperm`` row by row."""
    n, nb, block = plan.n, plan.nb, plan.block
    tile_ptr, tile_col, kperm = plan.tile_ptr, plan.tile_col, plan.kperm
    groups = [int(g) for g in plan.piece_group]
    residue = _residues(plan)
    kstart, kstep = _block_steps(kperm, block)
    qs = _block_steps(plan.qperm, block)[1]
    order = sorted(range(len(groups)), key=lambda p: bool((qs[p] == 1).all()))
    steps = []
    for p in order:
        same = [x for x in order if groups[x] == groups[p]]
        cols = tile_col[tile_ptr[p * nb]: tile_ptr[(p + 1) * nb]]
        used = int(cols.max()) + 1 if cols.size else 0
        ks, kt, kperm_used = kstep[p], kstart[p], kperm[p]
        span, items, reorder = 0, seg, None
        if (ks[:used] != 1).any():
            items = max(seg, -(-_LOCAL_ROWS // block))
            span = _item_span(tile_ptr[p * nb: (p + 1) * nb + 1], tile_col, items)
            if span > 2 * items:  # a work item would copy more than it reuses
                span, items = 0, seg
                reorder = (int(residue[p]), min(n, used * block))
                kt = np.arange(nb, dtype=np.int64) * block
                ks = np.ones(nb, dtype=np.int64)
                kperm_used = np.arange(n, dtype=kperm.dtype)
        copies = (_copy_orders(plan, p, items, kperm_used, int(residue[p])) if span > 0
                  else _NO_COPIES)
        steps.append((p, p == same[0], p == same[-1], span, items, reorder,
                      np.ascontiguousarray(kt), np.ascontiguousarray(ks), kperm_used, copies))
    return steps


_NO_MASKS = np.zeros(0, np.uint32)


def _masks_t(plan) -> np.ndarray:
    """``uint32 (M * 32 + 32,)``: the partial-tile masks of a 32-token plan transposed,
    the query bits of key ``c`` of mask ``m`` in word ``m * 32 + c`` (what
    :func:`_scores32` selects with), then 32 all-ones words."""
    bits = np.unpackbits(plan.masks.view(np.uint8), axis=-1, bitorder="little")[..., :32]
    words = np.packbits(bits.transpose(0, 2, 1), axis=-1, bitorder="little")  # (M, key, 4)
    words = np.ascontiguousarray(words).view("<u4").reshape(-1).astype(np.uint32)
    # _scores32 reads 32 words (then ignores them) for a full tile: never an empty array
    return np.concatenate([words, np.full(32, 0xFFFFFFFF, np.uint32)])


_NO_ROWS = np.zeros(16, np.int64)


def _group_rows(maskt: np.ndarray) -> np.ndarray:
    """``int64 (M + 1, 8, 2)`` flattened, from :func:`_masks_t`'s words: for mask ``m``
    and query group ``g`` (queries ``4g .. 4g+3`` of a 32-token tile), the first key
    that any of them sees and one past the last (``32, 0`` if none sees one); the
    last entry is the full tile, ``0, 32`` for every group (what :func:`_pv32` is
    told to skip)."""
    words = maskt.reshape(-1, 32).astype(np.int64)  # (M + 1, key): query bits
    groups = (words[:, None, :] >> (4 * np.arange(8))[None, :, None]) & 0xF  # (M+1, 8, key)
    seen = groups != 0
    first = np.where(seen.any(-1), seen.argmax(-1), 32)
    last = np.where(seen.any(-1), 32 - seen[..., ::-1].argmax(-1), 0)
    return np.ascontiguousarray(np.stack([first, last], axis=-1).reshape(-1), dtype=np.int64)


_WORKSPACE = threading.local()
_POOL_ARRAYS = 8  # recycled arrays a thread keeps (the least recently used one goes)
_POOL_MIN_BYTES = 1 << 20  # smaller arrays come from malloc, which recycles them itself


def _buffer(shape: tuple, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array: one of the calling thread's recycled
    arrays of that size and dtype that nothing outside the pool references any more
    (no array, view, tensor or buffer made from it is alive), else a new one, which
    joins the pool.

    Why: an array of more than 32 MiB is a new ``mmap`` each time (glibc's malloc
    recycles only smaller ones), and its first touch costs a page fault per page,
    on this machine's virtual machine also the host's. For the strided forward at
    n = 16,384 (32 MiB out) that was 5-6% of the call (A/B interleaved, 2 threads);
    the backward's three gradients pay it three times. Recycling puts the kernel's
    outputs on the footing that malloc gives smaller arrays. The pool keeps up to
    ``_POOL_ARRAYS`` arrays of at least ``_POOL_MIN_BYTES`` per thread (per thread, so
    concurrent calls never share one) until :func:`release_workspace`."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if size * dtype.itemsize < _POOL_MIN_BYTES:
        return np.empty(shape, dtype)
    pool = getattr(_WORKSPACE, "pool", None)
    if pool is None:
        pool = _WORKSPACE.pool = []
    pad = 64 // dtype.itemsize
    for i in range(len(pool)):
        raw = pool[i]
        # referenced by the pool, by ``raw`` and by getrefcount's argument only (every
        # view handed out refers to ``raw``, numpy's base of a view of a view)
        if raw.size == size + pad and raw.dtype == dtype and sys.getrefcount(raw) == 3:
            pool.append(pool.pop(i))  # the most recently used last
            break
    else:
        raw = np.empty(size + pad, dtype)
        pool.append(raw)
        if len(pool) > _POOL_ARRAYS:
            del pool[0]  # forgotten; freed unless its user still holds it
    # on a cache line: rows of the output and the gradients are read and written in
    # 64-byte vectors, and a large np.empty starts 16 bytes into a line (the strided
    # forward at n = 16,384: 3% faster aligned, A/B interleaved)
    off = (-raw.ctypes.data % 64) // dtype.itemsize
    return raw[off: off + size].reshape(shape)


def release_workspace() -> None:
    """Free the arrays that the calling thread keeps for reuse: outputs and
    gradients of earlier calls that nothing references any more (the forward and
    backward take their large arrays from a per-thread pool of up to 8 such arrays;
    see ``_buffer``). Arrays still in use are not touched.

    Examples
    --------
    >>> release_workspace()
    """
    _WORKSPACE.pool = []


def _forward(q1, k1, v1, o1, m1, BH, H, d, scale, plan, chunk, seg, precise):
    """``q1, k1, v1, o1``: flattened ``(B*H*n*d,)``; ``m1``: ``(B*H*n,)`` (becomes the
    log-sum-exp); head ``h`` uses group ``h % G``. The pieces of a group continue one
    online softmax per token, in the order of :func:`_forward_steps`; between them the
    unnormalized output lives in ``o1``'s rows, which the last piece normalizes."""
    ensure_blas()
    n, G, block = plan.n, plan.num_groups, plan.block
    groups = [int(g) for g in plan.piece_group]
    if len(set(groups)) < G:  # a group without pieces: its rows have no keys
        H_ = np.arange(BH) % H % G
        empty = ~np.isin(H_, groups)
        o1.reshape(BH, -1)[empty] = 0.0
        m1.reshape(BH, -1)[empty] = -np.inf
    l1 = np.empty_like(m1)
    kp1 = vp1 = None
    # 32-token float32 tiles: scores, masks and column max in one pass (_scores32)
    fused = block == 32 and not precise
    maskt = plan.memo("cpu.masks_t", lambda: _masks_t(plan)) if fused else _NO_MASKS
    grows = plan.memo("cpu.group_rows", lambda: _group_rows(maskt)) if fused else _NO_ROWS
    for (p, first, last, span, items, reorder, kt, ks, kperm_used,
         copies) in plan.memo(("cpu.forward", seg), lambda: _forward_steps(plan, seg)):
        kq, vq = k1, v1
        if reorder is not None:  # the used key blocks put in the piece's order
            if kp1 is None:  # one buffer pair reused by the pieces
                kp1, vp1 = _buffer(k1.shape, k1.dtype), _buffer(v1.shape, v1.dtype)
            s, rows = reorder
            if s > 0:
                _permute_residue(k1, s, BH, n, d, kp1)
                _permute_residue(v1, s, BH, n, d, vp1)
            else:
                _permute_rows(k1, plan.kperm, p, BH, rows, d, kp1)
                _permute_rows(v1, plan.kperm, p, BH, rows, d, vp1)
            kq, vq = kp1, vp1
        _forward_piece(q1, kq, vq, o1, m1, l1, BH, H, d, scale, G, groups[p], p, first,
                       last, plan.qperm, kperm_used, kt, ks, span, copies, plan.tile_ptr,
                       plan.tile_col, plan.tile_mask, plan.masks, maskt, grows, fused, block,
                       chunk, items, precise, numba.get_num_threads())


# --------------------------------------------------------------------- backward
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


_ITEM_BLOCKS = 64  # blocks per backward work item (2,048 rows of 32 tokens)


def _backward_items(plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Work items of the backward, ``(item_ptr int64 (P + 1,), items int64 (K, 3),
    order int64, rows)``: for a piece whose query blocks are not runs of tokens and
    whose query and key orders are one permutation (a ``residue(s)`` piece), ranges
    ``[b0, b1)`` of its blocks that no tile leaves (merged from each tile's query and
    key block), packed into items of about ``_ITEM_BLOCKS`` blocks; item ``w``'s
    positions, in the order to copy them, are ``order[o0: o0 + rows_w]`` with
    ``o0 = items[w, 2]`` (runs of grid rows, class by class, in a ``residue(s)``
    piece: see :func:`_copy_orders`); ``rows``: the most rows of an item. Other
    pieces get no items (they gather each chunk's query rows)."""
    n, nb, block = plan.n, plan.nb, plan.block
    qs = plan.memo("cpu.qsteps", lambda: _block_steps(plan.qperm, block))[1]
    residue = _residues(plan)
    ptr, out, order, most, at = [0], [], [], 0, 0
    tile_row = plan.tile_rows()
    for p in range(plan.num_pieces):
        t0, t1 = plan.tile_ptr[p * nb], plan.tile_ptr[(p + 1) * nb]
        ranges = []
        if t1 > t0 and (qs[p] != 1).any() and np.array_equal(plan.qperm[p], plan.kperm[p]):
            rows, cols = tile_row[t0:t1], plan.tile_col[t0:t1]
            lo, hi = np.minimum(rows, cols), np.maximum(rows, cols) + 1
            srt = np.argsort(lo, kind="stable")
            for a, b in zip(lo[srt].tolist(), hi[srt].tolist(), strict=True):
                if ranges and a < ranges[-1][1]:
                    ranges[-1][1] = max(ranges[-1][1], b)
                else:
                    ranges.append([a, b])
            if max(b - a for a, b in ranges) > 2 * _ITEM_BLOCKS:
                ranges = []  # a range too large for one item's buffers
        packed = []
        for a, b in ranges:
            if packed and b - packed[-1][0] <= _ITEM_BLOCKS:
                packed[-1][1] = b
            else:
                packed.append([a, b])
        for a, b in packed:
            x = np.arange(a * block, min(n, b * block))
            out.append([a, b, at])
            order.append(_copy_order(x, plan.qperm[p], int(residue[p])))
            most, at = max(most, x.size), at + x.size
        ptr.append(len(out))
    items = np.asarray(out, np.int64).reshape(-1, 3)
    order = np.concatenate(order).astype(np.int64) if order else np.zeros(0, np.int64)
    return np.asarray(ptr, np.int64), items, order, max(most, 1)


# --------------------------------------------------------------------- BLAS threads
def _openblas_controls() -> list[tuple]:
    """``(set, get)`` thread-count functions of every OpenBLAS loaded in this process."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return found
    for path in sorted(paths):
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("", "64_"):
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                    found.append((setter, getter))
                    break
            else:
                continue
            break
    return found


_CONTROLS: list[tuple] | None = None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Hold every loaded OpenBLAS to one thread, then restore its setting.

    The kernels call BLAS from each of their own threads; a multi-threaded BLAS
    inside would oversubscribe the cores (and OpenBLAS warns about OpenMP loops).

    Examples
    --------
    >>> with single_threaded_blas():
    ...     pass
    """
    global _CONTROLS
    import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls this BLAS)

    if _CONTROLS is None:
        _CONTROLS = _openblas_controls()
    saved = [(setter, getter()) for setter, getter in _CONTROLS]
    for setter, _ in saved:
        setter(1)
    try:
        yield
    finally:
        for setter, old in saved:
            setter(old)


_SMALL_FLOPS = 5e7  # below this (about a millisecond), one thread beats waking up more


@contextlib.contextmanager
def _threads_for(flops: float) -> Iterator[None]:
    """Run small problems on one thread (a parallel region costs more than they do);
    larger ones hand out loop iterations in small chunks, so that a thread slowed down
    (by uneven rows, or by a busy machine) does not hold the others up."""
    before = numba.get_num_threads()
    chunk = numba.get_parallel_chunksize()
    if flops < _SMALL_FLOPS:
        numba.set_num_threads(1)
    else:
        numba.set_parallel_chunksize(2)
    try:
        yield
    finally:
        numba.set_num_threads(before)
        numba.set_parallel_chunksize(chunk)


# --------------------------------------------------------------------- wrappers
def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def _residues(plan) -> np.ndarray:
    """``s`` for each ``residue(s)`` piece whose key order is exactly the ``i mod s``
    grouping (0 for other pieces)."""
    from .planning import residue_perm

    out = np.zeros(plan.num_pieces, dtype=np.int64)
    for p, kind in enumerate(plan.piece_kind):
        if kind.startswith("residue("):
            s = int(kind[8:-1])
            if np.array_equal(plan.kperm[p], residue_perm(plan.n, s)):
                out[p] = s
    return out


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, plan, *, scale: float,
            chunk: int = _CHUNK, seg: int = 8) -> tuple[np.ndarray, np.ndarray]:
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
    out = _buffer(q.shape, q.dtype)
    lse = np.empty(q.shape[:3], dtype=q.dtype)
    with single_threaded_blas(), _threads_for(plan.flops(B, H, d)[1]):
        _forward(q.reshape(-1), k.reshape(-1), v.reshape(-1), out.reshape(-1), lse.reshape(-1),
                 B * H, H, d, q.dtype.type(scale), plan, int(chunk), int(seg),
                 q.dtype == np.float64)
    return out, lse


def backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
             do: np.ndarray, plan, *, scale: float,
             chunk: int = _CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` recomputed from the saved ``lse`` (no ``n x n`` storage).

    All arrays C-contiguous, one float dtype; ``lse`` ``(B, H, n)`` as returned
    by :func:`forward`.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
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
