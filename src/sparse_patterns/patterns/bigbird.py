"""BigBird: block sliding window, global blocks and random blocks."""

from __future__ import annotations

import numpy as np

from .. import config
from ..pattern import BlockLayout, Pattern, PatternRule
from ..util.checks import MAX_N, check_bool, check_int, check_size
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
    by block row with ``numpy.random.default_rng(seed)``, ``min(random_blocks, m)``
    of the ``m`` blocks the other heads leave to the row (none in the first
    ``global_blocks`` rows): ``[gb, r - wb - 1]`` and, bidirectional,
    ``[r + wb + 1, nb - 1]``. Drawing indices into those two ranges takes the same
    numbers from the generator as drawing from the array of allowed blocks, in
    O(drawn) time per row (O(m) only when a draw takes more than 1/50 of them).
    """
    I = np.arange(nb, dtype=np.int64)
    # window: [I - wb, I + wb] (to I if causal), a progression per block row
    wlo = np.maximum(0, I - window_blocks)
    whi = I if causal else np.minimum(nb - 1, I + window_blocks)
    win = _ranges(wlo, whi - wlo + 1)
    del wlo, whi
    # global: every block in the first gb block rows (to I if causal), else blocks [0, gb)
    g = min(global_blocks, nb)
    ghi = np.where(I < g, I if causal else nb - 1, g - 1)
    glob = _ranges(np.zeros(nb, dtype=np.int64), ghi + 1)
    del ghi
    # random: the allowed blocks of row r are [gb, gb + a_r) and [b0_r, b0_r + b_r)
    a = np.maximum(0, I - window_blocks - global_blocks)
    b0 = np.maximum(global_blocks, I + window_blocks + 1)
    b = np.zeros_like(I) if causal else np.maximum(0, nb - b0)
    a[I < global_blocks] = 0
    b[I < global_blocks] = 0
    k = np.minimum(random_blocks, a + b)
    bptr = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum(k, out=bptr[1:])
    bidx = np.empty(int(bptr[-1]), dtype=np.int64)
    rng = np.random.default_rng(seed)
    for r in np.flatnonzero(k).tolist():
        idx = rng.choice(int(a[r] + b[r]), size=int(k[r]), replace=False)
        cols = np.where(idx < a[r], global_blocks + idx, b0[r] + (idx - a[r]))
        cols.sort()
        bidx[bptr[r]:bptr[r + 1]] = cols
    return [win, glob, (bptr, bidx)]


def _entries_bound(nb: int, wb: int, gb: int, rb: int, causal: bool) -> dict[str, int]:
    """Bytes :func:`_bigbird_blocks` allocates, by the parameter that drives each part.

    Closed form, from Python ints only: the block-row arrays (``block``, through
    ``nb``), and the entries of the window, global and random heads (``int64``
    each, and the temporaries of :func:`_ranges`).
    """
    def tri(w: int) -> int:  # sum over I < nb of min(I, w)
        w = min(w, nb - 1)
        return w * (w + 1) // 2 + (nb - 1 - w) * w

    e_win = nb + (1 if causal else 2) * tri(wb)
    g = min(gb, nb)
    e_glob = (g * (g + 1) // 2 if causal else g * nb) + (nb - g) * g
    return {
        "block": 8 * 12 * (nb + 1),
        "window_blocks": 24 * e_win,
        "global_blocks": 24 * e_glob,
        "random_blocks": 16 * nb * min(rb, nb),
    }


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
        Sequence length, in ``[1, 2^31 - 1]``.
    block : int
        Block size, in ``[1, 2^31 - 1]``. A block ``>= n`` makes a single block,
        which the window head covers whole: full attention, as BigBird
        implementations fall back to on sequences shorter than their blocks.
    window_blocks, global_blocks, random_blocks : int
        In ``[0, 2^31 - 1]`` each. Counts beyond the number of blocks saturate:
        a row draws ``min(random_blocks, m)`` of the ``m`` blocks the window and
        global heads leave it.
    seed : int
        Seed for the random blocks, ``>= 0``.
    causal : bool
        Causal (default) or bidirectional.

    Returns
    -------
    Pattern
        Heads ``window``, ``global`` and ``random``.

    Raises
    ------
    ValueError
        A parameter out of range; :class:`~sparse_patterns.config.MemoryLimitError`
        (a ``ValueError``) when the block-level heads (O(nb) arrays plus their
        entries, ``nb = ceil(n / block)``) would exceed the memory limit.

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
    n = check_int("n", n, 1, MAX_N)
    block = check_size("block", block)
    wb = check_size("window_blocks", window_blocks, 0)
    gb = check_size("global_blocks", global_blocks, 0)
    rb = check_size("random_blocks", random_blocks, 0)
    seed = check_int("seed", seed, 0)
    causal = check_bool("causal", causal)
    params = {
        "block": block, "window_blocks": wb, "global_blocks": gb, "random_blocks": rb,
        "seed": seed, "causal": causal,
    }
    nb = -(-n // block)
    need = _entries_bound(nb, wb, gb, rb, causal)
    limit = config.get_memory_limit()
    if sum(need.values()) > limit:
        worst = max(need, key=need.__getitem__)
        raise config.MemoryLimitError(
            f"{worst}: bigbird at n={n:,} with block={block} ({nb:,} block rows), "
            f"window_blocks={wb}, global_blocks={gb}, random_blocks={rb} needs "
            f"{config.format_bytes(sum(need.values()))} for its block-level heads, above the "
            f"memory limit of {config.format_bytes(limit)} (sparse_patterns.config.set_memory_limit)"
        )

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
        if b != block:  # max-pool the token rows, streamed range by range
            return BlockLayout.from_pattern(cache["pattern"], b)
        lay = layout().layout
        # with the causal token mask, diagonal blocks are partial (unless block == 1)
        full = lay.copy()
        if causal:
            sizes = np.minimum(block, n - np.arange(nb) * block)
            diag = np.arange(nb)
            full[:, diag, diag] &= sizes == 1  # a diagonal tile is full only if 1 x 1
        return BlockLayout(lay, block=block, n=n, full=full)

    cache["pattern"] = Pattern.from_rule(
        PatternRule(3, build, blocks, rows, counts, take=take), n, name="bigbird", params=params, causal=causal,
        head_names=("window", "global", "random"),
    )
    return cache["pattern"]
