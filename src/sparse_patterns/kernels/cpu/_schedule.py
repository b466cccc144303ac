"""What the CPU kernel derives from an :class:`ExecutionPlan` alone, shared by the
forward and the backward: block steps (which blocks are runs of tokens), the
``residue(s)`` pieces, the work items and the order in which they copy rows, and the
transposed masks of 32-token tiles.

Each is computed once per plan (:meth:`ExecutionPlan.memo`): what the forward derives
from the plan alone (piece order, block steps, copy schedules, transposed masks) and
the backward's work items cost nothing on the next call with the same plan.
"""

from __future__ import annotations

import numba
import numpy as np

from ..planning import residue_perm

__all__ = [
    "_CHUNK", "_CHUNK_FUSED", "_LOCAL_ROWS", "_COPY_RUN", "_ITEM_BLOCKS", "_NO_MASKS",
    "_NO_RANGES", "_chunk_ranges",
    "_block_steps", "_residues", "_item_span", "_copy_order", "_copy_orders",
    "_forward_steps", "_masks_t", "_group_rows", "_backward_items", "_finished_blocks",
    "_share", "_state_words",
]

_CHUNK = 8  # tiles gathered per step (keys per score matrix: _CHUNK * block)
# ... in the forward's fused float32 path (32-token tiles): fewer rescales of the output
# rows per block
_CHUNK_FUSED = 24


@numba.njit(cache=True, inline="always")
def _share(ptr, it, u, parts):  # pragma: no cover - compiled
    """Where share ``u`` of ``parts`` of ``ptr[it]: ptr[it + 1]`` starts."""
    return ptr[it] + (ptr[it + 1] - ptr[it]) * u // parts


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


def _residues(plan) -> np.ndarray:
    """``s`` for each ``residue(s)`` piece whose key order is exactly the ``i mod s``
    grouping (0 for other pieces)."""
    out = np.zeros(plan.num_pieces, dtype=np.int64)
    for p, kind in enumerate(plan.piece_kind):
        if kind.startswith("residue("):
            s = int(kind[8:-1])
            if np.array_equal(plan.kperm[p], residue_perm(plan.n, s)):
                out[p] = s
    return out


# queries of a work item that copies its rows: its query, key, value and output buffers
# (4 x 128 KB at d = 64, float32) then stay in a core's L2 beside the rows being read
# (2,048 filled it). bf16 inputs (rows of half the bytes) take twice as many (see
# _forward_steps' ``rows``)
_LOCAL_ROWS = 512


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
    writes a run of ``_COPY_RUN`` consecutive rows."""
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


def _identity(plan) -> np.ndarray:
    """The identity permutation of the plan's tokens, in its orders' dtype and read-only
    as they are (once per plan): the order of a piece reordered once per call and of a
    work item's own buffers, so that every order a block reads has one array type."""
    def build():
        local = np.arange(plan.n, dtype=plan.kperm.dtype)
        local.flags.writeable = False
        return local
    return plan.memo("cpu.identity", build)


def _forward_steps(plan, seg: int, rows: int = _LOCAL_ROWS) -> list[tuple]:
    """What the forward derives from the plan alone, once per plan (see
    :meth:`ExecutionPlan.memo`): the pieces in the order they run, each as
    ``(p, first, last, span, items, reorder, kstart, kstep, kperm_used, copies)``.

    Pieces whose query blocks are not runs of tokens run first: they then only write
    the state of their rows, which the pieces in natural order read back
    sequentially. Key rows are used in place where a piece's key blocks are runs of
    consecutive tokens; otherwise each work item (about ``rows`` queries, so
    that its copies read runs of rows: 4 rows per run for a stride-128 head's order at
    512)
    copies the rows it needs (``span`` > 0: the key blocks one item spans) or, if
    that would copy much more than it uses, ``reorder`` says how the used key blocks
    are put in the piece's order once per call: ``(s, rows)``, ``s`` > 0 for a
    ``residue(s)`` order, else ``kperm`` row by row. ``pair``: the piece runs together
    with the next one, block by block (:func:`._forward._forward_pair`)."""
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
            items = max(seg, -(-rows // block))
            span = _item_span(tile_ptr[p * nb: (p + 1) * nb + 1], tile_col, items)
            # a work item would copy more keys than it reuses, or the items together many
            # times the keys that one reordering per call puts in place (summary keys
            # that every item sees: fixed's items would copy its key rows 8 times over)
            if span > 2 * items or -(-nb // items) * span > 2 * used:
                span, items = 0, seg
                reorder = (int(residue[p]), min(n, used * block))
                kt = np.arange(nb, dtype=np.int64) * block
                ks = np.ones(nb, dtype=np.int64)
                kperm_used = _identity(plan)
        copies = (_copy_orders(plan, p, items, kperm_used, int(residue[p])) if span > 0
                  else _NO_COPIES)
        steps.append([p, p == same[0], p == same[-1], span, items, reorder,
                      np.ascontiguousarray(kt), np.ascontiguousarray(ks), kperm_used, copies,
                      False])
    # two consecutive pieces of a group with one query order that copy nothing (at most one
    # of them reordered: they share the reorder buffer) run block by block as a pair
    x = 0
    while x + 1 < len(steps):
        a, b = steps[x], steps[x + 1]
        if (a[3] == 0 and b[3] == 0 and a[4] == b[4] and not a[2] and groups[a[0]] == groups[b[0]]
                and (a[5] is None or b[5] is None)
                and np.array_equal(plan.qperm[a[0]], plan.qperm[b[0]])):
            a[10] = True
            x += 1
        x += 1
    return [tuple(st) for st in steps]


_NO_MASKS = np.zeros(0, np.uint32)


def _state_words(steps: list, groups: list[int]) -> list[int]:
    """Where the bf16 forward hands a softmax group's state over as bf16 words: per step of
    :func:`_forward_steps`, 1 for a copied piece (``span > 0``) that does not end its
    group and is followed, in its group, by the last piece, which runs alone and in place
    (``span == 0``, no pair); 2 for that last piece; else 0. Between those two pieces the
    state's output rows go through memory, a whole call apart (see
    :func:`._forward._forward_piece`); a pair passes its state in the cache, and other
    orders keep float32."""
    sw = [0] * len(steps)
    for x, a in enumerate(steps):
        y = next((y for y in range(x + 1, len(steps)) if groups[steps[y][0]] == groups[a[0]]),
                 None)
        if (y is not None and a[3] > 0 and not a[2] and steps[y][2] and steps[y][3] == 0
                and not steps[y][10] and not steps[y - 1][10]):
            sw[x], sw[y] = 1, 2
    return sw


def _masks_t(plan) -> np.ndarray:
    """``uint32 (M * 32 + 32,)``: the partial-tile masks of a 32-token plan transposed,
    the query bits of key ``c`` of mask ``m`` in word ``m * 32 + c`` (what
    :func:`_scores32` selects with), then 32 all-ones words."""
    bits = np.unpackbits(plan.masks.view(np.uint8), axis=-1, bitorder="little")[..., :32]
    words = np.packbits(bits.transpose(0, 2, 1), axis=-1, bitorder="little")  # (M, key, 4)
    words = np.ascontiguousarray(words).view("<u4").reshape(-1).astype(np.uint32)
    # _scores32 reads 32 words (then ignores them) for a full tile: never an empty array
    return np.concatenate([words, np.full(32, 0xFFFFFFFF, np.uint32)])


def _group_rows(maskt: np.ndarray) -> np.ndarray:
    """``int64 (M + 1, 8, 2)`` flattened, from :func:`_masks_t`'s words: for mask ``m``
    and query group ``g`` (queries ``4g .. 4g+3`` of a 32-token tile), the first key
    that any of them sees and one past the last (``32, 0`` if none sees one); the
    last entry is the full tile, ``0, 32`` for every group (what
    :func:`._llvm_fwd._pv32_dense` is told to skip)."""
    words = maskt.reshape(-1, 32).astype(np.int64)  # (M + 1, key): query bits
    groups = (words[:, None, :] >> (4 * np.arange(8))[None, :, None]) & 0xF  # (M+1, 8, key)
    seen = groups != 0
    first = np.where(seen.any(-1), seen.argmax(-1), 32)
    last = np.where(seen.any(-1), 32 - seen[..., ::-1].argmax(-1), 0)
    return np.ascontiguousarray(np.stack([first, last], axis=-1).reshape(-1), dtype=np.int64)


@numba.njit(cache=True)
def _ranges_of(tile_ptr, tile_mask, grows, nblocks, chunk):  # pragma: no cover - compiled
    """:func:`_chunk_ranges`' arrays for the ``nblocks`` (piece, block) pairs of
    ``tile_ptr``."""
    full = grows.size // 16 - 1
    cptr = np.zeros(nblocks + 1, np.int64)
    for b in range(nblocks):
        cptr[b + 1] = cptr[b] + (tile_ptr[b + 1] - tile_ptr[b] + chunk - 1) // chunk
    ranges = np.zeros(cptr[nblocks] * 16, np.int16)
    for b in range(nblocks):
        t0, t1 = tile_ptr[b], tile_ptr[b + 1]
        row = cptr[b] * 16
        for c0 in range(t0, t1, chunk):
            c1 = min(t1, c0 + chunk)
            for g in range(8):
                for t in range(c0, c1):
                    mi = tile_mask[t] if tile_mask[t] >= 0 else full
                    if grows[mi * 16 + 2 * g] < 32:
                        ranges[row + g] = (t - c0) * 32 + grows[mi * 16 + 2 * g]
                        break
                for t in range(c1 - 1, c0 - 1, -1):
                    mi = tile_mask[t] if tile_mask[t] >= 0 else full
                    if grows[mi * 16 + 2 * g + 1] > 0:
                        ranges[row + 8 + g] = (t - c0) * 32 + grows[mi * 16 + 2 * g + 1]
                        break
            row += 16
    return cptr, ranges


def _chunk_ranges(plan, grows: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """The key rows each query group sees in each chunk of ``chunk`` tiles that the
    forward's blocks run (what :func:`._llvm_fwd._pv32_dense` multiplies over), once per
    plan instead of once per chunk of every call: ``(cptr, ranges)``, the chunks of
    block ``I`` of piece ``p`` being rows ``cptr[p * nb + I]`` on of ``ranges``
    (``int16``, 16 a row: ``lo`` of the 8 groups of 4 queries, then ``hi``; key rows
    ``lo .. hi`` of the chunk, from :func:`_group_rows` of the masks of its first and
    last tile that hold any of the group's queries; 0, 0 if none)."""
    nblocks = plan.tile_ptr.size - 1
    return _ranges_of(plan.tile_ptr.astype(np.int64), plan.tile_mask, grows, nblocks, chunk)


_NO_RANGES = (np.zeros(1, np.int64), np.zeros(16, np.int16))


_ITEM_BLOCKS = 64  # blocks per backward work item (2,048 rows of 32 tokens)


def _backward_order(plan) -> np.ndarray:
    """``int64 (P,)``: the order in which the backward runs the pieces: those it runs
    in work items (``residue(s)`` pieces, :func:`_backward_items`) first, then the
    others, each kind in plan order.

    A piece's first write of a ``dk``, ``dv`` (and ``dq``) row is a store, a later one
    reads the row and adds to it. A residue piece's rows are 32 KB apart (d = 64,
    stride 128): read in that order, the hardware prefetcher does not follow them; the
    window piece's come in token order. So the residue piece stores and the window
    piece adds. Fixed's keys piece (summary columns, no work items) stays where it is:
    run first it gained nothing.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> _backward_order(sps.plan(sps.make("strided", 2048, stride=64), mode="merged",
    ...                          block=32)).tolist()
    [1, 0]
    """
    item_ptr = plan.memo("cpu.backward_items", lambda: _backward_items(plan))[0]
    has_items = np.diff(item_ptr) > 0
    return np.array(sorted(range(plan.num_pieces), key=lambda p: not has_items[p]), np.int64)


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


@numba.njit(cache=True)
def _finished_blocks(col_ptr, col_tile, tile_row, p, nb, J, I1):  # pragma: no cover - compiled
    """The first key block from ``J`` on of piece ``p`` (``nb`` blocks) with a tile in a
    query block ``>= I1``, or ``nb``: once the query blocks below ``I1`` are done, the
    key blocks before it get no more tiles (a column's tiles are sorted by query block)."""
    while J < nb and (col_ptr[p * nb + J + 1] == col_ptr[p * nb + J] or
                      tile_row[col_tile[col_ptr[p * nb + J + 1] - 1]] < I1):
        J += 1
    return J
