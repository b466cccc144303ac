"""The typer application and the pieces every command shares: the pattern
option parser, error handling (one line on stderr, exit status 2) and output."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer
from rich.console import Console

from ..pattern import Pattern
from ..patterns import registry

__all__ = [
    "app", "console", "err_console", "cli_command", "pattern_from_args", "parse_params",
    "parse_ns", "emit_json", "PATTERN_CONTEXT", "UsageError",
]

app = typer.Typer(
    name="patterns",
    help="Generate, verify, render, export and profile sparse attention patterns.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

#: context settings for commands that take a pattern's parameters as options
PATTERN_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


class UsageError(ValueError):
    """Bad input detected by the CLI itself (reported like a ValueError)."""


def cli_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn ``ValueError`` (bad input) into one line on stderr and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, OSError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            err_console.print(f"error: {msg}", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def parse_params(name: str | Sequence[str], args: Sequence[str]) -> dict[str, str | bool]:
    """Parse ``--param value`` / ``--flag`` / ``--no-flag`` for pattern ``name``.

    Dashes stand for underscores (``--summary-heads 2``). A parameter the
    pattern does not take is an error listing the ones it takes. With several
    names (``patterns profile strided fixed``) an option must be taken by at
    least one of them.

    Examples
    --------
    >>> parse_params("fixed", ["--stride", "8", "--summary-heads=2", "--no-causal"])
    {'stride': '8', 'summary_heads': '2', 'causal': False}
    >>> parse_params(["strided", "fixed"], ["--c", "2"])
    {'c': '2'}
    """
    names = [name] if isinstance(name, str) else list(name)
    known: dict[str, registry.Param] = {}
    for nm in names:
        for p in registry.get(nm).params:
            known.setdefault(p.name, p)
    takes = ", ".join("--" + k.replace("_", "-") for k in known) or "no parameters"
    if isinstance(name, str):
        who, no_such = f"pattern {name!r}", "takes no such option; it takes"
    else:
        who, no_such = f"none of the patterns {', '.join(names)}", "takes it; they take"
    out: dict[str, str | bool] = {}
    k = 0
    args = list(args)
    while k < len(args):
        tok = args[k]
        if not tok.startswith("--"):
            raise UsageError(f"{tok}: unexpected argument; the pattern options are {takes}")
        key, eq, val = tok[2:].partition("=")
        key = key.replace("-", "_")
        if key.startswith("no_") and key[3:] in known and known[key[3:]].type is bool and not eq:
            out[key[3:]] = False
            k += 1
            continue
        if key not in known:
            raise UsageError(f"--{key.replace('_', '-')}: {who} {no_such} {takes}")
        p = known[key]
        if eq:
            out[key] = val
            k += 1
        elif p.type is bool and (k + 1 == len(args) or args[k + 1].startswith("--")):
            out[key] = True
            k += 1
        else:
            if k + 1 == len(args):
                raise UsageError(f"--{key.replace('_', '-')}: needs a value")
            out[key] = args[k + 1]
            k += 2
    return out


def pattern_from_args(name: str | None, n: int | None, args: Sequence[str], file: str | None = None) -> Pattern:
    """Build the pattern a command names: ``NAME --n N [--param value ...]`` or ``--file F``."""
    if file is not None:
        if name is not None or args:
            raise UsageError("file: give either a pattern name with its options or --file, not both")
        from ..export import load  # noqa: PLC0415

        return load(file)
    if name is None:
        raise UsageError(f"name: give a pattern name ({', '.join(sorted(registry.REGISTRY))}) or --file")
    registry.get(name)  # unknown names fail before the options are read
    if n is None:
        raise UsageError("n: --n is required (an integer >= 1)")
    return registry.make(name, n, **parse_params(name, args))


def parse_ns(text: str) -> list[int]:
    """Parse ``--n 1024,4096`` into a list of ints (each >= 1)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise UsageError(f"n: expected comma-separated integers >= 1, got {text!r}") from None
        if v < 1:
            raise UsageError(f"n: every n must be >= 1, got {v}")
        out.append(v)
    if not out:
        raise UsageError(f"n: expected at least one integer, got {text!r}")
    return out


def emit_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (numpy scalars converted)."""

    def default(o: Any) -> Any:
        import numpy as np  # noqa: PLC0415

        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(f"not JSON serializable: {type(o).__name__}")

    sys.stdout.write(json.dumps(obj, default=default, indent=2) + "\n")
