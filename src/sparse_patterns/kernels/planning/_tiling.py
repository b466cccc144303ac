"""The plan's compiled loops: stride gcds, a piece's rows, tile counts and partial-tile masks.

Private to :mod:`sparse_patterns.kernels.planning`; numba functions that take
only arrays and scalars, release the GIL, and work on one chunk of query rows
at a time, so that a plan never holds more than a chunk of the pattern.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["gcd_of_offsets", "used_first", "piece_rows", "chunk_tiles"]


@numba.njit(cache=True, nogil=True)
def used_first(indices, n, out):  # pragma: no cover - compiled
    """The keys among ``0 .. n-1`` that ``indices`` holds, in increasing order, then the
    others, written into ``out`` (a permutation); returns how many are held. (A loop:
    NumPy's ``used[indices] = True`` with ``flatnonzero`` took 7.5 ms of a fixed plan's
    20 ms order choice at n = 16,384.)"""
    used = np.zeros(n, np.uint8)
    for e in range(indices.size):
        used[indices[e]] = 1
    u = 0
    for j in range(n):
        u += used[j]
    a, b = 0, u
    for j in range(n):
        if used[j]:
            out[a] = j
            a += 1
        else:
            out[b] = j
            b += 1
    return u


@numba.njit(cache=True, nogil=True)
def gcd_of_offsets(indptr, indices, rows):  # pragma: no cover - compiled
    """gcd of ``|i - j|`` over entries with ``i != j``, row ``r`` being token ``rows[r]`` (0: none)."""
    g = 0
    for r in range(indptr.size - 1):
        i = rows[r]
        for e in range(indptr[r], indptr[r + 1]):
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


@numba.njit(cache=True, nogil=True, inline="always")
def _lower(a, lo, hi, x):  # pragma: no cover - compiled
    """First position in ``a[lo:hi]`` (sorted) holding a value ``>= x`` (``hi``: none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True, inline="always")
def _held_before(starts, ends, idxs, h, r, flag, stamp):  # pragma: no cover - compiled
    """Flag (``flag[e - lo] = stamp``) the entries of head ``h``'s row ``r`` that an
    earlier head holds; return the entry range ``[fmin, fmax)`` holding the flags
    (``fmin = fmax = hi``: none). Only the entries between the first and last
    column of each earlier row are searched, a binary search each."""
    ind = idxs[h]
    lo_e, hi_e = starts[h][r], ends[h][r]
    fmin, fmax = hi_e, lo_e
    for h2 in range(h):
        cat = idxs[h2]
        a2, b2 = starts[h2][r], ends[h2][r]
        if a2 == b2:
            continue
        s0 = _lower(ind, lo_e, hi_e, cat[a2])
        s1 = _lower(ind, s0, hi_e, cat[b2 - 1] + 1)
        p = a2
        for e in range(s0, s1):
            p = _lower(cat, p, b2, ind[e])
            if p < b2 and cat[p] == ind[e]:
                flag[e - lo_e] = stamp
                fmin = min(fmin, e)
                fmax = max(fmax, e + 1)
    if fmin >= fmax:
        return hi_e, hi_e
    return fmin, fmax


@numba.njit(cache=True, nogil=True)
def piece_rows(starts, ends, idxs, member):  # pragma: no cover - compiled
    """Rows of a merged piece: entries of the member heads that no earlier head holds.

    ``starts``, ``ends`` and ``idxs`` are tuples of the heads' row bounds (int64) and
    ``indices`` (sorted columns), one row per query. An entry ``j`` of a member
    head ``h`` belongs to the piece when no head ``h2 < h`` holds ``j`` in that
    row, so the pieces of one merged softmax are disjoint and cover the union.
    Only the entries of ``h`` between the first and last column of ``h2``'s row
    are searched (a binary search each), so a head that lies beside an earlier
    one (a stride head beside its window, summaries beside their block) costs
    one copy per entry. Rows come out sorted: several members' rows are placed
    in order when their column ranges do not interleave, else merged.
    """
    H = len(starts)
    R = starts[0].size
    widest = 0
    total = 0
    for r in range(R):
        w = 0
        for h in range(H):
            if member[h]:
                w += ends[h][r] - starts[h][r]
        widest = max(widest, w)
        total += w
    out_ptr = np.zeros(R + 1, np.int64)
    out = np.empty(total, idxs[0].dtype)
    tmp = np.empty(widest, idxs[0].dtype)
    flag = np.zeros(widest, np.int64)
    seg = np.empty(H + 1, np.int64)
    order = np.empty(H, np.int64)
    stamp = 0
    k = 0
    for r in range(R):
        ns = 0
        tk = 0
        for h in range(H):
            if not member[h]:
                continue
            stamp += 1
            ind = idxs[h]
            lo_e, hi_e = starts[h][r], ends[h][r]
            fmin, fmax = _held_before(starts, ends, idxs, h, r, flag, stamp)
            seg[ns] = tk
            for e in range(lo_e, hi_e):
                if e < fmin or e >= fmax or flag[e - lo_e] != stamp:
                    tmp[tk] = ind[e]
                    tk += 1
            if seg[ns] < tk:
                ns += 1
        seg[ns] = tk
        # place the segments (each sorted, disjoint) in column order
        for u in range(ns):
            order[u] = u
        for u in range(1, ns):  # insertion sort of the few segments by first column
            v = order[u]
            w = u - 1
            while w >= 0 and tmp[seg[order[w]]] > tmp[seg[v]]:
                order[w + 1] = order[w]
                w -= 1
            order[w + 1] = v
        apart = True
        for u in range(1, ns):
            if tmp[seg[order[u - 1] + 1] - 1] > tmp[seg[order[u]]]:
                apart = False
        if apart:
            for u in range(ns):
                a, b = seg[order[u]], seg[order[u] + 1]
                out[k : k + b - a] = tmp[a:b]
                k += b - a
        else:
            # interleaved columns: merge the segments into out, one column at a time
            cur = seg[:ns].copy()
            for _ in range(tk):
                best = -1
                for u in range(ns):
                    if cur[u] < seg[u + 1] and (best < 0 or tmp[cur[u]] < tmp[cur[best]]):
                        best = u
                out[k] = tmp[cur[best]]
                cur[best] += 1
                k += 1
        out_ptr[r + 1] = k
    return out_ptr, out[:k]


@numba.njit(cache=True, nogil=True, inline="always")
def _run(indices, e, end, kpos, kperm, step, block, shift):  # pragma: no cover - compiled
    """``(kp, J, e2)``: the entries ``e .. e2-1`` hold consecutive key positions
    ``kp, kp + 1, ...`` inside key block ``J`` (one gather per run with a ``step``;
    without one, as where summary keys are put first and a row's entries lie at
    consecutive positions with no fixed step between their columns, the entries are
    compared with the tokens at the next positions, ``kperm`` (the inverse of
    ``kpos``), all up to the block's end at once, then one by one where they differ:
    contiguous loads, no gather per entry)."""
    j = indices[e]
    kp = kpos[j]
    J = (kp >> shift) if shift >= 0 else kp // block
    lim = min(end, e + (J + 1) * block - kp)  # the run cannot leave block J
    if step <= 0:
        lim = min(lim, e + kperm.size - kp)
        a, b = indices[e + 1: lim], kperm[kp + 1: kp + lim - e]  # views: the loop vectorizes
        diff = a.dtype.type(0)
        for t in range(a.size):  # the whole span at once, no early exit (3x faster)
            diff |= a[t] ^ b[t]
        if diff == 0:
            return kp, J, lim
        e2 = e + 1
        while e2 < lim and indices[e2] == kperm[kp + (e2 - e)]:
            e2 += 1
        return kp, J, e2
    if step == 1 and indices[lim - 1] - j == lim - 1 - e:
        return kp, J, lim  # sorted unique columns: a span equal to the count is a run
    e2 = e + 1
    while e2 < lim and indices[e2] - indices[e2 - 1] == step:
        e2 += 1
    return kp, J, e2


@numba.njit(cache=True, nogil=True)
def chunk_tiles(starts, ends, idxs, member, exclusive, kpos, kperm, step, block, n, rows_in, fill):  # pragma: no cover - compiled
    """Tiles of consecutive query blocks of a piece, in the piece's order.

    Row ``r`` of head ``h`` is ``idxs[h][starts[h][r]:ends[h][r]]`` (sorted
    columns; tuples of int64 row bounds and of index arrays, one row per query
    in the piece's order: a CSR's ``indptr[:-1]``, ``indptr[1:]`` and
    ``indices``, or the shared slices of :meth:`Pattern.spans_of`); the piece takes the entries of the heads in ``member``, and, when
    ``exclusive``, only those no earlier head holds in that row (so the pieces
    of a merged softmax are disjoint), without building the piece's rows.
    Query block ``q`` is the rows ``q * block .. q * block + rows_in[q] - 1``;
    a key ``j`` lies in key block ``kpos[j] // block`` (``kperm``: the inverse
    permutation, the token at each key position). ``step > 0`` promises
    ``kpos[j + step] = kpos[j] + 1`` (1 for the identity, ``s`` for residue
    classes mod ``s``), so a run of entries ``step`` apart is counted at once,
    and the partial tiles' masks are filled from the runs, not the entries.
    Returns ``(tiles per query block, key block of each tile, mask slot of each
    tile or -1 for a full one, masks, computed pairs, useful pairs)``; the
    masks (``uint64 (M, block, ceil(block / 64))``) are filled only when
    ``fill``. Tiles come by query block, then by key block.
    """
    nb = (n + block - 1) // block
    H = len(starts)
    shift = -1
    if block & (block - 1) == 0:
        shift = 0
        while (1 << shift) < block:
            shift += 1
    nq = rows_in.size
    R = starts[0].size
    widest = 1
    for h in range(H):
        for r in range(R):
            widest = max(widest, ends[h][r] - starts[h][r])
    flag = np.zeros(widest, np.int64)
    stamp = 0
    W = (block + 63) // 64
    counts = np.zeros(nb, np.int64)
    slot = np.full(nb, -1, np.int64)
    touched = np.empty(nb, np.int64)
    qcount = np.zeros(nq, np.int64)
    cap_t = 1024
    tj = np.empty(cap_t, np.int32)
    tm = np.empty(cap_t, np.int64)
    cap_m = 64 if fill else 1
    masks = np.zeros((cap_m, block, W), np.uint64)
    run_r = np.empty(1024, np.int64)  # the runs of the current query block, for its masks
    run_c = np.empty(1024, np.int64)
    run_n = np.empty(1024, np.int64)
    nt = 0
    nm = 0
    computed = 0
    pairs = 0
    r0 = 0
    for q in range(nq):
        r1 = r0 + rows_in[q]
        m = 0
        nr = 0
        if fill:  # room for every run of the block (at most one per entry), grown here, not in the loop
            need = 0
            for h in range(H):
                if member[h]:
                    for r in range(r0, r1):
                        need += ends[h][r] - starts[h][r]
            if need > run_r.size:
                run_r = np.empty(need, np.int64)
                run_c = np.empty(need, np.int64)
                run_n = np.empty(need, np.int64)
        for r in range(r0, r1):
            for h in range(H):
                if not member[h]:
                    continue
                ind = idxs[h]
                lo_e, hi_e = starts[h][r], ends[h][r]
                fmin, fmax = hi_e, hi_e
                if exclusive and h > 0:
                    stamp += 1
                    fmin, fmax = _held_before(starts, ends, idxs, h, r, flag, stamp)
                e = lo_e
                while e < hi_e:
                    if e < fmin:
                        end = fmin
                    elif e < fmax:  # between flagged entries: the span up to the next flag
                        if flag[e - lo_e] == stamp:
                            e += 1
                            continue
                        end = e + 1
                        while end < fmax and flag[end - lo_e] != stamp:
                            end += 1
                    else:
                        end = hi_e
                    while e < end:
                        if step <= 0:  # a constant step to the compiler: _run's check vectorizes (2.8x)
                            kp, J, e2 = _run(ind, e, end, kpos, kperm, 0, block, shift)
                        else:
                            kp, J, e2 = _run(ind, e, end, kpos, kperm, step, block, shift)
                        if counts[J] == 0:
                            touched[m] = J
                            m += 1
                        counts[J] += e2 - e
                        pairs += e2 - e
                        if fill:
                            run_r[nr] = r - r0
                            run_c[nr] = kp
                            run_n[nr] = e2 - e
                            nr += 1
                        e = e2
        touched[:m].sort()
        first = nm
        for t in range(m):
            J = touched[t]
            area = rows_in[q] * min(block, n - J * block)
            computed += area
            if nt == cap_t:
                cap_t *= 2
                tj2 = np.empty(cap_t, np.int32)
                tm2 = np.empty(cap_t, np.int64)
                tj2[:nt] = tj[:nt]
                tm2[:nt] = tm[:nt]
                tj, tm = tj2, tm2
            tj[nt] = J
            tm[nt] = -1
            if counts[J] < area:
                if fill:
                    if nm == cap_m:
                        cap_m *= 2
                        m2 = np.zeros((cap_m, block, W), np.uint64)
                        m2[:nm] = masks[:nm]
                        masks = m2
                    slot[J] = nm
                tm[nt] = nm
                nm += 1
            nt += 1
            counts[J] = 0
        qcount[q] = m
        if fill and nm > first:
            for u in range(nr):
                kp = run_c[u]
                J = (kp >> shift) if shift >= 0 else kp // block
                s = slot[J]
                if s >= 0:
                    rr = run_r[u]
                    for c in range(kp - J * block, kp - J * block + run_n[u]):
                        masks[s, rr, c >> 6] |= np.uint64(1) << np.uint64(c & 63)
            for t in range(m):
                slot[touched[t]] = -1
        r0 = r1
    return qcount, tj[:nt].copy(), tm[:nt].copy(), masks[: nm if fill else 0].copy(), computed, pairs
