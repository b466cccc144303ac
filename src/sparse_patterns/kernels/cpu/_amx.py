"""Intel AMX for bf16 inputs: whether this process may use the tile registers
(:func:`amx_here`), and the IR of the tile instructions that the passes of
:mod:`._llvm_fwd` (:func:`._llvm_fwd._scores32_amx`, :func:`._llvm_fwd._pv32_amx`) and
:mod:`._llvm_bwd` (``_dscores32_amx``, ``_dkv32_amx``, ``_dq32_amx``) emit.

AMX (AMX-TILE, AMX-BF16: Intel Xeon from Sapphire Rapids on) multiplies a tile of
16 rows x 32 bf16 by one of 16 rows of bf16 pairs into 16 x 16 float32 sums in one
``tdpbf16ps``: 512 products summed by pairs where ``vdpbf16ps`` does 32; so the bf16
products of the forward and the backward go to AMX where it is.

A process must ask Linux for the tiles' register state before its first tile
instruction (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``: without it the
instruction is a ``SIGILL``): :func:`amx_here` asks once. Every pass loads the tile
configuration (all eight tiles 16 rows x 64 bytes, :func:`_tiles_begin`) and releases
the tiles at its end (:func:`_tiles_end`), so that no state outlives it: the passes
that always run one after the other share one (the forward's scores and ``P V``, the
backward's three of a chunk); loading the configuration is cheap next to a query
block's work.
"""

from __future__ import annotations

import ctypes
import functools
import sys

from llvmlite import ir
from numba.core import cgutils

from ._llvm import _has_avx512, _row_pairs, _transpose_regs

__all__ = ["amx_here", "_AMX", "_amx_ok", "_tiles_begin", "_tiles_end", "_tile_load",
           "_tile_store", "_tile_zero", "_tile_dot", "_amx_tile32", "_amx_pairs_product"]

#: numba compiles for a CPU with AMX-TILE and AMX-BF16
_AMX = _has_avx512("amx-tile") and _has_avx512("amx-bf16")

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@functools.lru_cache(maxsize=1)
def amx_here() -> bool:
    """Whether this process runs AMX tile instructions: numba compiles for a CPU with
    AMX-TILE and AMX-BF16, and Linux granted the process the tiles' register state
    (asked for here, once per process; torch's oneDNN asks for it the same way).

    Examples
    --------
    >>> isinstance(amx_here(), bool)
    True
    """
    if not _AMX or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):  # pragma: no cover - no libc syscall
        return False


def _amx_ok(context, array_type) -> bool:
    """Whether an AMX pass can be generated for ``array_type``: float32 (bf16 pair
    containers) on a CPU with AMX. Elsewhere the pass compiles to nothing (its callers
    compile it into the float64 path too, and :func:`amx_here` keeps it from being
    reached on a CPU without AMX)."""
    return _AMX and context.get_value_type(array_type.dtype) == ir.FloatType()


_I8 = ir.IntType(8)
_I64 = ir.IntType(64)


def _call(builder, name: str, args: list) -> None:
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(ir.VoidType(), [a.type for a in args]),
                                        name)
    builder.call(fn, args)


def _tiles_begin(builder) -> None:
    """IR: load the tile configuration: palette 1, tiles 0-7 each 16 rows of 64 bytes."""
    cfg = [0] * 64
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t] = 64  # bytes a row (little-endian 16-bit)
        cfg[48 + t] = 16  # rows
    ty = ir.ArrayType(_I8, 64)
    name = "sparse_patterns.amx_config"
    g = builder.module.globals.get(name)
    if g is None:
        g = ir.GlobalVariable(builder.module, ty, name)
        g.global_constant = True
        g.linkage = "internal"
        g.align = 64
        g.initializer = ir.Constant(ty, cfg)
    _call(builder, "llvm.x86.ldtilecfg", [builder.bitcast(g, _I8.as_pointer())])


def _tiles_end(builder) -> None:
    """IR: release the tiles (their state back to its initial, empty one)."""
    _call(builder, "llvm.x86.tilerelease", [])


def _tile_load(builder, tile: int, ptr, stride) -> None:
    """IR: tile ``tile`` = 16 rows of 64 bytes from ``ptr``, rows ``stride`` bytes apart
    (an int or an ``i64`` value)."""
    _call(builder, "llvm.x86.tileloadd64", [_I8(tile), builder.bitcast(ptr, _I8.as_pointer()),
                                            _I64(stride) if isinstance(stride, int) else stride])


def _tile_store(builder, tile: int, ptr, stride) -> None:
    """IR: tile ``tile``'s 16 rows of 64 bytes to ``ptr``, rows ``stride`` bytes apart."""
    _call(builder, "llvm.x86.tilestored64", [_I8(tile), builder.bitcast(ptr, _I8.as_pointer()),
                                             _I64(stride) if isinstance(stride, int) else stride])


def _tile_zero(builder, tile: int) -> None:
    _call(builder, "llvm.x86.tilezero", [_I8(tile)])


def _tile_dot(builder, c: int, a: int, b: int) -> None:
    """IR: ``tdpbf16ps``: tile ``c`` (16 x 16 float32) += tile ``a`` (16 rows x 32 bf16)
    times tile ``b`` (16 rows of 16 bf16 pairs): ``c[m][n] += sum_k a[m][2k] b[k][2n] +
    a[m][2k+1] b[k][2n+1]``."""
    _call(builder, "llvm.x86.tdpbf16ps", [_I8(c), _I8(a), _I8(b)])


def _amx_tile32(builder, a_row, ap, bp, dw, out) -> None:
    """IR: a 32 x 32 float32 product by AMX, stored to ``out`` (rows of 32 floats): row
    ``i`` is a row of ``A`` (``2 dw`` bf16; rows ``16 h ..`` from word ``a_row(h)`` of
    ``ap``, ``dw`` words apart), column ``j`` a column of ``B^T`` by words (word ``c`` of
    column ``j`` at ``32 c + j`` of ``bp``). Tiles 0-3 accumulate (16 rows x 16 columns),
    4-5 hold rows of ``A``, 6-7 16 words of ``B^T``, a step being 32 of the ``2 dw``
    elements; the tile configuration is the caller's (:func:`_tiles_begin`). The
    forward's scores (keys x queries) and the backward's ``S`` and ``dP`` (rows x keys)."""
    i64 = ir.IntType(64)
    for c in range(4):
        _tile_zero(builder, c)
    with cgutils.for_range(builder, builder.sdiv(dw, i64(16))) as loop:
        w = builder.mul(loop.index, i64(16))
        for h in range(2):
            _tile_load(builder, 4 + h, builder.gep(ap, [builder.add(a_row(h), w)]),
                       builder.mul(dw, i64(4)))
            _tile_load(builder, 6 + h, builder.gep(bp, [builder.add(builder.mul(w, i64(32)),
                                                                     i64(16 * h))]), 128)
        for c in range(4):
            _tile_dot(builder, c, 4 + c // 2, 6 + c % 2)
    for c in range(4):  # rows 16 (c // 2) .., columns 16 (c % 2) ..
        _tile_store(builder, c, builder.gep(out, [i64(16 * 32 * (c // 2) + 16 * (c % 2))]), 128)


def _amx_pairs_product(builder, ntile, sp, src, row_at, d, pt, vt, cp, slot,
                       fresh: bool = False, configured: bool = False,
                       release: bool = True) -> None:
    """IR: ``C += X^T Y`` by AMX, summed over ``ntile`` tiles of 32 (the product of the
    forward's ``P V`` and the backward's ``dV``, ``dK``). ``C``: 32 rows of ``d`` float32
    from ``cp`` (row ``i`` at ``i d``), the accumulating tiles; ``X``: 32 x 32 bf16 a
    tile, given by pairs of its rows: word ``(16 t + p) 32 + i`` of ``sp`` holds
    elements ``(2p, i)`` and ``(2p + 1, i)`` of tile ``t``; ``Y``: 32 rows of ``d`` bf16 a
    tile, row ``j`` of tile ``t`` at word ``row_at(t, j)`` of ``src`` (``d / 2`` words).

    Per tile, ``X^T`` by rows (the left operand of ``tdpbf16ps``: ``X``'s pairs
    transposed as 16 x 16 words) goes to ``pt`` (words ``512 t ..``) and ``Y``'s rows
    interleaved by pairs (the right operand, :func:`._llvm._row_pairs`) to slot ``s`` of
    ``vt`` (words ``16 d s ..``); then tiles 0-3 accumulate ``C`` (2 halves of its rows x
    2 groups of 16 columns, straight in its rows), 4-5 hold ``X^T``, 6-7 ``Y``. ``d``: a
    multiple of 32. ``slot``: an ``i64`` pointer to ``ntile`` entries
    (:func:`._pool._ring_slots`): ``s >= 0``, tile ``t``'s pairs go to slot ``s``; ``s <
    0``, slot ``-1 - s`` holds them already. ``fresh``: ``C`` is summed from zero (its
    tiles not loaded), ``cp`` only written. ``configured``: the caller has loaded the tile
    configuration (:func:`_tiles_begin`); ``release``: the product releases the tiles."""
    i64 = ir.IntType(64)
    vty = ir.VectorType(ir.FloatType(), 16)

    def vec(ptr, off):
        return builder.bitcast(builder.gep(ptr, [off]), vty.as_pointer())

    def where(t):  # (tile t's slot, whether its pairs are still to be made)
        s = builder.load(builder.gep(slot, [t]))
        new = builder.icmp_signed(">=", s, i64(0))
        return builder.select(new, s, builder.sub(i64(-1), s)), new

    with cgutils.for_range(builder, ntile) as tl:
        t = tl.index
        for h in range(2):  # X^T's rows 16 h .. 16 h + 15: a 16 x 16 block of words
            rows = [builder.load(vec(sp, builder.add(builder.mul(builder.add(
                builder.mul(t, i64(16)), i64(p)), i64(32)), i64(16 * h))), align=4)
                for p in range(16)]
            base = builder.mul(builder.add(builder.mul(t, i64(2)), i64(h)), i64(256))
            for i, row in enumerate(_transpose_regs(builder, rows)):
                builder.store(row, vec(pt, builder.add(base, i64(16 * i))), align=4)
        s, new = where(t)
        with builder.if_then(new, likely=True):
            with cgutils.for_range(builder, builder.sdiv(d, i64(32))) as cl:
                for p in range(16):  # Y's rows 2p, 2p + 1, 32 columns from 32 cl
                    pair = _row_pairs(builder, src, row_at(t, i64(2 * p)),
                                      row_at(t, i64(2 * p + 1)), builder.mul(cl.index, i64(32)),
                                      2, vty)
                    at = builder.add(builder.mul(builder.add(builder.mul(s, i64(16)), i64(p)),
                                                 d), builder.mul(cl.index, i64(32)))
                    for h in range(2):
                        builder.store(pair[h], vec(vt, builder.add(at, i64(16 * h))), align=4)
    if not configured:
        _tiles_begin(builder)
    row_bytes = builder.mul(d, i64(4))
    with cgutils.for_range(builder, builder.sdiv(d, i64(32))) as cl:
        def c_at(c):  # tile c: rows 16 (c % 2) .., columns 32 cl + 16 (c // 2) ..
            return builder.gep(cp, [builder.add(builder.mul(i64(16 * (c % 2)), d), builder.add(
                builder.mul(cl.index, i64(32)), i64(16 * (c // 2))))])

        for c in range(4):
            if fresh:
                _tile_zero(builder, c)
            else:
                _tile_load(builder, c, c_at(c), row_bytes)
        with cgutils.for_range(builder, ntile) as tl:
            t = tl.index
            s = where(t)[0]
            for h in range(2):
                _tile_load(builder, 4 + h, builder.gep(pt, [builder.mul(builder.add(
                    builder.mul(t, i64(2)), i64(h)), i64(256))]), 64)
                col = builder.add(builder.mul(cl.index, i64(32)), i64(16 * h))
                _tile_load(builder, 6 + h, builder.gep(vt, [builder.add(builder.mul(
                    builder.mul(s, i64(16)), d), col)]), row_bytes)
            for c in range(4):
                _tile_dot(builder, c, 4 + c % 2, 6 + c // 2)
        for c in range(4):
            _tile_store(builder, c, c_at(c), row_bytes)
    if release:
        _tiles_end(builder)
