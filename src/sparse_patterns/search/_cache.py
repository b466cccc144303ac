"""The search's cache file: every finished candidate's row, written as it finishes.

Two formats, chosen by the suffix: **Parquet** (``.parquet``, ``.pq``; the
whole file is rewritten atomically, at most every :data:`WRITE_INTERVAL`
seconds while tasks finish and once at the end) and **JSON lines**
(``.jsonl``, ``.ndjson``; one header line, then one row per line, appended and
flushed as each task finishes). Both record the format, the schema and the
package version (Parquet in its schema metadata, JSON lines in its first line),
and a row's ``key`` hashes its recipe with the version
(:func:`~sparse_patterns.search._tasks.recipe_key`).

A file that is not a cache of this version (another version, another
program's file, a corrupted one) is never overwritten: the search says so and
starts a new file beside it, ``NAME.vVERSION.SUFFIX`` (then
``NAME.vVERSION-2.SUFFIX``, ...), which the next run with the same path finds
and resumes. The one repair made in place is to a JSON lines file whose last
line is unfinished (a write interrupted by a kill): that partial line is cut
off, and its candidate is computed again.

One search at a time writes a cache: :func:`open_cache` holds an exclusive
lock (``flock``) on ``PATH.lock`` until :meth:`Cache.close`, and a second
search given the same path is refused with a one-line error instead of
rewriting the first one's rows away. The lock file is removed on close.

Examples
--------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
>>> c = open_cache(path, "0.1.0")
>>> c.add({"key": "k1", "status": "ok", "measured": "verify", "n": 16}); c.close()
>>> c = open_cache(path, "0.1.0"); sorted(c.rows), c.lookup("k1", ("verify",)) is not None
(['k1'], True)
>>> c.close(); open(path, "a").write('{"key": "k2"'); c = open_cache(path, "0.1.0")
12
>>> sorted(c.rows), c.notes[0].split(":")[0]
(['k1'], 'cache')
>>> c.close(); c = open_cache(path, "0.2.0"); c.path.name, len(c.rows)
('r.v0.2.0.jsonl', 0)
>>> c.close()
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .._atomic import atomic_write
from ._tasks import FIELDS

__all__ = ["Cache", "open_cache", "FORMAT", "SCHEMA", "SUFFIXES", "WRITE_INTERVAL"]

#: What the header (JSON lines) or the schema metadata (Parquet) says the file is.
FORMAT = "sparse-patterns search cache"
#: Version of the row layout (:data:`~sparse_patterns.search._tasks.FIELDS`).
SCHEMA = 1
#: Suffix -> format.
SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: Least seconds between two rewrites of a Parquet cache while tasks finish.
WRITE_INTERVAL = 0.5
_META = b"sparse_patterns"
_KINDS = dict(FIELDS)
_MAX_BESIDE = 100


class _Unusable(Exception):
    """The file at a cache path is not a cache this run can resume (the reason)."""


def cache_format(path: Path) -> str:
    """``"parquet"`` or ``"jsonl"`` from the suffix, else ``ValueError``."""
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"cache: unknown format {path.suffix or '(no suffix)'!r} of {str(path)!r}; "
                         f"use {', '.join(SUFFIXES)}")
    return fmt


def _beside(path: Path, version: str) -> Iterator[Path]:
    """``path`` itself, then the names of new files beside it for this version."""
    yield path
    stem, suffix = path.name[: -len(path.suffix)], path.suffix
    yield path.with_name(f"{stem}.v{version}{suffix}")
    for k in range(2, _MAX_BESIDE):
        yield path.with_name(f"{stem}.v{version}-{k}{suffix}")


def _check_row(row: Any, where: str) -> dict[str, Any]:
    """A stored row with every field (missing ones None), or ``_Unusable``."""
    if not isinstance(row, dict) or not isinstance(row.get("key"), str) or row.get(
            "status") not in ("ok", "error"):
        raise _Unusable(f"has a row that is not a search result at {where}")
    out = dict.fromkeys(_KINDS)
    for name, value in row.items():
        kind = _KINDS.get(name)
        if kind is None:
            raise _Unusable(f"has an unknown field {name!r} at {where}")
        ok = (value is None or (kind == "str" and isinstance(value, str))
              or (kind == "bool" and isinstance(value, bool))
              or (kind == "int" and isinstance(value, int) and not isinstance(value, bool))
              or (kind == "float" and isinstance(value, (int, float))
                  and not isinstance(value, bool)))
        if not ok:
            raise _Unusable(f"has a bad {name} ({value!r:.40}) at {where}")
        out[name] = float(value) if kind == "float" and value is not None else value
    return out


def _check_header(meta: Any, version: str) -> None:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _Unusable("is not a search cache (no header naming it)")
    if meta.get("schema") != SCHEMA:
        raise _Unusable(f"has row layout {meta.get('schema')!r}, not {SCHEMA}")
    if meta.get("version") != version:
        raise _Unusable(f"was written by sparse-patterns {meta.get('version')!r}, not {version!r}")


def _header(version: str) -> dict[str, Any]:
    return {"format": FORMAT, "schema": SCHEMA, "version": version}


def _limit_size(path: Path) -> None:
    from .. import config  # noqa: PLC0415

    size, limit = path.stat().st_size, config.get_load_limit()
    if size > limit:
        raise ValueError(f"cache: {str(path)!r} is {config.format_bytes(size)}, above the load "
                         f"limit of {config.format_bytes(limit)} (config.set_load_limit)")


def _read_jsonl(path: Path, version: str) -> tuple[list[dict[str, Any]], int | None]:
    """The rows, and the byte length to cut the file to when its last line is unfinished."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    if not lines:
        raise _Unusable("is not a search cache (no header line)")
    try:
        _check_header(json.loads(lines[0]), version)
        rows = [_check_row(json.loads(line), f"line {k + 2}")
                for k, line in enumerate(lines[1:]) if line.strip()]
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise _Unusable(f"is corrupted ({type(exc).__name__}: {str(exc)[:80]})") from None
    return rows, (len(data) - len(tail) if tail else None)


def _arrow_schema(version: str) -> Any:
    import pyarrow as pa  # noqa: PLC0415

    types = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    return pa.schema([(name, types[kind]) for name, kind in FIELDS],
                     metadata={_META: json.dumps(_header(version)).encode()})


def _read_parquet(path: Path, version: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError: not a Parquet file
        raise _Unusable(f"is not a readable Parquet file ({type(exc).__name__}: "
                        f"{str(exc)[:80]})") from None
    try:
        meta = json.loads((schema.metadata or {}).get(_META, b"null"))
    except ValueError:
        meta = None
    _check_header(meta, version)
    want = _arrow_schema(version)
    if [(f.name, f.type) for f in schema] != [(f.name, f.type) for f in want]:
        raise _Unusable("has columns that are not this version's search rows")
    try:
        rows = pq.read_table(path, schema=want).to_pylist()
    except Exception as exc:  # noqa: BLE001 - a damaged row group
        raise _Unusable(f"is corrupted ({type(exc).__name__}: {str(exc)[:80]})") from None
    return [_check_row(r, f"row {k}") for k, r in enumerate(rows)]


class Cache:
    """The rows of one cache file, and where new ones go (see :func:`open_cache`).

    Attributes
    ----------
    path : pathlib.Path
        The file in use (the given path, or a new file beside it).
    format : {"parquet", "jsonl"}
    rows : dict of str to dict
        Row by key; the last row written for a key wins.
    notes : list of str
        What happened on opening (a file set aside, a line cut off).
    """

    def __init__(self, path: Path, fmt: str, version: str, rows: Iterable[dict[str, Any]],
                 notes: list[str]) -> None:
        self.path, self.format, self.version, self.notes = path, fmt, version, notes
        self.rows: dict[str, dict[str, Any]] = {r["key"]: r for r in rows}
        self._dirty = False
        self._last = 0.0
        self._fh: Any = None
        self._lock: _Lock | None = None

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
        row = {**dict.fromkeys(_KINDS), **row}
        self.rows[row["key"]] = row
        if self.format == "jsonl":
            if self._fh is None:
                self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open
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

    def close(self) -> None:
        """Write everything, close the file and let another search have it."""
        try:
            self.flush(force=True)
            if self._fh is not None:
                os.fsync(self._fh.fileno())
                self._fh.close()
                self._fh = None
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None


class _Lock:
    """An exclusive ``flock`` on ``PATH.lock``, taken without waiting.

    The lock file holds the owner's process id (for the message a second search
    gets) and is unlinked on release; a lock taken on a file that another
    process unlinked meanwhile is dropped and taken again on the new file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(path.name + ".lock")
        self.fd: int | None = None
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise ValueError(f"cache: {str(path)!r} is in use by another search"
                                 f"{_owner(self.path)}; wait for it to finish or give "
                                 "another path") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return
            os.close(fd)  # unlinked by its last owner between our open and our lock
        raise ValueError(f"cache: could not lock {str(self.path)!r}; give another path")

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
        text = lock.read_text(encoding="ascii", errors="replace")[:20].strip()
    except OSError:
        return ""
    return f" (process {text})" if text.isdigit() else ""


def open_cache(path: str | os.PathLike[str], version: str) -> Cache:
    """Open the cache at ``path`` for ``version``, or a new one beside it (see the module).

    Raises
    ------
    ValueError
        An unknown suffix, a missing directory, a path that is a directory, a
        file above the load limit, a hundred unusable files beside it, or a
        cache another search holds (its lock, ``PATH.lock``).
    """
    path = Path(os.fspath(path))
    fmt = cache_format(path)
    if not path.parent.is_dir():
        raise ValueError(f"cache: directory {str(path.parent)!r} of {str(path)!r} does not exist")
    lock = _Lock(path)
    try:
        cache = _open(path, fmt, version)
    except BaseException:
        lock.release()
        raise
    cache._lock = lock
    return cache


def _open(path: Path, fmt: str, version: str) -> Cache:
    """The cache at ``path`` or beside it (``open_cache`` without the lock)."""
    notes: list[str] = []
    unusable: tuple[Path, str] | None = None
    for cand in _beside(path, version):
        if unusable is not None:
            old, why = unusable
            notes.append(f"cache: {str(old)!r} {why}; it is kept as it is, and this search "
                         f"writes {str(cand)!r}")
            unusable = None
        if cand.is_dir():
            raise ValueError(f"cache: {str(cand)!r} is a directory; give a file path")
        if not cand.exists():
            return _create(cand, fmt, version, notes)
        _limit_size(cand)
        try:
            if fmt == "jsonl":
                rows, cut = _read_jsonl(cand, version)
            else:
                rows, cut = _read_parquet(cand, version), None
        except _Unusable as exc:
            unusable = (cand, str(exc))
            continue
        if cut is not None:
            os.truncate(cand, cut)
            notes.append(f"cache: {str(cand)!r} ended in an unfinished line (an interrupted "
                         "write); it was cut off and its candidate is computed again")
        return Cache(cand, fmt, version, rows, notes)
    raise ValueError(f"cache: {str(path)!r} and {_MAX_BESIDE - 1} files beside it are not "
                     "usable caches; give another path")


def _create(path: Path, fmt: str, version: str, notes: list[str]) -> Cache:
    """A new, empty cache file at ``path`` (its header written atomically)."""
    cache = Cache(path, fmt, version, [], notes)
    if fmt == "jsonl":
        line = json.dumps(_header(version)) + "\n"
        atomic_write(path, lambda f: f.write(line.encode()))
    else:
        cache._write_parquet()
    return cache
