"""The ``.npz`` pattern file: the CSR arrays of every head and the JSON
metadata in one compressed NumPy archive, written row chunk by row chunk (a
generated pattern's whole CSR is never held), read back without pickle, every
array header checked before the array is inflated."""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..pattern import Pattern
from ..util.files import atomic_write
from ..util.stream import chunk_rows, head_indices, index_dtype
from ._codec import (
    MAX_INFLATE,
    MAX_META,
    build,
    check_meta,
    expected_names,
    loads_json,
    meta_of,
)
from ._codec import one_line as _one

__all__ = ["write", "read"]

#: what reading a damaged zip archive or .npy member raises (``zlib.error`` for
#: corrupt deflate data, ``RuntimeError`` for an encrypted member,
#: ``NotImplementedError`` for an unknown compression method)
_ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error, RuntimeError,
               NotImplementedError, struct.error)


def write(pattern: Pattern, path: str | os.PathLike) -> Path:
    """Write ``pattern`` to ``path`` as a compressed ``.npz`` (atomically).

    The archive holds ``meta``, the JSON metadata as a uint8 array, then
    ``indptr_k`` / ``indices_k`` (int32, or int64 when needed) for every head
    ``k``: the members :func:`numpy.savez_compressed` would write, streamed
    in row chunks, so memory stays bounded by a chunk whatever the file's size.
    :func:`sparse_patterns.export.save` calls this for ``.npz``.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> f = write(make("strided", 16, stride=4), os.path.join(tempfile.mkdtemp(), "s.npz"))
    >>> sorted(np.load(f).files)
    ['indices_0', 'indices_1', 'indptr_0', 'indptr_1', 'meta']
    """
    meta = np.frombuffer(json.dumps(meta_of(pattern)).encode(), dtype=np.uint8)
    n = pattern.n
    nnz = pattern.head_nnz  # closed form for a generated pattern: no pass over the rows
    chunk = chunk_rows(pattern)

    def fill(f) -> None:
        with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
            _member(zf, "meta", meta.dtype, meta.size, iter([meta]))
            for k in range(pattern.num_heads):
                dt = index_dtype(n, nnz[k])
                _member(zf, f"indptr_{k}", dt, n + 1, _indptr(pattern, k, chunk, dt))
                _member(zf, f"indices_{k}", dt, nnz[k],
                        (idx for _, _, _, idx in head_indices(pattern, k, chunk)))

    return atomic_write(path, fill)


def _indptr(pattern: Pattern, k: int, chunk: int, dt: np.dtype):
    """``indptr_k`` in pieces: 0, then the running sum of ``|A_i|`` chunk by chunk."""
    yield np.zeros(1, dtype=dt)
    if pattern.materialized:
        yield pattern.heads[k].indptr[1:]
        return
    rule = pattern.rule
    if rule is not None and rule.counts is not None:  # closed form: no pass over the rows
        yield np.cumsum(np.asarray(rule.counts(), dtype=np.int64)[k])
        return
    total = 0
    for _, _, counts, _ in head_indices(pattern, k, chunk):
        run = np.cumsum(counts, dtype=np.int64) + total
        total = int(run[-1]) if run.size else total
        yield run


def _member(zf: zipfile.ZipFile, name: str, dt: np.dtype, count: int, pieces) -> None:
    """One ``name.npy`` member of ``count`` entries of ``dt``, written piece by piece.

    The bytes are those :func:`numpy.save` writes for the whole array (version
    1.0 header, C order, little-endian data); a piece stream whose length is
    not ``count`` raises ``ValueError`` (the atomic write then leaves nothing).
    """
    dt = np.dtype(dt).newbyteorder("<")
    header = {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": (count,)}
    written = 0
    with zf.open(f"{name}.npy", "w", force_zip64=True) as fp:
        np.lib.format.write_array_header_1_0(fp, header)
        for a in pieces:
            a = np.ascontiguousarray(a, dtype=dt)
            written += a.size
            if written > count:
                break
            fp.write(a.tobytes())
    if written != count:
        raise ValueError(f"{name}: the pattern's rows hold {written:,}+ entries, its counts say {count:,}")


def read(path: str | os.PathLike, *, max_nnz: int | None = None) -> Pattern:
    """Read a ``.npz`` written by :func:`write`, checking every header before its array.

    No pickle: object arrays are refused; a member's declared size is checked
    against its compressed size, its header against the metadata, and the
    bytes loading every array takes against the load limit
    (:func:`sparse_patterns.config.get_load_limit`) before anything is
    inflated; ``max_nnz``, when given, bounds the entries of all heads.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> pat = make("fixed", 16, stride=4, c=1)
    >>> read(write(pat, os.path.join(tempfile.mkdtemp(), "f.npz"))) == pat
    True
    """
    path = Path(path)
    where = str(path)
    size = path.stat().st_size
    try:
        zf = zipfile.ZipFile(path)
    except _ZIP_ERRORS as exc:
        raise ValueError(f"{where}: not a valid .npz (zip) file: {_one(exc)}") from None
    with zf:
        infos = {}
        for zi in zf.infolist():
            if not zi.filename.endswith(".npy"):
                raise ValueError(f"{where}: unexpected member {zi.filename[:80]!r}")
            if zi.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                # bzip2 / lzma inflate without a bound per read: never written by NumPy
                raise ValueError(
                    f"{where}: member {zi.filename[:80]!r} uses zip compression method "
                    f"{zi.compress_type}; only stored (0) and deflated (8) are read"
                )
            if zi.file_size > MAX_INFLATE * zi.compress_size + 4096 or zi.compress_size > size:
                raise ValueError(
                    f"{where}: member {zi.filename[:80]!r} claims {zi.file_size:,} bytes from "
                    f"{zi.compress_size:,} compressed: corrupt or hostile"
                )
            infos[zi.filename[:-4]] = zi
        if "meta" not in infos:
            raise ValueError(f"{where}: no 'meta' array: not a sparse-patterns .npz")

        def header(name: str) -> tuple[np.dtype, tuple]:
            if name not in infos:
                raise ValueError(f"{where}: missing array {name!r}")
            try:
                with zf.open(infos[name]) as fp:
                    version = np.lib.format.read_magic(fp)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
                    elif version in ((2, 0), (3, 0)):
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
                    else:
                        raise ValueError(f"unsupported .npy version {version}")
                    hlen = fp.tell()
            except (*_ZIP_ERRORS, SyntaxError, TypeError, RecursionError) as exc:
                raise ValueError(f"{where}: array {name!r} has a bad header: {_one(exc)}") from None
            if dtype.hasobject:
                raise ValueError(f"{where}: array {name!r} has dtype {dtype}, which needs pickle")
            if any(s < 0 for s in shape):
                raise ValueError(f"{where}: array {name!r} has a negative shape {tuple(shape)}")
            nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize if shape else dtype.itemsize
            if nbytes + hlen > infos[name].file_size:
                raise ValueError(
                    f"{where}: array {name!r} declares {nbytes:,} bytes but the member holds "
                    f"{infos[name].file_size:,}: truncated"
                )
            return dtype, tuple(shape)

        def read_array(name: str, count: int) -> np.ndarray:
            try:
                with zf.open(infos[name]) as fp:
                    a = np.lib.format.read_array(fp, allow_pickle=False)
            except _ZIP_ERRORS as exc:
                raise ValueError(f"{where}: cannot read array {name!r}: {_one(exc)}") from None
            if a.size != count:
                raise ValueError(f"{where}: array {name!r} has {a.size} entries, expected {count}")
            return a.ravel()

        dt, shape = header("meta")
        if dt != np.dtype(np.uint8) or len(shape) != 1 or shape[0] > MAX_META:
            raise ValueError(f"{where}: 'meta' must be a 1-D uint8 array of at most {MAX_META} bytes")
        raw = read_array("meta", shape[0])
        meta = check_meta(loads_json(raw.tobytes(), where, "'meta'"), where)
        extra = set(infos) - expected_names(meta["num_heads"]) - {"meta"}
        if extra:
            raise ValueError(f"{where}: unexpected arrays {sorted(extra)[:4]}")
        return build(where, meta, read_array, header, max_nnz=max_nnz)
