"""Argument checks shared by the whole package: one-line ``ValueError`` messages
that name the parameter, the value and the allowed range."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "check_int", "check_size", "check_choice", "check_bool", "check_binary", "MAX_N", "NO_LOWER_BOUND",
]

#: Largest sequence length any generator accepts.
MAX_N = 2**31 - 1


#: A ``lo`` at or below this is a "no lower bound" sentinel: messages leave it out.
NO_LOWER_BOUND = -(2**62)


def _range_text(lo: int, hi: int | None) -> str:
    if lo <= NO_LOWER_BOUND:
        return "" if hi is None else f" <= {hi}"
    return f" [{lo}, {hi}]" if hi is not None else f" >= {lo}"


def check_int(name: str, value: Any, lo: int = 1, hi: int | None = None) -> int:
    """Return ``value`` as an int in ``[lo, hi]`` or raise ``ValueError``.

    A ``lo`` at or below :data:`NO_LOWER_BOUND` means no lower bound (the
    message then does not quote it).

    Examples
    --------
    >>> check_int("stride", 4.0), check_int("seed", -3, lo=NO_LOWER_BOUND)
    (4, -3)
    >>> check_int("stride", 10**30, 1, 64)
    Traceback (most recent call last):
    ...
    ValueError: stride: must be an integer [1, 64], got 1000000000000000000000000000000
    >>> check_int("window", "x", lo=NO_LOWER_BOUND)
    Traceback (most recent call last):
    ...
    ValueError: window: must be an integer, got 'x'
    """
    rng = _range_text(lo, hi)
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: must be an integer{rng}, got {repr_text(value)}")
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: must be an integer{rng}, got {repr_text(value)}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}: must be an integer{rng}, got {_int_text(value)}")
    return value


def _int_text(value: int) -> str:
    """``value`` as digits, or its order of magnitude when it is too long to print."""
    if value.bit_length() <= 256:
        return str(value)
    sign = "-" if value < 0 else ""
    return f"about {sign}10^{int(value.bit_length() * 0.30103)}"


def repr_text(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters so that a message stays one short line."""
    text = repr(value) if not isinstance(value, int) else _int_text(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_size(name: str, value: Any, lo: int = 1, hi: int = MAX_N) -> int:
    """Return ``value`` as an int in ``[lo, hi]`` (a length, stride, window or count).

    Below ``lo`` the message says ``>= lo`` (the bound a user meets); above
    ``hi`` (``MAX_N`` by default, so that arithmetic on it stays in int64) it
    quotes the whole range.

    Examples
    --------
    >>> check_size("stride", 8)
    8
    >>> check_size("stride", 0)
    Traceback (most recent call last):
    ...
    ValueError: stride: must be an integer >= 1, got 0
    >>> check_size("stride", 10**30)
    Traceback (most recent call last):
    ...
    ValueError: stride: must be an integer [1, 2147483647], got 1000000000000000000000000000000
    """
    return check_int(name, check_int(name, value, lo), lo, hi)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices`` or raise ``ValueError``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}: must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return str(value)


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` as a bool or raise ``ValueError``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name}: must be True or False, got {value!r}")


def check_binary(name: str, a: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``a`` as a bool array: bool, or integer or float holding only 0 and 1.

    Anything else (2, 0.5, NaN, -1, strings, objects) is refused with a one-line
    ``ValueError`` naming the first bad value and its index in ``shape`` (the
    caller's shape, when ``a`` is a reshaped view of it).

    Examples
    --------
    >>> check_binary("dense", np.array([1.0, 0.0])).tolist()
    [True, False]
    >>> check_binary("dense", np.array([[1, 0], [2, 1]]))
    Traceback (most recent call last):
    ...
    ValueError: dense: values must be 0 or 1 (or bool), got 2 at (1, 0)
    """
    if a.dtype == bool:
        return a
    if a.dtype.kind not in "iuf":
        raise ValueError(
            f"{name}: must be a bool, integer or float array of 0 and 1, got dtype {a.dtype}"
        )
    ones = a == 1
    bad = ~(ones | (a == 0))  # NaN compares unequal to both
    if bad.any():
        first = int(np.argmax(bad))  # flat index of the first bad value
        where = tuple(int(x) for x in np.unravel_index(first, a.shape if shape is None else shape))
        value = a.reshape(-1)[first].item()
        raise ValueError(f"{name}: values must be 0 or 1 (or bool), got {value!r} at {where}")
    return ones
