"""The ``patterns`` app and what every command module shares: the typer app, the consoles,
:func:`cli_command` (an exception as one line and an exit status) and :func:`emit_json`.

Each command module of :mod:`sparse_patterns.cli` imports this one; none imports another.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from ._args import MAX_N, ClickException, Group, int_option, report, set_debug

__all__ = ["app", "console", "err_console", "PATTERN_CONTEXT", "cli_command", "emit_json",
           "NAME", "N", "FILE", "JSON", "int_opt"]

app = typer.Typer(
    name="patterns",
    help="Generate, verify, render, export and profile sparse attention patterns.",
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


#: context settings for commands that take a pattern's parameters as options
PATTERN_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}



@app.callback()
def _root(debug: bool = typer.Option(
        False, "--debug", help="On an error, print the full traceback (or SPARSE_PATTERNS_DEBUG=1).")
) -> None:
    set_debug(debug)


#: What each command can do instead when a size does not fit in memory.
_INSTEAD = {
    "show": "show a registered pattern by name (its |A_i| come from its rule; the picture "
            "needs n <= 64)",
    "verify": "verify a generated pattern by name (decided from its rule), or the block "
              "layout with --block 128",
    "analyze": "use smaller --n values; `patterns show NAME --n N` reads |A_i| at any n",
    "render": "draw block densities: --view matrix --tile 1024",
    "export": "export the recipe (--format json), which regenerates the pattern at any n",
    "profile": "use a smaller n, --heads, --batch or --head-dim",
}


def cli_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an exception into one line on stderr: exit status 2 for bad input, 1 for a bug.

    Bad input is ``ValueError``, ``OSError`` and what only a hostile size or file
    causes (``MemoryError``, ``OverflowError``, ``RecursionError``); a size that
    does not fit in memory (``config.MemoryLimitError``, raised before
    allocating, or a ``MemoryError``) also says what to use instead. Anything
    else is a bug: one line and a pointer to ``--debug``.
    """
    instead = _INSTEAD.get(func.__name__.removesuffix("_cmd"))

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, ClickException, BrokenPipeError):
            raise  # deliberate exits; a reader gone away (| head): typer exits 1 quietly
        except Exception as exc:
            raise typer.Exit(report(exc, instead)) from None

    return wrapper


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


#: The options every pattern command shares (typer reads a default; sharing one is safe).
NAME = typer.Argument(None, help="Pattern name (see `patterns list`).")
N = typer.Option(None, "--n", help=f"Sequence length (1 to {MAX_N}).", metavar="<int>",
                  parser=int_option("n", 1, MAX_N))
FILE = typer.Option(None, "--file", help="A saved pattern (.npz, .safetensors, .json).")
JSON = typer.Option(False, "--json", help="Print JSON.")

def int_opt(name: str, default: int | None, help: str, lo: int = 1, hi: int | None = None,
         flags: tuple[str, ...] = ()) -> Any:
    """An integer option whose bad value is one line naming the range (not typer's box)."""
    rng = f"{lo} to {hi}" if hi is not None else f">= {lo}"
    return typer.Option(default, *(flags or ("--" + name.replace("_", "-"),)),
                        help=f"{help} ({rng}).", metavar="<int>", parser=int_option(name, lo, hi))
