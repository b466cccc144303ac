"""The p-dimensional factorization: strided attention generalized to p heads
with ``l = ceil(n^(1/p))``, one base-l digit of the distance per head."""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern
from ..util.checks import MAX_N, check_bool, check_int
from ._build import progression_rule
from ._flex import Rule, band
from .registry import register, root_of

__all__ = ["factorized"]


def _factorized_flex(pattern: Pattern) -> list[Rule]:
    """Head m: ``|q - kv| <= (l - 1) l^(m-1)`` and ``(q - kv) mod l^(m-1) == 0``."""
    import torch  # noqa: PLC0415

    n, p, causal = pattern.n, pattern.params["p"], bool(pattern.params["causal"])
    l = root_of(n, p)
    rules = []
    for m in range(1, p + 1):
        step = min(l ** (m - 1), n)
        reach = min((l - 1) * step, n)
        win = band(0 if causal else -reach, reach)
        rules.append(
            lambda q, kv, win=win, step=step: win(q, kv) & (torch.remainder(q - kv, step) == 0)
        )
    return rules


@register("factorized", flex=_factorized_flex)
def factorized(n: int, p: int = 2, causal: bool = True) -> Pattern:
    """Head ``m`` (1-based): ``{j <= i : (i - j) mod l^(m-1) == 0, i - j < l^m}``.

    With ``l`` the smallest integer with ``l^p >= n``, every distance
    ``0 <= i - j < n`` is a sum of one step from each head, so the pattern
    connects in p steps; for ``p = 2`` it is ``strided(n, l, window="reference")``.
    Bidirectional uses ``|i - j|``.

    Parameters
    ----------
    n : int
        Sequence length, in ``[1, 2^31 - 1]``.
    p : int
        Number of heads, ``>= 1``.
    causal : bool
        Causal (default) or bidirectional.

    Returns
    -------
    Pattern
        Heads ``A1 .. Ap``.

    Examples
    --------
    >>> pat = factorized(27, p=3)
    >>> pat.heads[2][26].indices.tolist()  # l = 3: distances 0, 9, 18
    [8, 17, 26]
    """
    n = check_int("n", n, 1, MAX_N)
    p = check_int("p", p, 1, 64)
    causal = check_bool("causal", causal)
    l = root_of(n, p)

    def spec(i: np.ndarray):
        for m in range(1, p + 1):
            step = min(l ** (m - 1), n)  # a step >= n gives the same rows (just i); int64-safe
            back = np.minimum(l - 1, i // step)
            fwd = np.zeros_like(i) if causal else np.minimum(l - 1, (n - 1 - i) // step)
            yield i - back * step, back + fwd + 1, step

    return Pattern.from_rule(
        progression_rule(n, p, spec), n, name="factorized", params={"p": p, "causal": causal},
        causal=causal,
    )
