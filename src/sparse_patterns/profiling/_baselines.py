"""The baselines the profiler times beside our kernel: torch's
``scaled_dot_product_attention`` (``is_causal=True`` for a causal pattern, a
dense boolean mask otherwise; the flash backend on a GPU where the dtype allows)
and FlexAttention compiled, on the inputs' device, with a ``BlockMask`` in natural
token order built from the pattern's CSR. Each runner comes back as a
zero-argument callable, whether it computes the pattern's own function, and a
note saying what was run. torch is passed in, never imported at module level.

Before a baseline is built, :func:`baseline_bytes` estimates the memory it
would take beyond the shared ``q, k, v``; the profiler skips it, with a note,
when that exceeds :func:`sparse_patterns.config.get_memory_limit`. The
estimates, stated so that they can be checked:

* SDPA without a mask (``is_causal=True``, or a pattern with every pair) runs
  torch's fused CPU kernel, which holds no ``n x n`` scores: its output plus a
  float32 log-sum-exp per query row.
* SDPA with a mask runs the math path, which materializes the scores and their
  softmax (``2 * B * H * n * n`` elements of the input dtype, at least 4 bytes
  each), plus the boolean mask we build (``G * n * n``, ``G`` the mask heads) and
  its copy broadcast to ``H`` heads, plus the output.
* FlexAttention holds its ``BlockMask`` (four int32 ``(G, nb, nb)`` index arrays,
  ``nb = ceil(n / 128)``, ``G`` one in merged mode, ``H`` in multihead mode) and
  the output with its float32 log-sum-exp; its compiled kernel works in tiles.
* Checking a baseline keeps its output for the comparison with ours: one more
  output, counted above."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..pattern import DENSE_LIMIT, Pattern

__all__ = ["BASELINES", "FLEX_BLOCK", "baseline_bytes", "sdpa_runner", "flex_runner",
           "flex_block_mask"]

#: Baselines :func:`~sparse_patterns.profiling.profile` knows: torch SDPA and FlexAttention (compiled, CPU).
BASELINES = ("sdpa", "flex")
#: FlexAttention's block size on the CPU.
FLEX_BLOCK = 128

Runner = tuple[Callable[[], Any] | None, bool, str]


def _group_nnz(pattern: Pattern, mode: str) -> tuple[int, ...]:
    """Entries of the CSR each mask head uses (from the rule's counts, no CSR)."""
    return (pattern.nnz,) if mode == "merged" or pattern.num_heads == 1 else pattern.head_nnz


def _sdpa_kind(pattern: Pattern, mode: str) -> str:
    """How SDPA runs the pattern: ``"causal"``, ``"full"`` (no mask) or ``"mask"``."""
    if pattern.causal:
        return "causal"
    n = pattern.n
    return "full" if all(c == n * n for c in _group_nnz(pattern, mode)) else "mask"


def baseline_bytes(name: str, pattern: Pattern, mode: str, batch: int, heads: int,
                   head_dim: int, itemsize: int) -> tuple[int, str]:
    """``(bytes, what)``: the memory a baseline would take beyond the shared ``q, k, v``.

    The estimates are the module's (see its docstring); ``what`` says what
    dominates, for the note of a skipped baseline.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("strided", 1024, stride=32, causal=False)
    >>> nbytes, what = baseline_bytes("sdpa", pat, "merged", 1, 8, 64, 4)
    >>> nbytes > 2 * 8 * 1024 * 1024 * 4, what
    (True, 'the masked math path: scores and softmax 2 x 1 x 8 x 1,024 x 1,024 x 4 bytes and a dense mask')
    """
    n = pattern.n
    out = batch * heads * n * head_dim * itemsize
    lse = batch * heads * n * 4
    if name == "sdpa":
        if _sdpa_kind(pattern, mode) != "mask":
            return 2 * out + lse, "the fused kernel: its output and log-sum-exp"
        G = 1 if mode == "merged" or pattern.num_heads == 1 else pattern.num_heads
        mask = (G + (heads if G > 1 else 0)) * n * n
        size = max(itemsize, 4)
        scores = 2 * batch * heads * n * n * size
        return scores + mask + 2 * out, (
            f"the masked math path: scores and softmax 2 x {batch} x {heads} x {n:,} x {n:,} "
            f"x {size} bytes and a dense mask"
        )
    G = heads if mode == "multihead" else 1
    nb = -(-n // FLEX_BLOCK)
    return 16 * G * nb * nb + 2 * out + lse, (
        f"a BlockMask of 4 x {G} x {nb:,} x {nb:,} int32 indices and the output"
    )


def sdpa_runner(torch: Any, pattern: Pattern, mode: str, heads: int, scale: float,
                tq: Any, tk: Any, tv: Any, *, dense_limit: int = DENSE_LIMIT) -> Runner:
    """``(fn or None, same function as the pattern?, note)`` for torch SDPA.

    A causal pattern runs ``is_causal=True`` (the same function only when the
    pattern is dense causal); a pattern with every pair runs unmasked; any
    other gets a dense boolean mask of the CSR each attention head uses (the
    union in merged mode, head ``h % p`` in multihead mode), built from row
    ranges and skipped when it would exceed ``dense_limit`` cells.
    """
    F = torch.nn.functional.scaled_dot_product_attention
    n = pattern.n
    kind = _sdpa_kind(pattern, mode)
    flash, how = _flash(torch, tq)
    if kind == "causal":
        same = all(c == n * (n + 1) // 2 for c in _group_nnz(pattern, mode))
        note = "is_causal=True" + ("" if same else " (dense causal work, not this pattern)") + how
        return (lambda: flash(F, tq, tk, tv, is_causal=True, scale=scale)), same, note
    if kind == "full":
        return (lambda: flash(F, tq, tk, tv, scale=scale)), True, "no mask (every pair)" + how
    G = 1 if mode == "merged" or pattern.num_heads == 1 else pattern.num_heads
    cells = (heads if G > 1 else 1) * n * n
    if cells > dense_limit:
        return None, False, (
            f"skipped: a dense boolean mask would take {cells / 2**30:.2f} GiB "
            f"({cells:,} cells; the limit is {dense_limit:,})"
        )
    mask = torch.zeros((G, n, n), dtype=torch.bool)
    chunk = pattern.chunk_rows()
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        for gi in range(G):
            g = pattern.rows(start, stop, head=None if G == 1 else gi)
            rows = start + np.repeat(np.arange(stop - start, dtype=np.int64), np.diff(g.indptr))
            mask[gi][torch.from_numpy(rows), torch.from_numpy(g.indices.astype(np.int64))] = True
    mask = mask[torch.arange(heads) % G][None] if G > 1 else mask[None]
    mask = mask.to(tq.device)
    return (lambda: F(tq, tk, tv, attn_mask=mask, scale=scale)), True, "dense boolean mask"


def _flash(torch: Any, tq: Any) -> tuple[Callable[..., Any], str]:
    """``(call, note)``: on a CUDA device SDPA's flash backend where it takes the dtype
    (float16, bfloat16), else torch's own choice; the plain call on the CPU."""
    if tq.device.type != "cuda":
        return (lambda F, *a, **kw: F(*a, **kw)), ""
    if str(tq.dtype) not in ("torch.float16", "torch.bfloat16"):
        return (lambda F, *a, **kw: F(*a, **kw)), f", default backend (flash takes no {tq.dtype})"
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    def call(F: Any, *a: Any, **kw: Any) -> Any:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F(*a, **kw)

    return call, ", flash backend"


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
    """``(fn, True, note)`` for FlexAttention compiled on the pattern's ``BlockMask`` in
    natural token order (on the inputs' device)."""
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415

    t0 = time.perf_counter()
    bm = flex_block_mask(pattern, mode, heads, FLEX_BLOCK)
    if tq.device.type != "cpu":
        bm = bm.to(tq.device)  # a mask_mod holding CPU tables fails there: reported as an error
    t_mask = time.perf_counter() - t0
    torch._dynamo.reset()  # one compiled graph per shape: no recompile limit, honest compile time
    fa = torch.compile(flex_attention, dynamic=False)
    kept = 100.0 - float(bm.sparsity())
    note = (f"compiled, natural-order BlockMask of {FLEX_BLOCK}-blocks {kept:.0f}% kept, built in "
            f"{t_mask:.2f} s")
    return (lambda: fa(tq, tk, tv, block_mask=bm, scale=scale)), True, note
