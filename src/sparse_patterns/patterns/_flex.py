"""Building blocks of the families' FlexAttention formulas.

A family's formula is ``flex(pattern) -> list of rule(q, kv) -> bool tensor``,
one rule per head, registered beside its generator
(``register(..., flex=...)``); ``export.flex`` turns the rules into a
``mask_mod``. The helpers here only compose closures: torch is imported by
the formulas when they run (outside the rules, which ``torch.compile``
traces), never when this module is imported, so
``import sparse_patterns`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Rule", "Offsets", "band", "causal_rule", "every", "dilated_band"]

#: ``rule(q_idx, kv_idx) -> torch.bool tensor``: membership of one head
Rule = Callable[[Any, Any], Any]


def every(q: Any, kv: Any) -> Any:
    """The rule of a head that holds every pair (``q >= 0 & kv >= 0``, broadcast)."""
    return (q >= 0) & (kv >= 0)


def causal_rule(rule: Rule, causal: bool) -> Rule:
    """``rule`` and, when ``causal``, ``kv <= q``."""
    if not causal:
        return rule
    return lambda q, kv: rule(q, kv) & (kv <= q)


def band(lo: int, hi: int) -> Rule:
    """``lo <= q - kv <= hi``."""
    return lambda q, kv: ((q - kv) >= lo) & ((q - kv) <= hi)


def dilated_band(window: int, dilation: int, n: int, causal: bool) -> Rule:
    """A (dilated) sliding window: ``|q - kv| <= window * dilation`` (``kv <= q`` if
    causal) and ``(q - kv) mod dilation == 0``."""
    reach = min(window * dilation, n)
    win = band(-reach if not causal else 0, reach)
    if dilation == 1:
        return win
    import torch  # noqa: PLC0415

    return lambda q, kv: win(q, kv) & (torch.remainder(q - kv, dilation) == 0)


@dataclass(frozen=True)
class Offsets:
    """A causal head that depends only on ``i - j``: the pairs ``0 <= j <= i < n`` with
    ``lo <= i - j``, ``i - j <= hi`` (no bound when ``hi`` is None) and
    ``(i - j) mod step == 0``.

    A family declares its heads this way beside its formula (``register(...,
    offsets=...)``) where they are such sets: a causal window is ``Offsets(0, w)``,
    strided's stride head ``Offsets(0, None, l)``. A kernel reads the shape of a piece
    from them: a stride head grouped by ``i mod l`` is dense causal attention within
    each class.

    Examples
    --------
    >>> Offsets(0, None, 4).holds(8), Offsets(0, 3).holds(4)
    (True, False)
    """

    lo: int = 0
    hi: int | None = None
    step: int = 1

    def holds(self, delta: int) -> bool:
        """Whether offset ``delta = i - j`` is in the set."""
        return (delta >= self.lo and (self.hi is None or delta <= self.hi)
                and delta % self.step == 0)
