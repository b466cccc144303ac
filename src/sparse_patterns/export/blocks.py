"""Block layouts for block-sparse attention libraries: DeepSpeed sparse
attention, xformers' BlockSparseAttention, Triton's blocksparse ops
(``int64 (H, nb, nb)``) and MIT Han Lab's Block-Sparse-Attention /
FlashAttention-style boolean block masks ``(B, H, nb, nb)`` with 128-token
blocks; and the way back, from a layout to a token-level :class:`Pattern`.

Token -> block is max-pooling (a block is set when any of its token pairs is);
block -> token is the Kronecker expansion, cropped to ``n``, followed by the
causal token mask ``j <= i`` for unidirectional layouts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..pattern import BlockLayout, Pattern
from ..util.checks import MAX_N, check_bool, check_choice, check_int
from ..util.stream import check_fits
from ._common import head_layouts, head_plan, to_torch
from .formats import LAYOUT_FORMATS

__all__ = [
    "LAYOUT_FORMATS", "to_block_layout", "from_block_layout", "to_bsa_mask", "from_bsa_mask",
    "BSA_BLOCK", "expansion_pairs", "expansion_bytes",
]

#: Block-Sparse-Attention's fixed block size in tokens
BSA_BLOCK = 128


def to_block_layout(
    pattern: Pattern,
    block: int,
    *,
    format: str = "deepspeed",
    mode: str = "multihead",
    num_heads: int | None = None,
) -> Any:
    """The block layout ``int64 (H, nb, nb)`` a block-sparse library consumes.

    Block ``(h, I, J)`` is 1 when some token pair of tile ``(I, J)`` is set in
    the pattern head that attention head ``h`` uses (max-pooling), with
    ``nb = ceil(n / block)``. DeepSpeed (``SparseSelfAttention`` /
    ``SparsityConfig.make_layout``), xformers (``BlockSparseAttention(layout=...)``)
    and Triton's ``blocksparse`` ops all take this tensor (``torch.long``);
    they want ``n`` padded to ``nb * block`` and, in practice, ``block`` in
    16, 32, 64 or 128.

    A block layout is coarser than the token pattern: the kernel computes
    every token pair of a set block. For a causal pattern, run the kernel
    with its token-level causal mask (DeepSpeed ``attention="unidirectional"``
    applies one; xformers and Triton take ``causal=True`` / an attention
    mask): the layout expanded and then causally masked is exactly what the
    kernel computes, :func:`from_block_layout` rebuilds it, and it equals the
    pattern whenever the pattern is block-aligned (every set block full once
    causally masked, as for ``fixed`` with ``stride`` a multiple of ``block``
    and ``c`` a multiple of ``block``, or ``bigbird`` with the same block).

    DeepSpeed's own ``FixedSparsityConfig(attention="unidirectional")`` keeps a
    few blocks above the diagonal (the summary blocks of the current chunk)
    and relies on that token-level causal mask to drop them; our layout never
    has blocks above the diagonal for a causal pattern, and ours plus the
    causal mask is the exact token pattern wherever the pattern is
    block-aligned.

    Parameters
    ----------
    pattern : Pattern
    block : int
        Block size in tokens, ``>= 1``.
    format : {"deepspeed", "xformers", "triton"}
        The target library (the tensor is the same; the name documents intent).
    mode : {"multihead", "merged"}
        ``"multihead"``: attention head ``h`` uses pattern head ``h mod p``;
        ``"merged"``: every attention head uses the union of the heads.
    num_heads : int, optional
        ``H``: ``p`` for multihead, 1 for merged by default.

    Returns
    -------
    torch.Tensor
        ``torch.int64`` of shape ``(H, nb, nb)``, entries 0 or 1.

    Raises
    ------
    ValueError
        Unknown format or mode, ``block < 1``, ``num_heads < 1``.

    See Also
    --------
    from_block_layout : the way back.
    sparse_patterns.Pattern.to_blocks : the same max-pooling, as a BlockLayout.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> lay = to_block_layout(make("fixed", 16, stride=8, c=4), 4)
    >>> lay.shape, lay.dtype
    (torch.Size([2, 4, 4]), torch.int64)
    >>> lay[1].tolist()  # the summary head: blocks 1 and 3 (columns 4-7, 12-15)
    [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 1]]
    """
    import torch  # noqa: PLC0415

    check_choice("format", format, LAYOUT_FORMATS)
    block = check_int("block", block, 1)
    _, plan = head_plan(pattern, mode, num_heads)
    lay, _ = head_layouts(pattern, block, plan, out_bytes=8)  # (H, nb, nb)
    return to_torch(lay, torch.int64)


def _layout_array(layout: Any, name: str) -> np.ndarray:
    """A NumPy ``(H, nb, nb)`` 0/1 array from a tensor, array or nested list."""
    if hasattr(layout, "detach") and hasattr(layout, "cpu"):
        layout = layout.detach().cpu().numpy()
    a = np.asarray(layout)
    if a.dtype == np.object_ or not (
        np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_ or np.issubdtype(a.dtype, np.floating)
    ):
        raise ValueError(f"{name}: expected an integer or boolean array, got dtype {a.dtype}")
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[1] != a.shape[2]:
        raise ValueError(f"{name}: expected shape (H, nb, nb) or (nb, nb), got {np.shape(a)}")
    if a.shape[0] < 1:
        raise ValueError(f"{name}: needs at least one head, got shape {a.shape}")
    if a.dtype != np.bool_:
        if not np.isin(a, (0, 1)).all():
            raise ValueError(f"{name}: entries must be 0 or 1")
        a = a.astype(bool)
    return a


def expansion_pairs(layout: np.ndarray, block: int, n: int, causal: bool) -> list[int]:
    """The token pairs each head of a ``(H, nb, nb)`` layout expands to, counted exactly.

    A set tile ``(I, J)`` holds ``size(I) * size(J)`` pairs, ``size`` being
    the block's tokens cropped to ``n``; with ``causal``, tiles above the
    diagonal hold none and a diagonal tile ``size(I) * (size(I) + 1) / 2``.
    Any non-zero entry counts as set. Read in chunks of block rows (about
    ``2**20`` cells at a time), so counting costs no ``(H, nb, nb)`` array.

    Examples
    --------
    >>> expansion_pairs(np.array([[[1, 0], [1, 1]]]), 2, 3, causal=True)  # 3 + 2 + 1
    [6]
    >>> expansion_pairs(np.ones((2, 2, 2), dtype=bool), 2, 3, causal=False)
    [9, 9]
    """
    H, nb = layout.shape[0], layout.shape[-1]
    sizes = np.minimum(block, n - np.arange(nb, dtype=np.int64) * block)  # tokens per block
    out = [0] * H
    step = max(1, (1 << 20) // max(1, H * nb))
    cols = np.arange(nb)
    for i0 in range(0, nb, step):
        i1 = min(nb, i0 + step)
        part = layout[:, i0:i1, :] != 0  # (H, m, nb)
        rows = np.arange(i0, i1)
        if causal:
            below = part & (cols[None, :] < rows[:, None])[None]  # whole tiles J < I
            diag = part[:, rows - i0, rows]  # (H, m)
            per = (below @ sizes) * sizes[i0:i1] + diag * (sizes[i0:i1] * (sizes[i0:i1] + 1) // 2)
        else:
            per = (part @ sizes) * sizes[i0:i1]
        for h, v in enumerate(per.sum(axis=1).tolist()):
            out[h] += int(v)
    return out


def expansion_bytes(layout: np.ndarray, pairs: list[int], n: int) -> int:
    """Bytes that expanding ``layout`` (with :func:`expansion_pairs` ``pairs`` a head)
    to a Pattern allocates at its peak (an upper estimate).

    The 0/1 layout checked and copied (about 12 bytes a cell), every head's
    CSR (an index and a bool a pair, one index a token; measured with the
    allocator's slack: 13 bytes a pair), and, in passing, the largest head's
    expansion and causal check (about 9 more bytes a pair and 36 a token).

    Examples
    --------
    >>> expansion_bytes(np.ones((1, 2, 2), dtype=bool), [9], 3)
    386
    """
    kept, passing = 0, 0
    for p in pairs:
        dt = 4 if max(n, p) < 2**31 - 1 else 8
        kept += p * (dt + 9) + 2 * (n + 1) * dt
        passing = max(passing, 9 * p + 36 * n)
    return 12 * int(np.prod(layout.shape, dtype=object)) + kept + passing


def from_block_layout(
    layout: Any,
    block: int,
    n: int,
    *,
    causal: bool = True,
    name: str = "blocks",
) -> Pattern:
    """Turn a block layout ``(H, nb, nb)`` back into a token-level Pattern.

    Every set block is expanded to all its token pairs (Kronecker expansion,
    cropped to ``n``); with ``causal=True`` the causal token mask ``j <= i`` is
    applied afterwards, which is what a block-sparse kernel run with its
    causal mask computes (so DeepSpeed's unidirectional Fixed layout, whose
    few blocks above the diagonal the mask removes, imports exactly).

    Parameters
    ----------
    layout : torch.Tensor or array_like
        ``(H, nb, nb)`` or ``(nb, nb)``, entries 0/1 (any integer or bool dtype).
    block : int
        Block size in tokens.
    n : int
        Sequence length; ``nb`` must equal ``ceil(n / block)``.
    causal : bool
        Apply the causal token mask after the expansion.
    name : str
        Name of the returned pattern.

    Returns
    -------
    Pattern
        ``H`` heads, ``params={"block": block}``.

    Raises
    ------
    ValueError
        A shape, dtype or value that is not a 0/1 ``(H, nb, nb)`` layout, or
        ``nb != ceil(n / block)``.
    MemoryLimitError
        (a ``ValueError``) When the expansion (its token pairs counted
        first, :func:`expansion_pairs`) would pass the memory limit.

    Examples
    --------
    >>> import numpy as np
    >>> pat = from_block_layout(np.array([[1, 0], [1, 1]]), 2, 4)
    >>> print(pat.to_string())
    #...
    ##..
    ###.
    ####
    """
    block = check_int("block", block, 1)
    n = check_int("n", n, 1, MAX_N)
    causal = check_bool("causal", causal)
    if hasattr(layout, "detach") and hasattr(layout, "cpu"):
        layout = layout.detach().cpu().numpy()
    raw = np.asarray(layout)
    nb = -(-n // block)
    if raw.ndim in (2, 3) and raw.shape[-1] == raw.shape[-2] == nb and raw.dtype != np.object_:
        lay3 = raw[None] if raw.ndim == 2 else raw
        pairs = expansion_pairs(lay3, block, n, causal)
        check_fits(f"layout: expanding {lay3.shape[0]} heads of {nb:,} x {nb:,} blocks of "
                   f"{block:,} tokens to {sum(pairs):,} token pairs",
                   expansion_bytes(lay3, pairs, n), "a smaller n or layout")
    lay = _layout_array(raw, "layout")
    if lay.shape[1] != nb:
        raise ValueError(
            f"layout: has nb={lay.shape[1]} blocks per side but ceil(n / block) = "
            f"ceil({n} / {block}) = {nb}"
        )
    return Pattern.from_blocks(BlockLayout(lay, block=block, n=n), causal=causal, name=name)


def to_bsa_mask(
    pattern: Pattern,
    *,
    batch: int = 1,
    mode: str = "multihead",
    num_heads: int | None = None,
    block: int = BSA_BLOCK,
) -> Any:
    """Boolean block mask ``(B, H, nb, nb)`` for Block-Sparse-Attention.

    MIT Han Lab's ``block_sparse_attn_func(..., head_mask_type, streaming_info,
    base_blockmask, ...)`` takes ``base_blockmask`` of shape
    ``(batch, num_blockmask_heads, ceil(n/128), ceil(n/128))`` and, per query
    head, ``head_mask_type[h] = k`` to use ``base_blockmask[:, k - 1]``; pass
    ``head_mask_type = torch.arange(1, H + 1, dtype=torch.int32)`` with this
    mask, and ``is_causal=True`` for a causal pattern (the kernel then masks
    ``j > i`` inside the diagonal blocks). FlashAttention's block-sparse
    interface takes the same ``(nb, nb)`` 0/1 block mask per head.

    Parameters
    ----------
    pattern : Pattern
    batch : int
        ``B``, the number of identical copies along the batch axis.
    mode : {"multihead", "merged"}
        As in :func:`to_block_layout`.
    num_heads : int, optional
        ``H``; ``p`` (multihead) or 1 (merged) by default.
    block : int
        Block size; the library uses 128.

    Returns
    -------
    torch.Tensor
        ``torch.bool`` of shape ``(B, H, nb, nb)``.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> m = to_bsa_mask(make("local", 300, window=10))
    >>> m.shape, m.dtype
    (torch.Size([1, 1, 3, 3]), torch.bool)
    >>> m[0, 0].int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    import torch  # noqa: PLC0415

    batch = check_int("batch", batch, 1, 1 << 16)
    block = check_int("block", block, 1)
    _, plan = head_plan(pattern, mode, num_heads)
    lay, _ = head_layouts(pattern, block, plan, out_bytes=2 * batch)  # (H, nb, nb)
    t = to_torch(lay, torch.bool)
    return t.unsqueeze(0).expand(batch, *t.shape).contiguous()


def from_bsa_mask(
    mask: Any, n: int, *, causal: bool = True, batch: int = 0, block: int = BSA_BLOCK
) -> Pattern:
    """Token-level Pattern of one batch entry of a Block-Sparse-Attention mask.

    Parameters
    ----------
    mask : torch.Tensor or array_like
        ``(B, H, nb, nb)`` boolean block mask.
    n : int
        Sequence length (``nb == ceil(n / block)``).
    causal : bool
        Whether the kernel runs with ``is_causal=True``.
    batch : int
        Which batch entry to read.
    block : int
        Block size (128 in the library).

    Returns
    -------
    Pattern

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("bigbird", 512, block=128, random_blocks=0)
    >>> from_bsa_mask(to_bsa_mask(pat), 512) == pat
    True
    """
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    a = np.asarray(mask)
    if a.ndim != 4:
        raise ValueError(f"mask: expected shape (B, H, nb, nb), got {a.shape}")
    batch = check_int("batch", batch, 0, a.shape[0] - 1)
    return from_block_layout(a[batch], block, n, causal=causal)
