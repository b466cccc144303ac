"""The plan's compiled loops: stride gcds, tile counts, partial-tile masks, CSR set operations.

Private to :mod:`sparse_patterns.kernels.planning`; numba functions that take
only arrays and scalars.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["gcd_of_offsets", "count_tiles", "fill_masks", "csr_difference", "csr_union"]


@numba.njit(cache=True)
def gcd_of_offsets(indptr, indices):  # pragma: no cover - compiled
    """gcd of ``|i - j|`` over entries with ``i != j`` (0 when there are none)."""
    g = 0
    n = indptr.size - 1
    for i in range(n):
        for e in range(indptr[i], indptr[i + 1]):
            d = i - indices[e]
            if d < 0:
                d = -d
            if d == 0:
                continue
            a, b = g, d
            while b != 0:
                a, b = b, a % b
            g = a
            if g == 1:
                return 1
    return g


@numba.njit(cache=True)
def count_tiles(indptr, indices, qperm, kpos, block, n):  # pragma: no cover - compiled
    """Tiles touched by a piece in permuted order: (I, J, entries) per tile, by I then J."""
    nb = (n + block - 1) // block
    counts = np.zeros(nb, np.int64)
    touched = np.empty(nb, np.int64)
    cap = 1024
    ti = np.empty(cap, np.int64)
    tj = np.empty(cap, np.int64)
    tc = np.empty(cap, np.int64)
    nt = 0
    for I in range(nb):
        m = 0
        for pos in range(I * block, min(n, (I + 1) * block)):
            i = qperm[pos]
            for e in range(indptr[i], indptr[i + 1]):
                J = kpos[indices[e]] // block
                if counts[J] == 0:
                    touched[m] = J
                    m += 1
                counts[J] += 1
        touched[:m].sort()
        for t in range(m):
            J = touched[t]
            if nt == cap:
                cap *= 2
                ti2 = np.empty(cap, np.int64)
                tj2 = np.empty(cap, np.int64)
                tc2 = np.empty(cap, np.int64)
                ti2[:nt] = ti[:nt]
                tj2[:nt] = tj[:nt]
                tc2[:nt] = tc[:nt]
                ti, tj, tc = ti2, tj2, tc2
            ti[nt] = I
            tj[nt] = J
            tc[nt] = counts[J]
            nt += 1
            counts[J] = 0
    return ti[:nt].copy(), tj[:nt].copy(), tc[:nt].copy()


@numba.njit(cache=True)
def fill_masks(indptr, indices, qperm, kpos, block, n, tile_ptr, tile_col, tile_mask, masks):  # pragma: no cover - compiled
    """Set the bit of every entry of the piece in its partial tile's mask."""
    nb = (n + block - 1) // block
    slot = np.full(nb, -1, np.int64)
    for I in range(nb):
        for t in range(tile_ptr[I], tile_ptr[I + 1]):
            slot[tile_col[t]] = tile_mask[t]
        for pos in range(I * block, min(n, (I + 1) * block)):
            r = pos - I * block
            i = qperm[pos]
            for e in range(indptr[i], indptr[i + 1]):
                kp = kpos[indices[e]]
                mi = slot[kp // block]
                if mi >= 0:
                    c = kp % block
                    masks[mi, r, c >> 6] |= np.uint64(1) << np.uint64(c & 63)
        for t in range(tile_ptr[I], tile_ptr[I + 1]):
            slot[tile_col[t]] = -1


@numba.njit(cache=True)
def csr_difference(ap, ai, bp, bi):  # pragma: no cover - compiled
    """Row-wise ``A \\ B`` of two canonical CSR matrices (sorted indices)."""
    n = ap.size - 1
    outp = np.zeros(n + 1, np.int64)
    out = np.empty(ai.size, np.int64)
    k = 0
    for i in range(n):
        e, f = ap[i], bp[i]
        fe = bp[i + 1]
        for e in range(ap[i], ap[i + 1]):
            j = ai[e]
            while f < fe and bi[f] < j:
                f += 1
            if f < fe and bi[f] == j:
                continue
            out[k] = j
            k += 1
        outp[i + 1] = k
    return outp, out[:k].copy()


@numba.njit(cache=True)
def csr_union(ap, ai, bp, bi):  # pragma: no cover - compiled
    """Row-wise ``A | B`` of two canonical CSR matrices (sorted indices)."""
    n = ap.size - 1
    outp = np.zeros(n + 1, np.int64)
    out = np.empty(ai.size + bi.size, np.int64)
    k = 0
    for i in range(n):
        e, ee = ap[i], ap[i + 1]
        f, fe = bp[i], bp[i + 1]
        while e < ee or f < fe:
            if f >= fe or (e < ee and ai[e] < bi[f]):
                out[k] = ai[e]
                e += 1
            elif e >= ee or bi[f] < ai[e]:
                out[k] = bi[f]
                f += 1
            else:
                out[k] = ai[e]
                e += 1
                f += 1
            k += 1
        outp[i + 1] = k
    return outp, out[:k].copy()
