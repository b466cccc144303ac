"""BigBird: block sliding window, global blocks and random blocks."""

from __future__ import annotations

import numpy as np

from .._validate import check_bool, check_int
from ..pattern import BlockLayout, Pattern, PatternRule
from ._flex import Rule, causal_rule
from .registry import Param, register

__all__ = ["bigbird"]


def _bigbird_layouts(
    nb: int, window_blocks: int, global_blocks: int, random_blocks: int, seed: int, causal: bool
) -> np.ndarray:
    """bool (3, nb, nb): window, global, random block heads."""
    I = np.arange(nb)[:, None]
    J = np.arange(nb)[None, :]
    win = np.abs(I - J) <= window_blocks
    glob = (I < global_blocks) | (J < global_blocks)
    if causal:
        win &= J <= I
        glob &= J <= I
    rnd = np.zeros((nb, nb), dtype=bool)
    rng = np.random.default_rng(seed)
    taken = win | glob
    for r in range(nb):
        allowed = np.flatnonzero(~taken[r] & ((np.arange(nb) <= r) if causal else True))
        k = min(random_blocks, allowed.size)
        if k:
            rnd[r, rng.choice(allowed, size=k, replace=False)] = True
    return np.stack([win, glob, rnd])


def _bigbird_flex(pattern: Pattern) -> list[Rule]:
    """A lookup in each head's block table: ``table[q // b, kv // b]``."""
    import torch  # noqa: PLC0415

    b, causal = pattern.params["block"], bool(pattern.params["causal"])
    tables = torch.from_numpy(np.array(pattern.to_blocks(b).layout))  # (3, nb, nb), a writable copy
    return [
        causal_rule(lambda q, kv, t=tables[h]: t[q // b, kv // b], causal)
        for h in range(tables.shape[0])
    ]


@register(
    "bigbird",
    Param("block", int, 64, "block size in tokens"),
    Param("window_blocks", int, 1, "blocks seen on each side of the diagonal block"),
    Param("global_blocks", int, 1, "the first blocks are global"),
    Param("random_blocks", int, 2, "random blocks per block row"),
    Param("seed", int, 0, "seed of the random blocks"),
    Param("causal", bool, True, "keep only j <= i (token level)"),
    description="block window, global blocks and random blocks (three heads)",
    reference="Zaheer et al. 2020, arXiv:2007.14062",
    flex=_bigbird_flex,
)
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

    def layout() -> BlockLayout:
        return BlockLayout(_bigbird_layouts(nb, wb, gb, rb, seed, causal), block=block, n=n)

    def build():
        return list(layout().to_pattern(causal=causal).heads)

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
        PatternRule(3, build, blocks), n, name="bigbird", params=params, causal=causal,
        head_names=("window", "global", "random"),
    )
