"""An ExecutionPlan's pieces for FlexAttention: ``BlockMask`` objects and the CPU anchor path.

Private to :mod:`.flex`.

Each piece of a plan is block-compact in its own order (``qperm``, ``kperm``):
its ``block x block`` tiles become the ``BlockMask`` of that order, full tiles as
full blocks (no ``mask_mod`` evaluated) and partial tiles as partial blocks,
whose ``mask_mod(b, h, x, y)`` (``x``, ``y`` positions in the piece's order) is
one of two, both exact at every position:

* ``"bits"``: two gathers, a tile table ``(nb, nbk)`` of int32 (0 empty, 1 full,
  ``2 + m`` partial with mask ``m``) and the plan's tile masks (two prepended:
  all clear, all set), one byte a cell up to :data:`BYTES_LIMIT`, else the
  plan's bit-packed int64 words. Any plan.
* ``"formula"``: the family's FlexAttention formula
  (:func:`sparse_patterns.patterns.formulas.formula_of`) at the tokens
  ``qperm[x]``, ``kperm[y]``, restricted to the piece's share of its softmax
  group (a merged piece takes the pairs whose lowest head is a member). One
  gather per side and arithmetic. Needs the pattern.

With ``anchor=True`` the keys get one more position, ``nb * block`` (after the
padding of the last block), listed as a full block of every query block, where
the CPU path puts its anchor key: :func:`cpu_group` runs a softmax group's
pieces by compiled CPU FlexAttention, which returns no log-sum-exp, and merges
them through the anchors (the method is in :mod:`.flex`'s notes). It keeps the
gathered, extended tensors in a per-thread workspace (:func:`release_workspace`)
and its ``(B, H, n)`` bookkeeping in NumPy.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ...pattern import Pattern
from ...util.stream import check_fits, ordered_into
from ..planning import ExecutionPlan

__all__ = ["MASKS", "BYTES_LIMIT", "piece_block_mask", "piece_members", "probe_positions", "tile_layouts",
           "index", "perm", "cpu_group", "release_workspace", "on_device", "key_extent"]

#: How a piece's ``mask_mod`` decides its partial tiles (``"auto"``: formula on the CPU
#: when the pattern has one, else bits).
MASKS = ("auto", "bits", "formula")

#: Largest table of tile masks kept one byte a cell (``(M + 2) * block**2`` bytes for
#: ``M`` distinct masks); above it they stay packed 64 cells an int64 word. The byte is
#: one gather where the word needs a gather, a shift and a mask: the whole forward is
#: 1.2-1.3x faster with bytes (strided n = 16,384 merged, CPU, A/B in one process:
#: 1.03-1.16 s against 1.34-1.42 s).
BYTES_LIMIT = 1 << 26


# --------------------------------------------------------------------- tiles
def tile_layouts(plan: ExecutionPlan, p: int, columns: int | None = None) -> np.ndarray:
    """int32 ``(nb, nb)``: 0 no tile, 1 full tile, ``2 + m`` partial tile with mask ``m``
    (``columns`` >= ``nb``: that many columns, the ones past ``nb`` 0).

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pl = sps.plan(sps.make("strided", 8, stride=2), block=4, mode="multihead")
    >>> tile_layouts(pl, 0).tolist()  # the window head: two diagonal tiles and one below
    [[2, 0], [3, 2]]
    """
    nb = plan.nb
    t = plan.tiles(p)  # (T, 3): I, J, mask or -1
    out = np.zeros((nb, nb if columns is None else columns), dtype=np.int32)
    out[t[:, 0], t[:, 1]] = np.where(t[:, 2] < 0, 1, t[:, 2] + 2)
    return out


def probe_positions(plan: ExecutionPlan, p: int) -> np.ndarray:
    """int64 ``(n,)``: for each query position of piece ``p``, the key position of one of
    its pairs (the first set column of its last tile), ``-1`` for a row with none.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pl = sps.plan(sps.make("local", 6, window=2), block=4)
    >>> probe_positions(pl, 0).tolist()
    [0, 0, 0, 1, 4, 4]
    """
    def build() -> np.ndarray:
        n, B = plan.n, plan.block
        t = plan.tiles(p)
        out = np.full(n, -1, dtype=np.int64)
        if t.shape[0] == 0:
            return out
        masks = plan.masks  # (M, B, W) uint64, bit c % 64 of word c // 64
        first = np.full((masks.shape[0] + 1, B), -1, dtype=np.int64)  # row M: a full tile
        first[-1] = 0
        if masks.shape[0]:
            bits = np.unpackbits(masks.view(np.uint8), axis=2, bitorder="little")[:, :, :B]
            has = bits.any(axis=2)
            first[:-1] = np.where(has, bits.argmax(axis=2), -1)
        m = np.where(t[:, 2] < 0, masks.shape[0], t[:, 2])
        x = t[:, 0, None] * B + np.arange(B)[None, :]  # (T, B) query positions
        col = first[m]  # (T, B)
        y = t[:, 1, None] * B + col
        ok = (col >= 0) & (x < n) & (y < n)
        out[x[ok]] = y[ok]
        return out

    return plan.memo(("flex_probe", p), build)


# --------------------------------------------------------------------- members
def piece_members(pattern: Pattern, plan: ExecutionPlan) -> list[tuple[int, ...]] | None:
    """The pattern heads whose pairs each piece holds, or None when they cannot be told.

    ``multihead``: piece ``p`` is head ``p``. ``merged``: the planner's pieces are
    found again (same order, same permutations) and each piece takes the pairs
    whose lowest head is one of its members.
    """
    if plan.mode == "multihead":
        if plan.num_pieces != pattern.num_heads:
            return None
        return [(p,) for p in range(plan.num_pieces)]
    from ..planning import pieces  # noqa: PLC0415

    found, _ = pieces(pattern, "merged", plan.block)
    out = []
    for p in range(plan.num_pieces):
        match = [pc for pc in found if np.array_equal(pc.qperm, plan.qperm[p])
                 and np.array_equal(pc.kperm, plan.kperm[p])]
        if len(match) != 1:
            return None
        out.append(tuple(match[0].members))
    return out


def _piece_rule(rules: list[Callable[[Any, Any], Any]], members: tuple[int, ...],
                exclusive: bool) -> Callable[[Any, Any], Any]:
    """``rule(i, j)`` of a piece in token indices: its member heads' pairs, less the pairs
    an earlier head holds when ``exclusive`` (merged mode)."""
    top = max(members)
    if not exclusive:
        (h,) = members
        return rules[h]

    def rule(i: Any, j: Any) -> Any:
        held = out = None
        for h in range(top + 1):
            r = rules[h](i, j)
            if h in members:
                term = r if held is None else r & ~held
                out = term if out is None else out | term
            held = r if held is None else held | r
        return out

    return rule


# --------------------------------------------------------------------- mask_mods
def _bits_mask_mod(torch: Any, plan: ExecutionPlan, table: np.ndarray, device: Any) -> Callable:
    n, B = plan.n, plan.block
    nbk = table.shape[1]
    W = plan.masks.shape[2]
    M = plan.masks.shape[0] + 2
    unpacked = M * B * B <= BYTES_LIMIT

    def build() -> Any:
        m = plan.masks.reshape(-1, B, W)
        if unpacked:  # one byte a cell: a plain gather, vectorized by the compiled kernel
            cells = np.unpackbits(m.view(np.uint8), axis=2, bitorder="little")[:, :, :B]
            t = np.concatenate([np.zeros((1, B, B), np.uint8), np.ones((1, B, B), np.uint8),
                                cells])
        else:  # 64 cells a word
            t = np.concatenate([np.zeros((1, B, W), np.uint64),
                                np.full((1, B, W), np.iinfo(np.uint64).max, np.uint64),
                                m]).view(np.int64)
        return torch.from_numpy(np.ascontiguousarray(t).ravel()).to(device)

    bits = plan.memo(("flex_bits", str(device), unpacked), build)
    tiles = torch.from_numpy(table.ravel()).to(device)

    if unpacked:
        def mask_mod(b, h, q_idx, kv_idx):
            tile = tiles[(q_idx // B) * nbk + kv_idx // B]
            cell = bits[(tile * B + q_idx % B) * B + kv_idx % B]
            return (cell != 0) & (q_idx < n) & (kv_idx < n)

        return mask_mod

    def mask_mod(b, h, q_idx, kv_idx):
        tile = tiles[(q_idx // B) * nbk + kv_idx // B].to(torch.int64)
        c = kv_idx % B
        word = bits[(tile * B + q_idx % B) * W + c // 64]
        return (((word >> (c % 64)) & 1) == 1) & (q_idx < n) & (kv_idx < n)

    return mask_mod


def on_device(torch: Any, rule: Callable, device: Any, depth: int = 0) -> Callable:
    """``rule`` with the tensors its closures hold (packed documents' ids, bigbird's block
    tables) moved to ``device``, so that its ``mask_mod`` reads them where it runs.

    Only for rules made for this call (:func:`~sparse_patterns.patterns.formulas.formula_of` builds fresh closures):
    their cells are rebound in place. Nested closures and lists of them are followed.
    """
    dev = torch.device(device)
    for cell in getattr(rule, "__closure__", None) or ():
        try:
            x = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(x, torch.Tensor):
            if x.device != dev:
                cell.cell_contents = x.to(dev)
        elif depth < 16 and callable(x) and hasattr(x, "__closure__"):
            on_device(torch, x, dev, depth + 1)
        elif depth < 16 and isinstance(x, (list, tuple)):
            for item in x:
                for y in item if isinstance(item, (list, tuple)) else (item,):
                    if callable(y) and hasattr(y, "__closure__"):
                        on_device(torch, y, dev, depth + 1)
    return rule


def _formula_mask_mod(torch: Any, plan: ExecutionPlan, p: int, rule: Callable,
                      device: Any) -> Callable:
    n = plan.n
    ident = np.arange(n, dtype=np.int32)
    qp = None if np.array_equal(plan.qperm[p], ident) else torch.from_numpy(
        plan.qperm[p].astype(np.int64)).to(device)
    kp = None if np.array_equal(plan.kperm[p], ident) else torch.from_numpy(
        plan.kperm[p].astype(np.int64)).to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        x, y = torch.clamp(q_idx, 0, n - 1), torch.clamp(kv_idx, 0, n - 1)
        i = x if qp is None else qp[x]
        j = y if kp is None else kp[y]
        return rule(i, j) & (q_idx < n) & (kv_idx < n)

    return mask_mod


# --------------------------------------------------------------------- BlockMask
def piece_block_mask(plan: ExecutionPlan, p: int, *, device: Any, mask: str = "bits",
                     pattern: Pattern | None = None, anchor: bool = False,
                     with_q: bool = False, trim: bool = False) -> Any:
    """The FlexAttention ``BlockMask`` of piece ``p`` in its own order, on ``device``.

    ``trim``: only the piece's first :func:`key_extent` key positions (a summary-keys
    piece reads its ``u`` keys, gathered once, not ``n``); shape ``(1, 1, n, extent)``.

    ``BLOCK_SIZE`` is the plan's ``block``; shape ``(1, 1, n, n)`` broadcast over
    batch and heads, or ``(1, 1, n, nb * block + 1)`` with ``anchor``. The
    ``q_*`` index tensors (the backward's) only ``with_q``. Cached on the plan
    (:meth:`ExecutionPlan.memo`) per piece, device and options.

    Raises
    ------
    MemoryLimitError
        (a ``ValueError``) when the ``(nb, nb)`` index tensors would pass the memory limit.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pl = sps.plan(sps.make("strided", 8, stride=2), block=4, mode="multihead")
    >>> bm = piece_block_mask(pl, 1, device="cpu")  # the stride head, grouped by i mod 2
    >>> bm.shape, bm.to_dense()[0, 0].tolist(), pl.piece_kind[1]
    ((1, 1, 8, 8), [[1, 0], [0, 1]], 'residue(2)')
    """
    key = ("flex_bm", p, str(device), mask, anchor, with_q, trim)
    keys = key_extent(plan, p) if trim else None
    return plan.memo(key, lambda: _build(plan, p, device, mask, pattern, anchor, with_q, keys))


def key_extent(plan: ExecutionPlan, p: int) -> int:
    """Key positions of piece ``p``'s order up to the end of its last key block with a tile
    (``n`` for most pieces; about ``u`` for a ``keys(u)`` piece).

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pl = sps.plan(sps.make("fixed", 64, stride=16, c=2), block=8, mode="merged")
    >>> pl.piece_kind, [key_extent(pl, p) for p in range(pl.num_pieces)]
    (('identity', 'keys(6)'), [64, 8])
    """
    def build() -> int:
        nb = plan.nb
        lo, hi = plan.tile_ptr[p * nb], plan.tile_ptr[(p + 1) * nb]
        if hi == lo:
            return plan.n
        return min(plan.n, (int(plan.tile_col[lo:hi].max()) + 1) * plan.block)

    return plan.memo(("flex_keys", p), build)


def _build(plan: ExecutionPlan, p: int, device: Any, mask: str, pattern: Pattern | None,
           anchor: bool, with_q: bool, keys: int | None = None) -> Any:
    import torch  # noqa: PLC0415
    from torch.nn.attention.flex_attention import BlockMask  # noqa: PLC0415

    n, B, nb = plan.n, plan.block, plan.nb
    nbk = nb + 1 if anchor else nb
    check_fits(f"block: the BlockMask of piece {p} at n={n:,} with {nb:,} blocks a side",
               nb * nbk * (4 + 2 + 8 * (4 if with_q else 2)), "a larger block")
    table = tile_layouts(plan, p, nbk)
    if keys is not None:  # only the key blocks the piece has tiles in
        nbk = -(-keys // B)
        table = np.ascontiguousarray(table[:, :nbk])
    full = table == 1
    partial = table >= 2
    if anchor:
        if n % B:  # the last key block is padded: its full tiles must mask the padding
            partial[:, nb - 1] |= full[:, nb - 1]
            full[:, nb - 1] = False
        full[:, nb] = True  # the anchor: one key, in every query block
    if mask == "formula":
        members = piece_members(pattern, plan) if pattern is not None else None
        from ...patterns.formulas import formula_of  # noqa: PLC0415

        rules = formula_of(pattern) if members is not None else None
        if rules is None:
            raise ValueError("mask: 'formula' needs a pattern with a FlexAttention formula")
        rule = _piece_rule([on_device(torch, r, device) for r in rules], members[p],
                           plan.mode == "merged")
        mask_mod = _formula_mask_mod(torch, plan, p, rule, device)
    else:
        mask_mod = _bits_mask_mod(torch, plan, table, device)
    if anchor:  # a full block (no mask_mod) in the compiled kernel; the eager operator asks
        inner, a = mask_mod, nb * B

        def mask_mod(b, h, q_idx, kv_idx):
            return inner(b, h, q_idx, kv_idx) | (kv_idx == a)
    t = {}
    names = [("kv", partial), ("full_kv", full)]
    if with_q:
        names += [("q", partial.T), ("full_q", full.T)]
    for prefix, sel in names:
        rows, cols = sel.shape
        num = np.empty(rows, dtype=np.int32)
        idx = np.empty((rows, cols), dtype=np.int32)
        ordered_into(sel, num, idx)
        t[prefix] = (torch.from_numpy(num[None, None]).to(device),
                     torch.from_numpy(idx[None, None]).to(device))
    seq = (n, nb * B + 1 if anchor else n if keys is None else keys)
    try:  # the q_* tensors (the backward's) are ours: no dense (nb, nb) transposes in torch
        bm = BlockMask.from_kv_blocks(*t["kv"], *t["full_kv"], BLOCK_SIZE=B, mask_mod=mask_mod,
                                      seq_lengths=seq, compute_q_blocks=False)
    except TypeError:  # a torch without compute_q_blocks derives them itself (same values)
        return BlockMask.from_kv_blocks(*t["kv"], *t["full_kv"], BLOCK_SIZE=B,
                                        mask_mod=mask_mod, seq_lengths=seq)
    if with_q:
        bm.q_num_blocks, bm.q_indices = t["q"]
        bm.full_q_num_blocks, bm.full_q_indices = t["full_q"]
    return bm


# --------------------------------------------------------------------- the CPU path
_STEP = 40.0  # how far the anchor's score moves when its weight underflowed
_ROUNDS = 16  # at most this many moves (scores spanning 640 below the log-sum-exp)
_W_MIN = 1e-20  # an anchor weight below this is too close to underflow to trust


def index(torch: Any, plan: ExecutionPlan, key: str, p: int, device: Any) -> Any:
    """Piece ``p``'s query or key order, or the inverse query order, as an int64 tensor."""
    def build() -> Any:
        if key == "qinv":
            inv = np.empty(plan.n, np.int64)
            inv[plan.qperm[p]] = np.arange(plan.n)
            return torch.from_numpy(inv).to(device)
        return torch.from_numpy(getattr(plan, key)[p].astype(np.int64)).to(device)

    return plan.memo(("flex_index", key, p, str(device)), build)


class _Workspace(threading.local):
    """Recycled intermediate tensors of the CPU inference path, per thread: a fresh tensor of
    tens of MB costs more in first-touch page faults than the gather that fills it."""

    def __init__(self) -> None:
        self.bufs: OrderedDict[tuple, Any] = OrderedDict()

    def get(self, torch: Any, tag: str, shape: tuple[int, ...], dtype: Any,
            init: Any = None) -> Any:
        """The buffer ``tag`` of this shape and dtype; ``init(t)`` runs once, when it is made."""
        key = (tag, tuple(shape), dtype)
        t = self.bufs.pop(key, None)
        if t is None:
            t = torch.empty(shape, dtype=dtype)
            if init is not None:
                init(t)
        self.bufs[key] = t
        while len(self.bufs) > 12:
            self.bufs.popitem(last=False)
        return t


_WS = _Workspace()


def release_workspace() -> None:
    """Free the intermediate tensors the CPU path keeps between calls (this thread's).

    Examples
    --------
    >>> release_workspace()
    """
    _WS.bufs.clear()


def _gather(torch: Any, x: Any, idx: Any, tag: str) -> Any:
    """``x.index_select(2, idx)`` into a recycled tensor; for ``idx=None`` ``x`` itself, or
    its contiguous copy (every piece's call then has the same strides: one compiled graph)."""
    if idx is None:
        B, H, n, d = x.shape
        dense = (H * n * d, n * d, d, 1)  # the strides of a fresh tensor, size-1 dims included
        return x if x.stride() == dense else _WS.get(torch, tag, x.shape, x.dtype).copy_(x)
    shape = (*x.shape[:2], idx.numel(), x.shape[3])
    return torch.index_select(x, 2, idx, out=_WS.get(torch, tag, shape, x.dtype))


def perm(torch: Any, plan: ExecutionPlan, key: str, p: int, device: Any) -> Any:
    """:func:`index`, or None for the identity order (nothing to gather)."""
    perm = plan.qperm[p] if key in ("qperm", "qinv") else plan.kperm[p]
    ident = plan.memo(("flex_ident", key[0], p),
                      lambda: bool(np.array_equal(perm, np.arange(plan.n))))
    return None if ident else index(torch, plan, key, p, device)


def _extended(torch: Any, plan: ExecutionPlan, q: Any, k: Any, v: Any, run: Any) -> tuple:
    """``q`` with one more column (the anchor's ``c / scale``), ``k`` and ``v`` with one more
    column, padded to ``nb * block`` keys and the anchor key (a unit vector) after them."""
    B, H, n, d = q.shape
    a = plan.nb * plan.block

    def anchor(e: Any) -> None:
        e.zero_()
        e[:, :, a, d] = 1

    qe = _WS.get(torch, "q_ext", (B, H, n, d + 1), run, init=lambda e: e.zero_())
    qe[..., :d].copy_(q)
    out = [qe]
    for tag, x in (("k_ext", k), ("v_ext", v)):  # only [:n, :d] changes from call to call
        e = _WS.get(torch, tag, (B, H, a + 1, d + 1), run, init=anchor)
        e[:, :, :n, :d].copy_(x)
        out.append(e)
    return tuple(out)


# The CPU path keeps its (B, H, n) bookkeeping in NumPy: each small torch operation is a
# parallel region, and on a shared machine one waits for a time slice (~8 ms measured).
def _anchored(torch: Any, fn: Any, plan: ExecutionPlan, p: int, ext: tuple, bm: Any,
              scale: float) -> tuple[Any, np.ndarray, np.ndarray]:
    """Piece ``p`` by compiled CPU FlexAttention with an anchor key (see the module's notes):
    ``(output with the anchor's column, anchor weight w, lse)``, the last two float64
    NumPy ``(B, H, n)``, in the piece's order."""
    qe, ke, ve = ext
    B, H, n, d1 = qe.shape
    d, run = d1 - 1, qe.dtype
    qp = perm(torch, plan, "qperm", p, qe.device)
    kp = None
    if perm(torch, plan, "kperm", p, qe.device) is not None:
        kp = plan.memo(("flex_kext", p), lambda: torch.from_numpy(np.concatenate(
            [plan.kperm[p], np.arange(plan.n, ke.shape[2])]).astype(np.int64)))
    qa, ka, va = _gather(torch, qe, qp, "qa"), _gather(torch, ke, kp, "ka"), _gather(
        torch, ve, kp, "va")
    y0 = probe_positions(plan, p)
    empty = np.broadcast_to(y0 < 0, (B, H, n))
    y0t = plan.memo(("flex_probe_t", p), lambda: torch.from_numpy(np.maximum(y0, 0)))
    prod = torch.index_select(ka, 2, y0t, out=_WS.get(torch, "probe", qa.shape, run))
    qa[..., d] = 0  # the anchor's column: no part of a real pair's score
    prod.mul_(qa)
    c = prod.sum(-1, dtype=torch.float32).numpy().astype(np.float64) * scale  # c <= row max
    c[empty] = 0.0
    to_run = {torch.float32: np.float32, torch.float64: np.float64}.get(run)
    got = w = lse = None
    todo = ~empty
    for _ in range(_ROUNDS + 1):
        x = c / scale  # what column d holds, rounded as the kernel reads it
        cq = torch.from_numpy(x.astype(to_run)) if to_run else torch.from_numpy(x).to(run)
        qa[..., d] = cq
        o = fn(qa, ka, va, block_mask=bm, scale=scale)
        ow = o[..., d].to(torch.float64).numpy()  # one strided read
        cu = (cq.to(torch.float32) * np.float32(scale)).numpy().astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ol = cu + np.log1p(-ow) - np.log(ow)
        ok = todo & ~(ow < _W_MIN)  # NaN rows are done: NaN propagates
        if got is None:
            got, w, lse = o, ow, np.where(empty, -np.inf, ol)
        else:
            got = torch.where(torch.from_numpy(ok)[..., None], o, got)
            w, lse = np.where(ok, ow, w), np.where(ok, ol, lse)
        todo &= ~ok
        if not todo.any():
            return got, np.where(empty, 0.0, w), lse
        c = np.where(todo, c + _STEP, c)
    raise ValueError(
        f"q, k: some scores lie more than {_STEP * _ROUNDS:.0f} below their row's log-sum-exp; "
        "compiled FlexAttention on the CPU cannot merge the pieces exactly there; use impl='numba'"
    )


def cpu_group(torch: Any, fn: Any, plan: ExecutionPlan, ps: list[int], q: Any, k: Any, v: Any,
              out: Any, scale: float, mask: str, pattern: Pattern | None,
              return_lse: bool) -> Any:
    """Inference of one softmax group's pieces by ``fn`` (compiled CPU FlexAttention) into
    ``out`` (a float view of the result); returns the group's lse (None when neither merged
    nor asked for)."""
    d = q.shape[3]
    dev = q.device
    bms = [piece_block_mask(plan, p, device=dev, mask=mask, pattern=pattern,
                            anchor=return_lse or len(ps) > 1) for p in ps]
    if len(ps) == 1 and not return_lse:
        (p,) = ps
        qp, kp = perm(torch, plan, "qperm", p, dev), perm(torch, plan, "kperm", p, dev)
        o = fn(_gather(torch, q, qp, "xq"), _gather(torch, k, kp, "xk"),
               _gather(torch, v, kp, "xv"), block_mask=bms[0], scale=scale)
        inv = perm(torch, plan, "qinv", p, dev)
        out.copy_(o if inv is None else _gather(torch, o, inv, "back"))
        return None
    run = torch.float32 if q.dtype == torch.float16 else q.dtype  # float16's range: too short
    ext = _extended(torch, plan, q, k, v, run)
    res = []
    for p, bm in zip(ps, bms, strict=True):
        o, w, lse = _anchored(torch, fn, plan, p, ext, bm, scale)
        if perm(torch, plan, "qinv", p, dev) is not None:
            inv = index(torch, plan, "qinv", p, dev).numpy()
            w, lse = w[..., inv], lse[..., inv]
        res.append((o, p, w, lse))
    L = np.stack([r[3] for r in res])  # (P, B, H, n)
    m = L.max(axis=0)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        e = np.exp(L - m)
        tot = e.sum(axis=0)
        for i, (o, p, w, _) in enumerate(res):
            coef = np.where(tot == 0, 0.0, e[i] / (tot * (1 - w)))[..., None]
            coef = torch.from_numpy(coef.astype(np.float32 if out.dtype == torch.float32
                                                 else np.float64))
            inv = perm(torch, plan, "qinv", p, dev)
            o = o if inv is None else _gather(torch, o, inv, "back")
            if i == 0:
                torch.mul(o[..., :d], coef, out=out)
            else:
                out.addcmul_(o[..., :d], coef)
        return torch.from_numpy(np.where(tot == 0, -np.inf, np.log(tot) + m))
