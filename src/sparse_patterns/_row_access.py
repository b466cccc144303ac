"""How a :class:`~sparse_patterns.pattern.Pattern` gives its rows (:class:`RowAccess`):
row ranges, chosen tokens and chunks, streamed from the generator's rule where it can
build them, else sliced from the heads' CSR, with memory in proportion to the rows read."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ._csr import union_rows
from .rule import CHUNK_ENTRIES, csr_spans

__all__ = ["RowAccess"]


class RowAccess:
    """The row methods of :class:`~sparse_patterns.pattern.Pattern`, which holds the state
    they read: ``_n``, ``_heads`` (None until built), ``_rule``, ``_counts``, and
    ``heads``, ``num_heads``, ``_counts_without_csr``, ``_head_counts``."""

    __slots__ = ()
    _n: int
    _heads: Any
    _rule: Any
    _counts: Any

    def rows(self, start: int, stop: int, head: int | None = None) -> sp.csr_matrix:
        """The rows ``start .. stop-1`` (all columns) of one head, or of the union.

        Costs O(nnz of those rows) for a generated pattern whose rule builds
        row ranges; a pattern built from CSR (a user layout, a file) slices it.

        Parameters
        ----------
        start, stop : int
            ``0 <= start <= stop <= n``.
        head : int, optional
            The head, in ``[0, p)``; None (default) gives the union of the heads.

        Returns
        -------
        scipy.sparse.csr_matrix
            Boolean ``(stop - start, n)``, sorted unique column indices.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> pat = make("strided", 8, stride=3)
        >>> pat.rows(6, 8).toarray().astype(int)
        array([[1, 0, 0, 1, 1, 1, 1, 0],
               [0, 1, 0, 0, 1, 1, 1, 1]])
        >>> pat.rows(7, 8, head=1).indices.tolist()
        [1, 4, 7]
        """
        start, stop = self._check_range(start, stop)
        if head is not None:
            if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not (
                0 <= head < self.num_heads
            ):
                raise ValueError(f"head: must be an int in [0, {self.num_heads}), got {head!r}")
            return self._row_mats(start, stop)[int(head)]
        mats = self._row_mats(start, stop)
        return mats[0] if len(mats) == 1 else union_rows(list(mats))

    def iter_rows(self, chunk: int | None = None):
        """Yield ``(start, stop, heads)`` over consecutive row ranges covering ``[0, n)``.

        ``heads`` holds the rows ``start .. stop-1`` of every head, boolean CSR
        ``(stop - start, n)`` each. A chunk holds ``chunk`` rows, or by default
        about :data:`CHUNK_ENTRIES` entries, so memory stays bounded at any n.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> [(a, b, m[1].nnz) for a, b, m in make("strided", 8, stride=3).iter_rows(chunk=3)]
        [(0, 3, 3), (3, 6, 6), (6, 8, 6)]
        """
        if chunk is None:
            chunk = self.chunk_rows()
        elif isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
            raise ValueError(f"chunk: must be an int >= 1, got {chunk!r}")
        for start in range(0, self._n, int(chunk)):
            stop = min(self._n, start + int(chunk))
            yield start, stop, self._row_mats(start, stop)

    def rows_of(self, i: np.ndarray) -> tuple[sp.csr_matrix, ...]:
        """The rows ``i`` (token indices in ``[0, n)``, any order) of every head.

        Each head's rows come as boolean CSR ``(len(i), n)``, row ``r`` being
        token ``i[r]``: O(nnz of those rows) when the rule can take any rows,
        else one row range per run of consecutive indices.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> [m.indices.tolist() for m in make("strided", 8, stride=3).rows_of([7, 2])]
        [[4, 5, 6, 7, 0, 1, 2], [1, 4, 7, 2]]
        """
        i = np.asarray(i, dtype=np.int64).reshape(-1)
        self._check_tokens(i)
        if self._heads is None and self._rule is not None and self._rule.take is not None:
            return tuple(self._rule.take(i))
        if self._heads is not None or self._rule is None or self._rule.rows is None:
            return tuple(h[i] for h in self.heads)
        cuts = np.flatnonzero(np.diff(i) != 1) + 1  # runs of consecutive tokens
        parts = [self._row_mats(int(r[0]), int(r[-1]) + 1) for r in np.split(i, cuts) if r.size]
        if not parts:
            return tuple(h[:0] for h in self._row_mats(0, 0))
        return tuple(sp.vstack(col, format="csr") for col in zip(*parts, strict=True))

    def spans_of(self, i: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rows ``i`` of every head as slices: ``(ind, starts, ends)`` per head, row
        ``r`` being ``ind[starts[r]:ends[r]]`` (sorted columns); O(len(i)) where the
        rule shares its columns (:attr:`PatternRule.spans`), else the CSR of :meth:`rows_of`.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> [ind[a[0]:b[0]].tolist() for ind, a, b in make("strided", 8, stride=3).spans_of([7])]
        [[4, 5, 6, 7], [1, 4, 7]]
        """
        i = np.asarray(i, dtype=np.int64).reshape(-1)
        rule = self._rule
        if self._heads is None and rule is not None and rule.spans is not None:
            self._check_tokens(i)
            got = rule.spans(i)
            if got is not None:
                return list(got)
        return csr_spans(self.rows_of(i))

    def _check_tokens(self, i: np.ndarray) -> None:
        if i.size and (i.min() < 0 or i.max() >= self._n):
            raise ValueError(f"i: token indices must lie in [0, {self._n}), got {i.min()}..{i.max()}")

    def chunk_rows(self, entries: int = CHUNK_ENTRIES) -> int:
        """Rows per chunk so that a chunk of every head holds about ``entries`` entries."""
        widest = self.max_row_count()
        return int(max(1, min(self._n, entries // max(1, widest))))

    def max_row_count(self) -> int:
        """The largest ``|A_i|`` summed over the heads (a bound on the union's rows)."""
        if not self._counts_without_csr() or (
            self._heads is None and self._counts is None and self._rule.counts is None
        ):
            return self._n  # unknown without a pass over the rows: assume dense rows
        return int(self._head_counts().sum(axis=0).max())

    def _check_range(self, start: Any, stop: Any) -> tuple[int, int]:
        for name, v in (("start", start), ("stop", stop)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name}: must be an int in [0, {self._n}], got {v!r}")
        if not 0 <= start <= stop <= self._n:
            raise ValueError(
                f"start, stop: need 0 <= start <= stop <= n={self._n}, got start={start}, stop={stop}"
            )
        return int(start), int(stop)

    def _row_mats(self, start: int, stop: int) -> tuple[sp.csr_matrix, ...]:
        if self._heads is None and self._rule is not None and self._rule.rows is not None:
            return tuple(self._rule.rows(start, stop))
        return tuple(h[start:stop] for h in self.heads)
