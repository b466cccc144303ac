"""Package-wide settings: the memory limit that guards every full token-level CSR,
and the tighter load limit that guards reading a file.

A pattern carries its rule, so most consumers read it in row ranges
(:meth:`sparse_patterns.Pattern.rows`) and never hold the whole CSR. Where the
whole CSR is asked for (``pattern.heads``, ``pattern.union()``), its size is
computed first and compared with :func:`get_memory_limit`: above it, the request
is refused with a :class:`MemoryLimitError` that says what it would need and what
to use instead. The default is a quarter of the machine's physical memory.

Loading a file (:func:`sparse_patterns.export.load`) has its own, tighter
budget, :func:`get_load_limit`: a file is input that anyone may have written,
and a few bytes of it can declare gigabytes (a ``.pt`` tensor expanded with
stride 0, a block layout whose Kronecker expansion is ``nb^2 * block^2`` token
pairs, a deflated array of zeros). Every size a file declares is turned into
the bytes loading it would allocate, and the file is refused before anything
is allocated when they pass the load limit. By default it is the smaller of
1 GiB (:data:`DEFAULT_LOAD_LIMIT`) and the memory limit; raise it to load a
larger file you trust (a set value is used as it is).

Examples
--------
>>> from sparse_patterns import config
>>> with config.memory_limit(1 << 20):
...     config.get_memory_limit()
1048576
>>> config.set_memory_limit(0)
Traceback (most recent call last):
...
ValueError: memory_limit: must be a positive number of bytes, got 0
>>> with config.memory_limit(1 << 20):
...     config.get_load_limit()
1048576
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = [
    "MemoryLimitError",
    "default_memory_limit",
    "get_memory_limit",
    "set_memory_limit",
    "memory_limit",
    "DEFAULT_LOAD_LIMIT",
    "default_load_limit",
    "get_load_limit",
    "set_load_limit",
    "load_limit",
    "format_bytes",
]

_state: dict[str, int | None] = {"memory_limit": None, "load_limit": None}

#: the load limit's default ceiling, in bytes (1 GiB)
DEFAULT_LOAD_LIMIT = 1 << 30


class MemoryLimitError(ValueError, MemoryError):
    """A request would allocate more than the memory limit; raised before allocating."""


def default_memory_limit() -> int:
    """A quarter of the machine's physical memory, in bytes (4 GiB where it cannot be read).

    Examples
    --------
    >>> default_memory_limit() > 0
    True
    """
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 16 << 30
    return max(1, int(total) // 4)


def _check(nbytes: object, name: str = "memory_limit") -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not nbytes > 0:
        raise ValueError(f"{name}: must be a positive number of bytes, got {nbytes!r}")
    if nbytes == float("inf"):
        raise ValueError(f"{name}: must be a positive number of bytes, got {nbytes!r}")
    return int(nbytes)


def get_memory_limit() -> int:
    """The memory limit in bytes (:func:`default_memory_limit` unless one was set).

    Examples
    --------
    >>> get_memory_limit() == default_memory_limit()
    True
    """
    return _current("memory_limit", default_memory_limit)


def set_memory_limit(nbytes: int | None) -> None:
    """Set the memory limit to ``nbytes`` (> 0), or back to the default with None.

    Raises
    ------
    ValueError
        When ``nbytes`` is not a positive number.

    Examples
    --------
    >>> set_memory_limit(2 << 30); get_memory_limit()
    2147483648
    >>> set_memory_limit(None)
    """
    _set("memory_limit", nbytes)


@contextmanager
def memory_limit(nbytes: int) -> Iterator[int]:
    """Use ``nbytes`` as the memory limit inside a ``with`` block.

    Examples
    --------
    >>> with memory_limit(1000) as limit:
    ...     limit
    1000
    """
    with _scoped("memory_limit", nbytes) as new:
        yield new


def _current(name: str, default: Callable[[], int]) -> int:
    """The limit ``name``: the value set, else ``default()``."""
    limit = _state[name]
    return default() if limit is None else limit


def _set(name: str, nbytes: int | None) -> None:
    """Set the limit ``name`` to ``nbytes`` (checked), or back to its default with None."""
    _state[name] = None if nbytes is None else _check(nbytes, name)


@contextmanager
def _scoped(name: str, nbytes: int) -> Iterator[int]:
    """Set the limit ``name`` to ``nbytes`` (checked) for a ``with`` block, then restore it."""
    new = _check(nbytes, name)
    old = _state[name]
    _state[name] = new
    try:
        yield new
    finally:
        _state[name] = old


def default_load_limit() -> int:
    """The smaller of :data:`DEFAULT_LOAD_LIMIT` (1 GiB) and the memory limit, in bytes.

    Examples
    --------
    >>> default_load_limit() == min(DEFAULT_LOAD_LIMIT, get_memory_limit())
    True
    """
    return min(DEFAULT_LOAD_LIMIT, get_memory_limit())


def get_load_limit() -> int:
    """The most bytes loading one file may allocate (:func:`default_load_limit` unless set).

    Examples
    --------
    >>> get_load_limit() == default_load_limit() <= get_memory_limit()
    True
    """
    return _current("load_limit", default_load_limit)


def set_load_limit(nbytes: int | None) -> None:
    """Set the load limit to ``nbytes`` (> 0), or back to the default with None.

    Raises
    ------
    ValueError
        When ``nbytes`` is not a positive, finite number of bytes (a bool is not one).

    Examples
    --------
    >>> set_load_limit(8 << 30); get_load_limit()
    8589934592
    >>> set_load_limit(None)
    >>> set_load_limit(-1)
    Traceback (most recent call last):
    ...
    ValueError: load_limit: must be a positive number of bytes, got -1
    """
    _set("load_limit", nbytes)


@contextmanager
def load_limit(nbytes: int) -> Iterator[int]:
    """Use ``nbytes`` as the load limit inside a ``with`` block.

    Examples
    --------
    >>> with load_limit(4096) as limit:
    ...     get_load_limit()
    4096
    """
    with _scoped("load_limit", nbytes) as new:
        yield new


def format_bytes(nbytes: float) -> str:
    """``nbytes`` for people: ``'1.5 GB'``, ``'300 MB'``, ``'12 kB'``.

    Examples
    --------
    >>> format_bytes(1.5e9), format_bytes(3e8), format_bytes(512), format_bytes(1.2e20)
    ('1.5 GB', '300 MB', '512 B', '120 EB')
    """
    for unit, size in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6),
                       ("kB", 1e3)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{int(nbytes)} B"
