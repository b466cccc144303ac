"""The grid of a search: families, parameter values checked against each family's
parameters, and every candidate's recipe in grid order (:func:`_recipes`), bounded by
:data:`MAX_CANDIDATES`."""

from __future__ import annotations

import itertools
import math
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .. import __version__
from ..patterns import registry
from ..util.checks import check_int
from ._tasks import recipe_key

__all__ = ["MAX_CANDIDATES"]

#: Largest grid :func:`~sparse_patterns.search.search` accepts (families x values x ns x
#: blocks).
MAX_CANDIDATES = 100_000


def _families(families: Any) -> list[str]:
    names = [families] if isinstance(families, str) else families
    if not isinstance(names, Iterable):
        raise TypeError(f"families: expected a family name or a sequence of them, got "
                        f"{type(families).__name__}")
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError(f"families: name at least one ({', '.join(sorted(registry.REGISTRY))})")
    for name in names:
        registry.get(name)  # ValueError listing the known names
    return names


def _values(key: str, value: Any) -> list[Any]:
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return [value]
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"grid: {key}: expected a value or a list of values, got "
                        f"{type(value).__name__}")
    out = list(value)
    if not out:
        raise ValueError(f"grid: {key}: has no values")
    return out


def _shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters, with the value's length.

    Examples
    --------
    >>> _shown("abc"), _shown("9" * 5000), _shown(10**5000)
    ("'abc'", "'99999999999999999999999999999999999999... (5,000 characters)", 'an integer of about 5,000 digits')
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        digits = len(str(abs(value))) if value.bit_length() < 10_000 else None
        about = f"{digits:,}" if digits else f"about {int(value.bit_length() * 0.30103):,}"
        return f"an integer of {about} digits"
    size = len(value) if isinstance(value, str) else 0
    text = repr(value[: limit + 1] if isinstance(value, str) else value)
    if len(text) <= limit and size <= limit:
        return text
    return f"{text[:limit - 1]}... ({size or len(text):,} characters)"


#: An integer as text: ASCII digits only (as the command's integer options read them:
#: '٣', '1e3' and '1_000' are not integers here), at most :data:`_MAX_DIGITS` of them.
_MAX_DIGITS = 18
_INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _check_value(fam: str, param: Any, value: Any, n: int) -> None:
    """``TypeError`` for a value of the wrong type, ``ValueError`` for unreadable text or
    an integer of more than :data:`_MAX_DIGITS` digits (whatever a family takes, no
    parameter takes that); the message names the parameter and shows the value cut."""
    kind = {int: "an integer", bool: "True or False", str: "a string"}[param.type]
    extra = " or 'sqrt'/'cbrt'" if param.follows_n else ""
    digits = f"an integer of at most {_MAX_DIGITS} ASCII digits{extra}"
    if value is None and param.default is None:
        return
    if isinstance(value, str):
        text = value.strip()
        if param.type is int and not (param.follows_n and text in ("sqrt", "cbrt")):
            if _INT_TEXT.fullmatch(text) is None or len(text.lstrip("+-")) > _MAX_DIGITS:
                raise ValueError(f"grid: {param.name}: must be {digits}, got {_shown(value)}")
            return
        if len(value) > 64:
            raise ValueError(f"grid: {param.name}: not a value of {fam}'s {param.name}: "
                             f"{_shown(value)}")
        try:
            param.convert(text, n)
        except ValueError as exc:
            raise ValueError(f"grid: {str(exc)[:200]} (family {fam})") from None
        return
    good = {int: isinstance(value, int) and not isinstance(value, bool),
            bool: isinstance(value, bool), str: False}[param.type]
    if not good:
        raise TypeError(f"grid: {param.name}: must be {kind}{extra} for {fam}, got "
                        f"{_shown(value)} ({type(value).__name__})")
    if param.type is int and abs(value) >= 10**_MAX_DIGITS:
        raise ValueError(f"grid: {param.name}: must be {digits}, got {_shown(value)}")


def _grid(families: list[str], grid: Any, ns: list[int]
          ) -> tuple[dict[str, list[Any]], dict[str, dict[str, list[Any]]]]:
    """The grid's axes as given, and per family the values of its parameters that fit it.

    A name applies to every family that takes it, with the values of that
    parameter's type (``window=4`` goes to ``local``, ``window="reference"`` to
    ``strided``); a value that fits none of them is an error.
    """
    if grid is None:
        return {}, {f: {} for f in families}
    if not isinstance(grid, Mapping):
        raise TypeError(f"grid: expected a mapping of parameter name to values, got "
                        f"{type(grid).__name__}")
    taken = {f: {p.name: p for p in registry.get(f).params} for f in families}
    axes: dict[str, list[Any]] = {}
    per: dict[str, dict[str, list[Any]]] = {f: {} for f in families}
    for key, value in grid.items():
        if not isinstance(key, str):
            raise TypeError(f"grid: parameter names must be strings, got {key!r:.40}")
        users = [f for f in families if key in taken[f]]
        if not users:
            takes = sorted({k for f in families for k in taken[f]})
            raise ValueError(f"grid: {key!r} is a parameter of none of {', '.join(families)}; "
                             f"they take: {', '.join(takes) or 'no parameters'}")
        axes[key] = _values(key, value)
        for v in axes[key]:
            errors: list[Exception] = []
            for fam in users:
                try:
                    _check_value(fam, taken[fam][key], v, ns[0])
                except (TypeError, ValueError) as exc:
                    errors.append(exc)
                else:
                    per[fam].setdefault(key, []).append(v)
            if len(errors) == len(users):
                raise errors[0]
    return axes, per


def _ints(name: str, value: Any, lo: int, hi: int) -> list[int]:
    vals = ([value] if isinstance(value, (numbers.Integral, str)) or not isinstance(value, Iterable)
            else list(value))
    if not vals:
        raise ValueError(f"{name}: give at least one integer [{lo}, {hi}]")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name}: must be an integer [{lo}, {hi}], got {v!r:.40} "
                            f"({type(v).__name__})")
    return list(dict.fromkeys(check_int(name, v, lo, hi) for v in vals))


def _recipes(families: list[str], per: dict[str, dict[str, list[Any]]], ns: list[int],
             blocks: list[int], fixed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every candidate's recipe in grid order (families, ns, blocks, values), duplicates dropped."""
    out: dict[str, dict[str, Any]] = {}
    for fam in families:
        axes = per[fam]
        names = list(axes)
        order = [p.name for p in registry.get(fam).params]
        count = len(out) + len(ns) * len(blocks) * math.prod(len(axes[k]) for k in names)
        if count > MAX_CANDIDATES:
            raise ValueError(f"grid: {count:,}+ candidates, more than the {MAX_CANDIDATES:,} a "
                             "search takes; split the grid")
        for n in ns:
            for block in blocks:
                for combo in itertools.product(*(axes[k] for k in names)):
                    given = {k: v for k, v in zip(names, combo, strict=True) if v is not None}
                    try:
                        params = registry.resolve(fam, n, given)  # None: the default
                    except ValueError as exc:
                        raise ValueError(f"grid: {exc} (family {fam})") from None
                    params = {name: params[name] for name in order}  # the family's order
                    rec = {"family": fam, "params": params, "n": n, "block": block, **fixed}
                    out.setdefault(recipe_key(rec, __version__), rec)
    return list(out.values())
