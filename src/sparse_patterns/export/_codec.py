"""What the pattern file formats share (``.npz``, ``.safetensors`` and the
``flex`` ``.pt``): the JSON metadata, the CSR arrays of every head, and their
validation on the way in, so that each format module only reads its container.

Loading is bounded and distrustful. Every header is checked first and the
bytes that loading the declared arrays would allocate are compared with the
load limit (:func:`sparse_patterns.config.get_load_limit`) before any array
is read; then ``indptr`` (before the column indices are read), index ranges,
sorted and unique columns (in chunks, never a copy of the whole array) and a
consistent ``n``. A name and params in the metadata are kept only when the
registered generator, given them, regenerates exactly the stored heads
(compared row chunk by row chunk); otherwise the pattern loads as a plain user
layout (``"custom"``, no params), which has no recipe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import config
from ..pattern import CHUNK_ENTRIES, Pattern
from ..patterns import registry
from ..util.checks import MAX_N
from ..util.stream import check_load

__all__ = [
    "FORMAT_VERSION", "MAX_HEADS", "MAX_META", "MAX_INFLATE", "INDEX_DTYPES", "CHECK_CHUNK",
    "meta_of", "jsonable", "arrays_of", "one_line", "short_repr", "loads_json", "check_meta",
    "check_params", "check_header",
    "check_indptr", "check_csr", "load_bytes", "verify_bytes", "regenerated", "build",
    "expected_names",
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
#: column indices checked for order at a time (about 17 bytes of scratch each)
CHECK_CHUNK = 1 << 20
#: bytes per token and head that a generator's closed-form row counts may take
#: while a file's name and params are checked (measured: 8 to 80)
_COUNT_BYTES = 80
#: bytes per entry of a row chunk regenerated for that check
_ROW_BYTES = 24


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


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message, at most 200 characters (its type's name
    when it has none).

    Examples
    --------
    >>> one_line(ValueError("bad\\nworse")), one_line(KeyError())
    ('bad', 'KeyError')
    """
    text = str(exc)
    return text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__


def loads_json(data: str | bytes, where: str, what: str) -> Any:
    """Parse JSON read from a file; any failure (bad UTF-8, bad syntax, nesting too
    deep, an integer of thousands of digits) is a one-line ``ValueError``.

    Examples
    --------
    >>> loads_json(b'{"a": 1}', "f.json", "the recipe")
    {'a': 1}
    >>> loads_json("[" * 100000 + "]" * 100000, "f.json", "the recipe")
    Traceback (most recent call last):
    ...
    ValueError: f.json: the recipe is not valid JSON: nested too deeply
    """
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: {what} is not valid JSON: nested too deeply") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digits
        raise ValueError(f"{where}: {what} is not valid JSON: {one_line(exc)}") from None


def check_params(params: Any, where: str, what: str = "params") -> dict[str, Any]:
    """A JSON object of flat values (number, string, boolean or null), as :func:`jsonable` writes.

    Examples
    --------
    >>> check_params({"stride": 4, "window": "paper"}, "f.npz")
    {'stride': 4, 'window': 'paper'}
    >>> check_params({"stride": [4]}, "f.npz")
    Traceback (most recent call last):
    ...
    ValueError: f.npz: params: 'stride' must be a number, string, boolean or null, got a list
    """
    if not isinstance(params, dict):
        raise ValueError(f"{where}: {what} must be a JSON object")
    for k, v in params.items():
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise ValueError(
                f"{where}: {what}: {str(k)[:40]!r} must be a number, string, boolean or null, "
                f"got a {type(v).__name__}"
            )
    return params


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    """Validate the metadata dict of a .npz / .safetensors / .pt file."""
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: metadata must be a JSON object")
    if meta.get("format") != "sparse-patterns":
        fmt = meta.get("format")
        fmt = fmt[:40] if isinstance(fmt, str) else type(fmt).__name__
        raise ValueError(f"{where}: not a sparse-patterns file (format={fmt!r})")
    v = meta.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= FORMAT_VERSION:
        raise ValueError(f"{where}: version must be an integer in [1, {FORMAT_VERSION}], got {short_repr(v)}")
    n = meta.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {short_repr(n)}")
    p = meta.get("num_heads")
    if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= MAX_HEADS:
        raise ValueError(f"{where}: num_heads must be an integer in [1, {MAX_HEADS}], got {short_repr(p)}")
    if not isinstance(meta.get("name"), str):
        raise ValueError(f"{where}: name must be a string")
    check_params(meta.get("params"), where)
    if not isinstance(meta.get("causal"), bool):
        raise ValueError(f"{where}: causal must be true or false, got {short_repr(meta.get('causal'))}")
    names = meta.get("head_names")
    if not (isinstance(names, list) and len(names) == p and all(isinstance(s, str) for s in names)):
        raise ValueError(f"{where}: head_names must be a list of {p} strings")
    return meta


def short_repr(v: Any) -> str:
    """``repr(v)`` of a JSON scalar cut to 60 characters, else the type's name (a
    hostile value may be huge).

    Examples
    --------
    >>> short_repr(10**80), short_repr([1, 2])
    ('100000000000000000000000000000000000000000000000000000000...', 'list')
    """
    r = repr(v) if isinstance(v, (int, float, bool, str, type(None))) else type(v).__name__
    return r if len(r) <= 60 else r[:57] + "..."


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


def _index_size(n: int, nnz: int) -> int:
    """Bytes per index of a head as kept (int32, or int64 when needed)."""
    return 4 if max(n, nnz) < 2**31 - 1 else 8


def load_bytes(n: int, heads: list[tuple[int, int, int]], causal: bool) -> int:
    """Bytes that reading and checking CSR heads allocates at its peak (an upper estimate).

    ``heads`` holds ``(indptr itemsize, indices itemsize, nnz)`` as the file
    declares them. Kept: each head's ``indptr``, ``indices`` (int32 or int64)
    and its boolean data; passing: the arrays as read when their dtype
    differs, a row-count difference, the chunked order check and, for a
    causal pattern, the constructor's ``j <= i`` check (9 bytes an entry).

    Examples
    --------
    >>> load_bytes(4, [(4, 4, 4)], False)  # 5 + 4 int32, 4 bools; 5 int64 and 4 x 17 passing
    148
    """
    kept, passing = 0, 0
    for s_ptr, s_idx, nnz in heads:
        dt = _index_size(n, nnz)
        kept += (n + 1) * dt + nnz * (dt + 1)
        extra = ((n + 1) * s_ptr if s_ptr != dt else 0) + (nnz * s_idx if s_idx != dt else 0)
        extra += 8 * (n + 1) + 17 * min(nnz, CHECK_CHUNK) + (9 * nnz if causal else 0)
        passing = max(passing, extra)
    return kept + passing


def verify_bytes(n: int, p: int, nnz: int) -> int:
    """Bytes that checking a file's name and params against its heads may take: the
    generator's closed-form row counts and one regenerated row chunk.

    Examples
    --------
    >>> verify_bytes(16, 2, 100)
    4960
    """
    return _COUNT_BYTES * p * n + _ROW_BYTES * min(nnz, CHUNK_ENTRIES)


def check_indptr(where: str, k: int, n: int, indptr: np.ndarray, nnz: int) -> None:
    """Validate ``indptr_k`` before its column indices are read (``nnz`` as declared)."""
    if indptr[0] != 0:
        raise ValueError(f"{where}: indptr_{k}[0] must be 0, got {int(indptr[0])}")
    counts = np.diff(indptr)
    if counts.size and counts.min() < 0:
        raise ValueError(f"{where}: indptr_{k} must be non-decreasing")
    if int(indptr[-1]) != nnz:
        raise ValueError(f"{where}: indptr_{k}[-1] = {int(indptr[-1])} but indices_{k} has {nnz} entries")
    if counts.size and int(counts.max()) > n:
        raise ValueError(f"{where}: indptr_{k} has a row with more than n = {n} entries")


def check_csr(where: str, k: int, n: int, indptr: np.ndarray, indices: np.ndarray) -> sp.csr_matrix:
    """Validate one head's CSR arrays and wrap them (no copy of the data beyond dtype).

    Column indices are checked for range, then for order within rows in
    chunks of :data:`CHECK_CHUNK`: a step that does not increase is allowed
    only where a new row starts.
    """
    check_indptr(where, k, n, indptr, indices.size)
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{where}: indices_{k} has column {bad} out of range [0, {n})")
        for a in range(0, indices.size - 1, CHECK_CHUNK):
            b = min(indices.size, a + CHECK_CHUNK + 1)
            seg = indices[a:b].astype(np.int64)
            drop = np.flatnonzero(seg[1:] <= seg[:-1]) + (a + 1)  # entries not above the previous
            if drop.size:
                pos = np.minimum(np.searchsorted(indptr, drop), indptr.size - 1)
                if (indptr[pos] != drop).any():  # inside a row, not at its start
                    raise ValueError(f"{where}: indices_{k} must be sorted and unique within each row")
    dt = np.int32 if _index_size(n, indices.size) == 4 else np.int64
    m = sp.csr_matrix(
        (np.ones(indices.size, dtype=bool), indices.astype(dt, copy=False),
         indptr.astype(dt, copy=False)),
        shape=(n, n),
    )
    m.has_sorted_indices = True
    return m


def _registered(name: str) -> bool:
    return name in registry.REGISTRY


def regenerated(heads: list[sp.csr_matrix], meta: dict[str, Any]) -> Pattern | None:
    """The pattern the registered generator ``meta["name"]`` makes from the file's
    params, when it is exactly ``heads`` (under the file's head names); else None.

    Loading returns it instead of the held CSR: it carries its rule (row
    ranges, closed-form counts, a recipe), and it is the same pattern.

    Cheap checks first (the generator accepts the params; heads, causality and
    the entries of every head agree), then the rows, chunk by chunk, against
    the held CSR: one chunk of regenerated rows at a time, never a second
    whole CSR. The generator runs under the memory limit lowered to the load
    limit, so its own guards refuse what loading could not afford.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("strided", 16, stride=4)
    >>> meta = meta_of(pat)
    >>> regenerated(list(pat.heads), meta).params["stride"]
    4
    >>> regenerated(list(make("full", 16).heads) * 2, meta) is None
    True
    """
    limit = min(config.get_memory_limit(), config.get_load_limit())
    try:
        with config.memory_limit(limit):
            gen = registry.make(meta["name"], meta["n"], **meta["params"])
            if gen.num_heads != len(heads) or gen.causal != meta["causal"]:
                return None
            if gen.head_nnz != tuple(int(h.nnz) for h in heads):
                return None
            for start, stop, mats in gen.iter_rows():
                for h, m in zip(heads, mats, strict=True):
                    a, b = int(h.indptr[start]), int(h.indptr[stop])
                    if b - a != m.nnz or not np.array_equal(h.indices[a:b], m.indices):
                        return None
                    if not np.array_equal(np.diff(h.indptr[start : stop + 1]), np.diff(m.indptr)):
                        return None
            names = meta.get("head_names")
            if names is None or tuple(names) == gen.head_names:
                return gen
            named = Pattern.from_rule(gen.rule, gen.n, name=gen.name, params=gen.params,
                                      causal=gen.causal, head_names=names)
            if gen.remake is not None:  # pickled as the generator's, these head names kept
                func, args = gen.remake
                named.made_by(func, *args)
            return named
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError, KeyError):
        return None  # params the generator refuses, or a size it cannot afford: unverified


def build(where: str, meta: dict[str, Any], read: Callable[[str, int], np.ndarray],
          headers: Callable[[str], tuple[np.dtype, tuple]], *, max_nnz: int | None = None,
          mapped: bool = False) -> Pattern:
    """Assemble the pattern from validated headers and arrays (npz, safetensors, flex .pt).

    ``headers(name) -> (dtype, shape)`` reads a declared header without the
    data; ``read(name, count)`` reads an array once its header has passed.
    Every header is read first: the entries they declare are bounded by
    ``max_nnz`` (when given) and the bytes loading them takes by the load
    limit, before any array is read (``mapped``: the arrays are read through
    a memory map of the file, whose pages count too). A registered name whose
    params do not regenerate the heads is dropped (see :func:`regenerated_params`).
    """
    n, p = meta["n"], meta["num_heads"]
    declared = []
    for k in range(p):
        dt, shape = headers(f"indptr_{k}")
        check_header(where, f"indptr_{k}", dt, shape, n)
        dti, shapei = headers(f"indices_{k}")
        cnt = check_header(where, f"indices_{k}", dti, shapei, n)
        declared.append((dt.itemsize, dti.itemsize, cnt))
    total = sum(c for _, _, c in declared)
    if max_nnz is not None and total > max_nnz:
        raise ValueError(f"{where}: the heads hold {total:,} entries; max_nnz is {max_nnz:,}")
    big = max(range(p), key=lambda k: declared[k][2])
    need = load_bytes(n, declared, meta["causal"])
    if mapped:
        need += sum((n + 1) * ptr + c * idx for ptr, idx, c in declared)
    heads_text = f"n={n:,}, {p} head{'s' if p > 1 else ''}"
    check_load(where, f"indices_{big} declares {declared[big][2]:,} entries ({heads_text})", need)
    named = _registered(meta["name"])
    if named:
        check_load(where, f"checking that name {meta['name']!r} and its params regenerate the "
                   f"heads ({heads_text})", need + verify_bytes(n, p, total))
    heads = []
    for k in range(p):
        indptr = read(f"indptr_{k}", n + 1)
        check_indptr(where, k, n, indptr, declared[k][2])  # before the indices are read
        indices = read(f"indices_{k}", declared[k][2])
        heads.append(check_csr(where, k, n, indptr, indices))
        del indptr, indices
    name, params = meta["name"], meta["params"]
    if named:
        gen = regenerated(heads, meta)
        if gen is not None:
            return gen
        name, params = "custom", {}  # the metadata does not describe these heads: a user layout
    try:
        return Pattern(heads, name=name, params=params, causal=meta["causal"],
                       head_names=meta["head_names"])
    except ValueError as exc:  # MemoryLimitError stays one
        raise type(exc)(f"{where}: {exc}") from None


def expected_names(p: int) -> set[str]:
    """The array names a file of ``p`` heads holds."""
    return {f"{a}_{k}" for k in range(p) for a in ("indptr", "indices")}
