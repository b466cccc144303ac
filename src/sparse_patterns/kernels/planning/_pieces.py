"""The pieces of an execution plan: which heads each takes, its order, its streamed tiles.

Private to :mod:`sparse_patterns.kernels.planning`. A piece's order (identity,
residue classes, used keys first) is chosen on sampled query blocks; its tiles
are then counted, and its partial tiles' masks filled, chunk by chunk of query
blocks in that order, read through :meth:`~sparse_patterns.Pattern.rows_of`, so
that a plan never holds more than a chunk of the pattern.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

import numpy as np

from ...pattern import Pattern
from ...rule import csr_spans, residue_order
from ._tiling import chunk_tiles, gcd_of_offsets, piece_rows, used_first

__all__ = ["CHUNK_ROWS", "CHUNK_ENTRIES", "SAMPLE_BLOCKS", "residue_perm", "pieces", "piece_tiles",
           "chunk_rows", "MaskTable"]

#: Query rows per chunk of a plan's pass (None: about ``pattern.CHUNK_ENTRIES``
#: entries); tests set it small to check that chunking changes nothing.
CHUNK_ROWS: int | None = None

#: Entries per chunk of a plan's pass (about 8 MB of indices): measured at n = 2^20
#: strided and 2^18 fixed, 2^19 spends the time on per-chunk Python overhead and
#: 2^23 on page faults of fresh 32 MB arrays; 2^21 was fastest on both.
CHUNK_ENTRIES = 1 << 21

#: Query blocks read to choose a piece's order (all of them when there are fewer).
SAMPLE_BLOCKS = 64


#: The compiled loops (:func:`~._tiling.chunk_tiles`, :func:`~._tiling.piece_rows`) take
#: the heads as tuples, and numba compiles them once per tuple length: a piece of fewer
#: heads passes this many, the rest with no entries and no member, so patterns of 1 to 4
#: heads share one compiled loop.
_HEADS = 4


class _Piece:
    """One part of a softmax group: the heads whose entries it takes, and its order.

    In ``merged`` mode a piece takes the entries of its member heads that no
    earlier head holds; in ``multihead`` mode a piece is one head.
    """

    __slots__ = ("members", "exclusive", "group", "kind", "qperm", "kperm")

    def __init__(self, members, exclusive, group, kind=("identity",), qperm=None, kperm=None):
        self.members, self.exclusive, self.group = tuple(members), exclusive, group
        self.kind, self.qperm, self.kperm = kind, qperm, kperm

    def heads(self, spans: list) -> tuple[tuple, tuple, tuple, np.ndarray]:
        """``(starts, ends, indices, member)`` of the heads up to the last member, for
        the compiled loops (one index dtype, int64 row bounds), from ``(ind, starts,
        ends)`` per head (:meth:`Pattern.spans_of`); fewer than :data:`_HEADS` padded to it."""
        top = max(self.members)
        first = 0 if self.exclusive else min(self.members)
        use = spans[first : top + 1]
        dt = np.result_type(*(ind.dtype for ind, _, _ in use))
        starts = tuple(np.ascontiguousarray(a, dtype=np.int64) for _, a, _ in use)
        ends = tuple(np.ascontiguousarray(b, dtype=np.int64) for _, _, b in use)
        idxs = tuple(ind.astype(dt, copy=False) for ind, _, _ in use)
        member = np.zeros(max(len(use), _HEADS), dtype=np.bool_)
        member[[h - first for h in self.members]] = True
        if len(use) < _HEADS:
            none = np.zeros(starts[0].size, np.int64)
            pad = _HEADS - len(use)
            starts, ends = starts + (none,) * pad, ends + (none,) * pad
            idxs = idxs + (np.empty(0, dt),) * pad
        return starts, ends, idxs, member

    def rows(self, mats: tuple) -> tuple[np.ndarray, np.ndarray]:
        """The piece's CSR ``(indptr, indices)`` from the rows of every head."""
        if len(self.members) == 1 and (not self.exclusive or self.members[0] == 0):
            m = mats[self.members[0]]
            return m.indptr.astype(np.int64), m.indices
        return piece_rows(*self.heads(csr_spans(mats)))

    def tiles(self, spans: list, kpos: np.ndarray, kperm: np.ndarray, step: int, block: int,
              n: int, rows_in: np.ndarray, fill: bool) -> tuple:
        """:func:`~._tiling.chunk_tiles` of the piece on the rows of every head."""
        starts, ends, idxs, member = self.heads(spans)
        return chunk_tiles(starts, ends, idxs, member, self.exclusive, kpos, kperm, step, block,
                           n, rows_in, fill)


def residue_perm(n: int, s: int) -> np.ndarray:
    """Positions grouped by ``i mod s`` (each group in increasing i): OpenAI's strided transpose."""
    return residue_order(n, s)


def _inverse(perm: np.ndarray) -> np.ndarray:
    pos = np.empty(perm.size, perm.dtype)
    pos[perm] = np.arange(perm.size, dtype=perm.dtype)
    return pos


def _block_rows(n: int, block: int, blocks: np.ndarray) -> np.ndarray:
    """Tokens of each query block ``I`` in ``blocks``: ``min(block, n - I * block)``."""
    return np.minimum(block, n - blocks * block).astype(np.int64)


def _positions(n: int, block: int, blocks: np.ndarray) -> np.ndarray:
    """Piece positions of the query blocks ``blocks``, concatenated."""
    if blocks.size == 0:
        return np.empty(0, np.int64)
    starts = blocks * block
    sizes = _block_rows(n, block, blocks)
    return np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))


def _sample(nb: int) -> np.ndarray:
    """Query blocks read to choose an order: all, or :data:`SAMPLE_BLOCKS` spread evenly."""
    if nb <= SAMPLE_BLOCKS:
        return np.arange(nb, dtype=np.int64)
    return np.unique(np.linspace(0, nb - 1, SAMPLE_BLOCKS).round().astype(np.int64))


def _step(kind: tuple) -> int:
    """``s`` with ``kpos[j + s] = kpos[j] + 1`` in this order (0: none known)."""
    return {"identity": 1, "residue": kind[-1]}.get(kind[0], 0)


def _choose(pattern: Pattern, pieces: list[_Piece], block: int) -> None:
    """Give each piece the order (identity, residue class, key compaction) with the fewest
    computed pairs, estimated on sampled query blocks (exact when all are sampled).

    Any order gives an exact plan; the order only decides how compact the tiles are.
    """
    n = pattern.n
    nb = -(-n // block)
    blocks = _sample(nb)
    dt = np.int32  # the plan's permutations (n <= 2^31 - 1 tokens): half the memory of int64
    ident = np.arange(n, dtype=dt)
    tokens = _positions(n, block, blocks)
    mats = pattern.rows_of(tokens)
    residue: dict[int, tuple[np.ndarray, tuple]] = {}  # s -> (order, its sampled rows), shared by pieces
    for pc in pieces:
        indptr, indices = pc.rows(mats)
        s = int(gcd_of_offsets(indptr, indices, tokens))
        cands: list[tuple[Any, np.ndarray, np.ndarray]] = [(("identity",), ident, ident)]
        if 1 < s < n:
            if s not in residue:
                r = residue_perm(n, s).astype(dt)
                residue[s] = (r, pattern.rows_of(r[tokens]))
            cands.append((("residue", s), residue[s][0], residue[s][0]))
        kp = np.empty(n, dtype=dt)
        u = int(used_first(indices, n, kp))
        if 0 < u < n:
            cands.append((("keys", u), ident, kp))
        best = None
        for kind, qp, kp in cands:
            cost = pc.tiles(csr_spans(mats if qp is ident else residue[kind[1]][1]), _inverse(kp),
                            kp, _step(kind), block, n, _block_rows(n, block, blocks), False)[4]
            if best is None or cost < best[0]:
                best = (cost, kind, qp, kp)
        assert best is not None
        _, pc.kind, pc.qperm, pc.kperm = best


def pieces(pattern: Pattern, mode: str, block: int) -> tuple[list[_Piece], int]:
    """The pieces of ``pattern`` with their orders, and the number of softmax groups."""
    p = pattern.num_heads
    if mode == "multihead":
        pieces = [_Piece((h,), False, h) for h in range(p)]
        _choose(pattern, pieces, block)
        return pieces, p
    # merged: head h minus the heads before it, so that no pair is in two pieces
    pieces = [_Piece((h,), True, 0) for h in range(p)]
    _choose(pattern, pieces, block)
    # pieces that chose the same order are executed as one (shared partial tiles)
    merged: dict[Any, _Piece] = {}
    for pc in pieces:
        key = pc.kind if pc.kind[0] != "keys" else ("keys", pc.kperm.tobytes())
        if key in merged:
            a = merged[key]
            merged[key] = _Piece(a.members + pc.members, True, 0, a.kind, a.qperm, a.kperm)
        else:
            merged[key] = pc
    return list(merged.values()), 1


def piece_tiles(pattern: Pattern, pc: _Piece, block: int, chunk: int,
                pool: Executor | None) -> list[tuple]:
    """Stream the piece's query blocks in its order, ``chunk`` rows at a time (on ``pool``'s
    threads, or in this one when None)."""
    n = pattern.n
    kpos = _inverse(pc.kperm)
    step = _step(pc.kind)

    def run(start: int) -> tuple:
        stop = min(n, start + chunk)
        spans = pattern.spans_of(pc.qperm[start:stop])
        blocks = np.arange(start // block, -(-stop // block), dtype=np.int64)
        qcount, tj, tm, masks, area, pairs = pc.tiles(spans, kpos, pc.kperm, step, block, n,
                                                      _block_rows(n, block, blocks), True)
        masks, tm = _distinct(masks, tm)
        return qcount, tj, tm, masks, area, pairs

    return list((map if pool is None else pool.map)(run, range(0, n, chunk)))


def _distinct(masks: np.ndarray, tm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct masks in order of first use, and ``tm`` pointing into them (-1 kept)."""
    if masks.shape[0] < 2:
        return masks, tm
    rows = np.ascontiguousarray(masks).reshape(masks.shape[0], -1).view(
        np.dtype((np.void, masks[0].nbytes)))[:, 0]
    _, first, inv = np.unique(rows, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(order.size, np.int64)
    rank[order] = np.arange(order.size)
    return masks[first[order]], np.where(tm < 0, tm, rank[inv.ravel()][np.maximum(tm, 0)])


class MaskTable:
    """Distinct partial-tile masks of a whole plan, in order of first use.

    Structured patterns repeat a few masks (every diagonal tile of a window is
    the same), so a plan stores each once: at n = 2^20 strided, 130,016
    partial tiles share a handful of masks instead of taking 33 MB. At most
    ``limit`` masks are looked up; beyond that, new masks are stored as they
    come, so memory stays O(partial tiles) for patterns without repeats.
    """

    def __init__(self, limit: int = 1 << 16) -> None:
        self.seen: dict[bytes, int] = {}
        self.parts: list[np.ndarray] = []
        self.count = 0
        self.limit = limit

    def add(self, masks: np.ndarray, tm: np.ndarray) -> np.ndarray:
        """Store a chunk's distinct ``masks``; return ``tm`` as indices into the table."""
        where = np.empty(masks.shape[0], np.int64)
        new = []
        for i in range(masks.shape[0]):
            key = masks[i].tobytes()
            g = self.seen.get(key)
            if g is None:
                g = self.count + len(new)
                new.append(i)
                if len(self.seen) < self.limit:
                    self.seen[key] = g
            where[i] = g
        if new:
            self.parts.append(masks[new])
            self.count += len(new)
        return np.where(tm < 0, tm, where[np.maximum(tm, 0)]) if where.size else tm

    def array(self, block: int) -> np.ndarray:
        """All stored masks, ``uint64 (M, block, W)``."""
        if not self.parts:
            return np.empty((0, block, -(-block // 64)), np.uint64)
        return np.concatenate(self.parts)


def chunk_rows(pattern: Pattern, block: int) -> int:
    rows = CHUNK_ROWS if CHUNK_ROWS is not None else pattern.chunk_rows(CHUNK_ENTRIES)
    return block * max(1, -(-int(rows) // block))
