"""Shared helpers of the exporters: which pattern head each attention head uses,
and the block layout (set / full blocks) of those heads, from the CSR or the
generator's closed form, never from a dense n x n mask."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..pattern import KERNEL_MODES, BlockLayout, Pattern
from ..util.checks import check_choice, check_int
from ..util.stream import check_fits

__all__ = ["head_plan", "head_layouts", "to_torch"]


def head_plan(pattern: Pattern, mode: str, num_heads: int | None) -> tuple[str, list[int]]:
    """Validate ``mode`` / ``num_heads`` and say which pattern head each attention head uses.

    Returns ``(mode, plan)``: for ``"multihead"``, ``plan[h] = h mod p`` for the
    ``H`` attention heads (``H = p`` by default); for ``"merged"`` every entry is
    ``-1``, meaning the union of the heads (``H = 1`` by default, which
    broadcasts over any number of heads).
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    mode = check_choice("mode", mode, KERNEL_MODES)
    p = pattern.num_heads
    if num_heads is None:
        num_heads = p if mode == "multihead" else 1
    num_heads = check_int("num_heads", num_heads, 1, 1 << 16)
    if mode == "multihead":
        return mode, [h % p for h in range(num_heads)]
    return mode, [-1] * num_heads


def head_layouts(
    pattern: Pattern, block: int, plan: list[int], out_bytes: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(layout, full)``, bool ``(H, nb, nb)`` each, for the heads of ``plan``.

    A merged head (``-1``) is the OR of the heads' layouts (exactly the
    max-pooling of the union); its full blocks are the OR of the heads' full
    blocks, a subset of the union's full blocks (safe: a full block marked
    partial only costs a mask evaluation). The block layout comes from
    :meth:`Pattern.to_blocks` (closed form, or streamed rows); its size, with
    ``out_bytes`` more per cell of ``(H, nb, nb)`` for the caller's tensor, is
    checked against the memory limit before anything is allocated.
    """
    nb = -(-pattern.n // block)
    check_fits(
        f"block: the block layout of {pattern.name} at n={pattern.n:,} with {nb:,} blocks a side",
        nb * nb * (2 * pattern.num_heads + 2 + (2 + out_bytes) * len(plan)),
        "a larger block",
    )
    bl: BlockLayout = pattern.to_blocks(block)
    lay, full = bl.layout, bl.full  # (p, nb, nb)
    uses_union = any(k < 0 for k in plan)
    if uses_union:
        u_lay = lay.any(axis=0)
        u_full = full.any(axis=0)
    out_lay = np.empty((len(plan), bl.nb, bl.nb), dtype=bool)
    out_full = np.empty_like(out_lay)
    for h, k in enumerate(plan):
        out_lay[h] = u_lay if k < 0 else lay[k]
        out_full[h] = u_full if k < 0 else full[k]
    return out_lay, out_full


def to_torch(a: np.ndarray, dtype: Any) -> Any:
    """A torch tensor of ``dtype`` from a NumPy array (torch imported here)."""
    import torch  # noqa: PLC0415

    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)
