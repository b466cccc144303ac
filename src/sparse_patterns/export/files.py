"""Saving and loading patterns: ``.npz`` (the CSR arrays of every head plus a
JSON metadata string), ``.safetensors`` (the same arrays, metadata in the
header), a ``.json`` recipe that regenerates a registered pattern exactly, and
the ``.pt`` files ``patterns export`` writes for the torch targets.

Loading is safe: no pickle anywhere; every header (sizes, dtypes, shapes) is
checked before any array is allocated, then index ranges, sorted and unique
column indices, square shape and a consistent ``n``. A malformed or hostile
file raises ``ValueError`` with a one-line message.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._validate import MAX_N, check_choice
from ..pattern import Pattern

__all__ = [
    "save", "load", "to_recipe", "from_recipe", "save_torch_export", "FILE_FORMATS",
    "FORMAT_VERSION", "MAX_HEADS",
]

#: version of the files this module writes (and the newest it reads)
FORMAT_VERSION = 1
#: the suffixes :func:`save` and :func:`load` understand
FILE_FORMATS = (".npz", ".safetensors", ".json")
#: most heads a file may declare
MAX_HEADS = 4096
_MAX_META = 1 << 20  # bytes of JSON metadata / recipe
_MAX_INFLATE = 1100  # deflate cannot expand more than ~1032x
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


# ------------------------------------------------------------------ helpers
def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write through ``write(fileobj)`` to a temporary name, then rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _meta(pattern: Pattern) -> dict[str, Any]:
    return {
        "format": "sparse-patterns",
        "version": FORMAT_VERSION,
        "n": pattern.n,
        "num_heads": pattern.num_heads,
        "name": pattern.name,
        "params": _jsonable(dict(pattern.params)),
        "causal": pattern.causal,
        "head_names": list(pattern.head_names),
    }


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
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


def _arrays(pattern: Pattern) -> dict[str, np.ndarray]:
    arrays = {}
    for k, m in enumerate(pattern.heads):
        dt = np.int32 if max(pattern.n, m.nnz) < 2**31 - 1 else np.int64
        arrays[f"indptr_{k}"] = np.ascontiguousarray(m.indptr, dtype=dt)
        arrays[f"indices_{k}"] = np.ascontiguousarray(m.indices, dtype=dt)
    return arrays


def _check_meta(meta: Any, where: str) -> dict[str, Any]:
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


def _check_header(where: str, name: str, dtype: np.dtype, shape: tuple, n: int) -> int:
    """Check a declared dtype / shape before reading; return the element count."""
    if dtype not in _INDEX_DTYPES:
        raise ValueError(f"{where}: {name} has dtype {dtype}, expected int32 or int64")
    if len(shape) != 1:
        raise ValueError(f"{where}: {name} must be 1-D, got shape {tuple(shape)}")
    count = int(shape[0])
    if name.startswith("indptr") and count != n + 1:
        raise ValueError(f"{where}: {name} has {count} entries, expected n + 1 = {n + 1}")
    if name.startswith("indices") and count > n * n:
        raise ValueError(f"{where}: {name} has {count} entries, more than n * n = {n * n}")
    return count


def _check_csr(where: str, k: int, n: int, indptr: np.ndarray, indices: np.ndarray) -> sp.csr_matrix:
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


def _build(where: str, meta: dict[str, Any], read: Callable[[str, int], np.ndarray],
           headers: Callable[[str], tuple[np.dtype, tuple]]) -> Pattern:
    """Assemble the pattern from validated headers and arrays (shared by npz / safetensors)."""
    n, p = meta["n"], meta["num_heads"]
    heads = []
    for k in range(p):
        dt, shape = headers(f"indptr_{k}")
        cnt = _check_header(where, f"indptr_{k}", dt, shape, n)
        dti, shapei = headers(f"indices_{k}")
        cnti = _check_header(where, f"indices_{k}", dti, shapei, n)
        indptr = read(f"indptr_{k}", cnt)
        if int(indptr[-1]) != cnti:
            raise ValueError(
                f"{where}: indptr_{k}[-1] = {int(indptr[-1])} but indices_{k} has {cnti} entries"
            )
        indices = read(f"indices_{k}", cnti)
        heads.append(_check_csr(where, k, n, indptr, indices))
    try:
        return Pattern(heads, name=meta["name"], params=meta["params"], causal=meta["causal"],
                       head_names=meta["head_names"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _expected_names(p: int) -> set[str]:
    return {f"{a}_{k}" for k in range(p) for a in ("indptr", "indices")}


# ------------------------------------------------------------------ npz
def _save_npz(pattern: Pattern, f: Any) -> None:
    meta = np.frombuffer(json.dumps(_meta(pattern)).encode(), dtype=np.uint8)
    np.savez_compressed(f, meta=meta, **_arrays(pattern))


def _load_npz(path: Path) -> Pattern:
    where = str(path)
    size = path.stat().st_size
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ValueError(f"{where}: not a valid .npz (zip) file: {exc}") from None
    with zf:
        infos = {}
        for zi in zf.infolist():
            if not zi.filename.endswith(".npy"):
                raise ValueError(f"{where}: unexpected member {zi.filename!r}")
            if zi.file_size > _MAX_INFLATE * zi.compress_size + 4096 or zi.compress_size > size:
                raise ValueError(
                    f"{where}: member {zi.filename!r} claims {zi.file_size:,} bytes from "
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
                    hlen = fp.tell() if hasattr(fp, "tell") else 0
            except (ValueError, OSError, EOFError, zipfile.BadZipFile, SyntaxError) as exc:
                raise ValueError(f"{where}: array {name!r} has a bad header: {exc}") from None
            if dtype.hasobject:
                raise ValueError(f"{where}: array {name!r} has dtype {dtype}, which needs pickle")
            nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize if shape else dtype.itemsize
            if nbytes + hlen > infos[name].file_size:
                raise ValueError(
                    f"{where}: array {name!r} declares {nbytes:,} bytes but the member holds "
                    f"{infos[name].file_size:,}: truncated"
                )
            return dtype, tuple(shape)

        def read(name: str, count: int) -> np.ndarray:
            try:
                with zf.open(infos[name]) as fp:
                    a = np.lib.format.read_array(fp, allow_pickle=False)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise ValueError(f"{where}: cannot read array {name!r}: {exc}") from None
            if a.size != count:
                raise ValueError(f"{where}: array {name!r} has {a.size} entries, expected {count}")
            return a.ravel()

        dt, shape = header("meta")
        if dt != np.dtype(np.uint8) or len(shape) != 1 or shape[0] > _MAX_META:
            raise ValueError(f"{where}: 'meta' must be a 1-D uint8 array of at most {_MAX_META} bytes")
        raw = read("meta", shape[0])
        try:
            meta = json.loads(raw.tobytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{where}: 'meta' is not valid JSON: {exc}") from None
        meta = _check_meta(meta, where)
        extra = set(infos) - _expected_names(meta["num_heads"]) - {"meta"}
        if extra:
            raise ValueError(f"{where}: unexpected arrays {sorted(extra)}")
        return _build(where, meta, read, header)


# ------------------------------------------------------------------ safetensors
_ST_DTYPES = {"I32": np.dtype("<i4"), "I64": np.dtype("<i8")}


def _save_safetensors(pattern: Pattern, f: Any) -> None:
    from safetensors.numpy import save  # noqa: PLC0415

    arrays = {k: v.astype(v.dtype.newbyteorder("<"), copy=False) for k, v in _arrays(pattern).items()}
    f.write(save(arrays, metadata={"sparse_patterns": json.dumps(_meta(pattern))}))


def _load_safetensors(path: Path) -> Pattern:
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
    meta = _check_meta(meta, where)
    extra = set(header) - _expected_names(meta["num_heads"])
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

    def read(name: str, count: int) -> np.ndarray:
        from safetensors import SafetensorError, safe_open  # noqa: PLC0415

        try:
            with safe_open(str(path), framework="numpy") as st:
                a = st.get_tensor(name)
        except (SafetensorError, OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot read tensor {name!r}: {exc}") from None
        return np.asarray(a).ravel()

    return _build(where, meta, read, headers)


# ------------------------------------------------------------------ recipes
def to_recipe(pattern: Pattern) -> dict[str, Any]:
    """The JSON recipe of a registered pattern: name, params, n and version.

    ``sparse_patterns.make(r["pattern"], r["n"], **r["params"])`` regenerates
    the pattern exactly.

    Raises
    ------
    ValueError
        The pattern is not a registered family with its generator's params
        (``"custom"``, imported layouts, ...): save it as .npz or .safetensors.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> to_recipe(make("strided", 16, stride=4))
    {'pattern': 'strided', 'params': {'stride': 4, 'window': 'paper', 'causal': True}, 'n': 16, 'version': 1}
    """
    from ..patterns import registry  # noqa: PLC0415

    spec = registry.REGISTRY.get(pattern.name)
    if spec is None or set(pattern.params) != {p.name for p in spec.params}:
        raise ValueError(
            f"pattern: a {pattern.name!r} pattern has no recipe (only registered patterns "
            "with their generator's params do); save it as .npz or .safetensors"
        )
    return {
        "pattern": pattern.name,
        "params": _jsonable(dict(pattern.params)),
        "n": pattern.n,
        "version": FORMAT_VERSION,
    }


def from_recipe(recipe: Any, *, where: str = "recipe") -> Pattern:
    """Regenerate a pattern from its recipe (see :func:`to_recipe`).

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("fixed", 16, stride=4, c=1)
    >>> from_recipe(to_recipe(pat)) == pat
    True
    """
    from ..patterns import registry  # noqa: PLC0415

    if not isinstance(recipe, dict):
        raise ValueError(f"{where}: a recipe must be a JSON object")
    unknown = set(recipe) - {"pattern", "params", "n", "version", "generator"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    v = recipe.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= FORMAT_VERSION:
        raise ValueError(f"{where}: version must be an integer in [1, {FORMAT_VERSION}], got {v!r}")
    name = recipe.get("pattern")
    if not isinstance(name, str):
        raise ValueError(f"{where}: 'pattern' must be a pattern name, got {name!r}")
    n = recipe.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {n!r}")
    params = recipe.get("params", {})
    if not isinstance(params, dict):
        raise ValueError(f"{where}: 'params' must be a JSON object")
    try:
        return registry.make(name, n, **params)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _save_json(pattern: Pattern, f: Any) -> None:
    from .. import __version__  # noqa: PLC0415

    recipe = to_recipe(pattern)
    recipe["generator"] = f"sparse-patterns {__version__}"
    f.write((json.dumps(recipe, indent=2) + "\n").encode())


def _load_json(path: Path) -> Pattern:
    where = str(path)
    if path.stat().st_size > _MAX_META:
        raise ValueError(f"{where}: a recipe is at most {_MAX_META:,} bytes")
    try:
        recipe = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from None
    return from_recipe(recipe, where=where)


# ------------------------------------------------------------------ torch exports (.pt)
_TORCH_FORMATS = ("flex", "deepspeed", "xformers", "triton", "bsa")


def save_torch_export(
    pattern: Pattern,
    path: str | os.PathLike,
    format: str,
    *,
    block: int | None = None,
    mode: str = "multihead",
    num_heads: int | None = None,
) -> Path:
    """Write the tensors a torch target consumes to a ``.pt`` file (what ``patterns export`` does).

    The file is a plain dict of tensors, ints and strings: read it with
    ``torch.load(path, weights_only=True)`` (no pickle of code), or with
    :func:`load`, which turns it back into a Pattern.

    * ``flex``: ``kv_num_blocks``, ``kv_indices``, ``full_kv_num_blocks``,
      ``full_kv_indices`` (``BlockMask.from_kv_blocks`` arguments), ``block_size``,
      and the token pattern's CSR (``indptr_k``, ``indices_k``, ``meta``) to
      rebuild the ``mask_mod`` (``to_flex_block_mask(load(path))``).
    * ``deepspeed`` / ``xformers`` / ``triton``: ``layout`` int64 ``(H, nb, nb)``,
      ``block``, ``n``, ``causal``.
    * ``bsa``: ``base_blockmask`` bool ``(1, H, nb, nb)``, ``head_mask_type``
      int32 ``(H,)``, ``block`` (128), ``n``, ``causal``.

    Examples
    --------
    >>> import os, tempfile, torch
    >>> from sparse_patterns import make
    >>> d = tempfile.mkdtemp()
    >>> f = save_torch_export(make("local", 32, window=3), os.path.join(d, "l.pt"), "deepspeed", block=8)
    >>> torch.load(f, weights_only=True)["layout"].shape
    torch.Size([1, 4, 4])
    """
    import torch  # noqa: PLC0415

    from .blocks import BSA_BLOCK, to_block_layout, to_bsa_mask  # noqa: PLC0415
    from .flex import to_flex_block_mask  # noqa: PLC0415

    format = check_choice("format", format, _TORCH_FORMATS)
    obj: dict[str, Any] = {"format": format, "n": pattern.n, "causal": pattern.causal, "mode": mode,
                           "version": FORMAT_VERSION}
    if format == "flex":
        bs = 128 if block is None else block
        bm = to_flex_block_mask(pattern, mode=mode, num_heads=num_heads, block_size=bs)
        obj.update(block_size=bs, kv_num_blocks=bm.kv_num_blocks, kv_indices=bm.kv_indices,
                   full_kv_num_blocks=bm.full_kv_num_blocks, full_kv_indices=bm.full_kv_indices)
        obj["meta"] = json.dumps(_meta(pattern))
        for k, v in _arrays(pattern).items():
            obj[k] = torch.from_numpy(v.copy())
    elif format == "bsa":
        bs = BSA_BLOCK if block is None else block
        m = to_bsa_mask(pattern, mode=mode, num_heads=num_heads, block=bs)
        obj.update(block=bs, base_blockmask=m,
                   head_mask_type=torch.arange(1, m.shape[1] + 1, dtype=torch.int32))
    else:
        bs = 16 if block is None else block
        obj.update(block=bs, layout=to_block_layout(pattern, bs, format=format, mode=mode,
                                                    num_heads=num_heads))
    path = Path(path)

    def write(f: Any) -> None:
        buf = io.BytesIO()
        torch.save(obj, buf)
        f.write(buf.getvalue())

    _atomic_write(path, write)
    return path


def _load_pt(path: Path, max_nnz: int) -> Pattern:
    import torch  # noqa: PLC0415

    from .blocks import from_block_layout  # noqa: PLC0415

    where = str(path)
    try:
        obj = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds on a bad file
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{where}: not a readable torch file: {msg}") from None
    if not isinstance(obj, dict) or obj.get("format") not in _TORCH_FORMATS:
        raise ValueError(f"{where}: not a file written by 'patterns export' (no known 'format')")
    fmt = obj["format"]
    n, causal = obj.get("n"), obj.get("causal")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {n!r}")
    if not isinstance(causal, bool):
        raise ValueError(f"{where}: causal must be True or False, got {causal!r}")
    if fmt == "flex":
        meta = obj.get("meta")
        if not isinstance(meta, str) or len(meta) > _MAX_META:
            raise ValueError(f"{where}: missing or oversized 'meta'")
        try:
            meta = _check_meta(json.loads(meta), where)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: 'meta' is not valid JSON: {exc}") from None
        if meta["n"] != n:
            raise ValueError(f"{where}: n = {n} but the metadata says n = {meta['n']}")
        extra = {k for k in obj if k.startswith(("indptr_", "indices_"))} - _expected_names(
            meta["num_heads"]
        )
        if extra:
            raise ValueError(f"{where}: unexpected tensors {sorted(extra)}")

        def tensor(name: str) -> Any:
            t = obj.get(name)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{where}: missing tensor {name!r}")
            return t

        _TD = {torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64)}

        def headers(name: str) -> tuple[np.dtype, tuple]:
            t = tensor(name)
            return _TD.get(t.dtype, np.dtype(np.float64)), tuple(t.shape)

        def read(name: str, count: int) -> np.ndarray:
            return tensor(name).numpy().ravel()

        return _build(where, meta, read, headers)
    block = obj.get("block")
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= MAX_N:
        raise ValueError(f"{where}: block must be an integer in [1, {MAX_N}], got {block!r}")
    key = "base_blockmask" if fmt == "bsa" else "layout"
    t = obj.get(key)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{where}: missing tensor {key!r}")
    if fmt == "bsa":
        if t.dim() != 4:
            raise ValueError(f"{where}: base_blockmask must be (B, H, nb, nb), got {tuple(t.shape)}")
        t = t[0]
    nb = -(-n // block)
    if t.dim() != 3 or t.shape[1] != nb or t.shape[2] != nb or t.shape[0] > MAX_HEADS:
        raise ValueError(
            f"{where}: {key} must have shape (H, {nb}, {nb}) for n={n}, block={block}; "
            f"got {tuple(t.shape)}"
        )
    if t.dtype not in (torch.bool, torch.int32, torch.int64, torch.uint8, torch.int8):
        raise ValueError(f"{where}: {key} has dtype {t.dtype}, expected an integer or bool tensor")
    lay = t.numpy()
    # bound the token pairs of the expansion before building it
    pairs = int(np.count_nonzero(lay)) * block * block
    if pairs > max_nnz:
        raise ValueError(
            f"{where}: the layout expands to up to {pairs:,} token pairs; the limit is {max_nnz:,}"
        )
    try:
        return from_block_layout(lay, block, n, causal=causal)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


# ------------------------------------------------------------------ public
_SAVERS = {".npz": _save_npz, ".safetensors": _save_safetensors, ".json": _save_json}


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
    if suffix not in _SAVERS:
        raise ValueError(
            f"path: unknown suffix {suffix or '(none)'!r} of {str(path)!r}; use one of "
            f"{', '.join(FILE_FORMATS)}"
        )
    saver = _SAVERS[suffix]
    if suffix == ".json":
        to_recipe(pattern)  # fail before creating anything
    _atomic_write(path, lambda f: saver(pattern, f))
    return path


def load(path: str | os.PathLike, *, max_nnz: int = 1 << 34) -> Pattern:
    """Load a pattern saved by :func:`save` (or a ``.pt`` from ``patterns export``).

    Nothing is unpickled. Sizes, dtypes and shapes are checked before any
    array is allocated; then ``indptr`` (starts at 0, non-decreasing, ends at
    nnz), column indices (in ``[0, n)``, sorted and unique within each row),
    ``n`` (consistent everywhere, at most ``2**31 - 1``) and causality.

    Parameters
    ----------
    path : str or path-like
        ``.npz``, ``.safetensors``, ``.json`` or ``.pt``.
    max_nnz : int
        For ``.pt`` block layouts: the most token pairs the Kronecker
        expansion may produce.

    Returns
    -------
    Pattern

    Raises
    ------
    ValueError
        A missing, malformed or hostile file, with a one-line message.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> f = save(make("fixed", 16, stride=4, c=1), os.path.join(tempfile.mkdtemp(), "f.npz"))
    >>> load(f).params["stride"]
    4
    """
    path = Path(path)
    suffix = path.suffix.lower()
    loaders = {".npz": _load_npz, ".safetensors": _load_safetensors, ".json": _load_json}
    if suffix not in loaders and suffix != ".pt":
        raise ValueError(
            f"path: unknown suffix {suffix or '(none)'!r} of {str(path)!r}; use one of "
            f"{', '.join(FILE_FORMATS)} or .pt"
        )
    if not path.is_file():
        raise ValueError(f"path: no such file {str(path)!r}")
    if suffix == ".pt":
        return _load_pt(path, max_nnz)
    return loaders[suffix](path)
