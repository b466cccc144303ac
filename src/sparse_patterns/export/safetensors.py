"""The ``.safetensors`` pattern file: the CSR arrays of every head as tensors,
the JSON metadata in the header, read back after the header's sizes, dtypes,
shapes and offsets are checked."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from .._atomic import atomic_write
from ..pattern import Pattern
from ._codec import arrays_of, build, check_meta, expected_names, meta_of

__all__ = ["write", "read"]

_ST_DTYPES = {"I32": np.dtype("<i4"), "I64": np.dtype("<i8")}


def write(pattern: Pattern, path: str | os.PathLike) -> Path:
    """Write ``pattern`` to ``path`` as ``.safetensors`` (atomically).

    The same tensors as the ``.npz`` (little-endian); the metadata JSON under
    the header's ``__metadata__["sparse_patterns"]``.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> f = write(make("local", 16, window=2), os.path.join(tempfile.mkdtemp(), "l.safetensors"))
    >>> f.suffix
    '.safetensors'
    """
    from safetensors.numpy import save  # noqa: PLC0415

    arrays = {k: v.astype(v.dtype.newbyteorder("<"), copy=False) for k, v in arrays_of(pattern).items()}
    data = save(arrays, metadata={"sparse_patterns": json.dumps(meta_of(pattern))})
    return atomic_write(path, lambda f: f.write(data))


def read(path: str | os.PathLike) -> Pattern:
    """Read a ``.safetensors`` written by :func:`write`, checking the header first.

    The JSON header (its size bounded by the file's), the metadata, every
    tensor's dtype, shape and data offsets are checked before a tensor is read.

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
        if hlen > min(size - 8, 100 << 20):
            raise ValueError(
                f"{where}: header claims {hlen:,} bytes but the file has {size:,}: truncated or corrupt"
            )
        try:
            header = json.loads(f.read(hlen).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{where}: the safetensors header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: the safetensors header must be a JSON object")
    md = header.pop("__metadata__", None) or {}
    if not isinstance(md, dict) or "sparse_patterns" not in md:
        raise ValueError(f"{where}: no 'sparse_patterns' metadata: not a sparse-patterns file")
    try:
        meta = json.loads(md["sparse_patterns"])
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: the metadata is not valid JSON: {exc}") from None
    meta = check_meta(meta, where)
    extra = set(header) - expected_names(meta["num_heads"])
    if extra:
        raise ValueError(f"{where}: unexpected tensors {sorted(extra)}")
    data_len = size - 8 - hlen

    def headers(name: str) -> tuple[np.dtype, tuple]:
        info = header.get(name)
        if not isinstance(info, dict):
            raise ValueError(f"{where}: missing tensor {name!r}")
        dt = _ST_DTYPES.get(info.get("dtype"))
        if dt is None:
            raise ValueError(f"{where}: {name} has dtype {info.get('dtype')!r}, expected int32 or int64")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise ValueError(f"{where}: {name} has a bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise ValueError(f"{where}: {name} has bad data_offsets {offs!r}")
        nbytes = int(np.prod(shape, dtype=object)) * dt.itemsize
        if not 0 <= offs[0] <= offs[1] <= data_len or offs[1] - offs[0] != nbytes:
            raise ValueError(
                f"{where}: {name} declares {nbytes:,} bytes at {offs} but the data holds "
                f"{data_len:,}: truncated or corrupt"
            )
        return dt, tuple(shape)

    def read_tensor(name: str, count: int) -> np.ndarray:
        from safetensors import SafetensorError, safe_open  # noqa: PLC0415

        try:
            with safe_open(str(path), framework="numpy") as st:
                a = st.get_tensor(name)
        except (SafetensorError, OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot read tensor {name!r}: {exc}") from None
        return np.asarray(a).ravel()

    return build(where, meta, read_tensor, headers)
