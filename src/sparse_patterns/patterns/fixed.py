"""The fixed pattern of the Sparse Transformer (Child et al. 2019, section 4.2).

``A1_i = {j <= i : floor(j / l) == floor(i / l)}`` (the current block of l) and
``A2_i = {j <= i : j mod l in [l - c, l)}`` (c summary positions at the end of
every block). With ``summary_heads=k`` there is one A2 per distinct summary
sub-block, head h (0-based) using ``[l - (h + 1) c, l - h c)``, as OpenAI's
``num_verts`` and DeepSpeed's ``num_different_global_patterns``.
"""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern, PatternRule
from ..util.checks import MAX_N, check_bool, check_int, check_size
from ._blocks import block_bounds, layout_of
from ._build import SortedTokens, prefix_csr, progression_csr, with_union
from ._flex import Rule, causal_rule
from .registry import register

__all__ = ["fixed", "summary_columns", "MAX_HEADS"]

#: Most summary heads (``summary_heads``) a fixed pattern may have, as
#: :func:`~sparse_patterns.patterns.factorized.factorized` bounds ``p``.
MAX_HEADS = 64


def summary_columns(n: int, stride: int, lo: int, hi: int) -> np.ndarray:
    """Sorted columns ``j < n`` with ``j mod stride in [lo, hi)``.

    Offsets at or beyond ``n`` give no column, so at most ``n`` of them are
    made: O(n) memory even when ``hi - lo`` (``c``) is far larger than ``n``.

    Examples
    --------
    >>> summary_columns(10, 4, 2, 4).tolist(), summary_columns(5, 10**9, 0, 10**9).tolist()
    ([2, 3, 6, 7], [0, 1, 2, 3, 4])
    """
    starts = np.arange(0, n, stride, dtype=np.int64)
    offsets = np.arange(min(lo, n), min(hi, n), dtype=np.int64)
    cols = (starts[:, None] + offsets[None, :]).ravel()
    return cols[cols < n]


def _chunk_blocks(n: int, block: int, stride: int, causal: bool):
    lo, hi = block_bounds(n, block)
    clo, chi = lo // stride, hi // stride  # chunk range of each block
    overlap = (clo[:, None] <= chi[None, :]) & (clo[None, :] <= chi[:, None])
    single = clo == chi
    same = single[:, None] & single[None, :] & (clo[:, None] == clo[None, :])
    if causal:
        below = lo[:, None] >= hi[None, :]  # every j <= every i
        lay = overlap & (hi[:, None] >= lo[None, :])
        return lay, same & below
    return overlap, same


def _summary_blocks(n: int, block: int, stride: int, s_lo: int, s_hi: int, causal: bool):
    lo, hi = block_bounds(n, block)
    # first summary column >= lo of each block, and whether every column of the block is one
    r = lo % stride
    first = np.where(r < s_lo, lo - r + s_lo, np.where(r < s_hi, lo, lo - r + stride + s_lo))
    has = first <= hi
    all_sum = (s_hi - s_lo == stride) | (
        (lo % stride >= s_lo) & (hi % stride < s_hi) & (lo // stride == hi // stride)
    )
    if causal:
        lay = has[None, :] & (first[None, :] <= hi[:, None])
        full = all_sum[None, :] & (hi[None, :] <= lo[:, None])
    else:
        lay = np.broadcast_to(has[None, :], (lo.size, lo.size))
        full = np.broadcast_to(all_sum[None, :], (lo.size, lo.size))
    return lay, full


def _fixed_flex(pattern: Pattern) -> list[Rule]:
    """A1: ``q // l == kv // l``; summary head h: ``kv mod l in [l - (h+1) c, l - h c)``."""
    import torch  # noqa: PLC0415

    p = pattern.params
    l, c, k, causal = p["stride"], p["c"], p["summary_heads"], bool(p["causal"])
    rules = [causal_rule(lambda q, kv: (q // l) == (kv // l), causal)]
    for h in range(k):
        lo, hi = l - (h + 1) * c, l - h * c

        def summary(q, kv, lo=lo, hi=hi):
            r = torch.remainder(kv, l)
            return (r >= lo) & (r < hi) & (q >= 0)

        rules.append(causal_rule(summary, causal))
    return rules


@register("fixed", flex=_fixed_flex)
def fixed(
    n: int, stride: int, c: int | None = None, summary_heads: int = 1, causal: bool = True
) -> Pattern:
    """Fixed attention: a block head ``A1`` and ``summary_heads`` summary heads.

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    stride : int
        ``l``, the block length, in ``[1, 2^31 - 1]`` (``l >= n`` makes one block).
    c : int, optional
        Summary positions per block, in ``[1, l]``; default ``max(1, l // 8)``.
    summary_heads : int
        ``k`` in ``[1, 64]`` distinct summary sub-blocks; ``k * c <= l``.
    causal : bool
        Causal (``j <= i``) or bidirectional.

    Returns
    -------
    Pattern
        Heads ``A1`` then ``A2`` (or ``A2.0 .. A2.{k-1}`` when ``k > 1``).

    References
    ----------
    R. Child et al., arXiv:1904.10509, 2019, section 4.2.

    Examples
    --------
    >>> pat = fixed(8, stride=4, c=1)
    >>> pat.heads[0][6].indices.tolist(), pat.heads[1][6].indices.tolist()
    ([4, 5, 6], [3])
    >>> fixed(8, stride=4, c=1, summary_heads=2).heads[2][7].indices.tolist()
    [2, 6]
    """
    n = check_int("n", n, 1, MAX_N)
    stride = check_size("stride", stride)
    if c is None:
        c = max(1, stride // 8)
    c = check_int("c", c, 1, stride)
    k = check_int("summary_heads", summary_heads, 1, MAX_HEADS)
    if k * c > stride:
        raise ValueError(
            f"summary_heads: k * c must be <= stride ({stride}); got k={k}, c={c} (k * c = {k * c})"
        )
    causal = check_bool("causal", causal)
    params = {"stride": stride, "c": c, "summary_heads": k, "causal": causal}
    ranges = [(stride - (h + 1) * c, stride - h * c) for h in range(k)]
    names = ("A1", "A2") if k == 1 else ("A1", *(f"A2.{h}" for h in range(k)))

    def a1(i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = (i // stride) * stride
        return s, (i - s + 1) if causal else (np.minimum(s + stride, n) - s)

    def summary_counts(i: np.ndarray, lo: int, hi: int) -> np.ndarray:
        # j <= i with j mod l in [lo, hi): (i // l) whole blocks, then residues lo .. i mod l
        t = i if causal else np.full_like(i, n - 1)
        return (t // stride) * (hi - lo) + np.clip(t % stride - lo + 1, 0, hi - lo)

    def take(i: np.ndarray) -> list:
        heads = [progression_csr(n, *a1(i))]
        # causal rows read the summary columns <= max(i) only (a prefix of the last row)
        top = (int(i.max()) + 1 if i.size else 0) if causal else n
        for lo, hi in ranges:
            heads.append(prefix_csr(n, summary_columns(top, stride, lo, hi), summary_counts(i, lo, hi)))
        return heads

    def rows(start: int, stop: int) -> list:
        return take(np.arange(start, stop, dtype=np.int64))

    tokens = SortedTokens(n)
    columns: dict[int, np.ndarray] = {}

    def spans(i: np.ndarray) -> list:
        # A1 a slice of arange(n); each summary head a prefix of its sorted columns
        out = [tokens.progression(*a1(i), 1)]
        for h, (lo, hi) in enumerate(ranges):
            if h not in columns:
                columns[h] = summary_columns(n, stride, lo, hi).astype(np.int32)
            count = summary_counts(i, lo, hi)
            out.append((columns[h], np.zeros_like(count), count))
        return out

    def counts() -> np.ndarray:
        i = np.arange(n, dtype=np.int64)
        return np.stack([a1(i)[1], *(summary_counts(i, lo, hi) for lo, hi in ranges)])

    def union_counts() -> np.ndarray:
        # |A1| + |summaries| - the summary columns of i's own block that A1 holds;
        # the k summary ranges partition [l - k c, l)
        i = np.arange(n, dtype=np.int64)
        c1 = a1(i)[1]
        lo = stride - k * c
        return c1 + summary_counts(i, lo, stride) - np.clip(c1 - lo, 0, k * c)

    def head_nnz() -> tuple[int, ...]:
        # the sums of counts() in O(k): q whole blocks of l rows, then m rows
        q, m = divmod(n, stride)
        if causal:  # row r of a block: r + 1; summary: its columns in earlier blocks, then
            # those of its own block up to r
            out = [q * stride * (stride + 1) // 2 + m * (m + 1) // 2]
            for lo, hi in ranges:
                w = hi - lo
                whole = w * (w + 1) // 2 + (stride - hi) * w  # one block's own columns
                a = max(0, min(m, hi) - lo)
                part = a * (a + 1) // 2 + max(0, m - hi) * w
                out.append(stride * w * q * (q - 1) // 2 + q * whole + m * q * w + part)
            return tuple(out)
        t, r = divmod(n - 1, stride)  # every row sees every summary column
        return (q * stride * stride + m * m,
                *(n * (t * (hi - lo) + min(max(r - lo + 1, 0), hi - lo)) for lo, hi in ranges))

    def blocks(block: int):
        hs = [_chunk_blocks(n, block, stride, causal)]
        hs += [_summary_blocks(n, block, stride, lo, hi, causal) for lo, hi in ranges]
        return layout_of(n, block, hs)

    return Pattern.from_rule(
        with_union(PatternRule(k + 1, lambda: rows(0, n), blocks, rows, counts, take=take, spans=spans,
                               head_nnz=head_nnz), union_counts),
        n, name="fixed", params=params, causal=causal, head_names=names,
    )
