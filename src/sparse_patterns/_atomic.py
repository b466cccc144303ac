"""The one atomic file writer of the package, shared by ``export`` (pattern
files) and ``render`` (figures): the bytes go to a temporary file in the
target's directory, which is given the mode a plain ``open(path, "w")`` would
give (``0o666`` less the umask; ``mkstemp`` alone leaves ``0o600``) and then
renamed onto the target. A failure at any point leaves the target as it was
and no temporary file behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "file_mode"]


def file_mode() -> int:
    """The mode a new file gets under the current umask: ``0o666 & ~umask``.

    Examples
    --------
    >>> file_mode() & ~0o666
    0
    """
    umask = os.umask(0o022)  # read it (os has no getter); restored at once
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Write ``path`` through ``write(fileobj)``, all or nothing.

    Parameters
    ----------
    path : str or os.PathLike
        The target; its directory must exist.
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

    Examples
    --------
    >>> import os, tempfile
    >>> f = atomic_write(os.path.join(tempfile.mkdtemp(), "a.txt"), lambda fh: fh.write(b"hi"))
    >>> f.read_bytes(), os.stat(f).st_mode & 0o777 == file_mode()
    (b'hi', True)
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
