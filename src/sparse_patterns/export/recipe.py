"""The ``.json`` recipe: a registered pattern's name, params and n, from which
:func:`from_recipe` regenerates it exactly (so the file is a few hundred
bytes at any n).

Reading one runs the generator's own checks (those ``make`` and the CLI run)
on ``n`` and every param, and returns the generated pattern, which carries
its rule and builds nothing: loading a recipe allocates next to nothing at
any ``n``; what is later read from the pattern is bounded by the memory
limit where it is read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .. import __version__, config
from ..algebra import expression_recipe, from_expression
from ..pattern import Pattern
from ..patterns import registry
from ..util.checks import MAX_N
from ..util.files import atomic_write
from ._codec import (
    FORMAT_VERSION,
    MAX_META,
    check_params,
    loads_json,
    one_line,
    short_repr,
)

__all__ = ["to_recipe", "from_recipe", "write", "read"]


def to_recipe(pattern: Pattern) -> dict[str, Any]:
    """The JSON recipe of a registered pattern: name, params, n and version.

    ``sparse_patterns.make(r["pattern"], r["n"], **r["params"])`` regenerates
    the pattern exactly.

    Raises
    ------
    ValueError
        The pattern is not a registered family with its generator's params
        (``"custom"``, imported layouts, ...), or its recipe is over the
        ``MAX_META`` bytes a reader takes: save it as .npz or .safetensors.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> to_recipe(make("strided", 16, stride=4))
    {'pattern': 'strided', 'params': {'stride': 4, 'window': 'paper', 'causal': True}, 'n': 16, 'version': 1}
    """
    expr = expression_recipe(pattern)
    if expr is None:
        raise ValueError(
            f"pattern: a {pattern.name!r} pattern has no recipe (only registered patterns "
            "with their generator's params, packed documents and their algebra do; a loaded "
            "file whose name and params do not regenerate its heads loads as 'custom'); "
            "save it as .npz or .safetensors"
        )
    recipe = {**expr, "version": FORMAT_VERSION}
    _check_size(len(json.dumps(recipe, separators=(",", ":"))))
    return recipe


def _check_size(size: int) -> None:
    """A recipe that reading would refuse (over ``MAX_META`` bytes) is refused before writing."""
    if size > MAX_META:
        raise ValueError(f"pattern: its recipe is {size:,} bytes of JSON, over the {MAX_META:,} "
                         "a recipe may hold (reading refuses larger); save it as .npz or "
                         ".safetensors")


def from_recipe(recipe: Any, *, where: str = "recipe") -> Pattern:
    """Regenerate a pattern from its recipe (see :func:`to_recipe`).

    ``n`` and the params go through the generator's own checks (what
    ``make`` and the CLI do); a param must be a number, string, boolean or
    null. The pattern returned carries its rule: nothing is built.

    Raises
    ------
    ValueError
        A recipe that is not a JSON object of the known keys, an unknown
        pattern, ``n`` or a param the generator refuses; one line, prefixed
        with ``where``.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("fixed", 16, stride=4, c=1)
    >>> from_recipe(to_recipe(pat)) == pat
    True
    >>> both = make("strided", 16, stride=4, documents=[6, 10]) + make("global_tokens", 16, tokens=2)
    >>> from_recipe(to_recipe(both)) == both
    True
    """
    if not isinstance(recipe, dict):
        raise ValueError(f"{where}: a recipe must be a JSON object")
    unknown = set(recipe) - {"pattern", "params", "n", "version", "generator", "op", "args"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {[k[:40] for k in sorted(unknown)[:4]]}")
    v = recipe.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= FORMAT_VERSION:
        raise ValueError(
            f"{where}: version must be an integer in [1, {FORMAT_VERSION}], got {short_repr(v)}"
        )
    params = recipe.get("params")
    if "op" in recipe or (isinstance(params, dict) and "documents" in params):
        return from_expression(recipe, where=where)
    name = recipe.get("pattern")
    if not isinstance(name, str):
        raise ValueError(f"{where}: 'pattern' must be a pattern name, got {short_repr(name)}")
    n = recipe.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {short_repr(n)}")
    params = check_params(recipe.get("params", {}), where, "'params'")
    try:
        return registry.make(name, n, **params)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"{where}: {one_line(exc)}") from None


def write(pattern: Pattern, path: str | os.PathLike) -> Path:
    """Write the recipe of ``pattern`` to ``path`` as JSON (atomically).

    The recipe is checked first: a pattern without one, or one over the
    ``MAX_META`` bytes :func:`read` takes, raises before any file is created.
    It is indented, or compact when indenting would pass that size.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> f = write(make("strided", 16, stride=4), os.path.join(tempfile.mkdtemp(), "s.json"))
    >>> json.loads(f.read_text())["params"]["stride"]
    4
    """
    recipe = to_recipe(pattern)  # fail before creating anything
    recipe["generator"] = f"sparse-patterns {__version__}"
    data = (json.dumps(recipe, indent=2) + "\n").encode()
    if len(data) > MAX_META:  # indented, a long list of documents takes a line per item
        data = (json.dumps(recipe, separators=(",", ":")) + "\n").encode()
    _check_size(len(data))
    return atomic_write(path, lambda f: f.write(data))


def read(path: str | os.PathLike) -> Pattern:
    """Regenerate the pattern a JSON recipe file names (at most ``MAX_META`` bytes).

    Any malformed JSON (deep nesting included) is a one-line ``ValueError``;
    the generator runs under the memory limit lowered to the load limit.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> pat = make("fixed", 16, stride=4, c=1)
    >>> read(write(pat, os.path.join(tempfile.mkdtemp(), "f.json"))) == pat
    True
    """
    path = Path(path)
    where = str(path)
    if path.stat().st_size > MAX_META:
        raise ValueError(f"{where}: a recipe is at most {MAX_META:,} bytes")
    with open(path, "rb") as f:
        data = f.read(MAX_META + 1)  # the file may have grown since
    if len(data) > MAX_META:
        raise ValueError(f"{where}: a recipe is at most {MAX_META:,} bytes")
    recipe = loads_json(data, where, "the recipe")
    with config.memory_limit(min(config.get_memory_limit(), config.get_load_limit())):
        return from_recipe(recipe, where=where)  # a generator's own guards use the load limit
