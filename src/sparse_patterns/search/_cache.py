"""The search's cache file: every finished candidate's row, written as it finishes.

Two formats, chosen by the suffix: **Parquet** (``.parquet``, ``.pq``; the
whole file is rewritten atomically, at most every :data:`WRITE_INTERVAL`
seconds while tasks finish and once at the end) and **JSON lines**
(``.jsonl``, ``.ndjson``; one header line, then one row per line, appended and
flushed as each task finishes). Both record the format, the schema and the
package version (Parquet in its schema metadata, JSON lines in its first line),
and a row's ``key`` hashes its recipe with the version
(:func:`~sparse_patterns.search._tasks.recipe_key`).

A path names a regular file or nothing yet (a FIFO, a device or a directory is
refused before it is opened); a symbolic link stands for the file it points to.
A file that is not a search cache at all (another program's file, JSON lines
without the header) is refused with a one-line error and left as it is. A cache
of another version is never overwritten: the search says so and starts a new
file beside it, ``NAME.vVERSION.SUFFIX`` (then ``NAME.vVERSION-2.SUFFIX``,
...), which the next run with the same path finds and resumes.

Rows are not trusted: every row is checked against the schema and against its
key (the recipe its fields name must hash to it, its parameters must be what
the family resolves them to, its verdict must agree with its two criteria).
A row that fails is dropped, said once in :attr:`Cache.notes`, and its
candidate computed again; the file is rewritten without it. Free text (an
error message, a worker's name) is cut to
:data:`~sparse_patterns.search._tasks.TEXT_LIMIT` characters and rid of
control characters. Reading is bounded by the load limit
(:func:`sparse_patterns.config.get_load_limit`): the file's bytes, and its
rows at :data:`ROW_BYTES` each. The one repair made in place is to a JSON
lines file whose last line is unfinished (a write interrupted by a kill): that
partial line is cut off, and its candidate is computed again.

One search at a time writes a cache: :func:`open_cache` holds an exclusive
lock (``flock``) on ``PATH.lock`` until :meth:`Cache.close`, where ``PATH`` is
the resolved path (so every spelling of it, through a symbolic link or not,
shares one lock), and on the lock of the file beside it in use. A second search
given the same path is refused with a one-line error instead of rewriting the
first one's rows away. Lock files are opened without following a symbolic
link and must be regular files; they are removed on close.

Examples
--------
>>> import os, tempfile
>>> from sparse_patterns.search._tasks import _blank
>>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
>>> rec = {"family": "strided", "params": {"stride": 4, "window": "paper", "causal": True},
...        "n": 16, "mode": "interleaved", "block": 4, "batch": 1, "heads": 2, "head_dim": 8,
...        "depth": None}
>>> row = {**_blank(rec, "0.1.0", ("verify",)), "status": "error", "error": "ValueError: no"}
>>> c = open_cache(path, "0.1.0"); c.add(row); c.close()
>>> c = open_cache(path, "0.1.0"); list(c.rows) == [row["key"]]
True
>>> c.close(); open(path, "a").write('{"key": "k2"'); c = open_cache(path, "0.1.0")
12
>>> len(c.rows), c.notes[0].split(":")[0]
(1, 'cache')
>>> c.close(); c = open_cache(path, "0.2.0"); c.path.name, len(c.rows)
('r.v0.2.0.jsonl', 0)
>>> c.close()
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from .. import config
from ..util.files import atomic_write
from ..util.files import file_kind as _kind
from ._grid import _shown as shown
from ._rows import KINDS, BadRow, check_row
from ._tasks import FIELDS, clean_text

__all__ = ["Cache", "open_cache", "FORMAT", "SCHEMA", "SUFFIXES", "WRITE_INTERVAL", "ROW_BYTES",
           "MAX_LINE"]

#: What the header (JSON lines) or the schema metadata (Parquet) says the file is.
FORMAT = "sparse-patterns search cache"
#: Version of the row layout (:data:`~sparse_patterns.search._tasks.FIELDS`).
SCHEMA = 1
#: Suffix -> format.
SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: Least seconds between two rewrites of a Parquet cache while tasks finish.
WRITE_INTERVAL = 0.5
#: Bytes a row is counted for against the load limit: a row held as a dict of its ~50
#: fields takes about 1.8 kB, and a row of a minimal JSON line is as big once read.
ROW_BYTES = 4096
#: Longest JSON line read as a row (bytes); a longer one is an invalid row.
MAX_LINE = 1 << 16
_META = b"sparse_patterns"
_MAX_BESIDE = 100


class _Unusable(Exception):
    """The file at a cache path is a cache this run cannot resume (another version)."""


class _Foreign(Exception):
    """The file at a cache path is not a search cache at all (the reason)."""


def cache_format(path: Path) -> str:
    """``"parquet"`` or ``"jsonl"`` from the suffix, else ``ValueError``."""
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"cache: unknown format {_shown(path.suffix or '(no suffix)')} of "
                         f"{_shown(path)}; use {', '.join(SUFFIXES)}")
    return fmt


def _shown(path: Any) -> str:
    """A path in a message: whole up to 1,024 characters (a real path is shorter)."""
    return shown(str(path), 1024)


def _beside(path: Path, version: str) -> Iterable[Path]:
    """``path`` itself, then the names of new files beside it for this version."""
    yield path
    stem, suffix = path.name[: -len(path.suffix)], path.suffix
    yield path.with_name(f"{stem}.v{version}{suffix}")
    for k in range(2, _MAX_BESIDE):
        yield path.with_name(f"{stem}.v{version}-{k}{suffix}")




def _exists(path: Path) -> bool:
    """Whether ``path`` is a regular file (False: nothing there); anything else is
    ``ValueError``, before anything opens it (a FIFO would block, /dev/zero never end)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ValueError(f"cache: cannot use {_shown(path)}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"cache: {_shown(path)} is {_kind(st.st_mode)}; give a regular file's "
                         "path (or one that does not exist yet)")
    return True


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened to read, without blocking on a FIFO swapped in since :func:`_exists`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise ValueError(f"cache: cannot read {_shown(path)}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(f"cache: {_shown(path)} is {_kind(st.st_mode)}; give a regular file's "
                         "path (or one that does not exist yet)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _load_limit() -> tuple[int, int]:
    """``(bytes, rows)`` a cache may hold to be read: the load limit, a row at ROW_BYTES."""
    limit = config.get_load_limit()
    return limit, max(1, limit // ROW_BYTES)


def _too_big(path: Path, what: str) -> ValueError:
    return ValueError(f"cache: {_shown(path)} {what}, above the load limit of "
                      f"{config.format_bytes(config.get_load_limit())} "
                      f"(rows count {ROW_BYTES:,} bytes each; config.set_load_limit)")


def _check_header(meta: Any, version: str) -> None:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _Foreign("no header naming it one")
    if meta.get("schema") != SCHEMA:
        raise _Unusable(f"has row layout {clean_text(repr(meta.get('schema')), 40)}, not {SCHEMA}")
    if meta.get("version") != version:
        raise _Unusable(f"was written by sparse-patterns {clean_text(repr(meta.get('version')), 40)}"
                        f", not {version!r}")


def _header(version: str) -> dict[str, Any]:
    return {"format": FORMAT, "schema": SCHEMA, "version": version}


class _Read:
    """What reading a cache file found: the rows, the invalid ones (where, why), and the
    byte length to cut a JSON lines file to when its last line is unfinished."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.invalid: list[tuple[str, str]] = []
        self.cut: int | None = None

    def add(self, row: Any, version: str, where: str) -> None:
        try:
            self.rows.append(check_row(row, version))
        except BadRow as exc:
            self.invalid.append((where, str(exc)))


def _read_jsonl(path: Path, version: str) -> _Read | None:
    """The rows of a JSON lines cache, read line by line (None: the file is empty)."""
    limit, max_rows = _load_limit()
    out = _Read()
    with _open_regular(path) as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise _too_big(path, f"is {os.fstat(f.fileno()).st_size:,} bytes")
        first = f.readline(MAX_LINE + 1)
        if not first:
            return None
        try:
            meta = json.loads(first) if first.endswith(b"\n") else None
        except (ValueError, RecursionError):
            meta = None
        _check_header(meta, version)
        pos, k = len(first), 1
        while True:
            line = f.readline(MAX_LINE + 1)
            if not line:
                break
            k += 1
            if not line.endswith(b"\n"):
                if len(line) <= MAX_LINE:  # the last line, unfinished: a write cut by a kill
                    out.cut = pos
                    break
                while line and not line.endswith(b"\n"):  # skip the rest of a long line
                    pos += len(line)
                    line = f.readline(MAX_LINE + 1)
                pos += len(line)
                out.invalid.append((f"line {k}", f"longer than {MAX_LINE:,} bytes"))
                continue
            pos += len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
                out.invalid.append((f"line {k}", f"not JSON ({type(exc).__name__})"))
                continue
            out.add(row, version, f"line {k}")
            if len(out.rows) + len(out.invalid) > max_rows:
                raise _too_big(path, f"holds more than {max_rows:,} rows")
    return out


def _arrow_schema(version: str) -> Any:
    import pyarrow as pa  # noqa: PLC0415

    types = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    return pa.schema([(name, types[kind]) for name, kind in FIELDS],
                     metadata={_META: json.dumps(_header(version)).encode()})


def _read_parquet(path: Path, version: str) -> _Read:
    """The rows of a Parquet cache, one row group at a time, within the load limit as its
    metadata declares it (rows, uncompressed bytes) before any is read."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    limit, max_rows = _load_limit()
    out = _Read()
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise _too_big(path, f"is {size:,} bytes")
        try:
            pf = pq.ParquetFile(f)
            meta = pf.metadata
            schema = pf.schema_arrow
        except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError: not a Parquet file
            raise _Foreign(f"not a readable Parquet file: {type(exc).__name__}") from None
        try:
            header = json.loads((schema.metadata or {}).get(_META, b"null"))
        except (ValueError, RecursionError):
            header = None
        _check_header(header, version)
        want = _arrow_schema(version)
        if [(x.name, x.type) for x in schema] != [(x.name, x.type) for x in want]:
            raise _Foreign("columns that are not search rows")
        if meta.num_rows > max_rows:
            raise _too_big(path, f"declares {meta.num_rows:,} rows")
        declared = sum(max(0, meta.row_group(g).column(c).total_uncompressed_size)
                       for g in range(meta.num_row_groups) for c in range(meta.num_columns))
        if declared > limit:
            raise _too_big(path, f"declares {declared:,} bytes of rows")
        held = 0
        for g in range(meta.num_row_groups):
            try:
                table = pf.read_row_group(g)
            except Exception as exc:  # noqa: BLE001 - a damaged row group, a lying page header
                raise _Foreign(f"a damaged row group ({type(exc).__name__}: "
                               f"{clean_text(str(exc), 80)})") from None
            held += table.nbytes
            if held > limit or len(out.rows) + len(out.invalid) + table.num_rows > max_rows:
                raise _too_big(path, "holds more rows than its metadata declares")
            rows = table.to_pylist()
            del table
            for k, row in enumerate(rows):
                out.add(row, version, f"row {len(out.rows) + len(out.invalid) + k}")
    return out


class Cache:
    """The rows of one cache file, and where new ones go (see :func:`open_cache`).

    Attributes
    ----------
    path : pathlib.Path
        The file in use (the given path resolved, or a new file beside it).
    format : {"parquet", "jsonl"}
    rows : dict of str to dict
        Row by key; the last row written for a key wins.
    notes : list of str
        What happened on opening (a file set aside, a line cut off, rows dropped).
    """

    def __init__(self, path: Path, fmt: str, version: str, rows: Iterable[dict[str, Any]],
                 notes: list[str]) -> None:
        self.path, self.format, self.version, self.notes = path, fmt, version, notes
        self.rows: dict[str, dict[str, Any]] = {r["key"]: r for r in rows}
        self._dirty = False
        self._last = 0.0
        self._fh: Any = None
        self._locks: list[_Lock] = []

    def lookup(self, key: str, measured: Iterable[str], retry_errors: bool = False
               ) -> dict[str, Any] | None:
        """The stored row of ``key`` if it measured at least ``measured`` (an error row
        only when not ``retry_errors``), else None."""
        row = self.rows.get(key)
        if row is None or (retry_errors and row["status"] == "error"):
            return None
        have = set((row.get("measured") or "").split(","))
        return row if set(measured) <= have else None

    def add(self, row: Mapping[str, Any]) -> None:
        """Keep ``row``: appended at once (JSON lines) or at the next :meth:`flush` (Parquet)."""
        row = {**dict.fromkeys(KINDS), **row}
        self.rows[row["key"]] = row
        if self.format == "jsonl":
            if self._fh is None:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
                self._fh = os.fdopen(fd, "a", encoding="utf-8")
            self._fh.write(json.dumps(row, sort_keys=True, allow_nan=False) + "\n")
            self._fh.flush()
        else:
            self._dirty = True
            self.flush(force=False)

    def flush(self, force: bool = True) -> None:
        """Write what is not on disk yet (Parquet: unless written under a
        :data:`WRITE_INTERVAL` ago and not ``force``)."""
        if self.format == "jsonl":
            if self._fh is not None:
                self._fh.flush()
            return
        if not self._dirty or (not force and time.monotonic() - self._last < WRITE_INTERVAL):
            return
        self._write_parquet()

    def _write_parquet(self) -> None:
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415

        table = pa.Table.from_pylist(list(self.rows.values()), schema=_arrow_schema(self.version))
        atomic_write(self.path, lambda f: pq.write_table(table, f))
        self._dirty = False
        self._last = time.monotonic()

    def _write_jsonl(self) -> None:
        """The whole file again: the header and every row (dropping invalid ones)."""
        lines = [json.dumps(_header(self.version))] + [
            json.dumps(r, sort_keys=True, allow_nan=False) for r in self.rows.values()]
        atomic_write(self.path, lambda f: f.write(("\n".join(lines) + "\n").encode()))

    def close(self) -> None:
        """Write everything, close the file and let another search have it."""
        try:
            self.flush(force=True)
            if self._fh is not None:
                os.fsync(self._fh.fileno())
                self._fh.close()
                self._fh = None
        finally:
            while self._locks:
                self._locks.pop().release()


class _Lock:
    """An exclusive ``flock`` on ``PATH.lock``, taken without waiting.

    ``path`` is resolved already. The lock file is opened without following a
    symbolic link and must be a regular file of one name (not a hard link to
    another file); it holds the owner's process id (for the message a second
    search gets) and is unlinked on release; a lock taken on a file that
    another process unlinked meanwhile is dropped and taken again on the new
    file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(path.name + ".lock")
        self.fd: int | None = None
        for _ in range(100):
            fd = self._open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ValueError(f"cache: cannot lock {_shown(self.path)}: "
                                     f"{exc.strerror or exc}") from None
                raise ValueError(f"cache: {_shown(path)} is in use by another search"
                                 f"{_owner(self.path)}; wait for it to finish or give "
                                 "another path") from None
            try:
                st = os.stat(self.path, follow_symlinks=False)
                same = st.st_ino == os.fstat(fd).st_ino and st.st_dev == os.fstat(fd).st_dev
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return
            os.close(fd)  # unlinked by its last owner between our open and our lock
        raise ValueError(f"cache: could not lock {_shown(self.path)}; give another path")

    def _open(self, path: Path) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(f"cache: the lock file {_shown(self.path)} of {_shown(path)} "
                                 "is a symbolic link; remove it (the lock is never one)") from None
            raise ValueError(f"cache: cannot lock {_shown(path)}: cannot open "
                             f"{_shown(self.path)}: {exc.strerror or exc}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            os.close(fd)
            what = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else (
                "a hard link to another file")
            raise ValueError(f"cache: the lock file {_shown(self.path)} of {_shown(path)} is "
                             f"{what}; remove it")
        return fd

    def __del__(self) -> None:  # a cache dropped without close() does not keep its lock
        self.release()

    def release(self) -> None:
        """Unlink the lock file, then unlock it."""
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


def _owner(lock: Path) -> str:
    """`` (process N)`` from the lock file's contents, or nothing."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        text = os.read(fd, 20).decode("ascii", errors="replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)
    return f" (process {text})" if text.isdigit() else ""


def open_cache(path: str | os.PathLike[str], version: str) -> Cache:
    """Open the cache at ``path`` for ``version``, or a new one beside it (see the module).

    Raises
    ------
    ValueError
        An unknown suffix, a missing directory, a path that is not a regular
        file (a directory, a FIFO, a device), a file that is not a search cache,
        a file above the load limit (bytes or rows), a hundred unusable files
        beside it, or a cache another search holds (its lock, ``PATH.lock``).
    """
    given = Path(os.fspath(path))
    fmt = cache_format(given)
    real = Path(os.path.realpath(given))
    _exists(real)  # a FIFO or a device is refused before a lock file is made beside it
    if SUFFIXES.get(real.suffix.lower()) != fmt:
        raise ValueError(f"cache: {_shown(given)} is a link to {_shown(real)}, not a "
                         f"{fmt} file; give the file's own path")
    if not real.parent.is_dir():
        raise ValueError(f"cache: directory {_shown(real.parent)} of {_shown(given)} does not "
                         "exist")
    locks = [_Lock(real)]
    try:
        cache = _open(real, fmt, version, locks)
    except BaseException:
        while locks:
            locks.pop().release()
        raise
    cache._locks = locks
    return cache


def _open(path: Path, fmt: str, version: str, locks: list[_Lock]) -> Cache:
    """The cache at ``path`` or beside it (``open_cache`` after the lock of ``path``); the
    lock of a file beside it is appended to ``locks`` (another search may name that file)."""
    notes: list[str] = []
    unusable: tuple[Path, str] | None = None
    for cand in _beside(path, version):
        if unusable is not None:
            old, why = unusable
            notes.append(f"cache: {_shown(old)} {why}; it is kept as it is, and this search "
                         f"writes {_shown(cand)}")
            unusable = None
        if cand != path:
            locks.append(_Lock(cand))
        if not _exists(cand):
            return _create(cand, fmt, version, notes)
        try:
            read = _read_jsonl(cand, version) if fmt == "jsonl" else _read_parquet(cand, version)
        except _Unusable as exc:
            unusable = (cand, str(exc))
            if cand != path:
                locks.pop().release()
            continue
        except _Foreign as exc:
            raise ValueError(f"cache: {_shown(cand)} is not a search cache ({exc}); it is left "
                             "as it is: give another path") from None
        if read is None:  # an empty file: nothing to lose
            return _create(cand, fmt, version, notes)
        cache = Cache(cand, fmt, version, read.rows, notes)
        if read.cut is not None:
            if not read.invalid:  # else rewritten below
                os.truncate(cand, read.cut)
            notes.append(f"cache: {_shown(cand)} ended in an unfinished line (an interrupted "
                         "write); it was cut off and its candidate is computed again")
        if read.invalid:
            where, why = read.invalid[0]
            more = len(read.invalid)
            notes.append(f"cache: {_shown(cand)} holds {more} row{'s' * (more > 1)} that "
                         f"{'are' if more > 1 else 'is'} not valid (first: {where}, {why}); "
                         "never used, removed from the file and computed again")
            if fmt == "jsonl":
                cache._write_jsonl()
            else:
                cache._write_parquet()
        return cache
    raise ValueError(f"cache: {_shown(path)} and {_MAX_BESIDE - 1} files beside it are not "
                     "usable caches; give another path")


def _create(path: Path, fmt: str, version: str, notes: list[str]) -> Cache:
    """A new, empty cache file at ``path`` (its header written atomically)."""
    cache = Cache(path, fmt, version, [], notes)
    if fmt == "jsonl":
        cache._write_jsonl()
    else:
        cache._write_parquet()
    return cache
