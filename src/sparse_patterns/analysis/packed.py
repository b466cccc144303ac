"""Verification of packed documents: the criteria inside each document.

A pattern whose ``params`` hold ``documents`` (``make(..., documents=)``, or
:func:`~sparse_patterns.documents.within`) has no pair across documents, so the
paper's criteria ask for every earlier position *of the same document*. Each
document is checked exactly on its own: a packed family through the family
generated at the document's length (one check per distinct length, which keeps
the structured methods at any n), any other pattern through the document's
rows and columns (one document's CSR at a time, never n x n). The reports add
up: hop counts, failing pairs and targets are sums; a counter-example is the
first failing document's, in sequence positions.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from ..documents import document_offsets
from ..pattern import Pattern
from .budget import budgets
from .report import VerifyReport

__all__ = ["verify_documents"]


def _document(pattern: Pattern, s: int, e: int, family: bool) -> Pattern:
    """Document ``[s, e)`` of ``pattern`` as a pattern of its own (positions from s)."""
    if family:
        from ..patterns import registry  # noqa: PLC0415

        params = {k: v for k, v in pattern.params.items() if k != "documents"}
        return registry.make(pattern.name, e - s, **params)
    mats = [pattern.rows(s, e, head=k)[:, s:e] for k in range(pattern.num_heads)]
    return Pattern(mats, name=f"{pattern.name}[{s}:{e}]", causal=pattern.causal,
                   head_names=pattern.head_names)


def _shift(pair: tuple[int, int] | None, s: int) -> tuple[int, int] | None:
    return None if pair is None else (pair[0] + s, pair[1] + s)


def verify_documents(pattern: Pattern, verify: Any, **options: Any) -> VerifyReport:
    """:func:`~sparse_patterns.analysis.verify` of ``pattern`` inside each of its documents.

    Parameters
    ----------
    pattern : Pattern
        With ``params["documents"]`` (lengths or offsets).
    verify : callable
        The single-sequence check (``analysis.verify``).
    **options
        ``verify``'s options (``p``, ``mode``, ``residual``, ``depth``, ...).

    Returns
    -------
    VerifyReport
        Over the whole sequence: ``targets`` are the pairs inside documents;
        ``method`` is ``per-document`` and the methods that decided.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> from sparse_patterns.analysis import verify
    >>> r = verify(make("strided", 40, stride=4, documents=[16, 24]))
    >>> r.ok, r.targets == 16 * 17 // 2 + 24 * 25 // 2, r.method
    (True, True, 'per-document (structured-offsets)')
    """
    t0 = time.perf_counter()
    offs = document_offsets(pattern.params["documents"], pattern.n)
    lengths = np.diff(offs)
    from ..patterns import registry  # noqa: PLC0415

    family = pattern.name in registry.REGISTRY and pattern.rule is not None
    reports: dict[int, VerifyReport] = {}  # a packed family: one check per distinct length
    per_doc: list[VerifyReport] = []
    for d, (s, e) in enumerate(zip(offs[:-1].tolist(), offs[1:].tolist(), strict=True)):
        key = int(lengths[d]) if family else d
        if key not in reports:
            reports[key] = verify(_document(pattern, s, e, family), **options)
        per_doc.append(reports[key])
    first = per_doc[0]
    hops: dict[int, int] = {}
    for r in per_doc:
        for k, v in r.hops.items():
            hops[k] = hops.get(k, 0) + v

    def failing(attr: str) -> tuple[int, int] | None:
        for d, r in enumerate(per_doc):
            if getattr(r, attr) is not None:
                return _shift(getattr(r, attr), int(offs[d]))
        return None

    depths = [r.depth for r in per_doc]
    checked = all(r.depth_checked for r in per_doc)
    bad_doc = next((d for d, r in enumerate(per_doc) if not r.ok), None)
    return replace(
        first,
        ok=all(r.ok for r in per_doc),
        criterion1=all(r.criterion1 for r in per_doc),
        criterion2=all(r.criterion2 for r in per_doc),
        hops=hops,
        unreachable=sum(r.unreachable for r in per_doc),
        not_in_last=sum(r.not_in_last for r in per_doc),
        counterexample=failing("counterexample"),
        counterexample1=failing("counterexample1"),
        counterexample2=failing("counterexample2"),
        n=pattern.n,
        targets=sum(r.targets for r in per_doc),
        budgets=tuple(budgets(pattern, first.p)),
        depth=None if not checked or any(x is None for x in depths) else max(depths),
        depth_checked=checked,
        name=pattern.name,
        params=dict(pattern.params),
        seconds=time.perf_counter() - t0,
        explanation=None if bad_doc is None else per_doc[bad_doc].explanation,
        method="per-document (" + ", ".join(sorted({r.method for r in per_doc})) + ")",
    )
