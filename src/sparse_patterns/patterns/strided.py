"""The strided pattern of the Sparse Transformer (Child et al. 2019, section 4.2).

Two heads: ``A1_i = {max(0, i - l) .. i}`` (the previous l positions and i, as in
the paper; ``window="reference"`` keeps l positions ``i - l + 1 .. i`` as
OpenAI's code does) and ``A2_i = {j <= i : (i - j) mod l == 0}``. The union is the
same under both windows. Bidirectional: ``|i - j| <= l`` and ``(i - j) mod l == 0``.
"""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern
from ..util.checks import MAX_N, check_bool, check_choice, check_int, check_size
from ._blocks import distance_band, distance_multiple, layout_of
from ._build import progression_rule, with_union
from ._flex import Offsets, Rule, band, causal_rule
from .registry import register

__all__ = ["strided"]


def _window_width(stride: int, window: str) -> int:
    return stride if window == "paper" else stride - 1


def _strided_flex(pattern: Pattern) -> list[Rule]:
    """A1: ``0 <= q - kv <= w`` (``|q - kv| <= w``); A2: ``(q - kv) mod l == 0``."""
    import torch  # noqa: PLC0415

    l, causal = pattern.params["stride"], bool(pattern.params["causal"])
    w = _window_width(l, pattern.params["window"])
    a1 = band(0 if causal else -w, w)
    a2 = causal_rule(lambda q, kv: torch.remainder(q - kv, l) == 0, causal)
    return [a1, a2]


def _strided_offsets(pattern: Pattern) -> list[Offsets | None]:
    """Causal: A1 is ``0 <= i - j <= w``, A2 ``(i - j) mod l == 0``."""
    if not pattern.params["causal"]:
        return [None, None]
    l = pattern.params["stride"]
    return [Offsets(0, _window_width(l, pattern.params["window"])), Offsets(0, None, l)]


@register("strided", flex=_strided_flex, offsets=_strided_offsets)
def strided(n: int, stride: int, window: str = "paper", causal: bool = True) -> Pattern:
    """Strided attention: a window head ``A1`` and a stride head ``A2``.

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    stride : int
        ``l`` in ``[1, 2^31 - 1]``; the paper uses ``l ~ sqrt(n)`` (any ``l >= n``
        gives the heads of ``l = n``).
    window : {"paper", "reference"}
        ``"paper"``: ``A1_i = {max(0, i-l) .. i}``; ``"reference"``: ``{i-l+1 .. i}``.
    causal : bool
        Causal (``j <= i``) or bidirectional.

    Returns
    -------
    Pattern
        Two heads named ``A1`` (window) and ``A2`` (stride).

    References
    ----------
    R. Child, S. Gray, A. Radford, I. Sutskever, "Generating Long Sequences with
    Sparse Transformers", arXiv:1904.10509, 2019.

    Examples
    --------
    >>> pat = strided(8, stride=3)
    >>> pat.heads[0][7].indices.tolist(), pat.heads[1][7].indices.tolist()
    ([4, 5, 6, 7], [1, 4, 7])
    >>> strided(8, stride=3, window="reference").heads[0][7].indices.tolist()
    [5, 6, 7]
    """
    n = check_int("n", n, 1, MAX_N)
    stride = check_size("stride", stride)
    window = check_choice("window", window, ("paper", "reference"))
    causal = check_bool("causal", causal)
    w = _window_width(stride, window)
    params = {"stride": stride, "window": window, "causal": causal}

    def spec(i: np.ndarray):  # rows i of both heads as progressions, head by head
        s1 = np.maximum(0, i - w)
        yield s1, (i if causal else np.minimum(n - 1, i + w)) - s1 + 1, 1
        del s1
        if causal:
            yield i % stride, i // stride + 1, stride
        else:
            s2 = i % stride
            yield s2, (n - 1 - s2) // stride + 1, stride

    def union_counts() -> np.ndarray:
        # |A1| + |A2| - |A1 & A2|: the window [i - a, i + b] holds a // l + b // l + 1 of A2
        i = np.arange(n, dtype=np.int64)
        a = np.minimum(w, i)
        b = np.zeros_like(i) if causal else np.minimum(w, n - 1 - i)
        a2 = i // stride + (0 if causal else (n - 1 - i) // stride)  # |A2| - 1
        return a + b + 1 + a2 - a // stride - b // stride

    def blocks(block: int):
        if causal:
            h1 = distance_band(n, block, 0, w)
        else:
            h1 = distance_band(n, block, -w, w)
        return layout_of(n, block, [h1, distance_multiple(n, block, stride, causal)])

    return Pattern.from_rule(
        with_union(progression_rule(n, 2, spec, blocks), union_counts), n, name="strided", params=params, causal=causal, head_names=("A1", "A2"),
    )
