"""What the pattern file formats share (``.npz``, ``.safetensors`` and the
``flex`` ``.pt``): the JSON metadata, the CSR arrays of every head, and their
validation on the way in (every header checked before an array is read, then
index ranges, sorted and unique columns, a consistent ``n``), so that each
format module only reads its container.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._validate import MAX_N
from ..pattern import Pattern

__all__ = [
    "FORMAT_VERSION", "MAX_HEADS", "MAX_META", "MAX_INFLATE", "INDEX_DTYPES", "meta_of", "jsonable",
    "arrays_of", "check_meta", "check_header", "check_csr", "build", "expected_names",
]

#: version of the files this package writes (and the newest it reads)
FORMAT_VERSION = 1
#: most heads a file may declare
MAX_HEADS = 4096
#: most bytes of JSON metadata / recipe
MAX_META = 1 << 20
#: deflate cannot expand more than ~1032x
MAX_INFLATE = 1100
#: the dtypes of ``indptr_k`` / ``indices_k``
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def meta_of(pattern: Pattern) -> dict[str, Any]:
    """The JSON metadata of ``pattern``: n, num_heads, name, params, causal, head_names, version."""
    return {
        "format": "sparse-patterns",
        "version": FORMAT_VERSION,
        "n": pattern.n,
        "num_heads": pattern.num_heads,
        "name": pattern.name,
        "params": jsonable(dict(pattern.params)),
        "causal": pattern.causal,
        "head_names": list(pattern.head_names),
    }


def jsonable(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with NumPy scalars as Python ones and anything else as a string."""
    out = {}
    for k, v in params.items():
        if isinstance(v, (bool, np.bool_)):
            v = bool(v)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
        elif isinstance(v, (float, np.floating)):
            v = float(v)
        elif v is not None and not isinstance(v, str):
            v = str(v)
        out[str(k)] = v
    return out


def arrays_of(pattern: Pattern) -> dict[str, np.ndarray]:
    """``indptr_k`` / ``indices_k`` of every head ``k`` (int32, or int64 when needed)."""
    arrays = {}
    for k, m in enumerate(pattern.heads):
        dt = np.int32 if max(pattern.n, m.nnz) < 2**31 - 1 else np.int64
        arrays[f"indptr_{k}"] = np.ascontiguousarray(m.indptr, dtype=dt)
        arrays[f"indices_{k}"] = np.ascontiguousarray(m.indices, dtype=dt)
    return arrays


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    """Validate the metadata dict of a .npz / .safetensors / .pt file."""
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: metadata must be a JSON object")
    if meta.get("format") != "sparse-patterns":
        raise ValueError(f"{where}: not a sparse-patterns file (format={meta.get('format')!r})")
    v = meta.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= FORMAT_VERSION:
        raise ValueError(f"{where}: version must be an integer in [1, {FORMAT_VERSION}], got {v!r}")
    n = meta.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {n!r}")
    p = meta.get("num_heads")
    if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= MAX_HEADS:
        raise ValueError(f"{where}: num_heads must be an integer in [1, {MAX_HEADS}], got {p!r}")
    if not isinstance(meta.get("name"), str):
        raise ValueError(f"{where}: name must be a string")
    if not isinstance(meta.get("params"), dict):
        raise ValueError(f"{where}: params must be a JSON object")
    if not isinstance(meta.get("causal"), bool):
        raise ValueError(f"{where}: causal must be true or false, got {meta.get('causal')!r}")
    names = meta.get("head_names")
    if not (isinstance(names, list) and len(names) == p and all(isinstance(s, str) for s in names)):
        raise ValueError(f"{where}: head_names must be a list of {p} strings")
    return meta


def check_header(where: str, name: str, dtype: np.dtype, shape: tuple, n: int) -> int:
    """Check a declared dtype / shape before reading; return the element count."""
    if dtype not in INDEX_DTYPES:
        raise ValueError(f"{where}: {name} has dtype {dtype}, expected int32 or int64")
    if len(shape) != 1:
        raise ValueError(f"{where}: {name} must be 1-D, got shape {tuple(shape)}")
    count = int(shape[0])
    if name.startswith("indptr") and count != n + 1:
        raise ValueError(f"{where}: {name} has {count} entries, expected n + 1 = {n + 1}")
    if name.startswith("indices") and count > n * n:
        raise ValueError(f"{where}: {name} has {count} entries, more than n * n = {n * n}")
    return count


def check_csr(where: str, k: int, n: int, indptr: np.ndarray, indices: np.ndarray) -> sp.csr_matrix:
    """Validate one head's CSR arrays and wrap them (no copy of the data beyond dtype)."""
    if indptr[0] != 0:
        raise ValueError(f"{where}: indptr_{k}[0] must be 0, got {int(indptr[0])}")
    counts = np.diff(indptr)
    if counts.size and counts.min() < 0:
        raise ValueError(f"{where}: indptr_{k} must be non-decreasing")
    if int(indptr[-1]) != indices.size:
        raise ValueError(
            f"{where}: indptr_{k}[-1] = {int(indptr[-1])} but indices_{k} has {indices.size} entries"
        )
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{where}: indices_{k} has column {bad} out of range [0, {n})")
        if int(counts.max()) > n:
            raise ValueError(f"{where}: indptr_{k} has a row with more than n = {n} entries")
        step = np.diff(indices.astype(np.int64))
        inner = np.ones(step.size, dtype=bool)
        starts = indptr[1:-1].astype(np.int64)
        starts = starts[(starts > 0) & (starts < indices.size)]
        inner[starts - 1] = False  # the step from a row's last entry to the next row's first
        if (step[inner] <= 0).any():
            raise ValueError(f"{where}: indices_{k} must be sorted and unique within each row")
    dt = np.int32 if max(n, indices.size) < 2**31 - 1 else np.int64
    m = sp.csr_matrix(
        (np.ones(indices.size, dtype=bool), indices.astype(dt, copy=False),
         indptr.astype(dt, copy=False)),
        shape=(n, n),
    )
    m.has_sorted_indices = True
    return m


def build(where: str, meta: dict[str, Any], read: Callable[[str, int], np.ndarray],
          headers: Callable[[str], tuple[np.dtype, tuple]]) -> Pattern:
    """Assemble the pattern from validated headers and arrays (npz, safetensors, flex .pt).

    ``headers(name) -> (dtype, shape)`` reads a declared header without the
    data; ``read(name, count)`` reads an array once its header has passed.
    """
    n, p = meta["n"], meta["num_heads"]
    heads = []
    for k in range(p):
        dt, shape = headers(f"indptr_{k}")
        cnt = check_header(where, f"indptr_{k}", dt, shape, n)
        dti, shapei = headers(f"indices_{k}")
        cnti = check_header(where, f"indices_{k}", dti, shapei, n)
        indptr = read(f"indptr_{k}", cnt)
        if int(indptr[-1]) != cnti:
            raise ValueError(
                f"{where}: indptr_{k}[-1] = {int(indptr[-1])} but indices_{k} has {cnti} entries"
            )
        indices = read(f"indices_{k}", cnti)
        heads.append(check_csr(where, k, n, indptr, indices))
    try:
        return Pattern(heads, name=meta["name"], params=meta["params"], causal=meta["causal"],
                       head_names=meta["head_names"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def expected_names(p: int) -> set[str]:
    """The array names a file of ``p`` heads holds."""
    return {f"{a}_{k}" for k in range(p) for a in ("indptr", "indices")}
