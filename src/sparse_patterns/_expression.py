"""What the operators of :class:`~sparse_patterns.pattern.Pattern` compute
(:func:`combined`): the operands checked, the expression's rule (:class:`ExpressionRule`,
its rows computed from the operands' rows), its name, params and head names.

Below :mod:`.pattern`: the class of the result comes with the call (``kind``), so that
``Pattern``'s operators and :func:`sparse_patterns.algebra.combine` share this code
without either module importing the other's caller.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from .layout import BlockLayout
from .rule import CHUNK_ENTRIES, PatternRule
from .util.checks import repr_text

if TYPE_CHECKING:
    from .pattern import Pattern

__all__ = ["OPS", "MAX_DEPTH", "MAX_NODES", "MAX_NAME", "ExpressionRule", "combined"]

#: The operators: head-by-head union, intersection, difference; head concatenation.
OPS: tuple[str, ...] = ("|", "&", "-", "+")
#: Deepest nesting of operators, in a pattern or a recipe.
MAX_DEPTH = 32
#: Most nodes (operators and families, counted with repetition) a recipe or an expression may
#: hold: ``x = x - x`` twenty times doubles its tree each time (2**21 nodes), and its name,
#: params and rows walk the whole tree.
MAX_NODES = 256
#: Longest name (characters) of a pattern the operators make.
MAX_NAME = 1 << 16
_PREC = {"|": 1, "&": 2, "-": 3, "+": 3}  # Python's: | below & below + and -
_FLAT = ("|", "&", "+")  # associative: nested nodes of the same op are flattened


@dataclass(frozen=True, eq=False)
class ExpressionRule(PatternRule):
    """The rule of a pattern made by :func:`combine`: the operator and its operands.

    ``depth`` is the nesting of operators (1 for ``a | b`` of two families), ``nodes``
    the size of its tree with every repeated subexpression counted each time it occurs
    (3 for ``a | b``).
    """

    op: str = "+"
    operands: tuple[Pattern, ...] = ()
    depth: int = 1
    nodes: int = 3


# ------------------------------------------------------------------- set operations
def _canonical(m: sp.spmatrix) -> sp.csr_matrix:
    m = sp.csr_matrix(m, dtype=bool)
    if not m.has_canonical_format:
        m.sum_duplicates()
        m.sort_indices()
    return m


def _apply(op: str, mats: list[tuple[sp.csr_matrix, ...]]) -> list[sp.csr_matrix]:
    """Every head of ``op`` over the operands' rows (``mats[k]``: operand k's heads)."""
    if op == "+":
        return [m for heads in mats for m in heads]
    out = []
    for col in zip(*mats, strict=True):
        if op == "|":
            m = functools.reduce(operator.add, col)  # bool CSR: True + True is True
        elif op == "&":
            m = functools.reduce(lambda x, y: x.multiply(y), col)
        else:  # "-": a > b is a & ~b on booleans
            m = col[0] > col[1]
        out.append(_canonical(m))
    return out


# ------------------------------------------------------------------------ combine
def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _check(op: Any, patterns: tuple[Any, ...], kind: type) -> None:
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"op: must be one of {', '.join(map(repr, OPS))}; got {repr_text(op)}")
    if len(patterns) < 2 or (op == "-" and len(patterns) != 2):
        want = "exactly 2" if op == "-" else "at least 2"
        raise ValueError(f"patterns: {op!r} takes {want} patterns, got {len(patterns)}")
    label = ["a", "b"] if len(patterns) == 2 else [f"patterns[{k}]" for k in range(len(patterns))]
    for k, x in enumerate(patterns):
        if not isinstance(x, kind):
            raise TypeError(f"{label[k]}: expected a Pattern, got {type(x).__name__}")
    a = patterns[0]
    expr = f"a {op} b" if len(patterns) == 2 else f"{op!r}"
    for k, x in enumerate(patterns[1:], 1):
        if x.n != a.n:
            raise ValueError(f"{label[k]}: {_short(x.name)} has n={x.n:,}, but {label[0]} "
                             f"({_short(a.name)}) has n={a.n:,}; {expr} needs one sequence length")
        if op != "+" and x.num_heads != a.num_heads:
            raise ValueError(
                f"{label[k]}: {_short(x.name)} has {x.num_heads} heads, but {label[0]} "
                f"({_short(a.name)}) has {a.num_heads}; {expr} combines head by head "
                "(a + b concatenates heads)")


def _expr(p: Pattern) -> ExpressionRule | None:
    return p.rule if isinstance(p.rule, ExpressionRule) else None


def _node(p: Pattern) -> dict[str, Any]:
    """The expression tree of ``p`` for its params: an operator node or a family leaf."""
    e = _expr(p)
    if e is not None:
        return {"op": e.op, "args": tuple(_node(x) for x in e.operands)}
    return {"pattern": p.name, "params": dict(p.params)}


def _label(p: Pattern, op: str, first: bool) -> str:
    e = _expr(p)
    if e is not None and (_PREC[e.op] < _PREC[op] or (_PREC[e.op] == _PREC[op] and not first)):
        return f"({p.name})"
    return p.name


def _head_names(op: str, operands: tuple[Pattern, ...]) -> tuple[str, ...]:
    if op != "+":
        per_head = zip(*(x.head_names for x in operands), strict=True)
        return tuple(h[0] if len(set(h)) == 1 else op.join(h) for h in per_head)
    names: list[str] = []
    for x in operands:  # never a "+" node (flattened): prefix by the operand
        label = f"({x.name})" if _expr(x) is not None else x.name
        names += [f"{label}.{h}" for h in x.head_names]
    seen: dict[str, int] = {}
    out = []
    for s in names:  # a + a: the second copy's heads get "#2"
        seen[s] = seen.get(s, 0) + 1
        out.append(s if seen[s] == 1 else f"{s}#{seen[s]}")
    return tuple(out)


def combined(op: str, patterns: Sequence[Any], kind: type[Pattern]) -> Pattern:
    """``patterns[0] op patterns[1] op ...``, made by ``kind.from_rule`` (``kind``: the
    :class:`~sparse_patterns.pattern.Pattern` class, which every operand must be), after
    the checks that :func:`sparse_patterns.algebra.combine` documents."""
    patterns = tuple(patterns)
    _check(op, patterns, kind)
    operands: list[Any] = []
    for x in patterns:
        e = _expr(x)
        operands += list(e.operands) if e is not None and e.op == op and op in _FLAT else [x]
    depth = 1 + max((e.depth for x in operands if (e := _expr(x)) is not None), default=0)
    if depth > MAX_DEPTH:
        raise ValueError(f"patterns: the expression would nest {depth} operators deep; at most "
                         f"{MAX_DEPTH} (build its heads once and make a Pattern of them)")
    nodes = 1 + sum(e.nodes if (e := _expr(x)) is not None else 1 for x in operands)
    if nodes > MAX_NODES:  # before the name, params and head names, which walk the tree
        raise ValueError(f"patterns: the expression would hold {nodes:,} nodes, a repeated "
                         f"subexpression counted each time; at most {MAX_NODES} (build its "
                         "heads once and make a Pattern of them)")
    labels = [_label(x, op, k == 0) for k, x in enumerate(operands)]
    chars = sum(map(len, labels)) + 3 * (len(labels) - 1)
    if chars > MAX_NAME:
        raise ValueError(f"patterns: the expression's name would be {chars:,} characters; at "
                         f"most {MAX_NAME:,} (build its heads once and make a Pattern of them)")
    ops = tuple(operands)
    n = ops[0].n
    p = sum(x.num_heads for x in ops) if op == "+" else ops[0].num_heads
    flags = [x.causal for x in ops]
    causal = flags[0] if op == "-" else any(flags) if op == "&" else all(flags)

    def take(i: np.ndarray) -> list[sp.csr_matrix]:
        return _apply(op, [x.rows_of(i) for x in ops])

    def rows(start: int, stop: int) -> list[sp.csr_matrix]:
        return take(np.arange(start, stop, dtype=np.int64))

    def chunks():  # row ranges of about CHUNK_ENTRIES entries of the operands' heads
        step = max(1, CHUNK_ENTRIES // max(1, sum(x.max_row_count() for x in ops)))
        return ((s, min(n, s + step)) for s in range(0, n, step))

    def build() -> list[sp.csr_matrix]:
        if op == "+" or all(x.materialized for x in ops):  # whole heads (shared by "+")
            return _apply(op, [x.heads for x in ops])
        parts = [rows(s, t) for s, t in chunks()]
        return [sp.vstack(col, format="csr") for col in zip(*parts, strict=True)]

    def counts() -> np.ndarray:  # |A_i| per head: "+" concatenates, else one streamed pass
        if op == "+":
            return np.concatenate([x._head_counts() for x in ops])
        out = np.empty((p, n), dtype=np.int64)
        for s, t in chunks():
            for h, m in enumerate(rows(s, t)):
                out[h, s:t] = np.diff(m.indptr)
        return out

    blocks = None
    if op == "+":
        def blocks(block: int) -> BlockLayout:
            bls = [x.to_blocks(block) for x in ops]
            return BlockLayout(np.concatenate([b.layout for b in bls]), block=block, n=n,
                               full=np.concatenate([b.full for b in bls]))

    rule = ExpressionRule(p, build, blocks=blocks, rows=rows, counts=counts, take=take, op=op,
                          operands=ops, depth=depth, nodes=nodes)
    out = kind.from_rule(
        rule, n, name=f" {op} ".join(labels),
        params={"op": op, "args": tuple(_node(x) for x in ops)}, causal=causal,
        head_names=_head_names(op, ops),
    )
    return out.made_by(combined, op, ops, kind)
