"""Attention budgets: ``|A_i|`` per head and for the union against ``n^(1/p)``.

The Sparse Transformer asks that ``|A_i|`` grow like ``n^(1/p)`` for a pattern of
p heads, so that the total work is ``O(n * n^(1/p))`` instead of ``O(n^2)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..pattern import BlockLayout, Pattern

__all__ = ["HeadBudget", "budgets", "block_budgets"]


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


def budgets(
    pattern: Pattern, p: int | None = None, *, counts: np.ndarray | None = None
) -> list[HeadBudget]:
    """``|A_i|`` statistics per head, then for the union.

    Parameters
    ----------
    pattern : Pattern
    p : int, optional
        The factorization order for ``n^(1/p)``; defaults to the number of heads.
    counts : numpy.ndarray, optional
        ``int (heads + 1, n)`` row counts already known (as
        :meth:`Pattern.row_counts` returns them), so the union need not be built.

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
    if counts is None:
        counts = pattern.row_counts()  # (p_heads + 1, n)
    elif np.shape(counts) != (pattern.num_heads + 1, n):
        raise ValueError(
            f"counts: expected shape {(pattern.num_heads + 1, n)}, got {np.shape(counts)}"
        )
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


def block_budgets(layout: BlockLayout, p: int | None = None) -> list[HeadBudget]:
    """``|A_i|`` upper bounds of a block layout, per head then for the union.

    A set block counts as ``block`` columns for each of its rows (the
    max-pooled bound a block-sparse kernel computes), so ``max_row`` is
    ``block`` times the most set blocks in a block row and ``nnz`` is the
    number of set blocks times ``block ** 2`` (edge blocks cropped to n).

    Examples
    --------
    >>> from sparse_patterns import make
    >>> b = block_budgets(make("strided", 16, stride=4).to_blocks(4))
    >>> [(x.head, x.max_row) for x in b]
    [('A1', 8), ('A2', 16), ('union', 16)]
    """
    p = layout.num_heads if p is None else int(p)
    if p < 1:
        raise ValueError(f"p: must be an integer >= 1, got {p}")
    n, nb, block = layout.n, layout.nb, layout.block
    root = float(n) ** (1.0 / p)
    sizes = np.full(nb, block, dtype=np.int64)
    sizes[-1] = n - block * (nb - 1)
    lays = [layout.layout[h] for h in range(layout.num_heads)] + [layout.layout.any(axis=0)]
    names = [f"A{h + 1}" for h in range(layout.num_heads)] + ["union"]
    out = []
    for name, lay in zip(names, lays, strict=True):
        # (nb,) columns attended by each block row; only the last block may be short
        cols = np.count_nonzero(lay, axis=1).astype(np.int64) * block
        cols -= (block - sizes[-1]) * lay[:, -1]
        nnz = int(cols @ sizes)
        out.append(
            HeadBudget(
                head=name,
                nnz=nnz,
                density=nnz / float(n) ** 2,
                max_row=int(cols.max()),
                mean_row=float(nnz / n),
                root=root,
                max_over_root=float(cols.max()) / root,
                nnz_over_budget=nnz / (n * root),
            )
        )
    return out
