"""PyTorch FlexAttention export: a ``BlockMask`` built straight from the
pattern's block layout (``BlockMask.from_kv_blocks`` with partial and full
blocks separated) and a ``mask_mod`` that evaluates the token pattern, never a
dense n x n mask; and the way back from any ``BlockMask`` to a
:class:`Pattern`.

The ``mask_mod`` is exact at every position (FlexAttention's eager path
evaluates it everywhere; the compiled kernel only on partial blocks). For the
registered families it is the formula each family registers beside its
generator (``REGISTRY[name].flex``: arithmetic in the generator's parameters,
``(q - kv) % l == 0``, ``kv // l == q // l``, ...). A family packed in
documents (``documents=``) uses FlexAttention's document mask: an int32
document id per token and each document's start, ``doc[q] == doc[kv]`` and the
family's formula in positions counted from the document's start (the formula
of the document's own length where it depends on n). An expression of such
patterns (``a | b``, ``a & b``, ``a - b``, ``a + b``) composes its operands'
formulas (:func:`~sparse_patterns.algebra.expression_flex`). For any other
pattern (``within``, user layouts, ``local2d``) it reads a bit table of the
partial tiles built from the pattern's rows, chunk by chunk (two gathers,
quick to compile), or, when that table would be too big, binary-searches the
sorted CSR row (the whole CSR, under the memory limit; exact, but slow to
compile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..pattern import DENSE_LIMIT, Pattern
from ..patterns.formulas import DOCUMENT_FORMULAS_LIMIT, formula_of
from ..util.checks import check_choice, check_int
from ..util.stream import check_fits, chunk_rows, ordered_into
from ._common import head_plan

__all__ = [
    "to_flex_block_mask", "flex_mask_mod", "from_flex_block_mask", "flex_block_tensors",
    "MASK_IMPLS", "TILE_BITS_LIMIT", "DOCUMENT_FORMULAS_LIMIT",
]

#: how the mask_mod decides membership
MASK_IMPLS = ("auto", "formula", "csr")

# --------------------------------------------------------------- CSR lookup
#: most cells (partial tiles x block^2) the bit table of the generic mask_mod may hold
TILE_BITS_LIMIT = 1 << 28


def _row_chunks(pattern: Pattern, merged: bool, rows: int):
    """``(start, [rows of every head])`` or ``(start, [rows of the union])`` over row chunks."""
    for start, _, mats in pattern.iter_rows(rows):
        if merged and len(mats) > 1:
            u = mats[0]
            for m in mats[1:]:
                u = u + m
            mats = (u.tocsr(),)
        yield start, mats


def _tile_rule(pattern: Pattern, merged: bool, block: int) -> Callable[[Any, Any, Any], Any] | None:
    """``rule(k, q, kv)`` by a bit table of the partial tiles, or None when it is too big.

    ``tile[k, q // B, kv // B]`` names a tile: 0 (empty), 1 (full) or a partial
    tile whose ``B x B`` bits are packed 8 per byte. Two independent-depth
    gathers, so ``torch.compile`` lowers it quickly; memory is
    ``partial tiles x B^2 / 8`` bytes plus the int32 tile table. Built in two
    passes over row chunks (the pattern's rows, never its whole CSR): the
    first counts the pairs of every tile, the second sets the partial tiles' bits.
    """
    import torch  # noqa: PLC0415

    B = block
    n = pattern.n
    nb = -(-n // B)
    heads = 1 if merged else pattern.num_heads
    cdt = np.int32 if B * B < 2**31 else np.int64
    check_fits(f"block_size: the tile table of {pattern.name} at n={n:,}",
               (4 + np.dtype(cdt).itemsize) * heads * nb * nb + 9 * nb * nb,
               "a larger block_size or impl='formula'")
    sizes = np.full(nb, B, dtype=np.int64)
    sizes[-1] = n - B * (nb - 1)
    rows = chunk_rows(pattern)
    cnt = np.zeros((heads, nb, nb), dtype=cdt)  # set pairs a tile
    for start, mats in _row_chunks(pattern, merged, rows):
        b0 = start // B
        for k, m in enumerate(mats):
            r = np.repeat(np.arange(start, start + m.shape[0], dtype=np.int64) // B - b0,
                          np.diff(m.indptr))
            span = -(-(start + m.shape[0]) // B) - b0
            cnt[k, b0 : b0 + span] += np.bincount(r * nb + m.indices // B,
                                                  minlength=span * nb).reshape(span, nb).astype(cdt)
    area = np.multiply.outer(sizes, sizes)  # (nb, nb)
    tiles = np.zeros((heads, nb, nb), dtype=np.int32)
    W = -(-B // 8)  # bytes per tile row
    cells = B * W * 8  # bits of one tile
    nxt = 2
    for k in range(heads):
        full = cnt[k] == area
        tiles[k][full] = 1
        ids = np.flatnonzero((cnt[k] > 0) & ~full)
        tiles[k].reshape(-1)[ids] = nxt + np.arange(ids.size)
        nxt += ids.size
        if (nxt - 2) * cells > TILE_BITS_LIMIT:
            return None
    del cnt, area
    bits = np.zeros(nxt * cells, dtype=bool)
    bits[cells : 2 * cells] = True  # tile 1: full
    flat = tiles.reshape(heads, -1)
    for start, mats in _row_chunks(pattern, merged, rows):
        for k, m in enumerate(mats):
            r = np.repeat(np.arange(start, start + m.shape[0], dtype=np.int64), np.diff(m.indptr))
            cols = m.indices.astype(np.int64)
            t = flat[k, (r // B) * nb + cols // B].astype(np.int64)
            sel = t >= 2
            bits[(t[sel] * B + r[sel] % B) * W * 8 + cols[sel] % B] = True
    packed = np.packbits(bits, bitorder="little")  # (tiles * B * W,) uint8
    t_tiles = torch.from_numpy(flat.ravel())
    t_bits = torch.from_numpy(packed)

    def rule(k, q, kv):
        tile = t_tiles[(torch.as_tensor(k).to(torch.int64) * nb + q // B) * nb + kv // B]
        lc = kv % B
        byte = t_bits[(tile * B + q % B) * W + lc // 8].to(torch.int32)
        return ((byte >> (lc % 8)) & 1) == 1

    return rule


def _search_rule(mats: list[sp.csr_matrix], n: int) -> Callable[[Any, Any, Any], Any]:
    """``rule(k, q, kv)`` by binary search in the sorted CSR row (memory O(nnz)).

    Exact and fine in eager mode, but the chain of dependent gathers makes
    ``torch.compile`` slow (minutes); used only when the bit table is too big.
    """
    import torch  # noqa: PLC0415

    nnz = [int(m.nnz) for m in mats]
    total = sum(nnz)
    idx_dtype = np.int32 if total < 2**31 - 1 else np.int64
    indptr = np.empty((len(mats), n + 1), dtype=np.int64)
    off = 0
    for k, m in enumerate(mats):
        indptr[k] = m.indptr.astype(np.int64) + off
        off += nnz[k]
    indices = np.concatenate([m.indices for m in mats]).astype(idx_dtype) if total else np.zeros(
        1, dtype=idx_dtype
    )
    longest = max(int(np.diff(m.indptr).max()) for m in mats)
    steps = []
    s = 1
    while s <= longest:
        steps.append(s)
        s *= 2
    steps.reverse()
    t_indptr = torch.from_numpy(indptr.astype(idx_dtype).ravel())  # (p * (n + 1),)
    t_indices = torch.from_numpy(indices)  # (nnz,)
    last = max(total - 1, 0)

    def rule(k, q, kv):
        row = torch.as_tensor(k).to(torch.int64) * (n + 1) + q
        lo = t_indptr[row]
        hi = t_indptr[row + 1]
        pos = lo
        for st in steps:  # lower bound of kv in indices[lo:hi], depth log2(longest row)
            cand = pos + st
            ok = (cand <= hi) & (t_indices[torch.clamp(cand - 1, 0, last)] < kv)
            pos = torch.where(ok, cand, pos)
        return (pos < hi) & (t_indices[torch.clamp(pos, 0, last)] == kv)

    return rule


def _csr_rule(pattern: Pattern, merged: bool, block: int) -> Callable[[Any, Any, Any], Any]:
    rule = _tile_rule(pattern, merged, block)
    if rule is not None:
        return rule
    # the binary search needs the whole CSR (pattern.heads checks the memory limit)
    return _search_rule([pattern.union()] if merged else list(pattern.heads), pattern.n)


# --------------------------------------------------------------- public
def flex_mask_mod(
    pattern: Pattern,
    *,
    mode: str = "multihead",
    num_heads: int | None = None,
    impl: str = "auto",
    block_size: int = 128,
) -> Callable[..., Any]:
    """The FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` of a pattern.

    Parameters
    ----------
    pattern : Pattern
    mode : {"multihead", "merged"}
        ``"multihead"``: attention head ``h`` uses pattern head ``h mod p``;
        ``"merged"``: every head uses the union.
    num_heads : int, optional
        Only validated here (the mapping is ``h mod p`` for any ``H``).
    impl : {"auto", "formula", "csr"}
        ``"formula"``: arithmetic in the family's parameters (registered
        families whose heads are exactly what their name and params generate;
        local2d has none), inside each document for a packed pattern (a
        document-id tensor; at most :data:`DOCUMENT_FORMULAS_LIMIT` distinct
        per-length formulas), and composed for expressions of such patterns;
        ``"csr"``, for any pattern: a bit table of the
        partial ``block_size`` tiles built from the CSR (a binary search in the
        CSR rows when that table would pass ``TILE_BITS_LIMIT`` cells);
        ``"auto"``: formula when there is one, else csr.
    block_size : int
        Tile size of the csr bit table (use the BlockMask's).

    Returns
    -------
    callable
        ``mask_mod(b, h, q_idx, kv_idx) -> torch.bool tensor``, traceable by
        ``torch.compile`` and exact at every position.

    Examples
    --------
    >>> import torch
    >>> from sparse_patterns import make
    >>> mm = flex_mask_mod(make("strided", 16, stride=4))
    >>> q, kv = torch.tensor(9), torch.arange(16)
    >>> mm(0, torch.tensor(1), q, kv).nonzero().ravel().tolist()  # head A2
    [1, 5, 9]
    >>> mm = flex_mask_mod(make("strided", 8, stride=2, documents=[3, 5]))
    >>> mm(0, torch.tensor(1), torch.tensor(7), torch.arange(8)).nonzero().ravel().tolist()
    [3, 5, 7]
    """
    import torch  # noqa: PLC0415

    impl = check_choice("impl", impl, MASK_IMPLS)
    block_size = check_int("block_size", block_size, 1)
    mode, plan = head_plan(pattern, mode, num_heads)
    n = pattern.n
    p = pattern.num_heads
    rules = formula_of(pattern) if impl in ("auto", "formula") else None
    if impl == "formula" and rules is None:
        raise ValueError(
            f"impl: no formula for pattern {pattern.name!r} (a registered family whose heads "
            "match its params is needed); use impl='csr' or 'auto'"
        )
    if rules is not None:
        if mode == "merged" or p == 1:

            def mask_mod(b, h, q_idx, kv_idx):
                out = rules[0](q_idx, kv_idx)
                for r in rules[1:]:
                    out = out | r(q_idx, kv_idx)
                return out & (kv_idx < n)

        else:

            def mask_mod(b, h, q_idx, kv_idx):
                ph = torch.remainder(h, p)
                out = (ph == 0) & rules[0](q_idx, kv_idx)
                for k in range(1, p):
                    out = out | ((ph == k) & rules[k](q_idx, kv_idx))
                return out & (kv_idx < n)

        return mask_mod

    if mode == "merged" or p == 1:
        look = _csr_rule(pattern, True, block_size)

        def mask_mod(b, h, q_idx, kv_idx):
            inside = (q_idx < n) & (kv_idx < n)
            return look(0, torch.clamp(q_idx, 0, n - 1), torch.clamp(kv_idx, 0, n - 1)) & inside

    else:
        look = _csr_rule(pattern, False, block_size)

        def mask_mod(b, h, q_idx, kv_idx):
            inside = (q_idx < n) & (kv_idx < n)
            q, kv = torch.clamp(q_idx, 0, n - 1), torch.clamp(kv_idx, 0, n - 1)
            return look(torch.remainder(h, p), q, kv) & inside

    return mask_mod


#: the BlockMask tensors :func:`flex_block_tensors` builds: (prefix, full tiles?, transposed?)
_TENSORS = (("kv", False, False), ("full_kv", True, False), ("q", False, True), ("full_q", True, True))


def flex_block_tensors(
    pattern: Pattern,
    *,
    mode: str = "multihead",
    num_heads: int | None = None,
    block_size: int = 128,
    transposed: bool = True,
) -> dict[str, np.ndarray]:
    """The index tensors of the FlexAttention ``BlockMask`` of a pattern, as NumPy arrays.

    ``kv_num_blocks`` int32 ``(1, H, nb)`` and ``kv_indices`` int32
    ``(1, H, nb, nb)`` list the partial tiles of every query block row (set
    columns ascending, then the others, as ``BlockMask`` stores them);
    ``full_kv_*`` the full tiles; with ``transposed``, ``q_*`` and
    ``full_q_*`` the same per key block column (what ``BlockMask.from_kv_blocks``
    derives, here without its dense transposes). Built from the block layout
    (:meth:`Pattern.to_blocks`: closed form for a generated pattern, else
    streamed rows), never from the whole CSR; the size is checked against
    :func:`sparse_patterns.config.get_memory_limit` before anything is allocated.

    Parameters
    ----------
    pattern, mode, num_heads, block_size
        As for :func:`to_flex_block_mask`.
    transposed : bool
        Also build the ``q_*`` tensors (the backward pass needs them).

    Returns
    -------
    dict of str to numpy.ndarray

    Raises
    ------
    MemoryLimitError
        (a ``ValueError``) when the tensors would pass the memory limit.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> t = flex_block_tensors(make("strided", 16, stride=4), block_size=4, transposed=False)
    >>> t["kv_num_blocks"][0, 1].tolist(), t["kv_indices"][0, 1, 1].tolist()  # head A2
    ([1, 2, 3, 4], [0, 1, 2, 3])
    """
    block_size = check_int("block_size", block_size, 1)
    _, plan = head_plan(pattern, mode, num_heads)
    names = _TENSORS if transposed else _TENSORS[:2]
    nb = -(-pattern.n // block_size)
    cells = nb * nb
    check_fits(
        f"block_size: the BlockMask of {pattern.name} at n={pattern.n:,} with {nb:,} blocks a side",
        cells * (2 * pattern.num_heads + 2 + 4 * len(names) * len(plan)),
        "a larger block_size",
    )
    bl = pattern.to_blocks(block_size)
    lay, full = bl.layout, bl.full  # (p, nb, nb)
    if -1 in plan:  # the union: OR of the layouts, OR of the full tiles
        u_full = full.any(axis=0)
        u_part = lay.any(axis=0) & ~u_full
    out: dict[str, np.ndarray] = {}
    for prefix, is_full, transpose in names:
        num = np.empty((1, len(plan), nb), dtype=np.int32)
        idx = np.empty((1, len(plan), nb, nb), dtype=np.int32)
        first: dict[int, int] = {}
        for h, k in enumerate(plan):
            if k in first:  # another attention head on the same pattern head
                num[0, h], idx[0, h] = num[0, first[k]], idx[0, first[k]]
                continue
            first[k] = h
            if k < 0:
                sel = u_full if is_full else u_part
            else:
                sel = full[k] if is_full else lay[k] & ~full[k]
            ordered_into(sel.T if transpose else sel, num[0, h], idx[0, h])
        out[f"{prefix}_num_blocks"], out[f"{prefix}_indices"] = num, idx
    return out


def to_flex_block_mask(
    pattern: Pattern,
    *,
    mode: str = "multihead",
    num_heads: int | None = None,
    block_size: int = 128,
    impl: str = "auto",
) -> Any:
    """A FlexAttention ``BlockMask`` for the pattern, built from its block layout.

    The layout (which tiles hold a pair, which are full) comes from
    :meth:`Pattern.to_blocks` (the CSR's block counts, or the generator's
    closed form): full tiles go to ``full_kv_*`` and skip the ``mask_mod``,
    partial tiles to ``kv_*`` and evaluate it (see :func:`flex_mask_mod`). No
    dense n x n mask is built, unlike ``create_block_mask``; the BlockMask's
    own tensors are ``(1, H, nb, nb)`` int32.

    Parameters
    ----------
    pattern : Pattern
    mode : {"multihead", "merged"}
        ``"multihead"``: attention head ``h`` uses pattern head ``h mod p``;
        ``"merged"``: every head uses the union of the heads.
    num_heads : int, optional
        ``H``, the query heads of the ``flex_attention`` call: ``p``
        (multihead) or 1 (merged, broadcast over heads) by default.
    block_size : int
        FlexAttention's tile size (128 by default; the kernel's Q and KV block).
    impl : {"auto", "formula", "csr"}
        How the ``mask_mod`` decides membership (see :func:`flex_mask_mod`).

    Returns
    -------
    torch.nn.attention.flex_attention.BlockMask
        Shape ``(1, H, n, n)``; ``flex_attention(q, k, v, block_mask=bm)``
        with ``q`` of shape ``(B, H, n, d)`` attends exactly the pattern.

    Raises
    ------
    ValueError
        Bad mode, num_heads, block_size or impl.

    See Also
    --------
    from_flex_block_mask : the way back.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> bm = to_flex_block_mask(make("strided", 16, stride=4), block_size=4)
    >>> bm.shape
    (1, 2, 16, 16)
    >>> bm.kv_num_blocks[0, 1].tolist(), bm.full_kv_num_blocks[0, 1].tolist()  # head A2
    ([1, 2, 3, 4], [0, 0, 0, 0])
    >>> bm.kv_num_blocks[0, 0].tolist(), bm.full_kv_num_blocks[0, 0].tolist()  # head A1
    ([1, 2, 2, 2], [0, 0, 0, 0])
    """
    import torch  # noqa: PLC0415
    from torch.nn.attention.flex_attention import BlockMask  # noqa: PLC0415

    block_size = check_int("block_size", block_size, 1)
    mask_mod = flex_mask_mod(pattern, mode=mode, num_heads=num_heads, impl=impl,
                             block_size=block_size)
    t = {k: torch.from_numpy(v) for k, v in flex_block_tensors(
        pattern, mode=mode, num_heads=num_heads, block_size=block_size).items()}
    n = pattern.n
    kv = (t["kv_num_blocks"], t["kv_indices"], t["full_kv_num_blocks"], t["full_kv_indices"])
    try:  # the q_* tensors are ours: no dense (nb, nb) transposes inside torch
        bm = BlockMask.from_kv_blocks(*kv, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                      seq_lengths=(n, n), compute_q_blocks=False)
    except TypeError:  # a torch without compute_q_blocks derives them itself (same values)
        return BlockMask.from_kv_blocks(*kv, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                        seq_lengths=(n, n))
    bm.q_num_blocks, bm.q_indices = t["q_num_blocks"], t["q_indices"]
    bm.full_q_num_blocks, bm.full_q_indices = t["full_q_num_blocks"], t["full_q_indices"]
    return bm


def from_flex_block_mask(
    block_mask: Any, *, batch: int = 0, name: str = "flex", limit: int = DENSE_LIMIT
) -> Pattern:
    """The token-level Pattern a FlexAttention ``BlockMask`` attends.

    Full blocks contribute all their pairs; partial blocks the pairs where the
    ``mask_mod`` is True (evaluated tile by tile, never on blocks the mask
    skips). Works for any BlockMask, e.g. one from ``create_block_mask``.

    Parameters
    ----------
    block_mask : BlockMask
    batch : int
        Which batch entry to read.
    name : str
        Name of the returned pattern.
    limit : int
        Largest number of mask evaluations (cells of partial tiles) allowed.

    Returns
    -------
    Pattern
        One head per BlockMask head; ``causal`` inferred.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("fixed", 16, stride=4, c=1)
    >>> from_flex_block_mask(to_flex_block_mask(pat, block_size=4)) == pat
    True
    """
    import torch  # noqa: PLC0415

    q_len, kv_len = block_mask.seq_lengths
    if q_len != kv_len:
        raise ValueError(f"block_mask: must be square, got seq_lengths {block_mask.seq_lengths}")
    n = int(q_len)
    bq, bk = block_mask.BLOCK_SIZE
    kv_num = block_mask.kv_num_blocks
    B, H = kv_num.shape[0], kv_num.shape[1]
    batch = check_int("batch", batch, 0, B - 1)
    sets = [(block_mask.kv_num_blocks, block_mask.kv_indices, False)]
    if block_mask.full_kv_num_blocks is not None:
        sets.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices, True))
    nbq = -(-n // bq)
    cells = sum(int(num[batch, :, :nbq].sum()) for num, _, is_full in sets if not is_full) * bq * bk
    if cells > limit:
        raise ValueError(
            f"block_mask: evaluating the partial blocks needs {cells:,} mask cells; "
            f"the limit is {limit:,}"
        )
    mm = block_mask.mask_mod
    heads = []
    b_t = torch.tensor(batch)
    for h in range(H):
        h_t = torch.tensor(h)
        rows_i: list[np.ndarray] = []
        cols_j: list[np.ndarray] = []
        for qb in range(nbq):
            q0, q1 = qb * bq, min((qb + 1) * bq, n)
            for num, idx, is_full in sets:
                cnt = int(num[batch, h, qb])
                for kb in idx[batch, h, qb, :cnt].tolist():
                    k0, k1 = kb * bk, min((kb + 1) * bk, n)
                    if k0 >= n:
                        continue
                    qs = torch.arange(q0, q1)[:, None]
                    ks = torch.arange(k0, k1)[None, :]
                    if is_full:
                        tile = np.ones((q1 - q0, k1 - k0), dtype=bool)
                    else:
                        tile = torch.broadcast_to(mm(b_t, h_t, qs, ks), (q1 - q0, k1 - k0))
                        tile = tile.numpy()
                    r, c = np.nonzero(tile)
                    rows_i.append(r + q0)
                    cols_j.append(c + k0)
        r = np.concatenate(rows_i) if rows_i else np.empty(0, dtype=np.int64)
        c = np.concatenate(cols_j) if cols_j else np.empty(0, dtype=np.int64)
        m = sp.csr_matrix((np.ones(r.size, dtype=bool), (r, c)), shape=(n, n))
        heads.append(m)
    causal = all(not (sp.triu(m, 1).nnz) for m in heads)
    return Pattern(heads, name=name, causal=causal)
