"""What makes a stored row of a search cache valid: the exact types of its fields, a key
that its recipe hashes to (as the family resolves it, at the cache's version), results
that agree with its status and verdict, and free text that is bounded and printable.
:mod:`._cache` drops a row that fails (:class:`BadRow`) and computes it again."""

from __future__ import annotations

import math
import re
from typing import Any

from ..patterns import registry
from ._tasks import FIELDS, MEASURES, TEXT_LIMIT, clean_text, recipe_key, recipe_of

__all__ = ["KINDS", "BadRow", "check_row"]

#: Each field's kind ("str", "int", "bool", "float"), in row order.
KINDS = dict(FIELDS)
#: Fields checked exactly (through the key); the other text is cleaned (clean_text).
_EXACT = frozenset(("key", "version", "family", "params", "mode", "kernel_mode", "depth_search",
                    "measured", "status"))
_KEY = re.compile(r"[0-9a-f]{24}")
#: The types a stored value of each field may have (JSON and Arrow give exactly these).
_TYPES = {name: {"str": (str,), "int": (int,), "bool": (bool,), "float": (float, int)}[kind]
          + (type(None),) for name, kind in FIELDS}
_FLOATS = frozenset(name for name, kind in FIELDS if kind == "float")
_TEXT = frozenset(name for name, kind in FIELDS if kind == "str") - _EXACT


class BadRow(Exception):
    """A stored row that is not a valid search row (the reason)."""


def check_row(row: Any, version: str) -> dict[str, Any]:
    """A stored row with every field (missing ones None), its text cleaned; ``BadRow``
    (why) when it is not a valid row of ``version`` or contradicts its key."""
    if not isinstance(row, dict):
        raise BadRow(f"not an object but {type(row).__name__}")
    out: dict[str, Any] = dict.fromkeys(KINDS)
    for name, value in row.items():
        types = _TYPES.get(name)
        if types is None:
            raise BadRow(f"an unknown field {clean_text(str(name), 40)!r}")
        if type(value) not in types:  # exact types: a bool is not an int here
            raise BadRow(f"a bad {name} ({clean_text(repr(value), 40)})")
        if name in _FLOATS and value is not None:
            try:  # JSON takes NaN, Infinity and integers of any length
                value = float(value)
            except OverflowError:
                value = math.inf
            if not math.isfinite(value):
                raise BadRow(f"a {name} that is not a finite number ({clean_text(repr(value), 40)})")
        elif name in _TEXT and value is not None and not (
                len(value) <= TEXT_LIMIT and value.isprintable()):
            value = clean_text(value)
        out[name] = value
    _check_key(out, version)
    _check_results(out)
    return out


def _check_key(row: dict[str, Any], version: str) -> None:
    """The row names the recipe its key hashes, as the family resolves it, at ``version``."""
    key = row["key"]
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise BadRow("no key")
    if row["version"] != version:
        raise BadRow(f"version {clean_text(str(row['version']), 40)!r} under a cache of {version}")
    for name in ("family", "params", "n", "mode", "kernel_mode", "block", "batch", "heads",
                 "head_dim", "depth_search"):
        if row[name] is None:
            raise BadRow(f"no {name}")
    try:
        rec = recipe_of(row)
        if not isinstance(rec["params"], dict):
            raise BadRow(f"params that are a {type(rec['params']).__name__}, not an object")
        resolved = registry.resolve(rec["family"], rec["n"], rec["params"])
    except BadRow:
        raise
    except (KeyError, ValueError, TypeError, RecursionError) as exc:
        raise BadRow(f"a recipe that is not valid ({clean_text(str(exc), 80)})") from None
    if resolved != rec["params"] or recipe_key(rec, version) != key:
        raise BadRow("fields that do not match its key (another candidate's recipe)")
    from ._tasks import kernel_mode  # noqa: PLC0415

    if row["kernel_mode"] != kernel_mode(row["mode"]):
        raise BadRow("a kernel_mode that does not follow its mode")


def _check_results(row: dict[str, Any]) -> None:
    """The row's outcome is one a task makes: measures known, the verdict the criteria's."""
    measured = (row["measured"] or "").split(",")
    if not measured or any(m not in MEASURES for m in measured):
        raise BadRow(f"bad measures {clean_text(str(row['measured']), 40)!r}")
    status = row["status"]
    if status == "error":
        if row["error"] is None or row["ok"] is not None:
            raise BadRow("an error status without its error, or with a verdict")
        return
    if status != "ok":
        raise BadRow(f"status {clean_text(str(status), 20)!r}")
    if row["error"] is not None:
        raise BadRow("an error message under status 'ok'")
    if "verify" in measured:
        c1, c2 = row["criterion1"], row["criterion2"]
        if row["ok"] is None or c1 is None or c2 is None or row["ok"] != (c1 and c2):
            raise BadRow("a verdict (ok) that is not both criteria's")
    elif row["ok"] is not None:
        raise BadRow("a verdict without the verification")
    if "flops" in measured and (row["useful_flops"] is None or row["computed_flops"] is None):
        raise BadRow("no FLOPs although measured")
    if "time" in measured and row["time_s"] is None:
        raise BadRow("no time although measured")
