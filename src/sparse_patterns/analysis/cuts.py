"""Bottlenecks of the layered p-step graph (networkx, small n).

The fixed pattern routes everything a block holds through its ``c`` summary
positions (Child et al. 2019, arXiv:1904.10509, section 4.2): :func:`bottleneck`
makes that visible as the minimum vertex cut between a set of early input
positions and a later output position in the graph whose layer t holds the
positions after t steps of attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..pattern import Pattern
from ..util.checks import check_int

__all__ = ["Bottleneck", "bottleneck", "BOTTLENECK_LIMIT"]

#: Largest number of nodes ((p + 1) * n) of the layered graph handed to networkx.
BOTTLENECK_LIMIT = 200_000


@dataclass(frozen=True)
class Bottleneck:
    """Minimum vertex cut between ``sources`` (layer 0) and ``target`` (layer p).

    ``cut`` lists ``(step, position)`` nodes: position after that many steps.
    ``size`` is 0 when no path joins them at all.
    """

    size: int
    cut: tuple[tuple[int, int], ...]
    sources: tuple[int, ...]
    target: int
    p: int
    mode: str
    residual: bool

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cut"] = [list(c) for c in self.cut]
        d["sources"] = list(self.sources)
        return d


def bottleneck(
    pattern: Pattern,
    sources: int | Sequence[int],
    target: int,
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
) -> Bottleneck:
    """Minimum vertex cut from early inputs to a later output through the p steps.

    Parameters
    ----------
    pattern : Pattern
    sources : int or sequence of int
        Input positions (layer 0); an int s means ``range(s)``.
    target : int
        Output position (layer p).
    p, mode, residual
        As in :func:`sparse_patterns.verify`: layer t-1 -> layer t uses the
        step-t connectivity (plus the identity when ``residual``).

    Returns
    -------
    Bottleneck

    Raises
    ------
    ValueError
        Positions out of range, or a layered graph above ``BOTTLENECK_LIMIT`` nodes.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> bottleneck(make("fixed", 32, stride=8, c=1), 8, 31).size
    1
    >>> bottleneck(make("fixed", 32, stride=8, c=4), 8, 31).size
    4
    """
    import networkx as nx  # noqa: PLC0415

    from ._common import check_common, step_mats  # noqa: PLC0415

    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    p, mode, residual = check_common(p, mode, residual, pattern.num_heads)
    n = pattern.n
    if (p + 1) * n > BOTTLENECK_LIMIT:
        raise ValueError(
            f"n: the layered graph would have (p + 1) * n = {(p + 1) * n:,} nodes; "
            f"bottleneck handles at most {BOTTLENECK_LIMIT:,}"
        )
    if isinstance(sources, (int, np.integer)):
        src = list(range(check_int("sources", sources, 1, n)))
    else:
        src = sorted({check_int("sources", s, 0, n - 1) for s in sources})
        if not src:
            raise ValueError("sources: give at least one input position, got none")
    target = check_int("target", target, 0, n - 1)
    mats, _ = step_mats(pattern, p, mode)
    eye = sp.identity(n, dtype=bool, format="csr")
    steps = [(m + eye).tocsr() if residual else m.tocsr() for m in mats]
    # forward reach from the sources and backward reach from the target, per layer
    fwd = [np.zeros(n, bool) for _ in range(p + 1)]
    fwd[0][src] = True
    for t in range(1, p + 1):
        fwd[t] = (steps[t - 1] @ fwd[t - 1].astype(np.int8)) > 0
    bwd = [np.zeros(n, bool) for _ in range(p + 1)]
    bwd[p][target] = True
    for t in range(p, 0, -1):
        bwd[t - 1] = (steps[t - 1].T @ bwd[t].astype(np.int8)) > 0
    keep = [f & b for f, b in zip(fwd, bwd, strict=True)]
    if not keep[p][target]:
        return Bottleneck(0, (), tuple(src), target, p, mode, residual)
    g = nx.DiGraph()
    for j in np.flatnonzero(keep[0]):
        g.add_edge("s", (0, int(j)))
    for t in range(1, p + 1):
        m = steps[t - 1]
        for a in np.flatnonzero(keep[t]):
            row = m.indices[m.indptr[a]:m.indptr[a + 1]]
            for j in row[keep[t - 1][row]]:
                g.add_edge((t - 1, int(j)), (t, int(a)))
    tnode = (p, target)
    if p == 0 or g.has_edge("s", tnode):
        cut: set = set()
    else:
        cut = nx.minimum_node_cut(g, "s", tnode)
    return Bottleneck(len(cut), tuple(sorted(cut)), tuple(src), target, p, mode, residual)
