"""Whole-array row moves of the CPU kernel, in parallel: rows put in a piece's order
(:func:`_permute_rows`, :func:`_permute_residue`) for a piece whose key blocks are
reordered once per call, and bf16 rows interleaved by pairs (:func:`_permute_rows_paired`,
:func:`paired`) for the bf16 products of :mod:`._llvm_fwd` and :mod:`._llvm_bwd`.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ._llvm import _copy, _pair_rows, _wide
from ._pool import _buffer

__all__ = ["_permute_rows", "_permute_rows_paired", "_permute_residue", "paired"]


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
def _permute_rows_paired(x1, perm, p, BH, rows, dw, out1):  # pragma: no cover - compiled
    """:func:`_permute_rows` of bf16 rows (``dw`` words each) straight into the layout
    in which the bf16 passes read them: positions ``2y, 2y + 1`` interleaved by
    :func:`._llvm._pair_rows` (``rows`` even)."""
    n = perm.shape[1]
    R = 256  # row pairs per work item
    per = (rows // 2 + R - 1) // R
    for u in prange(BH * per):
        at = (u // per) * n
        for y in range((u % per) * R, min(rows // 2, (u % per + 1) * R)):
            _pair_rows(out1, (at + 2 * y) * dw, x1, (at + perm[p, 2 * y]) * dw,
                       (at + perm[p, 2 * y + 1]) * dw, dw)


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


def paired(x1: np.ndarray, BH: int, n: int, dw: int) -> np.ndarray:
    """A recycled array holding the ``BH`` heads of ``n`` rows of ``x1`` (``dw`` words of
    bf16 pairs a row, ``n`` even) interleaved by pairs of rows: :func:`_permute_rows_paired`
    in the tokens' own order, the layout in which the bf16 passes read values (forward)
    and ``q``, ``dO`` (backward).

    Examples
    --------
    >>> w = np.arange(2 * 32, dtype=np.uint16).view(np.float32)  # 2 rows of 32 bf16
    >>> paired(w, 1, 2, 16).view(np.uint16)[:4].tolist()  # row 0, row 1, row 0, row 1
    [0, 32, 1, 33]
    """
    out = _buffer(x1.shape, x1.dtype)
    _permute_rows_paired(x1.reshape(-1), np.arange(n, dtype=np.int64).reshape(1, n), 0, BH, n,
                         dw, out.reshape(-1))
    return out
