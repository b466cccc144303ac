"""What a generator gives a :class:`~sparse_patterns.pattern.Pattern`: its rule, so that
consumers read row ranges and closed-form counts instead of the whole CSR.

Re-exported by :mod:`sparse_patterns.pattern`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from . import config

if TYPE_CHECKING:
    from .layout import BlockLayout

__all__ = ["PatternRule", "CHUNK_ENTRIES", "csr_bytes", "check_csr_fits", "check_counts_fit",
           "residue_order", "csr_spans"]


@dataclass(frozen=True)
class PatternRule:
    """The rule a generator gives a :class:`Pattern`, so consumers need not build its CSR.

    Parameters
    ----------
    num_heads : int
        Number of heads the rule builds.
    build : callable
        ``build() -> sequence of csr_matrix``: every head, canonical bool CSR.
    blocks : callable, optional
        ``blocks(block) -> BlockLayout`` in closed form, without the CSR, so
        that block layouts of very long sequences stay cheap.
    rows : callable, optional
        ``rows(start, stop) -> sequence of csr_matrix``: the rows
        ``start .. stop-1`` of every head, each ``(stop - start, n)``, canonical
        bool CSR, in O(nnz of those rows). Without it, row ranges slice the
        whole CSR (built once, under the memory limit).
    counts : callable, optional
        ``counts() -> int64 (num_heads, n)``: ``|A_i|`` of every head in closed
        form, so ``nnz``, ``head_nnz`` and the memory guard need no CSR.
    union_counts : callable, optional
        ``union_counts() -> int64 (n,)``: ``|S_i|`` of the union of the heads in
        closed form, so ``nnz``, ``density`` and ``row_counts`` need no pass
        over the rows. Without it, the union is streamed row range by row range.
    head_nnz : callable, optional
        ``head_nnz() -> tuple of int``: each head's number of entries in O(1), so
        that ``head_nnz`` needs no counts (a search sorts thousands of candidates
        by it before the first task).
    take : callable, optional
        ``take(i) -> sequence of csr_matrix``: the rows ``i`` (int64 token
        indices, any order) of every head, each ``(i.size, n)``, as ``rows``
        does for a range; planners read permuted query blocks through it.
    spans : callable, optional
        ``spans(i) -> sequence of (ind, starts, ends)`` per head: row ``r`` of
        the head is ``ind[starts[r]:ends[r]]`` (sorted columns), ``ind`` an
        array shared by the rows. It costs O(len(i)), not O(entries): a
        window is a slice of ``arange(n)``, a stride progression a slice of
        the tokens sorted by residue, a summary head a prefix of its columns.
        Planners count tiles from it without building rows.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> from sparse_patterns.pattern import Pattern
    >>> rule = PatternRule(1, lambda: [sp.identity(4, dtype=bool, format="csr")])
    >>> Pattern.from_rule(rule, 4, name="diagonal").nnz
    4
    """

    num_heads: int
    build: Callable[[], Sequence[sp.csr_matrix]]
    blocks: Callable[[int], BlockLayout] | None = None
    rows: Callable[[int, int], Sequence[sp.csr_matrix]] | None = None
    counts: Callable[[], np.ndarray] | None = None
    union_counts: Callable[[], np.ndarray] | None = None
    take: Callable[[np.ndarray], Sequence[sp.csr_matrix]] | None = None
    spans: Callable[[np.ndarray], Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]] | None = None
    head_nnz: Callable[[], Sequence[int]] | None = None


#: Entries of one chunk of rows that streaming consumers read at a time (about 40 MB of CSR).
CHUNK_ENTRIES = 1 << 23


def csr_bytes(n_rows: int, nnz: int) -> int:
    """Bytes of a boolean CSR with ``n_rows`` rows and ``nnz`` entries (int32 or int64 indices).

    Examples
    --------
    >>> csr_bytes(4, 10)
    70
    """
    idx = 4 if max(n_rows, nnz) < 2**31 - 1 else 8
    return nnz * (idx + 1) + (n_rows + 1) * idx


def check_csr_fits(name: str, n: int, what: str, need: int) -> None:
    """Refuse (``MemoryLimitError``) a whole token-level CSR of ``need`` bytes above the limit."""
    limit = config.get_memory_limit()
    if need > limit:
        raise config.MemoryLimitError(
            f"{what}: the token-level CSR of {name} at n={n:,} needs "
            f"{config.format_bytes(need)}, above the memory limit of "
            f"{config.format_bytes(limit)} (sparse_patterns.config.set_memory_limit); "
            "read it in row ranges (pattern.rows, pattern.iter_rows) or at the block "
            "level (pattern.to_blocks) instead"
        )


def check_counts_fit(name: str, n: int, rows: int) -> None:
    """Refuse before allocating ``rows`` int64 counts per token (and twice as many temporaries).

    Per-token bookkeeping under 256 MiB (n up to millions) is always allowed:
    the memory limit guards what grows faster than n.
    """
    need = 3 * 8 * rows * n  # measured: local at 2^27 peaks at 5.2 GB for 4.3 GB of counts
    limit = max(config.get_memory_limit(), 256 << 20)
    if need > limit:
        raise config.MemoryLimitError(
            f"n: |A_i| of {name} at n={n:,} ({rows} rows of counts) needs "
            f"{config.format_bytes(need)}, above the memory limit of "
            f"{config.format_bytes(limit)} (sparse_patterns.config.set_memory_limit); "
            "use a smaller n"
        )


def residue_order(n: int, s: int) -> np.ndarray:
    """Tokens ``0 .. n-1`` grouped by ``i mod s``, each group increasing (int64; O(n)).

    Examples
    --------
    >>> residue_order(7, 3).tolist()
    [0, 3, 6, 1, 4, 2, 5]
    """
    grid = np.arange(s, dtype=np.int64)[:, None] + s * np.arange(-(-n // s), dtype=np.int64)
    order = grid.ravel()
    return order[order < n]


def csr_spans(mats: Sequence[sp.csr_matrix]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """CSR rows as ``(indices, indptr[:-1], indptr[1:])``: the spans form of any rows."""
    return [(m.indices, m.indptr[:-1], m.indptr[1:]) for m in mats]
