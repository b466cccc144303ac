"""How the heads of a pattern combine: :class:`Mode` and the mode tuples
(re-exported by :mod:`sparse_patterns.pattern`)."""

from __future__ import annotations

from enum import Enum

__all__ = ["Mode", "MODES", "KERNEL_MODES"]


class Mode(str, Enum):
    """How the heads of a pattern combine (the paper uses all three).

    ``INTERLEAVED``: step ``m`` of a path uses head ``m``; ``MERGED``: one
    softmax over the union of the heads; ``MULTIHEAD``: ``p`` heads in one
    layer, one softmax each. Analysis accepts all three; kernels and exports
    run ``MERGED`` and ``MULTIHEAD`` (:data:`KERNEL_MODES`).

    Examples
    --------
    >>> Mode("merged") is Mode.MERGED, Mode.MERGED == "merged"
    (True, True)
    """

    INTERLEAVED = "interleaved"
    MERGED = "merged"
    MULTIHEAD = "multihead"


#: Every mode's name, in the order analysis documents them.
MODES: tuple[str, ...] = tuple(m.value for m in Mode)
#: The modes a kernel or an export executes (one softmax per head, or over the union).
KERNEL_MODES: tuple[str, ...] = (Mode.MULTIHEAD.value, Mode.MERGED.value)
