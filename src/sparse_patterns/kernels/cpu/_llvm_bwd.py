"""Register-blocked passes of the float32 backward over 32-token tiles, numba
intrinsics written in LLVM IR (the backward's counterpart of :mod:`._llvm_fwd`'s
:func:`~._llvm_fwd._scores32` and :func:`~._llvm_fwd._pv32_dense`), which
:mod:`._backward` calls for every chunk of tiles of a key block.

A chunk is ``m`` query rows (whole tiles of 32) against the block's 32 keys; a row
``r`` of ``Q``, ``dO`` and ``dQ`` starts at element ``roff[r]`` of its array (rows used
in place where they lie, or in gather buffers). Three passes, each a product with
16 vector accumulators (AVX-512; without it, blocks a quarter the size: 8 of AVX2's 16
registers, :data:`._llvm._WIDE`), one operand a vector row and the other broadcast
element by element (no BLAS call):

* :func:`_dscores32`: ``S = Q K^T`` and ``dP = dO V^T`` for 4 queries at a time (1)
  (``K^T``, ``V^T``: ``d x 32``), then, in registers,
  ``P = 2**(S alpha - lse)`` (the exponential of :func:`._llvm._emit_exp2`, base-2
  units as the forward's) and ``dS = scale P (dP - delta)``, 0 where the tile's mask
  is unset: ``P`` and ``dS`` stored as ``m x 32`` rows. On bf16 inputs
  (:func:`_dscores32_bf16`) ``P`` and ``dS`` are rounded to bf16 when stored, and the
  exponential is the forward's bf16 one (:data:`._llvm._EXP2_POLY_BF16`, relative
  error at most 2.7e-6, two FMAs fewer an element);
* :func:`_dkv32`: ``dV += P^T dO`` or ``dK += dS^T Q`` for 8 keys at a time (4), each
  block over only the rows of each tile that see one of them (partial tiles);
* :func:`_dq32`: ``dQ += dS K`` for 4 queries at a time, over only the keys they see,
  read and written in ``dQ``'s rows.

On bf16 inputs where the CPU has AMX (:mod:`._amx`), the same three passes take their
products from ``tdpbf16ps`` (:func:`_dscores32_amx`: a tile's ``S`` and ``dP`` stored as
float32 rows, then the exponentials and ``dS`` as above; :func:`_dkv32_amx`,
:func:`_dq32_amx`: whole tiles, accumulated in the gradients' rows).

Which rows and keys of a partial tile those are comes from :func:`_tile_ranges`, once
per plan.

Each intrinsic emits nothing for an array that is not float32: :mod:`._backward`
never calls it with one, but numba compiles the float64 kernel's code too. As for
:mod:`._llvm`: after editing this module, delete the package's ``__pycache__``
(numba invalidates a cached caller only when its own file changes).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._amx import (
    _AMX,
    _amx_pairs_product,
    _amx_tile32,
    _tile_dot,
    _tile_load,
    _tile_store,
    _tiles_begin,
    _tiles_end,
)
from ._llvm import (
    _AVX512_BF16,
    _EXP2_POLY,
    _EXP2_POLY_BF16,
    _cat_bf16,
    _emit_exp2,
    _lane_order,
    _mac,
    _pack_bf16,
    _row_pairs,
    _splat,
    _wide_blocks,
)

__all__ = ["_dscores32", "_dkv32", "_dq32", "_tile_ranges", "_GROUP", "_dscores32_bf16",
           "_dkv32_bf16", "_dq32_bf16", "_exp_rows32", "_dscores32_amx", "_dkv32_amx",
           "_dq32_amx"]

_GROUP = 4  # rows (keys) of a group in _tile_ranges' table, and of _dq32's register block
# _dq32 asks for the ``dq`` rows of the group of rows 2 groups ahead (software prefetch):
# they come from memory when the rows of a head outgrow the cache
_DQ_AHEAD = 2
_VT = ir.VectorType(ir.FloatType(), 16)
_I64 = ir.IntType(64)


def _tile_ranges(masks: np.ndarray) -> np.ndarray:
    """What :func:`_dkv32` and :func:`_dq32` skip in the tiles of a 32-token plan
    (``masks``: its partial masks, ``uint64 (M, 32, W)``): ``int64 (M + 1, 32)``, for
    each mask (then the full tile, last) entries ``2g, 2g + 1``: the first row that sees
    one of keys ``4g .. 4g+3`` and one past the last, and entries ``16 + 2g, 17 + 2g``:
    the first key that one of rows ``4g .. 4g+3`` sees and one past the last (``0, 0``
    where there is none).

    Examples
    --------
    >>> m = np.zeros((1, 32, 1), np.uint64)
    >>> m[0, 5, 0] = 1 << 9  # row 5 sees key 9 only
    >>> _tile_ranges(m)[0, 4:6].tolist(), _tile_ranges(m)[0, 18:20].tolist()
    ([5, 6], [9, 10])
    """
    words = (masks[:, :, 0] & np.uint64(0xFFFFFFFF)).astype(np.int64)  # (M, 32 rows)
    words = np.concatenate([words, np.full((1, 32), 0xFFFFFFFF, np.int64)])
    g = np.arange(8)
    # (M + 1, key group, row): the row sees one of the group's keys
    rows = ((words[:, None, :] >> (4 * g)[None, :, None]) & 0xF) != 0
    # (M + 1, row group, key): one of the group's rows sees the key
    bits = np.bitwise_or.reduce(words.reshape(-1, 8, 4), axis=2)
    keys = ((bits[:, :, None] >> np.arange(32)[None, None, :]) & 1) != 0
    out = np.zeros((words.shape[0], 32), np.int64)
    for at, seen in ((0, rows), (16, keys)):
        anyone = seen.any(-1)
        out[:, at: at + 16: 2] = np.where(anyone, seen.argmax(-1), 0)
        out[:, at + 1: at + 16: 2] = np.where(anyone, 32 - seen[..., ::-1].argmax(-1), 0)
    return out


def _f32(context, signature, i) -> bool:
    return context.get_value_type(signature.args[i].dtype) == ir.FloatType()


def _data(context, builder, signature, args, i):
    return context.make_array(signature.args[i])(context, builder, args[i]).data


def _int(context, builder, signature, args, i):
    """Integer argument ``i`` as an ``int64``."""
    return context.cast(builder, args[i], signature.args[i], types.int64)


def _vec(builder, ptr, off):
    return builder.bitcast(builder.gep(ptr, [off]), _VT.as_pointer())


def _fma(builder):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VT, [_VT] * 3),
                                          "llvm.fma.v16f32")


def _bcast(builder, ptr, off):
    """Element ``ptr[off]`` in every lane."""
    return _splat(builder, builder.load(builder.gep(ptr, [off])), _VT)


def _columns(builder, d, body, C=4):
    """``body(c0, W)`` for the columns ``c0 .. c0 + 16 W`` of a row of ``d`` floats:
    whole groups of ``C`` vectors, then one vector at a time for the rest (``d`` a
    multiple of 16; two variants of the loop, not ``C``: each is compiled at every
    call site)."""
    whole = builder.sdiv(d, _I64(16 * C))
    with cgutils.for_range(builder, whole) as cl:
        body(builder.mul(cl.index, _I64(16 * C)), C)
    rest = builder.sdiv(builder.srem(d, _I64(16 * C)), _I64(16))
    with cgutils.for_range(builder, rest) as cl:
        body(builder.add(builder.mul(whole, _I64(16 * C)), builder.mul(cl.index, _I64(16))), 1)


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


def _amx_dscores(builder, qp, dop, rp, ktp, vtp, r0, dw, pp, sp) -> None:
    """IR: ``S`` and ``dP`` of rows ``r0 .. r0 + 31`` (a tile: rows at word offsets
    ``rp[r]`` of ``qp``, ``dop``, ``dw`` words apart) against the 32 keys by AMX
    (:func:`._amx._amx_tile32`, ``K^T`` and ``V^T`` by words in ``ktp``, ``vtp``), stored
    as float32 rows of 32 at ``pp`` and ``sp`` (row ``r`` at ``32 r``); the tiles configured
    by the caller."""
    for xp, tp, outp in ((qp, ktp, pp), (dop, vtp, sp)):
        _amx_tile32(builder,
                    lambda h: builder.load(builder.gep(rp, [builder.add(r0, _I64(16 * h))])),
                    xp, tp, dw, builder.gep(outp, [builder.mul(r0, _I64(32))]))


def _dscores_codegen(bf16: bool, amx: bool = False):
    """The IR of :func:`_dscores32`, (``bf16``) of :func:`_dscores32_bf16` and (``amx``)
    of :func:`_dscores32_amx`. A register block is ``G`` rows: 4, or 1 without AVX-512
    (:data:`._llvm._WIDE` false)."""

    def codegen(context, builder, signature, args):
        G = _GROUP if bf16 or amx or _wide_blocks() else 1
        if not _f32(context, signature, 0) or (bf16 and not _AVX512_BF16):
            return context.get_dummy_value()
        if amx and not _AMX:
            return context.get_dummy_value()
        qp, dop, rp, ktp, vtp = (_data(context, builder, signature, args, i) for i in range(5))
        m_, d_ = (_int(context, builder, signature, args, i) for i in (5, 6))
        al_, ds_ = args[7], args[11]
        lp, dlp, bp, pp, sp = (_data(context, builder, signature, args, i)
                               for i in (8, 9, 10, 12, 13))
        fma = _fma(builder)
        zero = ir.Constant(_VT, [0.0] * 16)

        def scalar(v, t):
            v = context.cast(builder, v, t, types.float32)
            return _splat(builder, v, _VT)

        av = scalar(al_, signature.args[7])
        dsv = scalar(ds_, signature.args[11])
        acc = [[[cgutils.alloca_once(builder, _VT) for h in range(2)] for u in range(G)]
               for w in range(2)]  # [S, dP][row][half]
        if amx:  # configured once for the chunk's passes (_dq32_amx releases them)
            _tiles_begin(builder)
        with cgutils.for_range(builder, builder.sdiv(m_, _I64(G))) as gl:
            r0 = builder.mul(gl.index, _I64(G))
            rows = [builder.add(r0, _I64(u)) for u in range(G)]
            offs = [builder.load(builder.gep(rp, [r])) for r in rows]
            if amx:  # a tile's products first (P, dS overwrite rows already read)
                first = builder.icmp_signed("==", builder.srem(r0, _I64(32)), _I64(0))
                with builder.if_then(first):
                    _amx_dscores(builder, qp, dop, rp, ktp, vtp, r0, d_, pp, sp)
            for w in range(2):
                for u in range(G):
                    for h in range(2):
                        x = zero
                        if amx:
                            off = builder.add(builder.mul(rows[u], _I64(32)), _I64(16 * h))
                            x = builder.load(_vec(builder, pp if w == 0 else sp, off), align=4)
                        builder.store(x, acc[w][u][h])

            def products(halves):  # S and dP of the group's rows against those 16 keys
                with cgutils.for_range(builder, d_) as cl:
                    c = cl.index
                    kv = {h: builder.load(_vec(builder, ktp, builder.add(builder.mul(c, _I64(32)),
                                                                         _I64(16 * h))), align=4)
                          for h in halves}
                    vv = {h: builder.load(_vec(builder, vtp, builder.add(builder.mul(c, _I64(32)),
                                                                         _I64(16 * h))), align=4)
                          for h in halves}
                    for u in range(G):
                        a = _bcast(builder, qp, builder.add(offs[u], c))
                        b = _bcast(builder, dop, builder.add(offs[u], c))
                        for h in halves:
                            for w, x, y in ((0, a, kv[h]), (1, b, vv[h])):
                                builder.store(_mac(builder, fma, bf16, builder.load(acc[w][u][h]),
                                                   x, y), acc[w][u][h])

            # a half of the keys that no row of the group sees (in a partial tile: a
            # diagonal one, a band's edge) is skipped; its P and dS come out 0 below
            seen = builder.load(builder.gep(bp, [rows[0]]))
            for r in rows[1:]:
                seen = builder.or_(seen, builder.load(builder.gep(bp, [r])))
            low = builder.icmp_unsigned("!=", builder.and_(seen, ir.Constant(seen.type, 0xFFFF)),
                                        ir.Constant(seen.type, 0))
            high = builder.icmp_unsigned("!=", builder.lshr(seen, ir.Constant(seen.type, 16)),
                                         ir.Constant(seen.type, 0))
            if amx:  # nothing to skip: the tile's products are done
                low = high = ir.Constant(ir.IntType(1), 0)
            with builder.if_else(builder.and_(low, high)) as (both, one):
                with both:
                    products((0, 1))
                with one:
                    with builder.if_else(low) as (lo_only, hi_only):
                        with lo_only:
                            products((0,))
                        with hi_only:
                            with builder.if_then(high):
                                products((1,))
            out = [[None, None] for u in range(G)]  # [row][half]: (P, dS)
            for u in range(G):
                r = rows[u]
                shift = _bcast(builder, lp, r)
                delta = _bcast(builder, dlp, r)
                word = builder.load(builder.gep(bp, [r]))
                for h in range(2):
                    x = builder.call(fma, [builder.load(acc[0][u][h]), av, builder.fneg(shift)])
                    # bf16: P is rounded to 2**-8 right after, the cheaper polynomial
                    p = _emit_exp2(builder, x, _EXP2_POLY_BF16 if bf16 else _EXP2_POLY, floor=bf16)
                    keep = builder.bitcast(builder.trunc(builder.lshr(word, ir.Constant(word.type, 16 * h)),
                                                         ir.IntType(16)), ir.VectorType(ir.IntType(1), 16))
                    ds = builder.fmul(builder.fmul(p, dsv), builder.fsub(builder.load(acc[1][u][h]), delta))
                    out[u][h] = (builder.select(keep, p, zero), builder.select(keep, ds, zero))
                    if not bf16:
                        off = builder.add(builder.mul(r, _I64(32)), _I64(16 * h))
                        builder.store(out[u][h][0], _vec(builder, pp, off), align=4)
                        builder.store(out[u][h][1], _vec(builder, sp, off), align=4)
            if bf16:  # P, dS by pairs of rows; dS by pairs of keys (its rows in bf16)
                kp_ = _data(context, builder, signature, args, 14)
                for u in range(0, G, 2):
                    pair = builder.add(builder.sdiv(r0, _I64(2)), _I64(u // 2))
                    for h in range(2):
                        off = builder.add(builder.mul(pair, _I64(32)), _I64(16 * h))
                        for w, ptr in ((0, pp), (1, sp)):
                            builder.store(_pack_bf16(builder, out[u][h][w], out[u + 1][h][w]),
                                          _vec(builder, ptr, off), align=4)
                for u in range(G):
                    builder.store(_cat_bf16(builder, out[u][0][1], out[u][1][1]),
                                  _vec(builder, kp_, builder.mul(rows[u], _I64(16))), align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _dscores32(typingctx, q, do, roff, kt, vt, m, d, alpha, lc, dl, bits, dscale, pbuf,
               sbuf):  # pragma: no cover - compiled
    """``P`` and ``dS`` of ``m`` query rows (a multiple of 4) against 32 keys.

    For row ``r`` (``Q`` row at ``q[roff[r]]``, ``dO`` row at ``do[roff[r]]``) and key
    ``j``: ``s = sum_c q[roff[r] + c] kt[c*32 + j]``, ``dp = sum_c do[roff[r] + c]
    vt[c*32 + j]``; ``pbuf[r*32 + j] = 2**(alpha s - lc[r])`` and ``sbuf[r*32 + j] =
    dscale * P * (dp - dl[r])`` where bit ``j`` of ``bits[r]`` is set, else 0 (a masked
    key, or a row without keys: ``bits[r] = 0``, ``lc[r]`` finite). The exponential is
    :func:`._llvm._emit_exp2` (NaN stays NaN); the accumulators are 4 rows (1 without
    AVX-512) x 2 vectors x (``S``, ``dP``), and a half of the keys that none of
    those rows sees is not multiplied."""
    return (types.none(q, do, roff, kt, vt, m, d, alpha, lc, dl, bits, dscale, pbuf, sbuf),
            _dscores_codegen(False))


@intrinsic
def _dscores32_amx(typingctx, q, do, roff, kt, vt, m, dw, alpha, lc, dl, bits, dscale, pbuf,
                   sbuf, skeys):  # pragma: no cover - compiled
    """:func:`_dscores32_bf16` with the products by AMX (:mod:`._amx`): each tile of 32
    rows' ``S`` and ``dP`` are four ``16 x 16`` float32 tiles each, ``dw / 16``
    ``tdpbf16ps`` of 16 rows of ``Q`` or ``dO`` (where they lie: a tile's rows ``dw``
    words apart) by 16 words of ``K^T`` or ``V^T``, stored as float32 rows in ``pbuf`` and
    ``sbuf`` first; then the exponentials, ``dS`` and their bf16 rows as there, over
    them. It configures the tiles once for a chunk's AMX passes, this one's tiles and the
    :func:`_dkv32_amx` and :func:`_dq32_amx` that must follow it (the last releases
    them), instead of each pass, and each tile of this one, loading the configuration and
    releasing the tiles."""
    return (types.none(q, do, roff, kt, vt, m, dw, alpha, lc, dl, bits, dscale, pbuf, sbuf,
                       skeys), _dscores_codegen(True, amx=True))


@intrinsic
def _dkv32_amx(typingctx, mat, src, roff, acc, nt, d, scratch, ring,
               slots):  # pragma: no cover - compiled
    """:func:`_dkv32_bf16` by AMX: ``acc += mat^T src`` (``dV += P^T dO``, ``dK += dS^T
    Q``) over ``nt`` tiles of 32 rows, ``mat`` by pairs of rows as
    :func:`_dscores32_amx` leaves ``P`` and ``dS``, row ``r`` of ``src`` at word
    ``roff[r]`` (``d / 2`` words), ``acc`` 32 rows of ``d`` float32
    (:func:`._amx._amx_pairs_product`, ``mat^T`` built in ``scratch``, ``512 nt`` words,
    and ``src``'s rows paired in slot ``slots[t]`` of ``ring``, ``16 d`` words a slot, or
    found there where ``slots[t] < 0``: :func:`._pool._ring_slots`). Every tile whole
    (``mat`` is 0 where masked); a tile's paired rows are kept for the next call (the
    window's query tiles serve 5 key blocks in a row). The tiles as
    :func:`_dscores32_amx` left them (configured), not released."""
    def codegen(context, builder, signature, args):
        if not _f32(context, signature, 0) or not _AMX:
            return context.get_dummy_value()
        mp, srcp, rp, ap = (_data(context, builder, signature, args, i) for i in range(4))
        nt_, d_ = (_int(context, builder, signature, args, i) for i in (4, 5))
        wp, vp, sl = (_data(context, builder, signature, args, i) for i in (6, 7, 8))
        _amx_pairs_product(
            builder, nt_, mp, srcp,
            lambda t, j: builder.load(builder.gep(rp, [builder.add(builder.mul(t, _I64(32)), j)])),
            d_, wp, vp, ap, sl, configured=True, release=False)
        return context.get_dummy_value()
    return types.none(mat, src, roff, acc, nt, d, scratch, ring, slots), codegen


@intrinsic
def _dq32_amx(typingctx, mat, kv, dst, roff, nt, d):  # pragma: no cover - compiled
    """:func:`_dq32_bf16` by AMX: ``dQ += dS K`` for ``nt`` tiles of 32 rows: ``mat`` is
    ``dS``'s rows in bf16 (``skeys``: 16 words a row), ``kv`` the key rows by pairs
    (pair ``p``'s ``d`` words at ``p d``), row ``r`` of ``dst`` (float32) at ``roff[r]``
    (a tile's rows ``d`` apart). Tiles 0-3 accumulate in ``dQ``'s rows (2 halves of a
    tile x 2 groups of 16 columns), 4-5 hold ``dS`` (16 rows x 32 keys), 6-7 the key
    pairs of the columns (loaded once per 32 columns). The tiles as
    :func:`_dscores32_amx` left them (configured); released at the end."""
    def codegen(context, builder, signature, args):
        if not _f32(context, signature, 0) or not _AMX:
            return context.get_dummy_value()
        mp, kp, dp, rp = (_data(context, builder, signature, args, i) for i in range(4))
        nt_, d_ = (_int(context, builder, signature, args, i) for i in (4, 5))
        row_bytes = builder.mul(d_, _I64(4))
        with cgutils.for_range(builder, builder.sdiv(d_, _I64(32))) as cl:
            c0 = builder.mul(cl.index, _I64(32))
            for h in range(2):
                _tile_load(builder, 6 + h, builder.gep(kp, [builder.add(c0, _I64(16 * h))]),
                           row_bytes)
            with cgutils.for_range(builder, nt_) as tl:
                r0 = builder.mul(tl.index, _I64(32))

                def c_at(c):  # rows 16 (c % 2) .., columns c0 + 16 (c // 2) ..
                    row = builder.load(builder.gep(rp, [builder.add(r0, _I64(16 * (c % 2)))]))
                    return builder.gep(dp, [builder.add(row, builder.add(c0, _I64(16 * (c // 2))))])

                for c in range(4):
                    _tile_load(builder, c, c_at(c), row_bytes)
                for h in range(2):
                    _tile_load(builder, 4 + h, builder.gep(mp, [builder.mul(
                        builder.add(r0, _I64(16 * h)), _I64(16))]), 64)
                for c in range(4):
                    _tile_dot(builder, c, 4 + c % 2, 6 + c // 2)
                for c in range(4):
                    _tile_store(builder, c, c_at(c), row_bytes)
        _tiles_end(builder)
        return context.get_dummy_value()
    return types.none(mat, kv, dst, roff, nt, d), codegen


@intrinsic
def _dscores32_bf16(typingctx, q, do, roff, kt, vt, m, dw, alpha, lc, dl, bits, dscale, pbuf,
                    sbuf, skeys):  # pragma: no cover - compiled
    """:func:`_dscores32` on bf16 inputs (float32 containers of bf16 pairs, ``dw`` words
    a row; ``roff`` in words; ``kt``, ``vt`` by words, ``dw x 32``): the products are
    ``vdpbf16ps``, the exponential and ``dS`` float32, and the results stored in bf16
    for the next passes: ``pbuf`` and ``sbuf`` by pairs of rows (word ``(r/2)*32 + j``:
    rows ``r, r + 1`` of key ``j``, for :func:`_dkv32_bf16`), ``skeys`` by pairs of keys
    (``dS``'s rows in bf16: word ``r*16 + j/2``, for :func:`_dq32_bf16`)."""
    return (types.none(q, do, roff, kt, vt, m, dw, alpha, lc, dl, bits, dscale, pbuf, sbuf,
                       skeys), _dscores_codegen(True))


def _dkv_codegen(bf16: bool):
    """The IR of :func:`_dkv32` and (``bf16``: a step is a pair of rows, interleaved in
    registers) of :func:`_dkv32_bf16`: blocks of ``G = 8`` keys x 2 vectors, each over
    the rows either of its two groups of 4 keys sees; without AVX-512
    (:data:`._llvm._WIDE` false), 4 keys x 1 vector over their group's rows."""

    def codegen(context, builder, signature, args):
        G, C = (2 * _GROUP, 2) if bf16 or _wide_blocks() else (_GROUP, 1)
        if not _f32(context, signature, 0) or (bf16 and not _AVX512_BF16):
            return context.get_dummy_value()
        mp, sp, rp, ap = (_data(context, builder, signature, args, i) for i in range(4))
        nt_, d_ = (_int(context, builder, signature, args, i) for i in (4, 6))
        gp = _data(context, builder, signature, args, 5)
        fma = _fma(builder)
        a = [[cgutils.alloca_once(builder, _VT) for c in range(C)] for u in range(G)]
        with cgutils.for_range(builder, _I64(32 // G)) as gl:
            g = gl.index
            keys = [builder.add(builder.mul(g, _I64(G)), _I64(u)) for u in range(G)]

            def body(c0, W):
                arows = [builder.add(builder.mul(j, d_), c0) for j in keys]
                lanes = bf16 and W == 2  # pairs by in-lane unpacks, sums in their order
                for u in range(G):
                    xs = [builder.load(_vec(builder, ap, builder.add(arows[u], _I64(16 * c))),
                                       align=4) for c in range(W)]
                    for c, x in enumerate(_lane_order(builder, *xs) if lanes else xs):
                        builder.store(x, a[u][c])
                with cgutils.for_range(builder, nt_) as tl:
                    t32 = builder.mul(tl.index, _I64(32))
                    lo = hi = None
                    for s in range(G // _GROUP):  # the union of the two groups' rows
                        grp = builder.add(builder.mul(g, _I64(G // _GROUP)), _I64(s))
                        at = builder.add(t32, builder.mul(grp, _I64(2)))
                        x0 = builder.load(builder.gep(gp, [at]))
                        x1 = builder.load(builder.gep(gp, [builder.add(at, _I64(1))]))
                        some = builder.icmp_signed("<", x0, x1)  # (0, 0): no row
                        x0 = builder.select(some, x0, _I64(32))
                        x1 = builder.select(some, x1, _I64(0))
                        lo = x0 if lo is None else builder.select(
                            builder.icmp_signed("<", x0, lo), x0, lo)
                        hi = x1 if hi is None else builder.select(
                            builder.icmp_signed(">", x1, hi), x1, hi)
                    if bf16:  # pairs of rows: the first one's .. the last one's
                        lo = builder.ashr(lo, _I64(1))
                        hi = builder.ashr(builder.add(hi, _I64(1)), _I64(1))
                    with cgutils.for_range(builder, builder.sub(hi, lo)) as rl:
                        # a row, or (bf16) a pair of rows: the tile's 16 pairs, then the
                        # two src rows interleaved by column
                        r = builder.add(builder.sdiv(t32, _I64(2)) if bf16 else t32,
                                        builder.add(lo, rl.index))
                        first = builder.mul(r, _I64(2)) if bf16 else r
                        if bf16:  # rows first, first + 1 interleaved in registers
                            ra, rb = (builder.load(builder.gep(rp, [builder.add(first, _I64(k))]))
                                      for k in (0, 1))
                            x = _row_pairs(builder, sp, ra, rb, c0, W, _VT, lanes)
                        else:
                            so = builder.add(builder.load(builder.gep(rp, [first])), c0)
                            x = [builder.load(_vec(builder, sp, builder.add(so, _I64(16 * c))),
                                              align=4) for c in range(W)]
                        mrow = builder.add(builder.mul(r, _I64(32)), builder.mul(g, _I64(G)))
                        for u in range(G):
                            pu = _bcast(builder, mp, builder.add(mrow, _I64(u)))
                            for c in range(W):
                                builder.store(_mac(builder, fma, bf16, builder.load(a[u][c]), pu,
                                                   x[c]), a[u][c])
                for u in range(G):
                    xs = [builder.load(a[u][c]) for c in range(W)]
                    for c, x in enumerate(_lane_order(builder, *xs, back=True) if lanes else xs):
                        builder.store(x, _vec(builder, ap, builder.add(arows[u], _I64(16 * c))),
                                      align=4)

            _columns(builder, d_, body, C)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _dkv32(typingctx, mat, src, roff, acc, nt, rng, d):  # pragma: no cover - compiled
    """``acc[j*d + c] += sum_r mat[r*32 + j] * src[roff[r] + c]`` for the 32 keys ``j``
    of a chunk of ``nt`` tiles (rows ``r = 32 t + i``): ``dV += P^T dO`` or
    ``dK += dS^T Q``. Keys ``4g .. 4g+3`` see only rows ``rng[t*32 + 2g] <= i <
    rng[t*32 + 2g + 1]`` of tile ``t`` (the others' ``mat`` entries are 0 there: ``P``
    and ``dS`` are 0 where masked), and a block of 8 keys takes the rows either of its
    groups of 4 sees. Accumulators: 8 keys x 2 vectors (32 columns), then 1 vector for
    the rest of ``d``; a ``src`` row is loaded once per block of keys and each ``mat``
    entry broadcast: half as often as blocks of 4 keys x 4 vectors would (the same
    gradients, bit for bit). Without AVX-512: 4 keys x 1 vector, over their
    group's rows."""
    return types.none(mat, src, roff, acc, nt, rng, d), _dkv_codegen(False)


@intrinsic
def _dkv32_bf16(typingctx, mat, src, roff, acc, nt, rng, d):  # pragma: no cover - compiled
    """:func:`_dkv32` on bf16: ``mat`` by pairs of rows (word ``(r/2)*32 + j``, as
    :func:`_dscores32_bf16` stores ``P`` and ``dS``), ``src`` rows of bf16 words at
    ``src[roff[r]]`` (``d / 2`` words), rows ``r`` and ``r + 1`` (``r`` even)
    interleaved by column in registers (:func:`._llvm._row_pairs`), ``acc`` float32; a row
    range is widened to whole pairs (``mat`` is 0 for the extra row). One ``vdpbf16ps``
    per pair of rows. The rows are read as they are, not copies interleaved by a pass
    over each head (and each work item) first. They are paired by in-lane unpacks, the
    sums in :func:`._llvm._lane_order`'s column order between their load and store (not
    by ``vpermt2w``: see :func:`._llvm._row_pairs`)."""
    return types.none(mat, src, roff, acc, nt, rng, d), _dkv_codegen(True)


def _dq_codegen(bf16: bool):
    """The IR of :func:`_dq32` and (``bf16``: a step is a pair of keys) of
    :func:`_dq32_bf16`: blocks of 4 rows x 4 vectors, or x 1 without AVX-512
    (:data:`._llvm._WIDE` false)."""
    G = _GROUP

    def codegen(context, builder, signature, args):
        C = 4 if bf16 or _wide_blocks() else 1
        if not _f32(context, signature, 0) or (bf16 and not _AVX512_BF16):
            return context.get_dummy_value()
        mp, kp, dp, rp = (_data(context, builder, signature, args, i) for i in range(4))
        nt_, d_ = (_int(context, builder, signature, args, i) for i in (4, 6))
        gp = _data(context, builder, signature, args, 5)
        fma = _fma(builder)
        a = [[cgutils.alloca_once(builder, _VT) for c in range(C)] for u in range(G)]
        with cgutils.for_range(builder, builder.mul(nt_, _I64(32 // G))) as gl:
            t = builder.sdiv(gl.index, _I64(32 // G))
            g = builder.srem(gl.index, _I64(32 // G))
            at = builder.add(builder.mul(t, _I64(32)), builder.add(_I64(16), builder.mul(g, _I64(2))))
            lo = builder.load(builder.gep(gp, [at]))
            hi = builder.load(builder.gep(gp, [builder.add(at, _I64(1))]))
            if bf16:  # pairs of keys
                lo = builder.ashr(lo, _I64(1))
                hi = builder.ashr(builder.add(hi, _I64(1)), _I64(1))
            r0 = builder.add(builder.mul(t, _I64(32)), builder.mul(g, _I64(G)))
            rows = [builder.add(r0, _I64(u)) for u in range(G)]
            if _DQ_AHEAD:  # the dst rows of the group _DQ_AHEAD groups on, into the cache
                ahead = builder.add(r0, _I64(G * _DQ_AHEAD))
                with builder.if_then(builder.icmp_signed("<", ahead, builder.mul(nt_, _I64(32)))):
                    pf = cgutils.get_or_insert_function(
                        builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] + [ir.IntType(32)] * 3),
                        "llvm.prefetch.p0")
                    for u in range(G):
                        o = builder.load(builder.gep(rp, [builder.add(ahead, _I64(u))]))
                        with cgutils.for_range(builder, builder.sdiv(d_, _I64(16))) as ll:
                            at_ = builder.gep(dp, [builder.add(o, builder.mul(ll.index, _I64(16)))])
                            builder.call(pf, [builder.bitcast(at_, ir.IntType(8).as_pointer()),
                                              ir.IntType(32)(1), ir.IntType(32)(3), ir.IntType(32)(1)])
            with builder.if_then(builder.icmp_signed("<", lo, hi)):
                offs = [builder.load(builder.gep(rp, [r])) for r in rows]

                def body(c0, W):
                    drows = [builder.add(o, c0) for o in offs]
                    for u in range(G):
                        for c in range(W):
                            builder.store(builder.load(_vec(builder, dp, builder.add(drows[u], _I64(16 * c))),
                                                       align=4), a[u][c])
                    with cgutils.for_range(builder, builder.sub(hi, lo)) as jl:
                        j = builder.add(lo, jl.index)
                        ko = builder.add(builder.mul(j, d_), c0)
                        x = [builder.load(_vec(builder, kp, builder.add(ko, _I64(16 * c))), align=4)
                             for c in range(W)]
                        for u in range(G):
                            su = _bcast(builder, mp, builder.add(builder.mul(rows[u], _I64(16 if bf16 else 32)), j))
                            for c in range(W):
                                builder.store(_mac(builder, fma, bf16, builder.load(a[u][c]), su,
                                                   x[c]), a[u][c])
                    for u in range(G):
                        for c in range(W):
                            builder.store(builder.load(a[u][c]),
                                          _vec(builder, dp, builder.add(drows[u], _I64(16 * c))), align=4)

                _columns(builder, d_, body, C)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _dq32(typingctx, mat, kv, dst, roff, nt, rng, d):  # pragma: no cover - compiled
    """``dst[roff[r] + c] += sum_j mat[r*32 + j] * kv[j*d + c]`` for the rows
    ``r = 32 t + i`` of a chunk of ``nt`` tiles against 32 key rows ``kv``: ``dQ += dS K``.
    Rows ``4g .. 4g+3`` of tile ``t`` take only keys ``rng[t*32 + 16 + 2g] <= j <
    rng[t*32 + 17 + 2g]`` (the others' ``mat`` entries are 0); a group that sees no
    key is not read or written. Accumulators: 4 rows x 4 vectors (1 without AVX-512),
    loaded from and stored to ``dst``."""
    return types.none(mat, kv, dst, roff, nt, rng, d), _dq_codegen(False)


@intrinsic
def _dq32_bf16(typingctx, mat, kv, dst, roff, nt, rng, d):  # pragma: no cover - compiled
    """:func:`_dq32` on bf16: ``mat`` by pairs of keys (``dS``'s rows in bf16, word
    ``r*16 + j/2``), ``kv`` the 32 key rows interleaved by pairs (16 rows of ``d``
    words, :func:`._llvm._pair_rows`), ``dst`` float32; a key range is widened to whole
    pairs. One ``vdpbf16ps`` per pair of keys."""
    return types.none(mat, kv, dst, roff, nt, rng, d), _dq_codegen(True)

