"""The ``patterns`` command line: a thin shell over the library.

Every command lives in its own module of this package, parses its arguments,
calls one library function that returns data and prints it (a rich table, or
JSON with ``--json``). Command modules are discovered here, so adding a command
means adding a module.
"""

from __future__ import annotations

import importlib
import pkgutil

from ._app import app

__all__ = ["app", "main"]

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")


def main() -> None:
    """Entry point of the ``patterns`` console script."""
    app()
