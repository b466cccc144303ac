"""Saving and loading patterns, and writing any export format to a file: the
suffix (or a format name) picks a row of :data:`~sparse_patterns.export.formats.FORMATS`,
whose module does the work (``npz``, ``safetensors``, ``recipe`` for ``.json``,
``pt`` for the torch targets).

Loading is safe and bounded: no pickle anywhere; every header (sizes, dtypes,
shapes, a ``.pt`` tensor's strides against its storage) is checked, and the
bytes loading the file would allocate are compared with the load limit
(:func:`sparse_patterns.config.get_load_limit`, by default the smaller of
1 GiB and the memory limit), before any array is allocated; then index
ranges, sorted and unique column indices, square shape and a consistent
``n``. A file's name and params are kept only when they regenerate exactly
its heads. A malformed or hostile file raises ``ValueError`` (or
:class:`~sparse_patterns.config.MemoryLimitError`, one) with a one-line
message. Every file is written atomically (a temporary name, then a rename)
with the umask's permissions.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..pattern import Pattern
from ..util.checks import check_int
from .formats import FILE_FORMATS, FORMATS, by_suffix

__all__ = ["save", "load", "export_pattern", "ExportResult"]


def save(pattern: Pattern, path: str | os.PathLike) -> Path:
    """Save a pattern; the suffix picks the format.

    * ``.npz``: ``indptr_k`` / ``indices_k`` (int32, or int64 when needed) for
      every head ``k`` and ``meta``, the JSON metadata (n, num_heads, name,
      params, causal, head_names, version) as a uint8 array; compressed.
    * ``.safetensors``: the same tensors; the metadata JSON under the header's
      ``__metadata__["sparse_patterns"]``.
    * ``.json``: the recipe ``{"pattern", "params", "n", "version"}`` (registered
      patterns only), which regenerates the pattern exactly.

    The file is written to a temporary name, then renamed: never half-written.
    It gets the permissions of any new file (``0o666`` less the umask).

    Parameters
    ----------
    pattern : Pattern
    path : str or path-like
        Ends in ``.npz``, ``.safetensors`` or ``.json``.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        Unknown suffix; a recipe of a pattern that has none.

    See Also
    --------
    export_pattern : any format, the torch targets included.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> d = tempfile.mkdtemp()
    >>> pat = make("strided", 16, stride=4)
    >>> all(load(save(pat, os.path.join(d, "p" + s))) == pat for s in FILE_FORMATS)
    True
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FILE_FORMATS:
        raise ValueError(
            f"path: unknown suffix {suffix or '(none)'!r} of {str(path)!r}; use one of "
            f"{', '.join(FILE_FORMATS)}"
        )
    return by_suffix(suffix)[0].write(pattern, path)


def load(path: str | os.PathLike, *, max_nnz: int | None = None) -> Pattern:
    """Load a pattern saved by :func:`save` (or a ``.pt`` from ``patterns export``).

    Nothing is unpickled. Sizes, dtypes and shapes are checked, and the bytes
    loading them would allocate are estimated and compared with
    :func:`sparse_patterns.config.get_load_limit`, before any array is
    allocated; then ``indptr`` (starts at 0, non-decreasing, ends at nnz),
    column indices (in ``[0, n)``, sorted and unique within each row), ``n``
    (consistent everywhere, at most ``2**31 - 1``) and causality.

    The metadata is not trusted: a registered name with params (``strided``,
    ``stride=4``) is kept only when the generator regenerates exactly the
    stored heads (compared row chunk by row chunk); otherwise the pattern
    loads as a user layout (``"custom"``, no params), which has no recipe. A
    ``.json`` recipe, or the recipe in a ``flex`` ``.pt``, regenerates its
    pattern with the generator's own checks; the pattern stays lazy (its
    rule, no CSR), so loading it allocates next to nothing at any ``n``.

    Parameters
    ----------
    path : str or path-like
        ``.npz``, ``.safetensors``, ``.json`` or ``.pt``.
    max_nnz : int, optional
        The most entries (token pairs, summed over the heads) a file's CSR or
        a ``.pt`` block layout's Kronecker expansion may hold; by default only
        the load limit bounds them.

    Returns
    -------
    Pattern
        The pattern the file holds.

    Raises
    ------
    ValueError
        A missing, malformed or hostile file, with a one-line message.
    MemoryLimitError
        (a ``ValueError``) Loading would pass the load limit; the message
        names the field, the bytes and the limit.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> f = save(make("fixed", 16, stride=4, c=1), os.path.join(tempfile.mkdtemp(), "f.npz"))
    >>> load(f).params["stride"]
    4
    """
    path = Path(path)
    found = by_suffix(path.suffix)
    if not found:
        suffix = path.suffix.lower()
        raise ValueError(
            f"path: unknown suffix {suffix or '(none)'!r} of {str(path)!r}; use one of "
            f"{', '.join(FILE_FORMATS)} or .pt"
        )
    if not path.is_file():
        raise ValueError(f"path: no such file {str(path)!r}")
    if max_nnz is not None:
        max_nnz = check_int("max_nnz", max_nnz, 0)
    return found[0].read(path, max_nnz=max_nnz)  # the formats of one suffix share a reader


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_pattern` wrote: the file, its format, the pattern and the size.

    Examples
    --------
    >>> r = ExportResult("s.npz", "npz", "strided", 16, 2, 1234)
    >>> r.summary()
    'wrote s.npz  (npz, strided, n=16, heads=2, 1,234 bytes)'
    """

    file: str
    format: str
    name: str
    n: int
    heads: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (what ``patterns export --json`` prints)."""
        return asdict(self)

    def summary(self) -> str:
        """One line for a terminal."""
        return (
            f"wrote {self.file}  ({self.format}, {self.name}, n={self.n}, "
            f"heads={self.heads}, {self.bytes:,} bytes)"
        )


def export_pattern(
    pattern: Pattern,
    path: str | os.PathLike,
    format: str | None = None,
    *,
    block: int | None = None,
    mode: str = "multihead",
    num_heads: int | None = None,
) -> ExportResult:
    """Write ``pattern`` to ``path`` in any export format (what ``patterns export`` does).

    Parameters
    ----------
    pattern : Pattern
    path : str or path-like
        The output file; its suffix must be the format's (``.pt`` for the
        torch targets).
    format : str, optional
        A name of :data:`~sparse_patterns.export.formats.FORMATS` (``flex``,
        ``deepspeed``, ``xformers``, ``triton``, ``bsa``, ``npz``,
        ``safetensors``, ``json``); by default the one the suffix names
        (``.pt`` names none: several formats write it).
    block, mode, num_heads
        Options of the torch targets (see :func:`save_torch_export`); the file
        formats take none.

    Returns
    -------
    ExportResult

    Raises
    ------
    ValueError
        An unknown format, a suffix that does not match it, options a format
        does not take, or what the writer rejects; nothing is written then.
        The messages name the ``patterns export`` options (``--format``, ...).

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> out = os.path.join(tempfile.mkdtemp(), "s.json")
    >>> export_pattern(make("strided", 16, stride=4), out).format
    'json'
    """
    if not isinstance(pattern, Pattern):
        raise ValueError(f"pattern: expected a Pattern, got {type(pattern).__name__}")
    path = Path(path)
    out = str(path)
    suffix = path.suffix.lower()
    if format is None:
        found = by_suffix(suffix)
        if len(found) != 1:
            raise ValueError(
                f"format: give --format ({', '.join(FORMATS)}); the suffix "
                f"{suffix or '(none)'!r} of {out!r} does not name one"
            )
        format = found[0].name
    if format not in FORMATS:
        raise ValueError(f"format: must be one of {', '.join(FORMATS)}; got {format!r}")
    fmt = FORMATS[format]
    if suffix != fmt.suffix:
        raise ValueError(f"output: --format {format} writes a {fmt.suffix} file; got {out!r}")
    options: dict[str, Any] = {"block": block, "mode": mode, "num_heads": num_heads}
    if not fmt.options:  # the file formats: the whole pattern, no options
        if block is not None or mode != "multihead" or num_heads is not None:
            raise ValueError(
                f"block: --block, --mode and --num-heads apply to the torch formats, not {format}"
            )
        options = {}
    fmt.write(pattern, path, **options)
    return ExportResult(out, format, pattern.name, pattern.n, pattern.num_heads, path.stat().st_size)
