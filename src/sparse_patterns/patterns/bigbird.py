"""BigBird: block sliding window, global blocks and random blocks."""

from __future__ import annotations

import numpy as np

from .._validate import check_bool, check_int
from ..pattern import BlockLayout, Pattern, PatternRule
from ._build import block_row_counts, blocks_csr
from ._flex import Rule, causal_rule
from .registry import register

__all__ = ["bigbird"]


def _bigbird_blocks(
    nb: int, window_blocks: int, global_blocks: int, random_blocks: int, seed: int, causal: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The window, global and random block heads as block-level CSR ``(bptr, bidx)``.

    Each is ``int64 (nb + 1,)`` and sorted ``int64`` column blocks: O(nb) memory
    besides the entries, never ``(nb, nb)``; the random blocks are drawn block row
    by block row with ``numpy.random.default_rng(seed)``.
    """
    I = np.arange(nb, dtype=np.int64)
    # window: [I - wb, I + wb] (to I if causal), a progression per block row
    wlo = np.maximum(0, I - window_blocks)
    whi = I if causal else np.minimum(nb - 1, I + window_blocks)
    win = _ranges(wlo, whi - wlo + 1)
    # global: every block in the first gb block rows (to I if causal), else blocks [0, gb)
    g = min(global_blocks, nb)
    ghi = np.where(I < g, I if causal else nb - 1, g - 1)
    glob = _ranges(np.zeros(nb, dtype=np.int64), ghi + 1)
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(nb):
        taken = (np.abs(I - r) <= window_blocks) | (r < global_blocks) | (I < global_blocks)
        if causal:
            taken |= I > r
        allowed = np.flatnonzero(~taken)
        k = min(random_blocks, allowed.size)
        rows.append(np.sort(rng.choice(allowed, size=k, replace=False)) if k else allowed[:0])
    bptr = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum([r.size for r in rows], out=bptr[1:])
    bidx = np.concatenate(rows).astype(np.int64) if nb else np.empty(0, dtype=np.int64)
    return [win, glob, (bptr, bidx)]


def _ranges(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block-level CSR whose row ``I`` holds ``first[I] .. first[I] + count[I] - 1``."""
    count = np.maximum(count, 0)
    bptr = np.zeros(first.size + 1, dtype=np.int64)
    np.cumsum(count, out=bptr[1:])
    bidx = np.arange(int(bptr[-1]), dtype=np.int64) - np.repeat(bptr[:-1] - first, count)
    return bptr, bidx


def _bigbird_flex(pattern: Pattern) -> list[Rule]:
    """A lookup in each head's block table: ``table[q // b, kv // b]``."""
    import torch  # noqa: PLC0415

    b, causal = pattern.params["block"], bool(pattern.params["causal"])
    tables = torch.from_numpy(np.array(pattern.to_blocks(b).layout))  # (3, nb, nb), a writable copy
    return [
        causal_rule(lambda q, kv, t=tables[h]: t[q // b, kv // b], causal)
        for h in range(tables.shape[0])
    ]


@register("bigbird", flex=_bigbird_flex)
def bigbird(
    n: int,
    block: int = 64,
    window_blocks: int = 1,
    global_blocks: int = 1,
    random_blocks: int = 2,
    seed: int = 0,
    causal: bool = True,
) -> Pattern:
    """BigBird attention at block granularity, expanded to tokens.

    Head ``window``: blocks with ``|I - J| <= window_blocks``; head ``global``:
    the first ``global_blocks`` block rows and columns; head ``random``: for
    every block row, ``random_blocks`` blocks drawn (with
    ``numpy.random.default_rng(seed)``) among those the other heads leave out
    (and ``J <= I`` if causal). Causal patterns then keep token pairs ``j <= i``.

    Parameters
    ----------
    n : int
        Sequence length, ``>= 1``.
    block : int
        Block size, ``>= 1``.
    window_blocks, global_blocks, random_blocks : int
        ``>= 0`` each.
    seed : int
        Seed for the random blocks, ``>= 0``.
    causal : bool
        Causal (default) or bidirectional.

    Returns
    -------
    Pattern
        Heads ``window``, ``global`` and ``random``.

    References
    ----------
    M. Zaheer et al., "Big Bird: Transformers for Longer Sequences",
    arXiv:2007.14062, 2020.

    Examples
    --------
    >>> pat = bigbird(16, block=4, random_blocks=1, seed=0)
    >>> pat.num_heads, pat.heads[0][5].indices.tolist()
    (3, [0, 1, 2, 3, 4, 5])
    """
    n = check_int("n", n, 1)
    block = check_int("block", block, 1)
    wb = check_int("window_blocks", window_blocks, 0)
    gb = check_int("global_blocks", global_blocks, 0)
    rb = check_int("random_blocks", random_blocks, 0)
    seed = check_int("seed", seed, 0)
    causal = check_bool("causal", causal)
    params = {
        "block": block, "window_blocks": wb, "global_blocks": gb, "random_blocks": rb,
        "seed": seed, "causal": causal,
    }
    nb = -(-n // block)

    cache: dict = {}

    def heads_blocks() -> list[tuple[np.ndarray, np.ndarray]]:  # drawn once, O(nb) memory
        if "b" not in cache:
            cache["b"] = _bigbird_blocks(nb, wb, gb, rb, seed, causal)
        return cache["b"]

    def layout() -> BlockLayout:
        lay = np.zeros((3, nb, nb), dtype=bool)
        for h, (bptr, bidx) in enumerate(heads_blocks()):
            lay[h, np.repeat(np.arange(nb), np.diff(bptr)), bidx] = True
        return BlockLayout(lay, block=block, n=n)

    def take(i: np.ndarray) -> list:
        return [blocks_csr(n, block, bp, bi, i, causal) for bp, bi in heads_blocks()]

    def rows(start: int, stop: int) -> list:
        return take(np.arange(start, stop, dtype=np.int64))

    def counts() -> np.ndarray:
        i = np.arange(n, dtype=np.int64)
        return np.stack([block_row_counts(n, block, bp, bi, i, causal) for bp, bi in heads_blocks()])

    def build():
        return rows(0, n)

    def blocks(b: int):
        if b != block:
            return BlockLayout.from_pattern(Pattern(build(), causal=causal), b)
        lay = layout().layout
        # with the causal token mask, diagonal blocks are partial (unless block == 1)
        full = lay.copy()
        if causal:
            sizes = np.minimum(block, n - np.arange(nb) * block)
            diag = np.arange(nb)
            full[:, diag, diag] &= sizes == 1  # a diagonal tile is full only if 1 x 1
        return BlockLayout(lay, block=block, n=n, full=full)

    return Pattern.from_rule(
        PatternRule(3, build, blocks, rows, counts, take=take), n, name="bigbird", params=params, causal=causal,
        head_names=("window", "global", "random"),
    )
