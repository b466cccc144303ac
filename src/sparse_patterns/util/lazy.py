"""Attributes imported on first use: a package's public names that live in heavy modules
(NumPy, numba, torch, matplotlib), so that ``import sparse_patterns`` and
``patterns --help`` stay fast. The one mechanism every package of this project uses."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_attributes", "LazyModule"]


def lazy_attributes(package: str, names: Mapping[str, str], modules: Iterable[str] = ()
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__``: ``names`` maps each public name to the
    module defining it (absolute, or relative to ``package`` with a leading dot);
    ``modules`` are submodules that resolve as attributes (``sps.export``). A name is
    imported on its first access and then stored in the package, so later accesses are
    plain attribute reads.

    Examples
    --------
    >>> getattr_, dir_ = lazy_attributes("json", {"dumps": "json"})
    >>> getattr_("dumps")({"a": 1})
    '{"a": 1}'
    >>> getattr_("nothing")
    Traceback (most recent call last):
    AttributeError: module 'json' has no attribute 'nothing'
    """
    names = dict(names)
    modules = tuple(modules)

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
            setattr(importlib.import_module(package), name, value)
            return value
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *names, *modules})

    return __getattr__, __dir__


class LazyModule:
    """A module imported on its first attribute access (``registry.get`` in the CLI, which
    must not import NumPy for ``--help``).

    Examples
    --------
    >>> LazyModule("json").dumps([1])
    '[1]'
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)
