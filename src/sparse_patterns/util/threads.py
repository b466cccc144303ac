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

:func:`settle` runs first and decides what numba would otherwise fail on later, with a
traceback far from the cause; each decision is one line on stderr, once per process:

- the on-disk cache of the package's ``@njit(cache=True)`` functions: numba writes it
  next to the source (``__pycache__``), else in ``~/.cache/numba``, else (``NUMBA_CACHE_DIR``
  set) there; a read-only install run by a user without a writable home has none of
  them (``RuntimeError: cannot cache function ...: no locator available``), so the
  cache goes to a private directory of this user under the temporary directory;
- ``NUMBA_CACHE_DIR`` that cannot be written: numba would try the others in silence;
- ``NUMBA_NUM_THREADS`` that is not an integer >= 1 (numba raised at the first
  parallel kernel): numba's default, every CPU;
- ``NUMBA_THREADING_LAYER=tbb`` (or ``safe``) where TBB cannot be loaded (numba raised
  "No threading layer could be loaded" at the first parallel kernel): numba's default;
- ``NUMBA_DISABLE_JIT=1``: numba would run the kernels as plain Python, where their LLVM
  intrinsics cannot run (``NotImplementedError: <intrinsic _wide> is not usable in
  pure-python`` deep in a call); said at import, and the kernels that need numba
  (``impl="numba"``, the exact verification) refuse with :func:`refuse_uncompiled`;
- a full disk under numba's cache (``OSError: [Errno 28]`` when numba saves compiled code
  after compiling it, failing the call that compiled): the package's functions run
  uncached for the rest of the process, said once with the cache directory.
"""

from __future__ import annotations

import ctypes
import errno
import importlib.abc
import importlib.util
import os
import stat
import sys
import tempfile
from importlib import metadata
from typing import Any

__all__ = ["choose", "settle", "TBB_MIN_INTERFACE", "jit_disabled", "refuse_uncompiled",
           "FULL_DISK"]

#: errno values of a write that failed for want of room (or of a writable file system).
FULL_DISK = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EROFS)
                      if e is not None)

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


_SETTLED: list[str] = []


def _note(line: str) -> None:
    """One line on stderr about a setting numba reads (once per process: a child sees the
    variables already set)."""
    _SETTLED.append(line)
    if sys.stderr is not None:
        print(f"sparse_patterns: {line}", file=sys.stderr, flush=True)


def _writable(path: str) -> bool:
    """Whether ``path`` is a directory this process may create files in, or could create."""
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _package_dirs() -> list[str]:
    """The directories of the package's modules (numba caches next to each source file)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package
    out = []
    for d, subdirs, files in os.walk(root):
        subdirs[:] = [x for x in subdirs if x != "__pycache__"]
        if any(f.endswith(".py") for f in files):
            out.append(d)
    return out


def _in_tree() -> bool:
    return all(_writable(os.path.join(d, "__pycache__")) for d in _package_dirs())


def _user_wide() -> str:
    """numba's user-wide cache directory (appdirs' user cache dir on Linux)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "numba")


def _private_dir() -> str | None:
    """A directory under the temporary directory that only this user can write, or None."""
    try:
        base = tempfile.gettempdir()
    except (OSError, FileNotFoundError):
        return None
    uid = os.getuid() if hasattr(os, "getuid") else None
    path = os.path.join(base, f"sparse-patterns-numba-{uid if uid is not None else 'user'}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    # another user's directory (or a link to one) would let them plant compiled code here
    if (not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid)
            or st.st_mode & 0o022 or not os.access(path, os.W_OK | os.X_OK)):
        try:
            return tempfile.mkdtemp(prefix="sparse-patterns-numba-")
        except OSError:
            return None
    return path


def _set(name: str, value: str | None, attr: str | None = None, config_value: object = None) -> None:
    """Set (or, with None, remove) a numba environment variable, and its value in numba's
    config when numba is already imported (it read the environment then)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    config = getattr(getattr(sys.modules.get("numba"), "core", None), "config", None)
    if config is not None and attr is not None:
        setattr(config, attr, config_value)


def _settle_cache() -> None:
    given = os.environ.get("NUMBA_CACHE_DIR", "")
    if given and _writable(given):
        return
    if _in_tree() or _writable(_user_wide()):
        if given:
            _note(f"NUMBA_CACHE_DIR={given!r} cannot be written; numba caches compiled "
                  "code in its other places (the package's __pycache__, ~/.cache/numba)")
        return
    private = _private_dir()
    where = (f"NUMBA_CACHE_DIR={given!r}, " if given else "") + "the package directory and " + \
        f"{_user_wide()!r} cannot be written"
    if private is None:
        _note(f"{where}, nor the temporary directory: numba cannot cache compiled code; set "
              "NUMBA_CACHE_DIR to a writable directory")
        return
    _set("NUMBA_CACHE_DIR", private, "CACHE_DIR", private)
    _note(f"{where}: numba caches compiled code in {private!r} (set NUMBA_CACHE_DIR to choose)")


def _settle_threads() -> None:
    value = os.environ.get("NUMBA_NUM_THREADS")
    if value is not None:
        text = value.strip()
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            import multiprocessing  # noqa: PLC0415

            cpus = multiprocessing.cpu_count()
            _set("NUMBA_NUM_THREADS", None, "NUMBA_NUM_THREADS", cpus)
            _note(f"NUMBA_NUM_THREADS={value[:40]!r} is not an integer >= 1; numba uses its "
                  f"default, {cpus} threads")
    layer = os.environ.get("NUMBA_THREADING_LAYER", "").strip().lower()
    if layer in ("tbb", "safe") and not _tbb_loads():
        _set("NUMBA_THREADING_LAYER", None, "THREADING_LAYER", "default")
        _note(f"NUMBA_THREADING_LAYER={layer}: TBB cannot be loaded here (pip install tbb); "
              "numba uses its default layer")


def _tbb_loads() -> bool:
    """Whether numba's TBB layer can load: the ``tbb`` wheel's library, or a system one."""
    path = _tbb_library()
    for name in ([path] if path is not None else []) + ["libtbb.so.12"]:
        try:
            lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return lib.TBB_runtime_interface_version() >= TBB_MIN_INTERFACE
        except (OSError, AttributeError):
            continue
    return False


def _jit_setting() -> str | None:
    """``NUMBA_DISABLE_JIT`` when it asks numba to run uncompiled (a non-zero integer)."""
    value = os.environ.get("NUMBA_DISABLE_JIT", "").strip()
    try:
        return value if int(value) else None
    except ValueError:
        return None


def jit_disabled() -> str | None:
    """The ``NUMBA_DISABLE_JIT`` value when numba's JIT is off in this process, else None.

    Examples
    --------
    >>> jit_disabled() is None or jit_disabled() != "0"
    True
    """
    config = getattr(getattr(sys.modules.get("numba"), "core", None), "config", None)
    if config is not None:
        return (os.environ.get("NUMBA_DISABLE_JIT", "").strip() or "1") if config.DISABLE_JIT \
            else None
    return _jit_setting()


def refuse_uncompiled(what: str, instead: str = "") -> None:
    """Raise a one-line ``ValueError`` naming ``NUMBA_DISABLE_JIT`` when numba's JIT is off:
    ``what`` needs numba's compiled kernels (their LLVM intrinsics have no Python form).

    Examples
    --------
    >>> refuse_uncompiled("the exact verification") if jit_disabled() is None else None
    """
    value = jit_disabled()
    if value is not None:
        raise ValueError(f"NUMBA_DISABLE_JIT={value}: {what} runs numba-compiled kernels, which "
                         f"do not run uncompiled; unset NUMBA_DISABLE_JIT{instead}")


def _settle_jit() -> None:
    value = _jit_setting()
    if value is not None:
        _note(f"NUMBA_DISABLE_JIT={value}: numba's JIT is off; the package's numba kernels "
              "(attention with impl='numba', the exact verification) refuse to run uncompiled "
              "(unset NUMBA_DISABLE_JIT)")


_FULL: list[str] = []


def _guard_cache_writes(caching: Any) -> None:
    """Make numba's cache write of a package function that finds the disk full (or read-only)
    say so once and leave the function uncached, instead of failing the call that compiled it."""
    save = caching.Cache.save_overload
    if getattr(save, "sparse_patterns_guard", False):
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package

    def save_overload(self: Any, sig: Any, data: Any) -> None:
        code = getattr(getattr(self, "_py_func", None), "__code__", None)
        ours = code is not None and code.co_filename.startswith(root)
        if ours and _FULL:
            return  # the cache directory was full: the package's functions run uncached
        try:
            save(self, sig, data)
        except OSError as exc:
            if not ours or exc.errno not in FULL_DISK:
                raise
            where = getattr(self, "_cache_path", None) or exc.filename
            _FULL.append(str(where))
            _note(f"numba's cache directory {str(where)!r} cannot be written "
                  f"({os.strerror(exc.errno)}): compiled code is not cached in this process "
                  "(free space there, or set NUMBA_CACHE_DIR to another directory)")

    save_overload.sparse_patterns_guard = True  # type: ignore[attr-defined]
    caching.Cache.save_overload = save_overload


class _CachingHook(importlib.abc.MetaPathFinder):
    """Guards numba's cache writes (:func:`_guard_cache_writes`) when ``numba.core.caching``
    is first imported, so ``import sparse_patterns`` does not import numba."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "numba.core.caching":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _guard_cache_writes(module)

        loader.exec_module = exec_module
        return spec


def _settle_cache_writes() -> None:
    caching = sys.modules.get("numba.core.caching")
    if caching is not None:
        _guard_cache_writes(caching)
    elif not any(isinstance(f, _CachingHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _CachingHook())


def settle() -> list[str]:
    """Decide the numba settings that would otherwise fail later (see the module docstring),
    once; returns the lines said on stderr.

    Examples
    --------
    >>> isinstance(settle(), list)
    True
    """
    if not _SETTLED and not getattr(settle, "done", False):
        settle.done = True  # type: ignore[attr-defined]
        _settle_threads()
        _settle_cache()
        _settle_jit()
        _settle_cache_writes()
    return list(_SETTLED)
