"""numba's threading layer, chosen by the package: TBB where its library is installed.

numba's default layer here is GNU OpenMP, which is neither fork-safe (a child forked
after the parent ran a parallel kernel hangs in its first one: ``multiprocessing``'s
fork start method, ``DataLoader`` workers) nor safe for parallel kernels called from
several Python threads at once (the workqueue layer aborts the process). Its TBB layer
is both. :func:`choose` runs when ``sparse_patterns`` is imported: where the ``tbb``
wheel (a dependency on Linux x86-64) provides ``libtbb.so.12``, recent enough for numba,
it loads that library and sets ``NUMBA_THREADING_LAYER=tbb``, unless the user chose
another layer (the variable set to one TBB is not part of). Elsewhere numba keeps its
default.
"""

from __future__ import annotations

import ctypes
import os
import sys
from importlib import metadata

__all__ = ["choose", "TBB_MIN_INTERFACE"]

#: The oldest TBB interface version numba's layer accepts (TBB 2021.6).
TBB_MIN_INTERFACE = 12060

_CHOSEN: list[str | None] = []


def _tbb_library() -> str | None:
    """The path of the ``tbb`` wheel's ``libtbb.so.12``, or None."""
    try:
        files = metadata.files("tbb") or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libtbb.so.12":
            return str(f.locate())
    return None


def choose() -> str | None:
    """Set numba's threading layer to TBB where it can load (once); returns ``"tbb"``,
    or None where numba keeps its own choice.

    Examples
    --------
    >>> choose() in (None, "tbb")
    True
    """
    if _CHOSEN:
        return _CHOSEN[0]
    _CHOSEN.append(None)
    asked = os.environ.get("NUMBA_THREADING_LAYER", "default")
    if asked not in ("default", "tbb", "safe", "threadsafe", "forksafe"):
        return None  # the user's choice, which TBB is not part of
    path = _tbb_library()
    if path is None or not os.path.exists(path):
        return None
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # where numba's tbbpool finds it
        version = lib.TBB_runtime_interface_version()
    except (OSError, AttributeError):
        return None
    if version < TBB_MIN_INTERFACE:
        return None
    if asked != "default":  # a layer TBB provides (a spawned child inherits "tbb"): loaded
        _CHOSEN[0] = "tbb"
        return "tbb"
    os.environ["NUMBA_THREADING_LAYER"] = "tbb"
    numba = sys.modules.get("numba")
    config = getattr(getattr(numba, "core", None), "config", None)
    if config is not None:  # numba imported first: its config has read the environment
        config.THREADING_LAYER = "tbb"
    _CHOSEN[0] = "tbb"
    return "tbb"
