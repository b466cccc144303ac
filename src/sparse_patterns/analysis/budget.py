"""Attention budgets: ``|A_i|`` per head and for the union against ``n^(1/p)``.

The Sparse Transformer asks that ``|A_i|`` grow like ``n^(1/p)`` for a pattern of
p heads, so that the total work is ``O(n * n^(1/p))`` instead of ``O(n^2)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..pattern import Pattern

__all__ = ["HeadBudget", "budgets"]


@dataclass(frozen=True)
class HeadBudget:
    """Budget figures of one head (or of the union)."""

    head: str
    nnz: int
    density: float
    max_row: int
    mean_row: float
    root: float  # n^(1/p)
    max_over_root: float  # max |A_i| / n^(1/p)
    nnz_over_budget: float  # nnz / (n * n^(1/p))

    def to_dict(self) -> dict:
        return asdict(self)


def budgets(pattern: Pattern, p: int | None = None) -> list[HeadBudget]:
    """``|A_i|`` statistics per head, then for the union.

    Parameters
    ----------
    pattern : Pattern
    p : int, optional
        The factorization order for ``n^(1/p)``; defaults to the number of heads.

    Returns
    -------
    list of HeadBudget
        One per head in order, then one named ``"union"``.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> b = budgets(make("strided", 16, stride=4))
    >>> [(x.head, x.max_row, x.root) for x in b]
    [('A1', 5, 4.0), ('A2', 4, 4.0), ('union', 7, 4.0)]
    """
    p = pattern.num_heads if p is None else int(p)
    if p < 1:
        raise ValueError(f"p: must be an integer >= 1, got {p}")
    n = pattern.n
    root = float(n) ** (1.0 / p)
    counts = pattern.row_counts()  # (p_heads + 1, n)
    names = [*pattern.head_names, "union"]
    out = []
    for name, row in zip(names, counts, strict=True):
        nnz = int(row.sum())
        out.append(
            HeadBudget(
                head=name,
                nnz=nnz,
                density=nnz / float(n) ** 2,
                max_row=int(row.max()),
                mean_row=float(np.mean(row)),
                root=root,
                max_over_root=float(row.max()) / root,
                nnz_over_budget=nnz / (n * root),
            )
        )
    return out
