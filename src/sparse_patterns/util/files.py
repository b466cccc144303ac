"""The one atomic file writer of the package, shared by ``export`` (pattern
files) and ``render`` (figures): the bytes go to a temporary file in the
target's directory, which is given the target's mode (an existing file keeps
its mode; a new one gets what a plain ``open(path, "w")`` would give, ``0o666``
less the umask, where ``mkstemp`` alone leaves ``0o600``) and then renamed onto
the target. A failure at any point leaves the target as it was and no
temporary file behind, and so does SIGTERM or SIGHUP (a ``kill``, a scheduler's
timeout, ``docker stop``): while a file is written in the main thread, those
signals, when they would kill the process anyway, become ``SystemExit(128 +
signal)`` (143 for SIGTERM), so the cleanup runs before the process exits.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["atomic_write", "file_mode", "file_kind"]

#: The signals that end a process from outside and should not leave a temporary file.
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os has no getter)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)  # set and restored at once: another thread could see 0o022 meanwhile
    os.umask(umask)
    return umask


def file_mode() -> int:
    """The mode a new file gets under the current umask: ``0o666 & ~umask``.

    Examples
    --------
    >>> file_mode() & ~0o666
    0
    """
    return 0o666 & ~_umask()


def _mode_for(path: Path) -> int:
    """An existing regular file's permission bits, else :func:`file_mode`."""
    try:
        st = os.stat(path)
    except OSError:
        return file_mode()
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else file_mode()


def _exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def _signals_exit() -> Iterator[None]:
    """While the body runs, SIGTERM and SIGHUP raise ``SystemExit(128 + signal)``.

    Only in the main thread (the only one that can set handlers, and the one
    Python runs them in), and only for a signal whose handler is the default
    (which kills the process): an ignored signal or a handler someone set is
    left alone. The previous handlers are put back afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    try:
        for sig in _SIGNALS:
            if signal.getsignal(sig) is signal.SIG_DFL:
                previous[sig] = signal.signal(sig, _exit)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Write ``path`` through ``write(fileobj)``, all or nothing.

    Parameters
    ----------
    path : str or os.PathLike
        The target; its directory must exist. An existing file keeps its mode.
    write : callable
        ``write(f)`` writes the whole content to the binary file object ``f``.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    OSError
        From creating, writing or renaming the file; whatever ``write`` raises
        passes through too. Either way nothing is left behind.
    SystemExit
        ``128 + signal`` on SIGTERM or SIGHUP during the write (main thread,
        default handlers): the temporary file is removed first.

    Examples
    --------
    >>> import os, tempfile
    >>> f = atomic_write(os.path.join(tempfile.mkdtemp(), "a.txt"), lambda fh: fh.write(b"hi"))
    >>> f.read_bytes(), os.stat(f).st_mode & 0o777 == file_mode()
    (b'hi', True)
    >>> os.chmod(f, 0o640)
    >>> oct(os.stat(atomic_write(f, lambda fh: fh.write(b"ho"))).st_mode & 0o777)
    '0o640'
    """
    path = Path(path)
    mode = _mode_for(path)
    tmp = None
    with _signals_exit():
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise
    return path


def file_kind(mode: int) -> str:
    """What a file of ``os.stat`` mode ``mode`` is, for a message about a path that must be
    a regular file.

    Examples
    --------
    >>> import os
    >>> file_kind(os.stat("/dev/null").st_mode), file_kind(os.stat("/").st_mode)
    ('a character device', 'a directory')
    """
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"
