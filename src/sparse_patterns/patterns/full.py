"""Dense attention, the baseline every sparse pattern is measured against."""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern
from ..util.checks import MAX_N, check_bool, check_int
from ._blocks import distance_band, layout_of
from ._build import progression_rule
from ._flex import Rule, causal_rule, every
from .registry import register

__all__ = ["full"]


def _full_flex(pattern: Pattern) -> list[Rule]:
    """Every pair (``kv <= q`` if causal)."""
    return [causal_rule(every, bool(pattern.params["causal"]))]


@register("full", flex=_full_flex)
def full(n: int, causal: bool = True) -> Pattern:
    """Dense attention: ``A_i = {0 .. i}`` (causal) or ``{0 .. n-1}``.

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    causal : bool
        Lower triangle (default) or every pair.

    Returns
    -------
    Pattern
        One head ``A``.

    Examples
    --------
    >>> full(4).nnz, full(4, causal=False).nnz
    (10, 16)
    """
    n = check_int("n", n, 1, MAX_N)
    causal = check_bool("causal", causal)

    def spec(i: np.ndarray):
        yield np.zeros_like(i), i + 1 if causal else np.full_like(i, n), 1

    def blocks(block: int):
        return layout_of(n, block, [distance_band(n, block, 0 if causal else -n, n)])

    return Pattern.from_rule(
        progression_rule(n, 1, spec, blocks), n, name="full", params={"causal": causal}, causal=causal, head_names=("A",),
    )
