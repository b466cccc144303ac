"""Results that print themselves: a rich ``table()`` and, from it, plain ``text()``.

:class:`~sparse_patterns.analysis.VerifyReport`,
:class:`~sparse_patterns.analysis.BudgetTable` and
:class:`~sparse_patterns.analysis.ScalingTable` define ``table()``; this base
class gives them :meth:`Printable.text`, the same table as the plain text
``patterns`` prints to a pipe (no colour, a fixed width).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Printable"]


class Printable:
    """Base of the result types: ``table()`` (defined by each) and :meth:`text`."""

    __slots__ = ()

    def table(self) -> Any:  # pragma: no cover - every result defines it
        raise NotImplementedError

    def text(self, width: int = 80) -> str:
        """:meth:`table` rendered as plain text, ``width`` columns wide, without colour.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> from sparse_patterns.analysis import budget_table
        >>> budget_table(make("full", 2)).text().splitlines()[0]
        'full(causal=True)  n=2  heads=1'
        """
        from rich.console import Console  # noqa: PLC0415

        out = Console(width=width, color_system=None)
        with out.capture() as cap:
            out.print(self.table())
        return cap.get()
