"""Row passes of the CPU kernel: rows put in a piece's order (:func:`_permute_rows`,
:func:`_permute_residue`, in parallel) for a piece whose key blocks are reordered once
per call; the backward's row sums ``delta`` of one head (:func:`_delta_rows`,
:func:`_delta_bf16`), its statistics in base-2 units (:func:`_stats32`) and its
gradient rows rounded to bf16 (:func:`_narrow_rows`). bf16 rows are paired in
registers by the products (:func:`._llvm._row_pairs`), not in a pass here.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ._convert import _narrow16
from ._llvm import _FM, _LOG2E, _copy, _dot_bf16, _wide, _zero

__all__ = ["_permute_rows", "_permute_residue", "_delta_rows",
           "_delta_bf16", "_narrow_rows", "_stats32"]


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


@numba.njit(cache=True, fastmath=_FM)
def _delta_rows(do2, o2, base, n, out, precise):  # pragma: no cover - compiled
    """``out[i] = sum_c do2[base + i, c] o2[base + i, c]`` (``delta``), ``i < n``: float32
    rows of a multiple of 16 summed in 16 lanes (a float reduction is not vectorized
    without reassociation), others in float64 term by term."""
    _wide()
    d = do2.shape[1]
    if precise or d % 16 != 0:
        for i in range(n):
            acc = 0.0
            for c in range(d):
                acc += do2[base + i, c] * o2[base + i, c]
            out[i] = acc
        return
    lanes = np.empty(16, np.float32)
    for i in range(n):
        a, b = do2[base + i], o2[base + i]  # row views: vectorized
        for e in range(16):
            lanes[e] = a[e] * b[e]
        for c0 in range(16, d, 16):
            for e in range(16):
                lanes[e] += a[c0 + e] * b[c0 + e]
        acc = np.float32(0.0)
        for e in range(16):
            acc += lanes[e]
        out[i] = acc


@numba.njit(cache=True, fastmath=_FM)
def _delta_bf16(do, o, n, dw, out):  # pragma: no cover - compiled
    """One head's ``delta`` from bf16 rows: ``out[i] = sum_c dO[i, c] O[i, c]``
    (:func:`._llvm._dot_bf16`, the halves widened in registers), flat float32 arrays of
    bf16 pairs, ``n`` rows of ``dw`` words (a multiple of 16) from word 0, widened in
    registers rather than 64 rows at a time into float32 buffers."""
    for i in range(n):
        out[i] = _dot_bf16(do, i * dw, o, i * dw, dw)


@numba.njit(cache=True, fastmath=_FM)
def _narrow_rows(perm, x0, x1, new, done, d, bf, w0, a, a16, b, b16):  # pragma: no cover - compiled
    """Rows ``perm[x]``, ``x0 <= x < x1``, of the flat float32 gradient rows ``a`` (and
    ``b`` unless empty) rounded to bf16 (``bf``) or IEEE-half words into ``a16``
    (``b16``) from word ``w0`` on (row ``i`` at ``w0 + i d``), each row once: ``done``
    is set for it, a row already done is skipped. A row whose flag ``new`` is still set
    (no tile wrote it: a key or query that no tile reaches) is zeroed first and its
    flag cleared. ``d`` elements a row; runs of consecutive rows are rounded in one pass."""
    a16, b16 = a16[w0:], b16[w0:]
    x = x0
    while x < x1:
        if done[perm[x]]:
            x += 1
            continue
        e = x + 1  # rows perm[x] .. perm[e - 1]: consecutive, none done
        while e < x1 and perm[e] == perm[e - 1] + 1 and not done[perm[e]]:
            e += 1
        for y in range(x, e):
            i = perm[y]
            done[i] = 1
            if new[i]:
                new[i] = 0
                _zero(a, i * d, d)
                if b.size > 0:
                    _zero(b, i * d, d)
        _narrow16(a, a16, perm[x] * d, (e - x) * d, bf)
        if b.size > 0:
            _narrow16(b, b16, perm[x] * d, (e - x) * d, bf)
        x = e


@numba.njit(cache=True, fastmath=_FM)
def _stats32(l1, base, i0, i1, l2, ok):  # pragma: no cover - compiled
    """For ``i0 <= i < i1``: ``l2[i] = l1[base + i] log2 e`` and ``ok[i]`` all ones, or
    ``0`` and ``0`` where ``l1[base + i]`` is ``-inf`` (a row without keys)."""
    _wide()
    if l2.size == 0:
        return
    ninf = -np.inf
    for i in range(i0, i1):
        x = l1[base + i]
        l2[i] = x * _LOG2E if x != ninf else 0.0
        ok[i] = np.uint32(0xFFFFFFFF) if x != ninf else np.uint32(0)
