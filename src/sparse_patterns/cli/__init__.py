"""The ``patterns`` command line: a thin shell over the library.

Every command parses its arguments, calls one library function that returns
data, and prints it (the result's ``table()``, or JSON with ``--json``). Bad
input (a bad or repeated option, a size that does not fit, a malformed file) is
one line on stderr and exit status 2; a pattern that fails verification exits
1; so does a bug, with one line pointing to ``patterns --debug``, which prints
the traceback. Ctrl-C exits 130 with the line "interrupted", wherever it lands (numba's
first compilation included). A closed stdout is an error line and exit status 2.

The package: :mod:`._app` (the typer app, its consoles, the options every command
shares, :func:`._app.cli_command`), :mod:`._args` (option parsing), and one module
per command, each with a ``register(app)`` that this module calls in the order
``patterns --help`` lists them: :mod:`.show` (``list``, ``show``), :mod:`.verify`
(``verify``, ``analyze``), :mod:`.render`, :mod:`.export`, :mod:`.profile`,
:mod:`.search`.
Heavy libraries (numba, torch, matplotlib) are imported inside the commands
that need them, so ``patterns --help`` and ``patterns list`` stay fast.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted(signum: int, frame: object) -> None:
    raise SystemExit(130)


#: As the ``patterns`` script, a Ctrl-C while the imports below run (a few tenths of a
#: second) exits 130 without a traceback; main() puts Python's handler back. (Before this
#: line only the interpreter's own start-up runs, which no package can guard.)
_STARTING = (bool(sys.argv) and os.path.basename(sys.argv[0]).split(".")[0] in (
    "patterns", "patterns-script") and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
if _STARTING:
    signal.signal(signal.SIGINT, _interrupted)

from . import export, profile, render, search, show, verify  # noqa: E402
from ._app import app  # noqa: E402
from ._args import UsageError, parse_ns, parse_params, pattern_from_args  # noqa: E402

__all__ = ["app", "main", "parse_params", "pattern_from_args", "parse_ns", "UsageError"]

# Registered in the order ``patterns --help`` lists them.
for _module in (show, verify, render, export, profile, search):
    _module.register(app)


def main() -> None:
    """Entry point of the ``patterns`` console script: errors end as one line, Ctrl-C as 130."""
    try:
        if _STARTING:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        app()
    except KeyboardInterrupt:  # outside a command (Group.main turns those into 130 itself)
        if sys.stderr is not None:
            print("interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
