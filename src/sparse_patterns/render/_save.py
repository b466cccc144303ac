"""Saving figures atomically, through the package's one atomic writer
(:func:`sparse_patterns.util.files.atomic_write`: a temporary file in the target
directory, the umask's mode for a new file and the old mode for an overwritten
one, then a rename).

A failed save (bad suffix, missing or read-only directory, a full disk) leaves
no partial file behind and raises a one-line ``ValueError``; SIGTERM or SIGHUP
during the save removes the temporary file and exits 143 (129).
"""

from __future__ import annotations

import os
import tempfile  # noqa: F401 - the writer's mkstemp; tests patch it as _save.tempfile.mkstemp
from pathlib import Path
from typing import Any

from ..util.files import atomic_write

__all__ = ["FORMATS", "check_output", "save_figure"]

#: File suffixes the figures can be saved as, and matplotlib's format names.
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def check_output(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` has a known suffix and lies in a writable directory.

    Examples
    --------
    >>> check_output("figure.png").suffix
    '.png'
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"output: unknown file suffix {p.suffix or '(none)'!r} in {str(p)!r}; "
            f"use one of {', '.join(FORMATS)}"
        )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"output: cannot write {str(p)!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"output: cannot write {str(p)!r}: directory {str(parent)!r} is not writable")
    if p.is_dir():
        raise ValueError(f"output: cannot write {str(p)!r}: it is a directory")
    return p


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 100) -> Path:
    """Save ``fig`` to ``path`` (PNG, SVG or PDF by suffix) without leaving a partial file.

    The figure is written to a temporary file in the same directory and renamed
    onto ``path`` only once complete; a new file gets the umask's mode, an
    overwritten one keeps its mode.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    path : str or os.PathLike
        Output file; its suffix (``.png``, ``.svg``, ``.pdf``) picks the format.
    dpi : int
        Resolution of PNG output.

    Returns
    -------
    pathlib.Path
        The path written.

    Raises
    ------
    ValueError
        Unknown suffix, or the file cannot be written (one line, nothing left behind).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig = plt.figure()
    >>> save_figure(fig, "figure.gif")
    Traceback (most recent call last):
    ...
    ValueError: output: unknown file suffix '.gif' in 'figure.gif'; use one of .png, .svg, .pdf
    >>> plt.close(fig)
    """
    p = check_output(path)
    fmt = FORMATS[p.suffix.lower()]
    # a fixed date keeps PDF/SVG output reproducible
    meta = {"CreationDate": None} if fmt == "pdf" else ({"Date": None} if fmt == "svg" else {})
    try:
        atomic_write(p, lambda fh: fig.savefig(fh, format=fmt, dpi=dpi, metadata=meta))
    except OSError as exc:
        raise ValueError(f"output: cannot write {str(p)!r}: {exc.strerror or exc}") from None
    return p
