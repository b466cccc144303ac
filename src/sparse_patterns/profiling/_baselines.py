"""The baselines the profiler times beside our kernel: torch's
``scaled_dot_product_attention`` (``is_causal=True`` for a causal pattern, a
dense boolean mask otherwise) and FlexAttention compiled on the CPU with a
``BlockMask`` built from the pattern's CSR. Each runner comes back as a
zero-argument callable, whether it computes the pattern's own function, and a
note saying what was run. torch is passed in, never imported at module level."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..pattern import DENSE_LIMIT, Pattern

__all__ = ["BASELINES", "FLEX_BLOCK", "sdpa_runner", "flex_runner", "flex_block_mask"]

#: Baselines :func:`~sparse_patterns.profiling.profile` knows: torch SDPA and FlexAttention (compiled, CPU).
BASELINES = ("sdpa", "flex")
#: FlexAttention's block size on the CPU.
FLEX_BLOCK = 128

Runner = tuple[Callable[[], Any] | None, bool, str]


def sdpa_runner(torch: Any, pattern: Pattern, groups: Sequence[sp.csr_matrix], heads: int,
                scale: float, tq: Any, tk: Any, tv: Any, *,
                dense_limit: int = DENSE_LIMIT) -> Runner:
    """``(fn or None, same function as the pattern?, note)`` for torch SDPA.

    A causal pattern runs ``is_causal=True`` (the same function only when the
    pattern is dense causal); a pattern with every pair runs unmasked; any
    other gets a dense boolean mask of its ``groups`` (the CSR each attention
    head uses), skipped when that mask would exceed ``dense_limit`` cells.
    """
    F = torch.nn.functional.scaled_dot_product_attention
    n = pattern.n
    if pattern.causal:
        same = all(g.nnz == n * (n + 1) // 2 for g in groups)
        note = "is_causal=True" + ("" if same else " (dense causal work, not this pattern)")
        return (lambda: F(tq, tk, tv, is_causal=True, scale=scale)), same, note
    if all(g.nnz == n * n for g in groups):
        return (lambda: F(tq, tk, tv, scale=scale)), True, "no mask (every pair)"
    G = len(groups)
    cells = (heads if G > 1 else 1) * n * n
    if cells > dense_limit:
        return None, False, (
            f"skipped: a dense boolean mask would take {cells / 2**30:.2f} GiB "
            f"({cells:,} cells; the limit is {dense_limit:,})"
        )
    mask = torch.zeros((G, n, n), dtype=torch.bool)
    for gi, g in enumerate(groups):
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.indptr))
        mask[gi][torch.from_numpy(rows), torch.from_numpy(g.indices.astype(np.int64))] = True
    mask = mask[torch.arange(heads) % G][None] if G > 1 else mask[None]
    return (lambda: F(tq, tk, tv, attn_mask=mask, scale=scale)), True, "dense boolean mask"


def flex_block_mask(pattern: Pattern, mode: str, heads: int, block: int) -> Any:
    """The pattern's FlexAttention ``BlockMask``, from its CSR (no n x n mask).

    :func:`sparse_patterns.export.to_flex_block_mask`: full and partial blocks
    separated, a ``mask_mod`` evaluated on partial blocks only. In merged mode one
    mask head broadcasts over the attention heads.
    """
    from ..export import to_flex_block_mask  # noqa: PLC0415

    return to_flex_block_mask(pattern, mode=mode, num_heads=heads if mode == "multihead" else None,
                              block_size=block)


def flex_runner(torch: Any, pattern: Pattern, mode: str, heads: int, scale: float,
                tq: Any, tk: Any, tv: Any) -> Runner:
    """``(fn, True, note)`` for FlexAttention compiled on the pattern's ``BlockMask``."""
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415

    t0 = time.perf_counter()
    bm = flex_block_mask(pattern, mode, heads, FLEX_BLOCK)
    t_mask = time.perf_counter() - t0
    torch._dynamo.reset()  # one compiled graph per shape: no recompile limit, honest compile time
    fa = torch.compile(flex_attention, dynamic=False)
    kept = 100.0 - float(bm.sparsity())
    note = f"compiled, BlockMask {FLEX_BLOCK}-blocks {kept:.0f}% kept, built in {t_mask:.2f} s"
    return (lambda: fa(tq, tk, tv, block_mask=bm, scale=scale)), True, note
