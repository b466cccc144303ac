"""Word-level bitset helpers for the numba verification kernels.

A bitset of ``n`` positions is a ``uint64`` array of ``ceil(n / 64)`` words;
bit ``j`` lives in word ``j >> 6`` at position ``j & 63``. The helpers OR a run
of consecutive positions into a bitset with whole-word fills and return how many
bits were newly set, so callers keep exact set sizes without recounting.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["popcount", "ctz", "or_run", "or_run_extract", "set_bit", "first_zero"]

_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


def _uint64_op(name: str, doc: str, emit):
    """An intrinsic ``int64 name(uint64)`` whose LLVM value ``emit(builder, x)`` builds."""

    def typer(typingctx, x):  # noqa: ARG001
        if x != types.uint64:
            return None

        def codegen(context, builder, signature, args):  # noqa: ARG001
            return emit(builder, args[0])  # an i64, as the signature says

        return types.int64(types.uint64), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


popcount = _uint64_op("popcount", "Number of set bits of a uint64 (LLVM ``ctpop``).",
                      lambda builder, x: builder.ctpop(x))
ctz = _uint64_op("ctz", "Index of the lowest set bit of a non-zero uint64 (LLVM ``cttz``).",
                 lambda builder, x: builder.cttz(x, ir.Constant(ir.IntType(1), 0)))


@njit(cache=True, inline="always")
def set_bit(bits, j):
    """Set bit ``j``; return 1 if it was clear, else 0."""
    w = j >> 6
    m = _ONE << np.uint64(j & 63)
    old = bits[w]
    if old & m:
        return 0
    bits[w] = old | m
    return 1


@njit(cache=True)
def or_run(bits, s, length):
    """Set bits ``[s, s + length)`` (``length >= 1``); return the number newly set."""
    e = s + length - 1
    w0 = s >> 6
    w1 = e >> 6
    lo = np.uint64(s & 63)
    hi = np.uint64(63 - (e & 63))
    if w0 == w1:
        m = ((_ALL >> hi) >> lo) << lo
        old = bits[w0]
        bits[w0] = old | m
        return popcount(m & ~old)
    m = (_ALL >> lo) << lo
    old = bits[w0]
    bits[w0] = old | m
    new = popcount(m & ~old)
    for w in range(w0 + 1, w1):
        old = bits[w]
        if old != _ALL:
            new += 64 - popcount(old)
            bits[w] = _ALL
    m = _ALL >> hi
    old = bits[w1]
    bits[w1] = old | m
    new += popcount(m & ~old)
    return new


@njit(cache=True)
def or_run_extract(bits, s, length, out, m):
    """Set bits ``[s, s + length)`` and append the newly set positions to ``out[m:]``.

    Returns the new length ``m`` of ``out``.
    """
    e = s + length - 1
    w0 = s >> 6
    w1 = e >> 6
    lo = np.uint64(s & 63)
    hi = np.uint64(63 - (e & 63))
    for w in range(w0, w1 + 1):
        mask = _ALL
        if w == w0:
            mask = (mask >> lo) << lo
        if w == w1:
            mask = mask & (_ALL >> hi)
        old = bits[w]
        fresh = mask & ~old
        if fresh:
            bits[w] = old | mask
            base = w << 6
            while fresh:
                out[m] = base + ctz(fresh)
                m += 1
                fresh &= fresh - _ONE
    return m


@njit(cache=True)
def first_zero(bits, limit):
    """Smallest ``j < limit`` whose bit is clear, or ``-1``."""
    nw = (limit + 63) >> 6
    for w in range(nw):
        x = ~bits[w]
        if x:
            j = (w << 6) + ctz(x)
            return j if j < limit else -1
    return -1
