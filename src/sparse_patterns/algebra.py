"""Pattern algebra: ``a | b``, ``a & b`` and ``a - b`` head by head, ``a + b`` heads
concatenated, and the JSON expression recipe that regenerates such a pattern.

The operators of :class:`~sparse_patterns.pattern.Pattern` compute :func:`combine` (one
code, :mod:`._expression`'s).
The result carries an :class:`ExpressionRule`: its rows are computed from the
operands' rows (``rows_of``), a chunk at a time, with sorted set operations on
CSR rows, so it streams like a generated pattern and builds only what is
read. ``|``, ``&`` and ``+`` are associative and are flattened (``a + b + c``
is one node of three operands); ``-`` stays binary. Name, params and head
names follow the expression: ``strided(n, 4) + global_tokens(n, 2)`` is named
``"strided + global_tokens"``, its params are the tree
``{"op": "+", "args": ({"pattern": "strided", "params": {...}}, ...)}`` and its
heads ``strided.A1, strided.A2, global_tokens.G``.

:func:`expression_recipe` gives the JSON tree of a pattern built by these
operators from generated families (``None`` otherwise), :func:`from_expression`
regenerates it exactly, and :func:`expression_flex` composes the families'
FlexAttention formulas.

Examples
--------
>>> from sparse_patterns import make
>>> pat = make("strided", 8, stride=4) + make("global_tokens", 8, tokens=1)
>>> pat.name, pat.head_names, pat.num_heads
('strided + global_tokens', ('strided.A1', 'strided.A2', 'global_tokens.G'), 3)
>>> from_expression(expression_recipe(pat)) == pat
True
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._expression import (
    MAX_DEPTH,
    MAX_NAME,
    MAX_NODES,
    OPS,
    ExpressionRule,
    _expr,
    combined,
)
from .pattern import Pattern
from .patterns import registry
from .util.checks import MAX_N, repr_text

if TYPE_CHECKING:
    from .patterns.formulas import Rule

__all__ = [
    "OPS", "MAX_DEPTH", "MAX_NODES", "MAX_NAME", "ExpressionRule", "combine", "expression_recipe",
    "from_expression", "expression_flex",
]


# ------------------------------------------------------------------------ combine
def combine(op: str, *patterns: Pattern) -> Pattern:
    """The pattern ``patterns[0] op patterns[1] op ...``, computed row range by row range.

    ``|``, ``&`` and ``-`` combine head ``m`` of each operand into head ``m``
    of the result (union, intersection, difference); ``+`` concatenates the
    heads. Nothing is built here: rows are computed from the operands' rows
    when read.

    Parameters
    ----------
    op : {"|", "&", "-", "+"}
        The operator (``-`` takes exactly two patterns).
    *patterns : Pattern
        Two or more patterns of one ``n``; for ``|``, ``&`` and ``-`` also of
        one head count.

    Returns
    -------
    Pattern
        Causal when every operand is (``|``, ``+``), when any is (``&``), when
        the first is (``-``). Its name, params and head names follow the
        expression (see the module docstring).

    Raises
    ------
    TypeError
        An operand that is not a :class:`~sparse_patterns.pattern.Pattern`.
    ValueError
        An unknown ``op``, a wrong number of operands, operands of different
        ``n`` or (``|``, ``&``, ``-``) head counts, nesting deeper than
        :data:`MAX_DEPTH`, more than :data:`MAX_NODES` nodes counted with
        repetition, or a name over :data:`MAX_NAME` characters.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> win = make("local", 6, window=1, causal=False) & make("full", 6)
    >>> win.name, win.causal, win.rows(4, 6).toarray().astype(int).tolist()
    ('local & full', True, [[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]])
    >>> (make("local", 6, window=1) | make("strided", 6, stride=2))
    Traceback (most recent call last):
    ...
    ValueError: b: strided has 2 heads, but a (local) has 1; a | b combines head by head (a + b concatenates heads)
    """
    return combined(op, patterns, Pattern)



# ------------------------------------------------------------------------ recipes
def _json(v: Any) -> Any:
    """A param as JSON (int, float, str, bool, None, or a list of them), else raise TypeError."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, (tuple, list)):
        return [_json(x) for x in v]
    raise TypeError(type(v).__name__)


def _family(p: Pattern) -> Any:
    """The registry's spec when ``p`` is exactly what its generator (or ``documents=``) made."""
    spec = registry.REGISTRY.get(p.name)
    if spec is None or p.rule is None or _expr(p) is not None:
        return None
    declared = {q.name for q in spec.params}
    # packed() (documents=) adds params["documents"]; within() renames its cut
    return spec if set(p.params) - {"documents"} == declared else None


def _tree(p: Pattern) -> dict[str, Any] | None:
    e = _expr(p)
    if e is not None:
        args = [_tree(x) for x in e.operands]
        return None if any(a is None for a in args) else {"op": e.op, "args": args}
    if _family(p) is None:
        return None
    try:
        return {"pattern": p.name, "params": {k: _json(v) for k, v in p.params.items()}}
    except TypeError:
        return None


def expression_recipe(pattern: Pattern) -> dict[str, Any] | None:
    """The JSON expression tree of ``pattern``, or None when it has none.

    A pattern made by the operators from generated families (a generator,
    ``make``, ``documents=``; not a user layout, a loaded file or
    :func:`~sparse_patterns.documents.within`) has one; so has a generated
    pattern alone (a single leaf).

    Parameters
    ----------
    pattern : Pattern

    Returns
    -------
    dict or None
        ``{"op": op, "args": [node, ...], "n": n}``, a node being an operator
        node (without ``n``) or a family ``{"pattern": name, "params": {...}}``;
        or ``{"pattern": name, "params": {...}, "n": n}`` for a generated
        pattern. :func:`from_expression` regenerates the pattern exactly.

    Raises
    ------
    TypeError
        ``pattern`` is not a Pattern.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> r = expression_recipe(make("local", 8, window=2) - make("global_tokens", 8, tokens=1))
    >>> r["op"], [a["pattern"] for a in r["args"]], r["n"]
    ('-', ['local', 'global_tokens'], 8)
    >>> r["args"][0]["params"]
    {'window': 2, 'causal': True}
    """
    if not isinstance(pattern, Pattern):
        raise TypeError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    tree = _tree(pattern)
    return None if tree is None else {**tree, "n": pattern.n}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Reader:
    """Walks a recipe tree, counting nodes, with one-line errors prefixed by ``where``."""

    def __init__(self, where: str, n: int) -> None:
        self.where, self.n, self.nodes = where, n, 0

    def fail(self, path: str, msg: str) -> ValueError:
        return ValueError(f"{self.where}: {path}: {msg}")

    def read(self, node: Any, path: str, depth: int, extra: frozenset = frozenset()) -> Pattern:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(path, f"a recipe holds at most {MAX_NODES} nodes")
        if not isinstance(node, Mapping):
            raise self.fail(path, f"expected a JSON object, got {repr_text(node)}")
        if "n" in node and (not _int(node["n"]) or node["n"] != self.n):
            raise self.fail(path, f"n={repr_text(node['n'])} differs from the recipe's n={self.n}")
        if "op" in node:
            return self._op(node, path, depth, extra)
        if "pattern" in node:
            return self._leaf(node, path, extra)
        raise self.fail(path, f"a node needs 'op' (one of {', '.join(OPS)}) or 'pattern'")

    def _keys(self, node: Mapping, path: str, allowed: set[str]) -> None:
        unknown = sorted(str(k)[:40] for k in node if k not in allowed)
        if unknown:
            raise self.fail(path, f"unknown keys {unknown[:4]}")

    def _op(self, node: Mapping, path: str, depth: int, extra: frozenset) -> Pattern:
        self._keys(node, path, {"op", "args", "n", *extra})
        op, args = node["op"], node.get("args")
        if not isinstance(op, str) or op not in OPS:
            raise self.fail(path, f"op must be one of {', '.join(map(repr, OPS))}, got {repr_text(op)}")
        if depth + 1 > MAX_DEPTH:
            raise self.fail(path, f"operators nest deeper than {MAX_DEPTH}")
        if not isinstance(args, list) or len(args) < 2 or (op == "-" and len(args) != 2):
            want = "exactly 2" if op == "-" else "at least 2"
            got = f"{len(args)} of them" if isinstance(args, list) else repr_text(args)
            raise self.fail(path, f"{op!r} takes a list 'args' of {want} nodes, got {got}")
        parts = [self.read(a, f"{path}.args[{k}]", depth + 1) for k, a in enumerate(args)]
        try:
            return combine(op, *parts)
        except ValueError as exc:
            raise self.fail(path, str(exc).splitlines()[0]) from None

    def _leaf(self, node: Mapping, path: str, extra: frozenset) -> Pattern:
        self._keys(node, path, {"pattern", "params", "n", *extra})
        name, params = node["pattern"], node.get("params", {})
        if not isinstance(name, str):
            raise self.fail(path, f"'pattern' must be a pattern name, got {repr_text(name)}")
        if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
            raise self.fail(path, f"'params' must be a JSON object, got {repr_text(params)}")
        for k, v in params.items():
            flat = v is None or isinstance(v, (bool, int, float, str))
            ints = isinstance(v, list) and all(_int(x) for x in v)
            if not (flat or (k == "documents" and ints)):
                raise self.fail(path, f"param {k[:40]!r} must be a number, string, boolean or "
                                      f"null (documents: a list of integers), got {repr_text(v)}")
        try:
            return registry.make(name, self.n, **params)
        except (ValueError, TypeError, OverflowError) as exc:
            text = str(exc).strip().splitlines()
            raise self.fail(path, text[0][:200] if text else type(exc).__name__) from None


def from_expression(recipe: Any, *, where: str = "recipe") -> Pattern:
    """Regenerate the pattern of an expression recipe (see :func:`expression_recipe`).

    Every family runs its generator's own checks (those of ``make``); a node
    may repeat ``n``, which must then be the recipe's. Nothing is built: the
    pattern returned reads its rows from the families' rules. At the top,
    ``version`` and ``generator`` keys are allowed and ignored (the file
    format's business).

    Parameters
    ----------
    recipe : dict
        ``{"op": ..., "args": [...], "n": n}`` or ``{"pattern": ..., "params": {...}, "n": n}``.
    where : str
        Prefix of error messages (a file name).

    Returns
    -------
    Pattern
        The expression's pattern, reading its rows from the families' rules.

    Raises
    ------
    ValueError
        One line, prefixed with ``where`` and the node's path: not an object,
        unknown keys, an unknown ``op``, the wrong number of ``args``, nesting
        deeper than :data:`MAX_DEPTH`, more than :data:`MAX_NODES` nodes, a bad
        or inconsistent ``n``, operands of different head counts, or a family
        or param its generator refuses.

    Examples
    --------
    >>> r = {"op": "+", "n": 8, "args": [{"pattern": "local", "params": {"window": 1}},
    ...                                  {"pattern": "global_tokens", "params": {"tokens": 2}}]}
    >>> from_expression(r).head_names
    ('local.A', 'global_tokens.G')
    >>> from_expression({"op": "*", "args": [], "n": 8}, where="f.json")
    Traceback (most recent call last):
    ...
    ValueError: f.json: expression: op must be one of '|', '&', '-', '+', got '*'
    """
    if not isinstance(recipe, Mapping):
        raise ValueError(f"{where}: an expression recipe must be a JSON object, got "
                         f"{repr_text(recipe)}")
    n = recipe.get("n")
    if not _int(n) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {repr_text(n)}")
    return _Reader(where, n).read(recipe, "expression", 0, frozenset({"version", "generator"}))


# -------------------------------------------------------------------------- flex


def _registered_flex(p: Pattern) -> list[Rule] | None:
    spec = _family(p)
    if spec is None or spec.flex is None or "documents" in p.params:
        return None
    return spec.flex(p)


def _fold(op: str, rules: list[Rule]) -> Rule:
    if op == "-":
        a, b = rules
        return lambda q, kv: a(q, kv) & ~b(q, kv)
    f = operator.or_ if op == "|" else operator.and_
    return lambda q, kv: functools.reduce(f, (r(q, kv) for r in rules))


def expression_flex(
    pattern: Pattern, leaf: Callable[[Pattern], list[Rule] | None] | None = None
) -> list[Rule] | None:
    """FlexAttention rules, one ``rule(q_idx, kv_idx)`` per head, composed from the families'.

    Parameters
    ----------
    pattern : Pattern
        Made by the operators (or a generated pattern alone).
    leaf : callable, optional
        ``leaf(family_pattern) -> rules or None`` for each operand that is not
        an operator node; by default the family's registered formula
        (``REGISTRY[name].flex``) for a pattern its generator made without
        ``documents``.

    Returns
    -------
    list or None
        ``|``: ``ra | rb``, ``&``: ``ra & rb``, ``-``: ``ra & ~rb`` head by head,
        ``+``: the rules concatenated; None when some operand has none.

    Examples
    --------
    >>> import torch
    >>> from sparse_patterns import make
    >>> pat = make("local", 4, window=1) + make("global_tokens", 4, tokens=1)
    >>> q, kv = torch.arange(4)[:, None], torch.arange(4)[None, :]
    >>> [r(q, kv).int().tolist()[3] for r in expression_flex(pat)]
    [[0, 0, 1, 1], [1, 0, 0, 0]]
    """
    leaf = _registered_flex if leaf is None else leaf
    e = _expr(pattern)
    if e is None:
        return leaf(pattern)
    parts = [expression_flex(x, leaf) for x in e.operands]
    if any(r is None for r in parts):
        return None
    if e.op == "+":
        return [r for part in parts for r in part]
    return [_fold(e.op, [part[h] for part in parts]) for h in range(e.num_heads)]
