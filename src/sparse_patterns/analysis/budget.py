"""Attention budgets: ``|A_i|`` per head and for the union against ``n^(1/p)``.

The Sparse Transformer asks that ``|A_i|`` grow like ``n^(1/p)`` for a pattern of
p heads, so that the total work is ``O(n * n^(1/p))`` instead of ``O(n^2)``.
:func:`budgets` gives the figures of a pattern, :func:`block_budgets` the
upper bounds of a block layout, and :func:`budget_table` a :class:`BudgetTable`
that prints itself (``patterns show``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..pattern import BlockLayout, Pattern
from ._printable import Printable

__all__ = ["HeadBudget", "BudgetTable", "budgets", "block_budgets", "budget_table", "PICTURE_LIMIT"]

#: Largest n for which :func:`budget_table` keeps a text picture of the pattern.
PICTURE_LIMIT = 64


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

    @classmethod
    def of(cls, head: str, nnz: int, max_row: int, mean_row: float, n: int, root: float) -> HeadBudget:
        """The figures of a head with ``nnz`` entries, rows of at most ``max_row``, over n and ``n^(1/p)``."""
        return cls(head=head, nnz=nnz, density=nnz / float(n) ** 2, max_row=max_row,
                   mean_row=mean_row, root=root, max_over_root=float(max_row) / root,
                   nnz_over_budget=nnz / (n * root))

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
        out.append(HeadBudget.of(name, int(row.sum()), int(row.max()), float(np.mean(row)), n, root))
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
        out.append(HeadBudget.of(name, nnz, int(cols.max()), float(nnz / n), n, root))
    return out


@dataclass(frozen=True)
class BudgetTable(Printable):
    """A pattern's budgets per head and for the union, with a text picture for small n.

    Attributes
    ----------
    name : str
    n : int
    params : dict
    causal : bool
    heads : tuple of HeadBudget
        One per head in order, then the union (see :func:`budgets`).
    picture : str or None
        :meth:`Pattern.to_string` for ``n <= PICTURE_LIMIT``, else None.
    """

    name: str
    n: int
    params: dict[str, Any] = field(default_factory=dict)
    causal: bool = True
    heads: tuple[HeadBudget, ...] = ()
    picture: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict: name, n, params, causal, heads (budget dicts), picture."""
        return {
            "name": self.name,
            "n": self.n,
            "params": dict(self.params),
            "causal": self.causal,
            "heads": [h.to_dict() for h in self.heads],
            "picture": self.picture,
        }

    def table(self) -> Any:
        """A rich renderable: a title line, the picture with its legend, the budgets table.

        Returns
        -------
        rich.console.Group

        Examples
        --------
        >>> from sparse_patterns import make
        >>> print(budget_table(make("strided", 4, stride=2)).text().splitlines()[0])
        strided(stride=2, window=paper, causal=True)  n=4  heads=2
        """
        from rich.console import Group  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415
        from rich.text import Text  # noqa: PLC0415

        names = [h.head for h in self.heads[:-1]]
        ps = ", ".join(f"{k}={v}" for k, v in self.params.items())
        out: list[Any] = [Text.from_markup(f"[bold]{self.name}[/]({ps})  n={self.n}  heads={len(names)}")]
        if self.picture is not None:
            legend = "  ".join(f"{k + 1}={h}" for k, h in enumerate(names) if k < 9)
            out.append(Text(self.picture))
            out.append(Text(f"rows are outputs i, columns inputs j; {legend}; # = several heads"))
        t = Table()
        for col in ("head", "nnz", "density", "max |A_i|", "mean |A_i|", "n^(1/p)", "max/n^(1/p)"):
            t.add_column(col, justify="right")
        for r in self.heads:
            t.add_row(r.head, f"{r.nnz:,}", f"{r.density:.4g}", str(r.max_row), f"{r.mean_row:.2f}",
                      f"{r.root:.2f}", f"{r.max_over_root:.2f}")
        out.append(t)
        return Group(*out)


def budget_table(pattern: Pattern, p: int | None = None) -> BudgetTable:
    """The budgets of a pattern (:func:`budgets`) with what ``patterns show`` prints around them.

    Parameters
    ----------
    pattern : Pattern
    p : int, optional
        As in :func:`budgets`.

    Returns
    -------
    BudgetTable

    Examples
    --------
    >>> from sparse_patterns import make
    >>> t = budget_table(make("strided", 16, stride=4))
    >>> [h.head for h in t.heads], t.picture.splitlines()[0]
    (['A1', 'A2', 'union'], '#...............')
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    return BudgetTable(
        name=pattern.name,
        n=pattern.n,
        params=dict(pattern.params),
        causal=pattern.causal,
        heads=tuple(budgets(pattern, p)),
        picture=pattern.to_string() if pattern.n <= PICTURE_LIMIT else None,
    )
