"""The ``.safetensors`` pattern file: the CSR arrays of every head as tensors,
the JSON metadata in the header, written in one pass over row chunks (each
tensor's place is known from the closed-form counts, so a generated pattern's
whole CSR is never held), read back after the header's sizes, dtypes, shapes
and offsets are checked."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..pattern import Pattern
from ..util.files import atomic_write
from ..util.stream import chunk_rows, index_dtype
from ._codec import (
    MAX_HEADS,
    MAX_META,
    build,
    check_meta,
    expected_names,
    loads_json,
    meta_of,
    one_line,
    short_repr,
)

__all__ = ["write", "read"]

_ST_DTYPES = {"I32": np.dtype("<i4"), "I64": np.dtype("<i8")}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
#: most bytes of a header this package reads: the metadata JSON (as an escaped
#: string, about twice its size) and an entry of at most 128 bytes for each of the
#: 2 * MAX_HEADS tensors
MAX_HEADER = 2 * MAX_META + 256 * MAX_HEADS + 4096


def write(pattern: Pattern, path: str | os.PathLike) -> Path:
    """Write ``pattern`` to ``path`` as ``.safetensors`` (atomically).

    The same tensors as the ``.npz`` (little-endian); the metadata JSON under
    the header's ``__metadata__["sparse_patterns"]``. The bytes are those
    ``safetensors.numpy.save`` writes for the whole arrays (tensors ordered by
    dtype size, then name; the header padded to 8 bytes), but the data is
    filled in one pass over row chunks, so memory stays bounded by a chunk
    (plus ``indptr``, ``n + 1`` entries a head) whatever the file's size.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> f = write(make("local", 16, window=2), os.path.join(tempfile.mkdtemp(), "l.safetensors"))
    >>> f.suffix
    '.safetensors'
    """
    n, p = pattern.n, pattern.num_heads
    nnz = pattern.head_nnz  # closed form for a generated pattern: no pass over the rows
    dts = [index_dtype(n, c).newbyteorder("<") for c in nnz]
    sizes = {}
    for k in range(p):
        sizes[f"indptr_{k}"] = (dts[k], n + 1)
        sizes[f"indices_{k}"] = (dts[k], nnz[k])
    header: dict = {"__metadata__": {"sparse_patterns": json.dumps(meta_of(pattern))}}
    offset = {}
    pos = 0
    for name in sorted(sizes, key=lambda s: (-sizes[s][0].itemsize, s)):  # safetensors' order
        dt, count = sizes[name]
        header[name] = {"dtype": _ST_NAMES[dt], "shape": [count],
                        "data_offsets": [pos, pos + count * dt.itemsize]}
        offset[name] = pos
        pos += count * dt.itemsize
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    base = 8 + len(text)
    chunk = chunk_rows(pattern)

    def fill(f) -> None:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(base + pos)
        indptr = [np.empty(n + 1, dtype=dt) for dt in dts]  # O(n) a head
        done = [0] * p
        for start, stop, mats in pattern.iter_rows(chunk):  # slices of a held CSR, or the rule's rows
            for k, m in enumerate(mats):
                cnt = m.indices.size
                if done[k] + cnt > nnz[k]:
                    raise ValueError(f"indices_{k}: the pattern's rows hold more entries than "
                                     f"its counts say ({nnz[k]:,})")
                f.seek(base + offset[f"indices_{k}"] + done[k] * dts[k].itemsize)
                f.write(np.ascontiguousarray(m.indices, dtype=dts[k]).tobytes())
                indptr[k][start + 1 : stop + 1] = done[k] + m.indptr[1:].astype(np.int64) - m.indptr[0]
                done[k] += cnt
        for k in range(p):
            if done[k] != nnz[k]:
                raise ValueError(f"indices_{k}: the pattern's rows hold {done[k]:,} entries, its "
                                 f"counts say {nnz[k]:,}")
            indptr[k][0] = 0
            f.seek(base + offset[f"indptr_{k}"])
            f.write(indptr[k].tobytes())
        f.seek(base + pos)

    return atomic_write(path, fill)


def read(path: str | os.PathLike, *, max_nnz: int | None = None) -> Pattern:
    """Read a ``.safetensors`` written by :func:`write`, checking the header first.

    The JSON header (its size bounded by the file's and by what the metadata
    and ``2 * MAX_HEADS`` tensor entries can take), the metadata, every
    tensor's dtype, shape and data offsets are checked, and the bytes loading
    them takes against the load limit, before a tensor is read; ``max_nnz``,
    when given, bounds the entries of all heads.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> pat = make("local", 16, window=2)
    >>> read(write(pat, os.path.join(tempfile.mkdtemp(), "l.safetensors"))) == pat
    True
    """
    path = Path(path)
    where = str(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{where}: truncated: no safetensors header")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > size - 8:
            raise ValueError(
                f"{where}: header claims {hlen:,} bytes but the file has {size:,}: truncated or corrupt"
            )
        if hlen > MAX_HEADER:
            raise ValueError(f"{where}: header claims {hlen:,} bytes; a sparse-patterns header "
                             f"is at most {MAX_HEADER:,}")
        header = loads_json(f.read(hlen), where, "the safetensors header")
    if not isinstance(header, dict):
        raise ValueError(f"{where}: the safetensors header must be a JSON object")
    md = header.pop("__metadata__", None) or {}
    if not isinstance(md, dict) or not isinstance(md.get("sparse_patterns"), str):
        raise ValueError(f"{where}: no 'sparse_patterns' metadata: not a sparse-patterns file")
    meta = check_meta(loads_json(md["sparse_patterns"], where, "the metadata"), where)
    extra = set(header) - expected_names(meta["num_heads"])
    if extra:
        raise ValueError(f"{where}: unexpected tensors {sorted(extra)[:4]}")
    base = 8 + hlen
    data_len = size - base

    def headers(name: str) -> tuple[np.dtype, tuple]:
        info = header.get(name)
        if not isinstance(info, dict):
            raise ValueError(f"{where}: missing tensor {name!r}")
        dt = _ST_DTYPES.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
        if dt is None:
            raise ValueError(f"{where}: {name} has dtype {short_repr(info.get('dtype'))}, expected int32 or int64")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if not (isinstance(shape, list) and all(_nat(s) for s in shape)):
            raise ValueError(f"{where}: {name} has a bad shape {short_repr(shape)}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(_nat(o) for o in offs)):
            raise ValueError(f"{where}: {name} has bad data_offsets {short_repr(offs)}")
        nbytes = int(np.prod(shape, dtype=object)) * dt.itemsize
        if not offs[0] <= offs[1] <= data_len or offs[1] - offs[0] != nbytes:
            raise ValueError(
                f"{where}: {name} declares {nbytes:,} bytes at {offs} but the data holds "
                f"{data_len:,}: truncated or corrupt"
            )
        return dt, tuple(shape)

    def read_tensor(name: str, count: int) -> np.ndarray:
        dt, _ = headers(name)
        try:
            with open(path, "rb") as f:
                f.seek(base + header[name]["data_offsets"][0])
                a = np.fromfile(f, dtype=dt, count=count)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot read tensor {name!r}: {one_line(exc)}") from None
        if a.size != count:
            raise ValueError(f"{where}: tensor {name!r} is truncated: {a.size:,} of {count:,} entries")
        return a

    return build(where, meta, read_tensor, headers, max_nnz=max_nnz)


def _nat(v: object) -> bool:
    """A JSON integer >= 0 (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
