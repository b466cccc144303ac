"""How a :class:`~sparse_patterns.pattern.Pattern` is pickled: by what makes it again.

A generated pattern holds closures (its rule) that pickle cannot take, so
``Pattern.__reduce__`` gives :func:`recipe_of`: a registered family's name and
parameters (packed documents included), an algebra expression's recipe, else the
heads themselves; :func:`restore` makes the pattern from it.
"""

from __future__ import annotations

from typing import Any

from .algebra import ExpressionRule, expression_recipe, from_expression
from .pattern import Pattern
from .patterns import registry

__all__ = ["recipe_of", "restore"]


def recipe_of(pattern: Pattern) -> tuple[Any, tuple[Any, ...]]:
    """``(restore, args)``, what ``__reduce__`` returns for ``pattern``."""
    names = pattern.head_names
    if isinstance(pattern.rule, ExpressionRule):
        recipe = expression_recipe(pattern)
        if recipe is not None:
            return restore, ("expression", recipe, names)
    spec = registry.REGISTRY.get(pattern.name)
    taken = {q.name for q in spec.params} if spec is not None else set()
    params = dict(pattern.params)
    if pattern.rule is not None and spec is not None and set(params) - {"documents"} == taken:
        return restore, ("family", (pattern.name, pattern.n, params), names)
    return restore, ("heads", (pattern.heads, pattern.name, params, pattern.causal), names)


def restore(kind: str, what: Any, head_names: tuple[str, ...]) -> Pattern:
    """The pattern :meth:`Pattern.__reduce__` described."""
    if kind == "expression":
        pat = from_expression(what)
    elif kind == "family":
        name, n, params = what
        pat = registry.make(name, n, **params)
    else:
        heads, name, params, causal = what
        return Pattern(heads, name=name, params=params, causal=causal, head_names=head_names)
    if pat._head_names != tuple(head_names):
        pat._head_names = tuple(head_names)
    return pat
