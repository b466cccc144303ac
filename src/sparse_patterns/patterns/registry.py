"""The registry: pattern name -> generator, with a declared parameter list and,
where the family has one, its FlexAttention formula.

The CLI, ``make`` and every later command (verify, analyze, render, export,
profile) use this table, so no command needs per-pattern code: ``export``
asks ``REGISTRY[name].flex`` for a family's ``mask_mod`` rules. The families'
parameters, descriptions and papers come from :mod:`sparse_patterns.catalog`
(NumPy-free, so ``patterns list`` starts fast); :class:`Param` and
:func:`root_of` are re-exported from there.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..catalog import CATALOG, Param, root_of
from ..catalog import describe as catalog_rows
from ..documents import pack
from ..pattern import Pattern
from ..util.checks import MAX_N, check_int

__all__ = [
    "Param", "PatternSpec", "REGISTRY", "register", "get", "make", "make_again", "resolve", "root_of", "describe",
]


@dataclass(frozen=True)
class PatternSpec:
    """A registered pattern family."""

    name: str
    func: Callable[..., Pattern]
    params: tuple[Param, ...]
    description: str
    reference: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: ``flex(pattern) -> list of rule(q, kv)``, one FlexAttention rule per head
    #: (torch imported when it runs), for a pattern its generator built; None
    #: when the family has no formula
    flex: Callable[[Pattern], list[Callable[[Any, Any], Any]]] | None = None
    #: ``offsets(pattern) -> list of Offsets or None``, one per head: the heads that
    #: depend only on ``i - j`` (``patterns._flex.Offsets``), for a pattern its
    #: generator built; None when the family declares none
    offsets: Callable[[Pattern], list[Any]] | None = None

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


REGISTRY: dict[str, PatternSpec] = {}


def register(
    name: str,
    *params: Param,
    description: str | None = None,
    reference: str | None = None,
    flex: Callable[[Pattern], list[Callable[[Any, Any], Any]]] | None = None,
    offsets: Callable[[Pattern], list[Any]] | None = None,
) -> Callable[[Callable[..., Pattern]], Callable[..., Pattern]]:
    """Class the decorated generator ``f(n, **params) -> Pattern`` under ``name``.

    A family in :data:`~sparse_patterns.catalog.CATALOG` takes its parameters,
    description and reference from there (give none); a new family gives
    them here. Either way the declared parameters must be exactly the
    generator's keyword arguments (``TypeError`` otherwise).

    The generator returned takes one more keyword, ``documents`` (lengths or
    ``cu_seqlens`` offsets): the family applied inside each packed document
    (:func:`sparse_patterns.documents.pack`).

    ``flex``, when given, is the family's FlexAttention formula:
    ``flex(pattern)`` returns one ``rule(q_idx, kv_idx) -> bool tensor`` per
    head, in the generator's parameters (``pattern.params``). It is only
    asked about patterns that are exactly what the generator gives.
    ``offsets``, when given, says which heads depend only on ``i - j``
    (:class:`~sparse_patterns.patterns._flex.Offsets` per head, None for the others),
    under the same condition.
    """
    if not params and description is None and name in CATALOG:
        fam = CATALOG[name]
        params, description, reference = fam.params, fam.description, fam.reference
    if description is None or reference is None:
        raise TypeError(f"{name}: not in the catalog; give its params, description and reference")

    def deco(func: Callable[..., Pattern]) -> Callable[..., Pattern]:
        sig = inspect.signature(func)
        declared = {p.name for p in params}
        taken = [k for k in sig.parameters if k != "n"]
        if set(taken) != declared:
            raise TypeError(f"{name}: declared params {declared} != signature {taken}")
        REGISTRY[name] = PatternSpec(name, func, tuple(params), description, reference, flex=flex,
                                     offsets=offsets)

        @functools.wraps(func)
        def generator(n: int, *args: Any, documents: Any = None, **kwargs: Any) -> Pattern:
            if documents is None:
                return _made(name, func(n, *args, **kwargs))
            bound = sig.bind(n, *args, **kwargs).arguments
            given = {k: v for k, v in bound.items() if k != "n"}
            return _made(name, pack(get(name), n, documents, resolve(name, n, given)))

        kw = inspect.Parameter("documents", inspect.Parameter.KEYWORD_ONLY, default=None)
        generator.__signature__ = sig.replace(parameters=[*sig.parameters.values(), kw])  # type: ignore[attr-defined]
        return generator

    return deco


def get(name: str) -> PatternSpec:
    """The spec registered under ``name``; ``ValueError`` lists the known names."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"name: unknown pattern {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def resolve(name: str, n: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """Check parameter names and convert values (CLI strings, ``sqrt``) for ``name``."""
    spec = get(name)
    n = check_int("n", n, 1, MAX_N)
    known = {p.name: p for p in spec.params}
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in known:
            takes = ", ".join(known) if known else "no parameters"
            raise ValueError(f"{key}: pattern {name!r} takes no parameter {key!r}; it takes: {takes}")
        out[key] = known[key].convert(value, n)
    for p in spec.params:
        if p.name not in out and p.default is not inspect.Parameter.empty:
            out[p.name] = p.convert(p.default, n) if p.default is not None else None
    return out


def make(name: str, n: int, **params: Any) -> Pattern:
    """Generate the registered pattern ``name`` at sequence length ``n``.

    Parameters
    ----------
    name : str
        A registered family (see ``patterns list``).
    n : int
        Sequence length, ``>= 1``.
    **params
        The family's parameters; integers that follow ``n`` accept ``"sqrt"``.
        ``documents`` (lengths or ``cu_seqlens`` offsets) applies the family
        inside each packed document (:func:`sparse_patterns.documents.pack`).

    Returns
    -------
    Pattern
        The family's pattern on ``n`` tokens.

    Raises
    ------
    ValueError
        Unknown name, unknown parameter, or a value out of range.

    Examples
    --------
    >>> pat = make("strided", 16, stride=4)
    >>> pat.head_names, pat.params["stride"]
    (('A1', 'A2'), 4)
    >>> make("strided", 16384, stride="sqrt").params["stride"]
    128
    >>> make("local", 8, window=1, documents=[4, 4]).rows(4, 5).indices.tolist()
    [4]
    """
    if params.get("documents") is not None:
        documents = params.pop("documents")
        return _made(name, pack(get(name), n, documents, resolve(name, n, params)))
    params.pop("documents", None)
    return _made(name, get(name).func(n, **resolve(name, n, params)))


def _made(name: str, pattern: Pattern) -> Pattern:
    """``pattern``, as family ``name``'s generator made it; where its params are the
    family's (packed ``documents`` aside), it records that :func:`make` makes it again from
    them (:func:`make_again`, :meth:`Pattern.made_by`: how it pickles)."""
    params = dict(pattern.params)
    if set(params) - {"documents"} == {q.name for q in get(name).params}:
        pattern.made_by(make_again, name, pattern.n, params)
    return pattern


def make_again(name: str, n: int, params: Mapping[str, Any]) -> Pattern:
    """:func:`make` with the params as one mapping (what a pickled family pattern holds).

    Examples
    --------
    >>> make_again("local", 8, {"window": 2}) == make("local", 8, window=2)
    True
    """
    return make(name, n, **params)


def describe() -> list[dict[str, Any]]:
    """The registered families, sorted by name: parameters with defaults, description, reference.

    The catalog's rows (:func:`sparse_patterns.catalog.describe`, what
    ``patterns list`` prints) plus any family registered at run time.

    Examples
    --------
    >>> row = {r["name"]: r for r in describe()}["strided"]
    >>> row["params"]
    {'stride': 'sqrt', 'window': 'paper', 'causal': True}
    """
    return catalog_rows(REGISTRY.values())
