"""Packed documents: several sequences in one, attention kept inside each.

Training runs pack documents into one sequence and mask attention at their
boundaries (FlashAttention's ``cu_seqlens``, FlexAttention's document mask).
:func:`pack` applies a registered family inside each document, positions
counted from the document's start (fixed's blocks and summaries, strided's
window and stride restart at every document), with no entry across documents;
``make(name, n, documents=...)`` and every generator's ``documents=`` call it.
:func:`within` intersects any pattern (a user layout too) with the documents:
it cannot re-anchor a rule it does not know, so a strided layout cut by
:func:`within` keeps the stride phase of the whole sequence.

Both give patterns that carry a rule: their rows are read per document from
the family's own rule (one generated pattern per distinct document length),
so plans, exports and row-range reads stream as for any generated pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from ._csr import csr
from .pattern import Pattern
from .rule import PatternRule
from .util.checks import check_int, repr_text

__all__ = ["document_offsets", "pack", "within"]


def document_offsets(documents: Any, n: int) -> np.ndarray:
    """The ``cu_seqlens`` offsets of packed documents, from lengths or offsets.

    Parameters
    ----------
    documents : sequence of int, or None
        Document lengths (each ``>= 1``, summing to n), or ``cu_seqlens``
        offsets (0, strictly increasing, n) as FlashAttention's varlen
        functions take them: a sequence starting with 0 is read as offsets (a
        length is never 0). None is one document, the whole sequence.
    n : int
        Sequence length.

    Returns
    -------
    numpy.ndarray
        ``int64 (D + 1,)``: document d is ``[offsets[d], offsets[d + 1])``.

    Raises
    ------
    ValueError
        Not a 1-D sequence of integers, empty, or not lengths or offsets as above.

    Examples
    --------
    >>> document_offsets([3, 5], 8).tolist(), document_offsets([0, 3, 8], 8).tolist()
    ([0, 3, 8], [0, 3, 8])
    >>> document_offsets([3, 4], 8)
    Traceback (most recent call last):
    ...
    ValueError: documents: lengths sum to 7, not n=8
    """
    n = check_int("n", n, 1)
    if documents is None:
        return np.array([0, n], dtype=np.int64)
    if isinstance(documents, (str, bytes, dict)) or np.ndim(documents) != 1:
        raise ValueError(f"documents: expected a 1-D sequence of document lengths or cu_seqlens "
                         f"offsets, got {repr_text(documents)}")
    if isinstance(documents, (list, tuple)) and any(
            isinstance(x, (bool, np.bool_)) for x in documents):
        raise ValueError(f"documents: expected integers, got {repr_text(documents)}")
    a = np.asarray(documents)
    if a.size == 0:
        raise ValueError("documents: needs at least one document, got an empty sequence")
    if a.dtype.kind not in "iu":
        raise ValueError(f"documents: expected integers, got {repr_text(documents)}")
    off = bool(a[0] == 0)  # cu_seqlens offsets; else lengths
    what, lo = ("offsets", 0) if off else ("lengths", 1)
    bad = np.flatnonzero((a < lo) | (a > n))
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"documents: {what} must be integers [{lo}, {n}], "
                         f"got {what}[{k}]={int(a[k])}")
    looks = a.size > 1 and bool(a[-1] == n and (np.diff(a.astype(np.int64)) > 0).all())
    a = a.astype(np.int64)
    if off:
        bad = np.flatnonzero(np.diff(a) <= 0)
        if bad.size:
            k = int(bad[0]) + 1
            raise ValueError(
                f"documents: starts with 0, so read as cu_seqlens offsets, which must be strictly "
                f"increasing; got offsets[{k}]={a[k]} after offsets[{k - 1}]={a[k - 1]} "
                "(document lengths must be >= 1)"
            )
        if a.size < 2 or a[-1] != n:
            raise ValueError(f"documents: cu_seqlens offsets must end at n={n}, "
                             f"got {repr_text(a.tolist())}")
        return a
    total = int(a.sum())  # every term <= n < 2^31, so no overflow below 2^32 documents
    if total != n:
        hint = "; cu_seqlens offsets must start at 0" if looks else ""
        raise ValueError(f"documents: lengths sum to {total}, not n={n}{hint}")
    out = np.zeros(a.size + 1, dtype=np.int64)
    np.cumsum(a, out=out[1:])
    return out


def _shifted(m: sp.csr_matrix, shift: np.ndarray, n: int) -> sp.csr_matrix:
    """Rows of ``m`` with row ``r``'s columns moved right by ``shift[r]``, as ``(rows, n)``."""
    indptr = m.indptr.astype(np.int64)
    cols = m.indices.astype(np.int64) + np.repeat(shift, np.diff(indptr))
    return csr(n, indptr, cols)


class _Documents:
    """Where each token lies: its document, the document's start and length."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = offsets
        self.lengths = np.diff(offsets)

    def locate(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        doc = np.searchsorted(self.offsets, tokens, side="right") - 1
        return doc, self.offsets[doc], self.lengths[doc]

    def spread(self, per_length: Callable[[int], np.ndarray], rows: int) -> np.ndarray:
        """``(rows, n)``: for every document, ``per_length(its length)`` placed at its tokens."""
        n = int(self.offsets[-1])
        out = np.empty((rows, n), dtype=np.int64)
        for length in np.unique(self.lengths):
            docs = np.flatnonzero(self.lengths == length)
            at = (self.offsets[docs][:, None] + np.arange(length)).ravel()
            out[:, at] = np.tile(per_length(int(length)), len(docs))
        return out


def pack(spec: Any, n: int, documents: Any, resolved: Mapping[str, Any]) -> Pattern:
    """A family applied inside each packed document: what
    :func:`~sparse_patterns.patterns.registry.make` (and a family's generator) gives for
    ``documents=``, which is how to call it.

    Parameters
    ----------
    spec : sparse_patterns.patterns.registry.PatternSpec
        The family (its ``name``, generator ``func`` and ``params``).
    n : int
        Sequence length: the documents' lengths sum to n.
    documents : sequence of int
        Document lengths, or ``cu_seqlens`` offsets (see :func:`document_offsets`).
    resolved : mapping
        The family's parameters resolved once at ``n``
        (:func:`~sparse_patterns.patterns.registry.resolve`: ``stride="sqrt"`` is
        ``ceil(sqrt(n))`` in every document); a parameter left to its default of None
        (axial2d's height) takes each document's own default.

    Returns
    -------
    Pattern
        Named ``spec.name``, with ``params["documents"]`` the lengths; document d's
        rows and columns are those of ``make(name, length_d, **params)``
        shifted by the document's start.

    Raises
    ------
    ValueError
        Bad ``documents``, or parameters a document cannot take (the message
        names the document).

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("strided", 8, stride=2, documents=[3, 5])
    >>> a1, a2 = pat.rows_of([2, 7])  # token 2 of document 0; token 7 is 4 of document 1 (starts at 3)
    >>> a1.indices.tolist(), a2.indices.tolist()  # window {i-2..i}, stride 2 from the document's start
    ([0, 1, 2, 5, 6, 7], [0, 2, 3, 5, 7])
    >>> pat.params["documents"]
    (3, 5)
    """
    name = spec.name
    n = check_int("n", n, 1)
    where = _Documents(document_offsets(documents, n))
    cache: dict[int, Pattern] = {}

    def part(length: int) -> Pattern:
        if length not in cache:
            try:
                cache[length] = spec.func(length, **resolved)
            except ValueError as exc:
                d = int(np.flatnonzero(where.lengths == length)[0])
                raise ValueError(f"documents: document {d} (length {length}): {exc}") from None
        return cache[length]

    first = part(int(where.lengths[0]))
    p, causal = first.num_heads, first.causal
    for length in np.unique(where.lengths):
        if part(int(length)).num_heads != p:
            raise ValueError(f"documents: {name} gives {part(int(length)).num_heads} heads at "
                             f"length {int(length)} but {p} at length {int(where.lengths[0])}")

    def take(tokens: np.ndarray) -> list[sp.csr_matrix]:
        tokens = np.asarray(tokens, dtype=np.int64)
        _, start, length = where.locate(tokens)
        groups = np.unique(length)
        if groups.size <= 1:  # one length (or no tokens): no reordering
            mats = part(int(groups[0]) if groups.size else int(where.lengths[0])).rows_of(tokens - start)
            return [_shifted(m, start, n) for m in mats]
        order, parts = [], []
        for g in groups:
            sel = np.flatnonzero(length == g)
            order.append(sel)
            parts.append([_shifted(m, start[sel], n) for m in part(int(g)).rows_of(tokens[sel] - start[sel])])
        back = np.empty(tokens.size, dtype=np.int64)
        back[np.concatenate(order)] = np.arange(tokens.size)
        return [sp.vstack(col, format="csr")[back] for col in zip(*parts, strict=True)]

    rule = PatternRule(
        p,
        lambda: take(np.arange(n)),
        rows=lambda a, b: take(np.arange(a, b)),
        counts=lambda: where.spread(lambda L: part(L).row_counts()[:-1], p),
        union_counts=lambda: where.spread(lambda L: part(L).row_counts()[-1:], 1)[0],
        take=take,
    )
    return Pattern.from_rule(
        rule, n, name=name, causal=causal, head_names=first.head_names,
        params={**{q.name: resolved[q.name] for q in spec.params}, "documents": _lengths(where)},
    )


def _lengths(where: _Documents) -> tuple[int, ...]:
    return tuple(int(x) for x in where.lengths)


def within(pattern: Pattern, documents: Any) -> Pattern:
    """``pattern`` with every entry across documents removed (an intersection).

    Works for any pattern, user layouts included. It cannot re-anchor a rule it
    does not know: the family's positions keep counting from the start of the
    whole sequence (use :func:`pack`, or a generator's ``documents=``, to
    restart a family at each document).

    Parameters
    ----------
    pattern : Pattern
    documents : sequence of int
        Lengths or ``cu_seqlens`` offsets (see :func:`document_offsets`).

    Returns
    -------
    Pattern
        Named ``within(NAME)`` (it is not what the family's generator makes,
        so no recipe or family formula applies), same heads,
        ``params["documents"]`` added.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> cut = within(make("full", 4), [2, 2])
    >>> [m.indices.tolist() for m in cut.rows_of([1, 3])]
    [[0, 1, 2, 3]]
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    n = pattern.n
    where = _Documents(document_offsets(documents, n))

    def take(tokens: np.ndarray) -> list[sp.csr_matrix]:
        tokens = np.asarray(tokens, dtype=np.int64)
        _, start, length = where.locate(tokens)
        out = []
        for m in pattern.rows_of(tokens):
            counts = np.diff(m.indptr)
            row = np.repeat(np.arange(tokens.size), counts)
            cols = m.indices.astype(np.int64)
            keep = (cols >= start[row]) & (cols < start[row] + length[row])
            indptr = np.zeros(tokens.size + 1, dtype=np.int64)
            np.cumsum(np.bincount(row[keep], minlength=tokens.size), out=indptr[1:])
            out.append(csr(n, indptr, cols[keep]))
        return out

    rule = PatternRule(pattern.num_heads, lambda: take(np.arange(n)),
                       rows=lambda a, b: take(np.arange(a, b)), take=take)
    return Pattern.from_rule(rule, n, name=f"within({pattern.name})", causal=pattern.causal,
                             head_names=pattern.head_names,
                             params={**pattern.params, "documents": _lengths(where)})
