"""Parsing the ``patterns`` command line, and reporting what goes wrong in one line.

The commands in :mod:`sparse_patterns.cli` declare their options; this module
reads what typer cannot: a pattern's parameters given as options
(``--stride 8 --no-causal``), a schedule of layers (``--schedule
local:window=128,full``) and packed documents, lists of sequence lengths, integer options with
their allowed range, and a repeated option (an error, never "the last one
wins"). It also decides what an error looks like: one line on stderr, exit
status 2 for bad input (including ``MemoryError``, ``OverflowError`` and
``RecursionError``, which only a hostile size or file can cause), exit status 1
with a pointer to ``--debug`` for anything else (a bug), 130 on Ctrl-C.
Nothing here imports NumPy: ``patterns --help`` and ``patterns list`` stay fast.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import traceback
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

from ..util.files import file_kind as _kind
from ..util.lazy import LazyModule

try:  # typer >= 0.29 carries its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer, on click
    from click.exceptions import ClickException

if TYPE_CHECKING:
    from ..pattern import Pattern

__all__ = [
    "UsageError", "OptionValueError", "ClickException", "Command", "Group", "report", "set_debug", "int_option",
    "parse_int", "parse_params", "parse_ns", "pattern_from_args", "split_steps", "parse_heads",
    "split_names", "parse_list", "registry", "regular_file", "read_regular", "shown",
]

#: Largest sequence length: ``util.checks.MAX_N``, which imports NumPy (a test checks they agree).
MAX_N = 2**31 - 1
#: Most values a list option takes: sequence lengths (``--n``, ``--ns``), pattern names.
MAX_NS = 64


#: The family registry, imported on first use: ``--help`` loads neither NumPy nor SciPy.
registry = LazyModule("sparse_patterns.patterns.registry")


class UsageError(ValueError):
    """Bad input detected by the CLI itself (reported like a ValueError)."""


class OptionValueError(typer.BadParameter):
    """A bad or repeated option found while parsing; its message is the whole error line."""

    def format_message(self) -> str:
        return self.message


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to about ``limit`` characters (a hostile value can be megabytes).

    Examples
    --------
    >>> shown("abc"), shown("9" * 100, limit=12)
    ("'abc'", "'9999999999... (100 characters)")
    """
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}... ({len(str(value))} characters)"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def parse_int(name: str, value: Any, lo: int, hi: int | None = None,
              error: type[Exception] = UsageError) -> int:
    """``value`` (an int, or the text of one) as an int in ``[lo, hi]``, else ``error``.

    Examples
    --------
    >>> parse_int("n", " 64 ", 1)
    64
    >>> parse_int("n", "1.5", 1, 100)
    Traceback (most recent call last):
    ...
    sparse_patterns.cli._args.UsageError: n: must be an integer [1, 100], got '1.5'
    """
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    if isinstance(value, str):
        text = value.strip()
        # ASCII digits only, and short enough for int(): '1e3', '1_000', '٣' are not integers here
        if re.fullmatch(r"[+-]?[0-9]{1,4000}", text, re.ASCII) is None:
            raise error(f"{name}: must be an integer {rng}, got {shown(value)}")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name}: must be an integer {rng}, got {shown(value)}")
    if value < lo or (hi is not None and value > hi):
        raise error(f"{name}: must be an integer {rng}, got {shown(value)}")
    return value


def int_option(name: str, lo: int = 1, hi: int | None = None) -> Callable[[Any], int]:
    """A typer ``parser=`` for an integer option: a bad value is one line naming the range."""

    def parse(value: Any) -> int:
        return parse_int(name, value, lo, hi, OptionValueError)

    return parse


def _option_name(param: Any) -> str:
    """What an option is called in messages: its long flag, as a parameter name (``head_dim``)."""
    long = [o for o in param.opts if o.startswith("--")]
    return long[0][2:].replace("-", "_") if long else param.name


class _Once:
    """Refuse a declared option given more than once (``--n 64 --n 16``, ``--json --json``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            # a dry run of the same parser: its order lists an option once per occurrence
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))  # type: ignore[attr-defined]
            counts: dict[str, int] = {}
            for param in order:
                if (getattr(param, "param_type_name", "") == "option" and not param.is_eager
                        and not getattr(param, "multiple", False) and not getattr(param, "count", False)):
                    counts[param.name] = counts.get(param.name, 0) + 1
            for param in order:
                k = counts.get(param.name, 0)
                if k > 1:
                    times = "twice" if k == 2 else f"{k} times"
                    raise OptionValueError(
                        f"{_option_name(param)}: {'/'.join([*param.opts, *param.secondary_opts])} "
                        f"given {times}; give it once", ctx=ctx)
        return super().parse_args(ctx, args)  # type: ignore[misc]


class Command(_Once, TyperCommand):
    """A ``patterns`` command: a repeated option is an error."""


#: Debugging for the invocation under way: ``--debug`` or ``SPARSE_PATTERNS_DEBUG=1``.
_debug: ContextVar[bool] = ContextVar("sparse_patterns_debug", default=False)


def set_debug(on: bool) -> None:
    """Show full tracebacks for the rest of this invocation (the ``--debug`` option)."""
    if on:
        _debug.set(True)


def _debugging() -> bool:
    env = os.environ.get("SPARSE_PATTERNS_DEBUG", "").strip().lower()
    return _debug.get() or env not in ("", "0", "false", "no", "off")


def _say(line: str) -> None:
    if sys.stderr is not None:  # closed (2>&-): print(file=None) would write to stdout
        print(line, file=sys.stderr, flush=True)


def stdout_closed() -> bool:
    """Whether standard output is closed (``>&-``): Python starts with ``sys.stdout`` None,
    or its descriptor was closed since (EBADF). A stream with no descriptor (a test's
    capture) and a pipe whose reader has gone are open."""
    out = sys.stdout
    if out is None or getattr(out, "closed", False):
        return True
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation: no descriptor
        return False
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


#: Exceptions only bad input can cause in this package: exit status 2.
BAD_INPUT = (ValueError, OSError, MemoryError, OverflowError, RecursionError)


#: Optional dependencies (their top-level module) and the extra that installs each.
_EXTRAS = {"torch": "torch", "safetensors": "files", "dask": "search", "distributed": "search",
           "pandas": "search", "pyarrow": "search", "numba_cuda": "cuda",
           "transformers": "transformers"}


def report(exc: BaseException, instead: str | None = None) -> int:
    """Print ``exc`` as one line on stderr; return the exit status (2: bad input, 1: a bug,
    130 without a line: what a Ctrl-C during this invocation broke).

    ``instead`` says what the command can do instead when a size does not fit
    in memory. With ``--debug`` the traceback comes first.
    """
    debugging = _debugging()
    if debugging:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    if interrupted(exc):  # whatever Ctrl-C broke on its way (Group.main says "interrupted")
        return 130
    msg = first_line(exc)
    extra = _EXTRAS.get((getattr(exc, "name", None) or "").split(".")[0])
    if isinstance(exc, ModuleNotFoundError) and extra is not None:  # an optional dependency
        _say(f"error: {exc.name}: not installed; this command needs the {extra!r} extra "
             f"(pip install 'sparse-patterns[{extra}]')")
        return 2
    if isinstance(exc, MemoryError):  # config.MemoryLimitError (a ValueError too), or an allocation
        msg = msg if isinstance(exc, ValueError) else f"out of memory: {msg}"
        msg += f"; from the command line: {instead}" if instead and instead not in msg else ""
    elif isinstance(exc, RecursionError):
        msg = f"input nested too deeply: {msg}"
    elif isinstance(exc, OverflowError):
        msg = f"a value is too large: {msg}"
    elif not isinstance(exc, BAD_INPUT):
        how = ("the traceback is above" if debugging else
               "run again with --debug or SPARSE_PATTERNS_DEBUG=1 for the traceback")
        _say(f"error: internal error: {type(exc).__name__}: {msg} (a bug; {how})")
        return 1
    _say(f"error: {msg}")
    return 2


class _Interrupts:
    """Ctrl-C during a command, wherever it lands: the command ends with exit status 130.

    Python raises ``KeyboardInterrupt`` at the next bytecode, which during numba's first
    compilation is often a ctypes callback of llvmlite: there the exception is printed as
    "Exception ignored" and dropped, and the compilation fails later with an unrelated
    error (``RuntimeError: no compiled object yet``) or even succeeds. So the handler
    records the interrupt; an interrupt dropped in a callback is delivered again from a
    timer thread, to land where it stops the command; and once interrupted, whatever ends
    the command, and what half-built objects print when collected, is only "interrupted".
    """

    def __init__(self) -> None:
        self.hit = False
        self._saved: tuple[Any, Any] | None = None
        self._timer: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        self.hit = True
        raise KeyboardInterrupt

    def _unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            self.hit = True
            if not sys.is_finalizing():
                import _thread  # noqa: PLC0415
                import threading  # noqa: PLC0415

                self._timer = threading.Timer(0.05, _thread.interrupt_main)
                self._timer.daemon = True
                try:
                    self._timer.start()
                except RuntimeError:  # no new thread at interpreter shutdown
                    pass
        elif not self.hit and self._saved is not None:
            self._saved[1](unraisable)

    def __enter__(self) -> _Interrupts:
        import signal  # noqa: PLC0415
        import threading  # noqa: PLC0415

        # only where Python's own handler is in place (not a host's), from the main thread
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._saved = (signal.signal(signal.SIGINT, self._handler), sys.unraisablehook)
            sys.unraisablehook = self._unraisable
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal  # noqa: PLC0415

        if self._timer is not None:  # the command has ended: nothing more to deliver
            self._timer.cancel()
        if self._saved is not None:
            signal.signal(signal.SIGINT, self._saved[0])
            if not self.hit:  # interrupted: half-built objects may still print when collected
                sys.unraisablehook = self._saved[1]


#: The interrupts of the invocation under way (None outside one).
_interrupts: ContextVar[_Interrupts | None] = ContextVar("sparse_patterns_interrupts", default=None)


def interrupted(exc: BaseException | None = None) -> bool:
    """Whether Ctrl-C arrived during this invocation, or ``exc`` came of one (a
    ``KeyboardInterrupt`` in its ``__cause__`` or ``__context__`` chain)."""
    state = _interrupts.get()
    if state is not None and state.hit:
        return True
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class Group(_Once, TyperGroup):
    """The ``patterns`` app: every error ends as one line on stderr and an exit status.

    typer prints bad option values in a box without the allowed range, and
    lets other exceptions through as tracebacks; here a usage error is
    ``error: ...`` with exit status 2, an exception goes through
    :func:`report`, and Ctrl-C exits 130 without a traceback.
    """

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        token = _debug.set(False)
        state = _Interrupts()
        itoken = _interrupts.set(state)
        try:
            with state:
                if stdout_closed():  # the output would be lost and the exit status say success
                    raise UsageError("stdout: standard output is closed; send it somewhere "
                                     "(> FILE, > /dev/null or | less)")
                rv = super().main(*args, standalone_mode=False, **kwargs)
            code = rv if isinstance(rv, int) else 0  # typer.Exit(k) comes back as k
        except KeyboardInterrupt:
            code = 130
        except ClickException as exc:
            code = exc.exit_code
            if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help
                ctx = getattr(exc, "ctx", None)
                see = f" (see '{ctx.command_path} --help')" if ctx is not None and not isinstance(
                    exc, OptionValueError) else ""
                _say(f"error: {' '.join(exc.format_message().split())}{see}")
        except typer.Abort:
            code = 1
            _say("error: aborted")
        except Exception as exc:
            code = report(exc)
        finally:
            _debug.reset(token)
            _interrupts.reset(itoken)
        if code == 130 or state.hit:  # typer turns KeyboardInterrupt into 130; report() too
            code = 130
            _say("interrupted")
        sys.exit(code)


def parse_params(name: str | Sequence[str], args: Sequence[str]) -> dict[str, str | bool]:
    """Parse ``--param value`` / ``--flag`` / ``--no-flag`` for pattern ``name``.

    Dashes stand for underscores (``--summary-heads 2``). A parameter the
    pattern does not take, or one given twice, is an error. With several
    names (``patterns profile strided fixed``) an option must be taken by at
    least one of them.

    Examples
    --------
    >>> parse_params("fixed", ["--stride", "8", "--summary-heads=2", "--no-causal"])
    {'stride': '8', 'summary_heads': '2', 'causal': False}
    >>> parse_params(["strided", "fixed"], ["--c", "2"])
    {'c': '2'}
    >>> parse_params("strided", ["--causal", "--no-causal"])
    Traceback (most recent call last):
    ...
    sparse_patterns.cli._args.UsageError: causal: --causal/--no-causal given twice; give it once
    """
    names = [name] if isinstance(name, str) else list(name)
    known: dict[str, Any] = {}
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
            raise UsageError(f"{shown(tok)}: unexpected argument; the pattern options are {takes}")
        key, eq, val = tok[2:].partition("=")
        key = key.replace("-", "_")
        if key.startswith("no_") and key[3:] in known and known[key[3:]].type is bool and not eq:
            key, value, step = key[3:], False, 1
        elif key not in known:
            flag = "--" + key.replace("_", "-")
            flag = flag if len(flag) <= 40 else f"{flag[:37]}..."
            raise UsageError(f"{flag}: {who} {no_such} {takes}")
        elif eq:
            value, step = val, 1
        elif known[key].type is bool and (k + 1 == len(args) or args[k + 1].startswith("--")):
            value, step = True, 1
        elif k + 1 == len(args):
            raise UsageError(f"--{key.replace('_', '-')}: needs a value")
        else:
            value, step = args[k + 1], 2
        if key in out:
            flag = "--" + key.replace("_", "-")
            both = f"{flag}/--no-{flag[2:]}" if known[key].type is bool else flag
            raise UsageError(f"{key}: {both} given twice; give it once")
        out[key] = value
        k += step
    return out




def regular_file(what: str, path: str) -> int:
    """The size of ``path`` if it is a regular file (after symlinks), else a one-line error.

    Checked before opening: opening a FIFO blocks until a writer comes, and
    ``/dev/zero`` never ends.

    Examples
    --------
    >>> regular_file("schedule", "/dev/null")
    Traceback (most recent call last):
    ...
    sparse_patterns.cli._args.UsageError: schedule: '/dev/null' is a character device, not a regular file
    """
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)
        raise UsageError(f"{what}: cannot read {shown(path)}: {why}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what}: {shown(path)} is {_kind(st.st_mode)}, not a regular file")
    return st.st_size


def read_regular(what: str, path: str, limit: int, why: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, else one line.

    The file is opened without blocking and checked again once open (it may
    have been replaced by a FIFO since :func:`regular_file` looked).
    """
    if regular_file(what, path) > limit:
        raise UsageError(f"{what}: {shown(path)} is over {limit:,} bytes, {why}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UsageError(f"{what}: {shown(path)} is not a regular file")
            data = f.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {shown(path)}: "
                         f"{exc.strerror or first_line(exc)}") from None
    if len(data) > limit:
        raise UsageError(f"{what}: {shown(path)} is over {limit:,} bytes, {why}")
    return data


def _check_name(name: str) -> None:
    if name.startswith("-"):
        raise UsageError(f"name: expected a pattern name first, got the option {shown(name)}; "
                         "give the name before its options (strided --n 64 --stride 8)")


def pattern_from_args(name: str | None, n: int | None, args: Sequence[str],
                      file: str | None = None, documents: Sequence[int] | None = None) -> Pattern:
    """Build the pattern a command names: ``NAME --n N [--param value ...]`` or ``--file F``.

    ``documents`` (lengths or offsets): the family made inside each document, or
    a file's pattern cut at them (``within``).
    """
    if file is not None:
        if name is not None or args:
            raise UsageError("file: give either a pattern name with its options or --file, not both")
        from ..export import load  # noqa: PLC0415

        regular_file("file", file)
        try:
            pat = load(file)
            if documents is None:
                return pat
        except BAD_INPUT:
            raise
        except Exception as exc:  # whatever a malformed file breaks that load() does not check
            raise UsageError(f"file: cannot read {file!r}: {type(exc).__name__}: "
                             f"{first_line(exc)}") from exc
        from ..documents import within  # noqa: PLC0415

        return within(pat, documents)
    if name is None:
        raise UsageError(f"name: give a pattern name ({', '.join(sorted(registry.REGISTRY))}) or --file")
    _check_name(name)
    registry.get(name)  # unknown names fail before the options are read
    if n is None:
        raise UsageError(f"n: --n is required (an integer [1, {MAX_N}])")
    return registry.make(name, n, documents=documents, **parse_params(name, args))


def parse_ns(text: str) -> list[int]:
    """Parse ``--n 1024,4096`` into a list of ints, each in ``[1, MAX_N]``, at most ``MAX_NS``.

    Examples
    --------
    >>> parse_ns("1024, 4096")
    [1024, 4096]
    """
    expected = f"n: expected comma-separated integers [1, {MAX_N}], got {shown(text)}"
    parts = [part for part in text.split(",") if part.strip()]
    if len(parts) > MAX_NS:
        raise UsageError(f"n: {len(parts):,} sequence lengths; at most {MAX_NS} (each one is "
                         "a full run of the command)")
    out = []
    for part in parts:
        if re.fullmatch(r"\s*[+-]?[0-9]{1,4000}\s*", part, re.ASCII) is None:
            raise UsageError(expected)
        out.append(parse_int("n", part, 1, MAX_N))
    if not out:
        raise UsageError(f"n: expected at least one integer [1, {MAX_N}], got {shown(text)}")
    return out


def split_steps(name: str | None, args: list[str]) -> tuple[int | None, list[str]]:
    """Take ``--p P`` out of the pattern options unless the pattern has a parameter ``p``."""
    takes_p = name is not None and name in registry.REGISTRY and any(
        q.name == "p" for q in registry.REGISTRY[name].params
    )
    if takes_p:
        return None, args
    out: list[str] = []
    steps, k = None, 0
    while k < len(args):
        tok = args[k]
        if tok == "--p" or tok.startswith("--p="):
            if "=" in tok:
                val, k = tok.split("=", 1)[1], k + 1
            elif k + 1 < len(args):
                val, k = args[k + 1], k + 2
            else:
                raise UsageError("p: --p needs a value (an integer >= 1)")
            if steps is not None:
                raise UsageError("p: --p given twice; give it once")
            steps = parse_int("p", val, 1)
            continue
        out.append(tok)
        k += 1
    return steps, out


def parse_heads(text: str | None) -> list[str | int] | None:
    """``--heads A1,2`` -> ``["A1", 2]``: names, or indices when numeric."""
    if text is None:
        return None
    out: list[str | int] = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(int(part) if re.fullmatch(r"-?[0-9]{1,18}", part, re.ASCII) else part)
    return out


def split_names(ctx_args: list[str], n: str | None,
                example: str) -> tuple[list[str], list[str], list[int]]:
    """Pattern names (the leading words, each registered), the parameters (everything
    from the first ``--option`` on) and the sequence lengths of ``--n`` (required;
    ``example`` shows its form), for the commands that take several patterns."""
    k = next((i for i, a in enumerate(ctx_args) if a.startswith("--")), len(ctx_args))
    names, rest = ctx_args[:k], ctx_args[k:]
    if not names:
        raise UsageError(f"patterns: name at least one pattern ({', '.join(sorted(registry.REGISTRY))})")
    for k, name in enumerate(names):
        registry.get(name)
        if name in names[:k]:
            raise UsageError(f"patterns: {shown(name)} named twice; name each pattern once")
    if n is None:
        raise UsageError(f"n: --n is required (comma-separated integers >= 1, e.g. {example})")
    return names, rest, parse_ns(n)


def parse_list(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``; ``"none"`` -> ``[]``."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    return [] if items == ["none"] else items
