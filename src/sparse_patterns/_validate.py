"""Argument checks shared by the whole package: one-line ``ValueError`` messages
that name the parameter, the value and the allowed range."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["check_int", "check_choice", "check_bool", "MAX_N"]

#: Largest sequence length any generator accepts.
MAX_N = 2**31 - 1


def check_int(name: str, value: Any, lo: int = 1, hi: int | None = None) -> int:
    """Return ``value`` as an int in ``[lo, hi]`` or raise ``ValueError``."""
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: must be an integer {rng}, got {value!r}")
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: must be an integer {rng}, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name}: must be an integer {rng}, got {value}")
    return value


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
