"""A pattern's FlexAttention formula, asked of the pattern by export and kernels alike:
:func:`formula_of` gives the rules of a registered family, of packed documents of one,
or of an algebra expression of them, and None where no formula can be trusted.

A family's formula (``REGISTRY[name].flex``) is used only for a pattern that is
what its name and params generate; inside packed documents it is evaluated in
positions counted from each document's start, with the formula of the
document's own length (identical closures shared), through an int32 document
id per token: never an n x n mask.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from ..algebra import ExpressionRule, expression_flex
from ..documents import document_offsets
from ..pattern import Pattern
from ..util.stream import check_fits
from . import registry
from ._flex import Rule

__all__ = ["DOCUMENT_FORMULAS_LIMIT", "Rule", "formula_of"]

#: most distinct document formulas (document lengths whose family rules differ, e.g.
#: factorized's ``l`` or bigbird's block table) one mask_mod dispatches between;
#: a packed pattern needing more uses the csr bit table instead
DOCUMENT_FORMULAS_LIMIT = 16


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether two rules are the same closure: same code, equal captured values.

    Conservative: tensors, arrays and unknown objects are equal only when they
    are the same object.
    """
    if a is b:
        return True
    if depth > 16 or type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, types.FunctionType):
        ca, cb = a.__closure__ or (), b.__closure__ or ()
        if a.__code__ is not b.__code__ or len(ca) != len(cb):
            return False
        try:
            cells = [(x.cell_contents, y.cell_contents) for x, y in zip(ca, cb, strict=True)]
        except ValueError:  # an empty cell
            return False
        return (_same(a.__defaults__, b.__defaults__, depth + 1)
                and _same(a.__kwdefaults__, b.__kwdefaults__, depth + 1)
                and all(_same(x, y, depth + 1) for x, y in cells))
    if isinstance(a, (bool, int, float, str, np.generic)):
        return bool(a == b)
    return False


def _document_formula(spec: Any, pattern: Pattern) -> list[Rule] | None:
    """Rules of a family packed in documents (``documents.pack``):
    ``doc[q] == doc[kv] & rule(q - start[doc[q]], kv - start[doc[kv]])``.

    ``rule`` is the family's formula for the generated pattern of the document's
    own length (a formula may depend on n: factorized's ``l``, bigbird's block
    table, axial2d's default square); lengths whose formulas are the same
    closure share one, and a token picks its document's by a group id. ``doc``
    is int32 ``(n,)``, ``start`` and the group ids int32 ``(D,)``: O(n), never
    n x n. None when more than :data:`DOCUMENT_FORMULAS_LIMIT` formulas differ.
    """
    import torch  # noqa: PLC0415

    n = pattern.n
    params = {k: v for k, v in pattern.params.items() if k != "documents"}
    offsets = document_offsets(pattern.params["documents"], n)  # (D + 1,)
    lengths = np.diff(offsets)
    check_fits(f"documents: the document ids of {pattern.name} at n={n:,}",
               4 * n + 12 * lengths.size, "a smaller n")
    groups: list[tuple[list[Rule], int]] = []  # (rules, longest length using them)
    distinct, which = np.unique(lengths, return_inverse=True)  # ascending
    group_of = np.empty(distinct.size, dtype=np.int32)
    for u, length in enumerate(distinct.tolist()):
        try:
            rules = spec.flex(spec.func(length, **params))
        except (KeyError, TypeError, ValueError):
            return None
        g = next((k for k, (r, _) in enumerate(groups) if _same(r, rules)), len(groups))
        if g == len(groups):
            if g == DOCUMENT_FORMULAS_LIMIT:
                return None
            groups.append((rules, length))
        groups[g] = (groups[g][0], length)  # the longest so far
        group_of[u] = g
    doc = torch.repeat_interleave(torch.arange(lengths.size, dtype=torch.int32),
                                  torch.from_numpy(lengths))  # (n,)
    start = torch.from_numpy(offsets[:-1].astype(np.int32))  # (D,)
    t_gid = torch.from_numpy(group_of[which.ravel()])  # (D,)

    def head(k: int) -> Rule:
        def rule(q, kv):
            qc, kc = torch.clamp(q, 0, n - 1), torch.clamp(kv, 0, n - 1)
            dq, dk = doc[qc], doc[kc]
            same = (dq == dk) & (q < n) & (kv < n)
            lq = qc - start[dq]
            lk = torch.where(same, kc - start[dk], lq)  # in q's document: a valid local index
            if len(groups) == 1:
                return same & groups[0][0][k](lq, lk)
            g = t_gid[dq]
            out = same & (g < 0)
            for j, (rules, longest) in enumerate(groups):  # clamped: a gather stays in range
                lq_j, lk_j = torch.clamp(lq, max=longest - 1), torch.clamp(lk, max=longest - 1)
                out = out | ((g == j) & rules[k](lq_j, lk_j))
            return same & out

        return rule

    return [head(k) for k in range(pattern.num_heads)]


def _family_formula(pattern: Pattern) -> list[Rule] | None:
    """The family's registered formula (``REGISTRY[name].flex``), inside each
    document for a packed pattern, only when the pattern is what its name and
    params generate."""
    spec = registry.REGISTRY.get(pattern.name)
    if spec is None or spec.flex is None:
        return None
    packed = "documents" in pattern.params
    if set(pattern.params) - {"documents"} != {q.name for q in spec.params}:
        return None
    generated = pattern.rule is not None  # built by its generator
    if not generated:
        try:
            again = registry.make(pattern.name, pattern.n, **dict(pattern.params))
        except (ValueError, TypeError):
            return None
        if again.num_heads != pattern.num_heads or not again == pattern:
            return None
    if packed:
        return _document_formula(spec, pattern)
    try:
        return spec.flex(pattern)
    except (KeyError, TypeError):
        return None


def formula_of(pattern: Pattern) -> list[Rule] | None:
    """Rules of a registered family (packed documents included) or of an
    expression of them (:func:`~sparse_patterns.algebra.expression_flex`)."""
    if isinstance(pattern.rule, ExpressionRule):
        return expression_flex(pattern, leaf=_family_formula)
    return _family_formula(pattern)


