"""Global tokens: the first ``g`` positions, seen by every position and seeing everything
before them (Longformer's global attention, BigBird's ITC global tokens), as one head.

Usually added to another pattern's heads: ``strided(n, l) + global_tokens(n, g)``
(:mod:`sparse_patterns.algebra`).
"""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern
from ..util.checks import MAX_N, check_bool, check_int
from ._blocks import block_bounds, layout_of
from ._build import progression_rule
from ._flex import Rule, causal_rule
from .registry import register

__all__ = ["global_tokens"]


def _global_flex(pattern: Pattern) -> list[Rule]:
    """``q < g or kv < g`` (and ``kv <= q`` if causal)."""
    g, causal = pattern.params["tokens"], bool(pattern.params["causal"])
    return [causal_rule(lambda q, kv: (q < g) | (kv < g), causal)]


def _tiles(n: int, block: int, g: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(layout, full)``, ``bool (nb, nb)``, of the head in closed form.

    Causal, the head is ``{(i, j) : j < g, j <= i}`` (a global row ``i < g``
    holds ``0 .. i``, all below ``g``): a tile is set when its first column is
    below ``g`` and not after its last row, full when its last column is below
    ``g`` and not after its first row. Bidirectional, it is ``{i < g or j < g}``.
    """
    lo, hi = block_bounds(n, block)
    rlo, rhi = lo[:, None], hi[:, None]  # rows (I)
    clo, chi = lo[None, :], hi[None, :]  # columns (J)
    if causal:
        return (clo < g) & (clo <= rhi), (chi < g) & (chi <= rlo)
    return (rlo < g) | (clo < g), (rhi < g) | (chi < g)


@register("global_tokens", flex=_global_flex)
def global_tokens(n: int, tokens: int = 1, causal: bool = True) -> Pattern:
    """Global tokens: every position attends to the first ``g`` positions, which attend
    to every position before them (every position, if bidirectional).

    Row ``i`` holds ``{0 .. min(i, g - 1)}`` when ``i >= g`` and ``{0 .. i}``
    when ``i < g`` (causal), or ``{0 .. g - 1}`` and everything (bidirectional).
    This is the global head of :func:`~sparse_patterns.patterns.longformer.longformer`
    alone; ``g`` counts leading positions, as Longformer and BigBird place
    them (a packed sequence gets ``g`` per document with ``documents=``).

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    tokens : int
        ``g`` in ``[0, n]``: the first ``g`` positions are global.
    causal : bool
        Causal (default) or bidirectional.

    Returns
    -------
    Pattern
        One head ``G``.

    References
    ----------
    I. Beltagy, M. E. Peters, A. Cohan, "Longformer: The Long-Document
    Transformer", arXiv:2004.05150, 2020. M. Zaheer et al., "Big Bird:
    Transformers for Longer Sequences", arXiv:2007.14062, 2020.

    Examples
    --------
    >>> pat = global_tokens(6, tokens=2)
    >>> print(pat.to_string())
    #.....
    ##....
    ##....
    ##....
    ##....
    ##....
    >>> global_tokens(4, tokens=1, causal=False).rows(0, 2).toarray().astype(int)
    array([[1, 1, 1, 1],
           [1, 0, 0, 0]])
    """
    n = check_int("n", n, 1, MAX_N)
    g = check_int("tokens", tokens, 0, n)
    causal = check_bool("causal", causal)

    def spec(i: np.ndarray):
        yield np.zeros_like(i), (np.minimum(i + 1, g) if causal else np.where(i < g, n, g)), 1

    def blocks(block: int):
        return layout_of(n, block, [_tiles(n, block, g, causal)])

    return Pattern.from_rule(
        progression_rule(n, 1, spec, blocks), n, name="global_tokens",
        params={"tokens": g, "causal": causal}, causal=causal, head_names=("G",),
    )
