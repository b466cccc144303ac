"""Execution plans: how a fused kernel covers a token-level pattern with dense tiles.

A block-sparse kernel in natural token order wastes work on strided heads (every
l-th key lands in nearly every block). :func:`plan` therefore cuts the pattern
into disjoint **pieces**, gives each piece a query permutation and a key
permutation in which it is block-compact (identity for local and fixed blocks,
positions grouped by ``i mod l`` for a stride head as OpenAI's
``strided_transpose`` does, summary keys moved to the front for a fixed summary
head), and lists the ``block x block`` tiles of each piece in that order, split
into full tiles and partial tiles with a bit-packed token mask. Pieces of one
softmax are merged exactly by their log-sum-exp, and no token pair belongs to two
pieces. The result is an :class:`ExecutionPlan` of plain NumPy arrays, so that
the CPU kernel (``kernels.cpu``), a GPU kernel and the profiler consume the same
structure.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...pattern import KERNEL_MODES, Mode, Pattern
from ...util.checks import check_choice, check_int
from ._pieces import MaskTable, chunk_rows, piece_tiles, pieces, residue_perm

__all__ = [
    "ExecutionPlan", "plan", "cached_plan", "MODES", "BLOCK", "check_mode", "clear_plan_cache",
    "residue_perm", "pieces",
]

#: Softmax grouping of the pattern's heads: one softmax per pattern head, or one over the union.
MODES = KERNEL_MODES

_FULL = -1  # tile_mask value of a full tile

#: Tile size of the plans that ``attention``, ``attention_backward``, ``SparseAttention``
#: and ``profile`` build by default: 32 ran the numba forward fastest on every pattern
#: measured (strided, fixed, full, local, bigbird; n = 4,096-16,384, d = 64).
BLOCK = 32


def check_mode(mode: Any) -> str:
    """``mode`` (a name or a :class:`~sparse_patterns.pattern.Mode`) as one of :data:`MODES`.

    Raises ``ValueError`` naming the allowed modes otherwise.

    Examples
    --------
    >>> from sparse_patterns.pattern import Mode
    >>> check_mode(Mode.MERGED), check_mode("multihead")
    ('merged', 'multihead')
    """
    return check_choice("mode", mode.value if isinstance(mode, Mode) else mode, MODES)


def _freeze(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


# --------------------------------------------------------------------- the plan
class ExecutionPlan:
    """Disjoint pieces, permutations and tiles that cover a pattern exactly.

    Built by :func:`plan`; immutable; every array is a read-only, C-contiguous
    NumPy array, so a GPU kernel can consume the same plan as the CPU one.

    Attributes
    ----------
    n, block, mode : int, int, str
        Sequence length, tile size, and ``"multihead"`` or ``"merged"``.
    nb : int
        ``ceil(n / block)``: blocks per side, in any piece's order.
    num_groups : int
        ``G``: softmax groups. ``merged``: 1 (the union); ``multihead``: ``p``,
        and attention head ``h`` uses group ``h % G``.
    piece_group : int32 (P,)
        Softmax group of each piece. Pieces of one group are disjoint.
    piece_kind : tuple of str
        How each piece's permutation was chosen: ``"identity"``,
        ``"residue(s)"`` (grouped by ``i mod s``) or ``"keys(u)"`` (the ``u``
        used key positions first).
    qperm, kperm : int32 (P, n)
        Piece order -> token: position ``x`` of piece ``p`` is query token
        ``qperm[p, x]`` (and key token ``kperm[p, x]``). Query block ``I`` of
        piece ``p`` is the tokens ``qperm[p, I*block : (I+1)*block]``.
    tile_ptr : int64 (P * nb + 1,)
        CSR over (piece, query block): the tiles of query block ``I`` of piece
        ``p`` are ``tile_ptr[p*nb + I] : tile_ptr[p*nb + I + 1]``, by key block.
    tile_col : int32 (T,)
        Key block ``J`` of each tile (in the piece's key order).
    tile_mask : int32 (T,)
        ``-1`` for a **full** tile (every pair of the tile, cropped to ``n``, is
        in the piece); otherwise the tile is **partial** and this is its index
        into ``masks``.
    masks : uint64 (M, block, W), ``W = ceil(block / 64)``
        The distinct token masks of the partial tiles, in order of first use
        (partial tiles with the same mask share one): bit ``c % 64`` of
        ``masks[m, r, c // 64]`` set means row ``r``, column ``c`` of the tile
        is a pair of the piece. Bits beyond ``n`` are never set.
    useful_pairs, computed_pairs : int64 (G,)
        Pairs of the pattern per group, and pairs the tiles compute (tile
        areas cropped to ``n``).

    Notes
    -----
    Decoding a plan to the token pairs it computes (what the tests check)::

        for p in range(plan.num_pieces):
            for I in range(plan.nb):
                for t in range(plan.tile_ptr[p * plan.nb + I], plan.tile_ptr[p * plan.nb + I + 1]):
                    for r, c in plan.tile_pairs(t, I):   # (row, col) inside the tile
                        i, j = plan.qperm[p, I * plan.block + r], plan.kperm[p, plan.tile_col[t] * plan.block + c]

    ``tile_pairs`` yields every in-range ``(r, c)`` for a full tile and the set
    bits of ``masks[tile_mask[t]]`` for a partial one.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pl = sps.plan(sps.make("strided", 16, stride=4), block=4, mode="multihead")
    >>> pl.piece_kind, pl.num_groups, pl.num_pieces
    (('identity', 'residue(4)'), 2, 2)
    >>> pl.useful_pairs.tolist(), pl.computed_pairs.tolist()
    ([70, 40], [112, 64])
    >>> pl.tiles(1)[:2].tolist()  # (I, J, mask index or -1) of piece 1
    [[0, 0, 0], [1, 1, 0]]
    """

    __slots__ = (
        "_n", "_block", "_mode", "_G", "piece_group", "piece_kind", "qperm", "kperm",
        "tile_ptr", "tile_col", "tile_mask", "masks", "useful_pairs", "computed_pairs",
        "_memo",
    )

    def __init__(self, *, n, block, mode, num_groups, piece_group, piece_kind, qperm, kperm,
                 tile_ptr, tile_col, tile_mask, masks, useful_pairs, computed_pairs) -> None:
        self._n, self._block, self._mode, self._G = int(n), int(block), str(mode), int(num_groups)
        self.piece_group = _freeze(np.asarray(piece_group, dtype=np.int32))
        self.piece_kind = tuple(piece_kind)
        self.qperm = _freeze(np.asarray(qperm, dtype=np.int32))
        self.kperm = _freeze(np.asarray(kperm, dtype=np.int32))
        self.tile_ptr = _freeze(np.asarray(tile_ptr, dtype=np.int64))
        self.tile_col = _freeze(np.asarray(tile_col, dtype=np.int32))
        self.tile_mask = _freeze(np.asarray(tile_mask, dtype=np.int32))
        self.masks = _freeze(np.asarray(masks, dtype=np.uint64))
        self.useful_pairs = _freeze(np.asarray(useful_pairs, dtype=np.int64))
        self.computed_pairs = _freeze(np.asarray(computed_pairs, dtype=np.int64))
        self._memo = {}

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        """The arrays and scalars, without what kernels derived from them (``memo``: device
        tensors, BlockMasks holding closures), which a copy rebuilds on first use."""
        return None, {k: getattr(self, k) for k in ExecutionPlan.__slots__ if k != "_memo"}

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        for k, v in state[1].items():
            object.__setattr__(self, k, _freeze(v) if isinstance(v, np.ndarray) else v)
        object.__setattr__(self, "_memo", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_memo" and hasattr(self, name) and name in ExecutionPlan.__slots__:
            raise AttributeError(f"ExecutionPlan is immutable: cannot set {name!r}")
        object.__setattr__(self, name, value)

    # ---------------------------------------------------------------- scalars
    @property
    def n(self) -> int:
        """Sequence length."""
        return self._n

    @property
    def block(self) -> int:
        """Tile size (query and key)."""
        return self._block

    @property
    def mode(self) -> str:
        """``"multihead"`` or ``"merged"``."""
        return self._mode

    @property
    def nb(self) -> int:
        """Blocks per side, ``ceil(n / block)``."""
        return -(-self._n // self._block)

    @property
    def num_groups(self) -> int:
        """Softmax groups ``G`` (attention head ``h`` uses group ``h % G``)."""
        return self._G

    @property
    def num_pieces(self) -> int:
        """Number of pieces ``P``."""
        return int(self.piece_group.size)

    @property
    def num_tiles(self) -> int:
        """Number of tiles ``T`` (full and partial)."""
        return int(self.tile_col.size)

    @property
    def num_partial(self) -> int:
        """Number of partial tiles (they share the ``M`` distinct ``masks``)."""
        return int(np.count_nonzero(self.tile_mask >= 0))

    @property
    def useful_flops(self) -> int:
        """Forward FLOPs per unit of head dimension on the pattern's pairs (4 per pair).

        Summed over the groups, one attention head per group; multiply by ``d``,
        or use :meth:`flops` for a whole ``(B, H, n, d)`` call.
        """
        return 4 * int(self.useful_pairs.sum())

    @property
    def computed_flops(self) -> int:
        """Forward FLOPs per unit of head dimension on the pairs the tiles compute."""
        return 4 * int(self.computed_pairs.sum())

    @property
    def ratio(self) -> float:
        """``computed_flops / useful_flops`` (1.0 = no wasted work)."""
        u = self.useful_flops
        return self.computed_flops / u if u else 1.0

    def flops(self, batch: int, heads: int, head_dim: int) -> tuple[int, int]:
        """Forward ``(useful, computed)`` FLOPs of a call on ``(batch, heads, n, head_dim)``.

        Counts ``2 d`` for ``q.k`` and ``2 d`` for ``p v`` per pair; attention head
        ``h`` uses group ``h % G``.

        Examples
        --------
        >>> import sparse_patterns as sps
        >>> sps.plan(sps.make("full", 8), block=4).flops(1, 2, 16)
        (4608, 6144)
        """
        g = np.arange(int(heads)) % self._G
        u = int(self.useful_pairs[g].sum()) * 4 * int(head_dim) * int(batch)
        c = int(self.computed_pairs[g].sum()) * 4 * int(head_dim) * int(batch)
        return u, c

    # ---------------------------------------------------------------- views
    def tiles(self, piece: int) -> np.ndarray:
        """``int64 (t, 3)``: ``(I, J, mask index or -1)`` of every tile of a piece."""
        nb = self.nb
        lo, hi = self.tile_ptr[piece * nb], self.tile_ptr[(piece + 1) * nb]
        rows = np.repeat(np.arange(nb), np.diff(self.tile_ptr[piece * nb : (piece + 1) * nb + 1]))
        return np.stack([rows, self.tile_col[lo:hi], self.tile_mask[lo:hi]], axis=1).astype(
            np.int64
        )

    @property
    def full_tiles(self) -> np.ndarray:
        """``int64 (F, 3)``: ``(piece, I, J)`` of the full tiles."""
        return self._select(full=True)

    @property
    def partial_tiles(self) -> np.ndarray:
        """``int64 (M, 4)``: ``(piece, I, J, mask index)`` of the partial tiles."""
        return self._select(full=False)

    def _select(self, full: bool) -> np.ndarray:
        out = []
        for p in range(self.num_pieces):
            t = self.tiles(p)
            sel = t[:, 2] < 0 if full else t[:, 2] >= 0
            t = t[sel]
            cols = [np.full(len(t), p), t[:, 0], t[:, 1]] + ([] if full else [t[:, 2]])
            out.append(np.stack(cols, axis=1))
        width = 3 if full else 4
        return np.concatenate(out).astype(np.int64) if out else np.empty((0, width), np.int64)

    def tile_pairs(self, t: int, I: int) -> np.ndarray:
        """``int64 (k, 2)``: in-range ``(row, col)`` inside tile ``t`` of query block ``I``."""
        b, n = self._block, self._n
        rows = min(b, n - I * b)
        cols = min(b, n - int(self.tile_col[t]) * b)
        m = int(self.tile_mask[t])
        if m < 0:
            r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
            return np.stack([r.ravel(), c.ravel()], axis=1)
        bits = np.unpackbits(self.masks[m].view(np.uint8), bitorder="little")
        bits = bits.reshape(b, -1)[:, :b]
        r, c = np.nonzero(bits)
        return np.stack([r, c], axis=1).astype(np.int64)

    def column_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Tiles by key block: ``(col_ptr int64 (P*nb+1,), col_tile int64 (T,))``.

        The tiles of key block ``J`` of piece ``p`` are
        ``col_tile[col_ptr[p*nb + J] : col_ptr[p*nb + J + 1]]`` (indices into
        ``tile_col``), by query block. Used by the backward pass.
        """
        def build() -> tuple[np.ndarray, np.ndarray]:
            nb = self.nb
            piece_of = np.repeat(np.arange(self.num_pieces), np.diff(self.tile_ptr[::nb]))
            key = piece_of.astype(np.int64) * nb + self.tile_col
            order = np.argsort(key, kind="stable").astype(np.int64)
            ptr = np.zeros(self.num_pieces * nb + 1, dtype=np.int64)
            np.cumsum(np.bincount(key, minlength=self.num_pieces * nb), out=ptr[1:])
            return _freeze(ptr), _freeze(order)

        return self.memo("column_index", build)

    def tile_rows(self) -> np.ndarray:
        """``int64 (T,)``: the query block ``I`` of every tile (expanded from ``tile_ptr``)."""
        nb = self.nb
        return np.tile(np.arange(nb, dtype=np.int64), self.num_pieces).repeat(
            np.diff(self.tile_ptr)
        ) if self.num_pieces else np.empty(0, np.int64)

    def memo(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per plan and ``key``: what a kernel derives from
        the plan alone (block steps, inverse permutations, work-item sizes).

        Examples
        --------
        >>> import sparse_patterns as sps
        >>> pl = sps.plan(sps.make("local", 8, window=2), block=4)
        >>> pl.memo("x", lambda: [1]) is pl.memo("x", lambda: [2])
        True
        """
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary (pieces, tiles, FLOP ratio)."""
        return {
            "n": self._n, "block": self._block, "mode": self._mode,
            "groups": self._G, "pieces": list(self.piece_kind),
            "tiles": self.num_tiles, "partial": self.num_partial,
            "useful_pairs": int(self.useful_pairs.sum()),
            "computed_pairs": int(self.computed_pairs.sum()),
            "ratio": round(self.ratio, 4),
        }

    def __repr__(self) -> str:
        return (
            f"ExecutionPlan(n={self._n}, block={self._block}, mode={self._mode!r}, "
            f"pieces={list(self.piece_kind)}, tiles={self.num_tiles}, "
            f"partial={self.num_partial}, ratio={self.ratio:.3f})"
        )


def _kind_str(kind: tuple) -> str:
    return kind[0] if len(kind) == 1 else f"{kind[0]}({kind[1]})"


def planning_threads() -> int:
    """Threads that build a plan's chunks: numba's configured thread count (the
    ``NUMBA_NUM_THREADS`` environment variable, else the CPU count), at most 4.

    A process given one thread (a search's dask worker, ``NUMBA_NUM_THREADS=1``)
    plans with one thread too, instead of contending with its neighbours for cores.

    Examples
    --------
    >>> 1 <= planning_threads() <= 4
    True
    """
    import numba  # noqa: PLC0415 - numba.config reads the environment, starts no thread

    return max(1, min(4, int(numba.config.NUMBA_NUM_THREADS)))


def _build(pattern: Pattern, block: int, mode: str) -> ExecutionPlan:
    n = pattern.n
    nb = -(-n // block)
    parts_of, G = pieces(pattern, mode, block)
    chunk = chunk_rows(pattern, block)
    useful = np.zeros(G, dtype=np.int64)
    computed = np.zeros(G, dtype=np.int64)
    kept, counts, cols, mask_idx = [], [], [], []
    table = MaskTable()
    threads = planning_threads()
    # one thread: the chunks run here (a pool's thread would only wait for this one's GIL)
    with ThreadPoolExecutor(threads) if threads > 1 else contextlib.nullcontext() as pool:
        for pc in parts_of:
            parts = piece_tiles(pattern, pc, block, chunk, pool)
            pairs = sum(part[5] for part in parts)
            if mode == "merged" and pairs == 0:
                continue  # a head wholly inside earlier heads adds no piece
            kept.append(pc)
            useful[pc.group] += pairs
            for k, (qcount, tj, tm, masks, area, _) in enumerate(parts):
                parts[k] = None  # each chunk's arrays go as soon as they are copied
                computed[pc.group] += area
                counts.append(qcount)
                cols.append(tj)
                mask_idx.append(table.add(masks, tm).astype(np.int32))
    P = len(kept)
    tile_ptr = np.zeros(P * nb + 1, dtype=np.int64)
    if counts:
        np.cumsum(np.concatenate(counts), out=tile_ptr[1:])
    return ExecutionPlan(
        n=n, block=block, mode=mode, num_groups=G,
        piece_group=[pc.group for pc in kept],
        piece_kind=[_kind_str(pc.kind) for pc in kept],
        qperm=np.stack([pc.qperm for pc in kept]) if P else np.empty((0, n)),
        kperm=np.stack([pc.kperm for pc in kept]) if P else np.empty((0, n)),
        tile_ptr=tile_ptr,
        tile_col=np.concatenate(cols) if cols else np.empty(0),
        tile_mask=np.concatenate(mask_idx) if mask_idx else np.empty(0),
        masks=table.array(block),
        useful_pairs=useful,
        computed_pairs=computed,
    )


_CACHE: OrderedDict[tuple, tuple[Pattern, ExecutionPlan]] = OrderedDict()
_CACHE_SIZE = 16


def clear_plan_cache() -> None:
    """Forget every cached plan."""
    _CACHE.clear()


def plan(
    pattern: Pattern, *, block: int = BLOCK, mode: str = "multihead", cache: bool = True
) -> ExecutionPlan:
    """Plan the execution of ``pattern``: pieces, permutations, full and partial tiles.

    Parameters
    ----------
    pattern : Pattern
        The token-level pattern.
    block : int
        Tile size in tokens, in ``[1, 4096]`` (the default, :data:`BLOCK`, is the tile size the kernels run).
    mode : {"multihead", "merged"}
        ``"multihead"``: one softmax per pattern head (attention head ``h`` uses
        pattern head ``h % p``); ``"merged"``: one softmax over the union of the
        heads, cut into disjoint pieces (head ``m`` minus heads ``< m``).
    cache : bool
        Reuse the plan built for this very pattern object, block and mode (the
        last 16 are kept), so a timed call does not plan again.

    Returns
    -------
    ExecutionPlan

    Raises
    ------
    ValueError
        If ``pattern`` is not a :class:`~sparse_patterns.Pattern`, or ``block``
        or ``mode`` is out of range.

    Notes
    -----
    Each piece tries the identity order, positions grouped by ``i mod s`` where
    ``s`` is the gcd of the piece's offsets ``i - j`` (a stride head, as
    OpenAI's ``strided_transpose``), and its used key positions moved to the
    front (a fixed summary head); the order with the fewest computed pairs wins.
    Pieces of a merged group that choose the same order are executed as one.
    Orders are chosen on sampled query blocks; the tiles are then counted chunk by
    chunk of query blocks read through :meth:`~sparse_patterns.Pattern.rows_of`:
    time ``O(nnz)``, memory ``O(tiles + partial masks + one chunk)``, never the
    whole CSR and never ``n x n``.

    References
    ----------
    R. Child et al., "Generating Long Sequences with Sparse Transformers",
    arXiv:1904.10509, 2019.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pl = sps.plan(sps.make("strided", 16, stride=4), block=4, mode="multihead")
    >>> pl.piece_kind, pl.num_groups
    (('identity', 'residue(4)'), 2)
    >>> pl.ratio < 2
    True
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a sparse_patterns.Pattern, got {type(pattern).__name__}")
    return cached_plan(pattern, check_int("block", block, 1, 4096), check_mode(mode), cache)


def cached_plan(pattern: Pattern, block: int, mode: str, cache: bool = True) -> ExecutionPlan:
    """:func:`plan` for arguments already checked, as ``kernels.inputs.resolve`` does.

    ``pattern`` a :class:`~sparse_patterns.Pattern`, ``block`` an int in
    ``[1, 4096]``, ``mode`` one of :data:`MODES` (:func:`check_mode`); nothing is
    checked again.
    """
    key = (id(pattern), block, mode)
    if cache and key in _CACHE and _CACHE[key][0] is pattern:
        _CACHE.move_to_end(key)
        return _CACHE[key][1]
    pl = _build(pattern, block, mode)
    if cache:
        _CACHE[key] = (pattern, pl)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return pl
