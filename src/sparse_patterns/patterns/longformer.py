"""Longformer: a (dilated) sliding window plus global tokens."""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern
from ..util.checks import MAX_N, check_bool, check_int, check_size
from ._build import progression_rule
from ._flex import Rule, causal_rule, dilated_band
from .local import dilated_rows
from .registry import register

__all__ = ["longformer"]


def _longformer_flex(pattern: Pattern) -> list[Rule]:
    """window: the dilated band; global: ``q < g or kv < g``."""
    p = pattern.params
    g, causal = p["global_tokens"], bool(p["causal"])
    win = dilated_band(p["window"], p["dilation"], pattern.n, causal)
    glob = causal_rule(lambda q, kv: (q < g) | (kv < g), causal)
    return [win, glob]


@register("longformer", flex=_longformer_flex)
def longformer(
    n: int, window: int = 8, global_tokens: int = 1, dilation: int = 1, causal: bool = True
) -> Pattern:
    """Longformer attention: head ``window`` and head ``global``.

    The window head is ``dilated(n, window, dilation)``. In the global head the
    first ``g`` positions attend to every position (every earlier one, if
    causal) and every position attends to them.

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    window : int
        ``w`` in ``[0, 2^31 - 1]``.
    global_tokens : int
        ``g`` in ``[0, n]``.
    dilation : int
        ``d`` in ``[1, 2^31 - 1]``.
    causal : bool
        Causal (default) or bidirectional.

    Returns
    -------
    Pattern
        Heads ``window`` and ``global``.

    References
    ----------
    I. Beltagy, M. E. Peters, A. Cohan, "Longformer: The Long-Document
    Transformer", arXiv:2004.05150, 2020.

    Examples
    --------
    >>> pat = longformer(8, window=1, global_tokens=2)
    >>> pat.union()[7].indices.tolist()
    [0, 1, 6, 7]
    """
    n = check_int("n", n, 1, MAX_N)
    window = check_size("window", window, 0)
    g = check_int("global_tokens", global_tokens, 0, n)
    d = check_size("dilation", dilation)
    causal = check_bool("causal", causal)
    params = {"window": window, "global_tokens": g, "dilation": d, "causal": causal}

    def spec(i: np.ndarray):
        yield dilated_rows(n, window, d, causal, i)
        if causal:
            cnt = np.minimum(np.where(i < g, i + 1, min(g, n)), i + 1)
        else:
            cnt = np.where(i < g, n, g)
        yield np.zeros_like(i), cnt, 1

    return Pattern.from_rule(
        progression_rule(n, 2, spec), n, name="longformer", params=params, causal=causal,
        head_names=("window", "global"),
    )
