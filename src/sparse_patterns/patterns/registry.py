"""The registry: pattern name -> generator, with a declared parameter list and,
where the family has one, its FlexAttention formula.

The CLI, ``make`` and every later command (verify, analyze, render, export,
profile) use this table, so no command needs per-pattern code: ``export``
asks ``REGISTRY[name].flex`` for a family's ``mask_mod`` rules and
:func:`describe` gives ``patterns list`` its rows. A parameter
declared with ``follows_n=True`` also accepts ``"sqrt"`` (``ceil(sqrt(n))``) or
``"cbrt"`` (``ceil(n ** (1/3))``), so a sweep over n can keep ``l ~ n^(1/p)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._validate import MAX_N, check_int
from ..pattern import Pattern

__all__ = [
    "Param", "PatternSpec", "REGISTRY", "register", "get", "make", "resolve", "root_of", "describe",
]


def root_of(n: int, p: int) -> int:
    """Smallest integer ``l`` with ``l ** p >= n`` (exact, no float rounding).

    Examples
    --------
    >>> root_of(16384, 2), root_of(1000, 3), root_of(1001, 3)
    (128, 10, 11)
    """
    l = max(1, round(n ** (1.0 / p)))
    while l**p < n:
        l += 1
    while l > 1 and (l - 1) ** p >= n:
        l -= 1
    return l


_FOLLOW = {"sqrt": 2, "cbrt": 3}


@dataclass(frozen=True)
class Param:
    """One generator parameter: its type (int, str, bool), default and help."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    follows_n: bool = False

    def convert(self, value: Any, n: int) -> Any:
        """Convert a CLI string or Python value, resolving ``sqrt``/``cbrt``."""
        if self.follows_n and isinstance(value, str) and value in _FOLLOW:
            return root_of(n, _FOLLOW[value])
        if self.type is int:
            if isinstance(value, str):
                try:
                    value = int(value, 10)
                except ValueError:
                    extra = " or 'sqrt'/'cbrt'" if self.follows_n else ""
                    raise ValueError(
                        f"{self.name}: must be an integer{extra}, got {value!r}"
                    ) from None
            return check_int(self.name, value, lo=-(2**62))
        if self.type is bool:
            if isinstance(value, str):
                low = value.lower()
                if low in ("true", "1", "yes"):
                    return True
                if low in ("false", "0", "no"):
                    return False
                raise ValueError(f"{self.name}: must be true or false, got {value!r}")
            if not isinstance(value, bool):
                raise ValueError(f"{self.name}: must be True or False, got {value!r}")
            return value
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"{self.name}: must be one of {', '.join(map(repr, self.choices))}; got {value!r}"
            )
        return value

    def default_text(self) -> str:
        return "required" if self.default is inspect.Parameter.empty else repr(self.default)


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

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


REGISTRY: dict[str, PatternSpec] = {}


def register(
    name: str,
    *params: Param,
    description: str,
    reference: str,
    flex: Callable[[Pattern], list[Callable[[Any, Any], Any]]] | None = None,
) -> Callable[[Callable[..., Pattern]], Callable[..., Pattern]]:
    """Class the decorated generator ``f(n, **params) -> Pattern`` under ``name``.

    ``flex``, when given, is the family's FlexAttention formula:
    ``flex(pattern)`` returns one ``rule(q_idx, kv_idx) -> bool tensor`` per
    head, in the generator's parameters (``pattern.params``). It is only
    asked about patterns that are exactly what the generator gives.
    """

    def deco(func: Callable[..., Pattern]) -> Callable[..., Pattern]:
        sig = inspect.signature(func)
        declared = {p.name for p in params}
        taken = [k for k in sig.parameters if k != "n"]
        if set(taken) != declared:
            raise TypeError(f"{name}: declared params {declared} != signature {taken}")
        REGISTRY[name] = PatternSpec(name, func, tuple(params), description, reference, flex=flex)
        return func

    return deco


def get(name: str) -> PatternSpec:
    """The spec registered under ``name``; ``ValueError`` lists the known names."""
    if name not in REGISTRY:
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

    Returns
    -------
    Pattern

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
    """
    return get(name).func(n, **resolve(name, n, params))


def describe() -> list[dict[str, Any]]:
    """The registered families, sorted by name: parameters with defaults, description, reference.

    What ``patterns list`` prints (``--json`` prints this list as is).

    Examples
    --------
    >>> row = {r["name"]: r for r in describe()}["strided"]
    >>> row["params"]
    {'stride': 'sqrt', 'window': 'paper', 'causal': True}
    """
    out = []
    for name in sorted(REGISTRY):
        spec = REGISTRY[name]
        out.append(
            {
                "name": name,
                "params": {p.name: p.default for p in spec.params},
                "description": spec.description,
                "reference": spec.reference,
            }
        )
    return out
