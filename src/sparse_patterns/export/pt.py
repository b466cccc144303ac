"""The ``.pt`` files of the torch targets (``patterns export --format flex``,
``deepspeed``, ``xformers``, ``triton``, ``bsa``): a plain dict of tensors, ints
and strings that ``torch.load(path, weights_only=True)`` reads, and the way
back to a Pattern. torch is imported inside the functions.

``torch.save`` writes whole tensors, so a ``.pt`` cannot be streamed: its
tensors are block-level (``(H, nb, nb)``, checked against the memory limit
first) and a generated pattern's token level goes in as its recipe (a few
hundred bytes at any n), never as its CSR; only a pattern that holds its CSR
already (a user layout, a loaded file) stores it.

Reading one back trusts nothing in it: only a small pickle is unpickled
(``weights_only``), a tensor is used only when its strides neither repeat
nor overlap its storage (``torch.save`` keeps a stride-0 expansion as one
element), and what the tensors would expand to is compared with the load
limit before anything is built."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..pattern import Pattern
from ..util.checks import MAX_N, check_choice
from ..util.files import atomic_write
from ..util.stream import check_load
from ._codec import (
    FORMAT_VERSION,
    MAX_HEADS,
    MAX_META,
    arrays_of,
    build,
    check_meta,
    expected_names,
    loads_json,
    meta_of,
    one_line,
    short_repr,
)
from .formats import TORCH_FORMATS

__all__ = ["save_torch_export", "read"]


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
    :func:`read` (or :func:`sparse_patterns.export.load`), which turns it back into a Pattern.

    * ``flex``: ``kv_num_blocks``, ``kv_indices``, ``full_kv_num_blocks``,
      ``full_kv_indices`` (``BlockMask.from_kv_blocks`` arguments), ``block_size``,
      ``meta``, and the token pattern to rebuild the ``mask_mod``
      (``to_flex_block_mask(load(path))``): for a generated pattern its
      ``recipe`` (JSON: name, params, n), else its CSR (``indptr_k``, ``indices_k``).
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

    format = check_choice("format", format, TORCH_FORMATS)
    obj: dict[str, Any] = {"format": format, "n": pattern.n, "causal": pattern.causal, "mode": mode,
                           "version": FORMAT_VERSION}
    if format == "flex":
        from .flex import flex_block_tensors  # noqa: PLC0415

        bs = 128 if block is None else block
        tensors = flex_block_tensors(pattern, mode=mode, num_heads=num_heads, block_size=bs,
                                     transposed=False)  # BlockMask.from_kv_blocks derives q_*
        obj["block_size"] = bs
        obj.update({k: torch.from_numpy(v) for k, v in tensors.items()})
        obj["meta"] = json.dumps(meta_of(pattern))
        recipe = _recipe_of(pattern) if pattern.rule is not None else None
        if recipe is not None:  # generated: its recipe (exact), never its CSR
            obj["recipe"] = json.dumps(recipe)
        else:  # held already (a user layout, a file); else pattern.heads checks the memory limit
            for k, v in arrays_of(pattern).items():
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
    return atomic_write(path, lambda f: torch.save(obj, f))  # straight to the file: no copy


def _recipe_of(pattern: Pattern) -> dict[str, Any] | None:
    """The recipe of a registered pattern, or None (a custom pattern stores its CSR)."""
    from .recipe import to_recipe  # noqa: PLC0415

    try:
        return to_recipe(pattern)
    except ValueError:
        return None


def read(path: str | os.PathLike, *, max_nnz: int | None = None) -> Pattern:
    """Read a ``.pt`` written by :func:`save_torch_export` back into a Pattern.

    ``torch.load(weights_only=True)``: no code is unpickled. A tensor is
    used only when it is a dense CPU tensor whose strides neither repeat nor
    overlap its storage (``torch.save`` keeps a stride-0 expansion as one
    stored element, so its declared shape says nothing about the file's
    size). ``flex`` files hold the token pattern's recipe, or its CSR,
    checked like a ``.npz``; the block layouts (``deepspeed``, ``xformers``,
    ``triton``, ``bsa``) are checked for shape and dtype, and the token pairs
    of their Kronecker expansion are counted exactly (cropped to ``n``, causal
    mask applied) before it is built. Whatever loading would allocate is
    compared with the load limit (:func:`sparse_patterns.config.get_load_limit`)
    first; ``max_nnz``, when given, bounds the token pairs of all heads.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> pat = make("fixed", 64, stride=16, c=8)
    >>> f = save_torch_export(pat, os.path.join(tempfile.mkdtemp(), "f.pt"), "flex", block=16)
    >>> read(f) == pat
    True
    """
    path = Path(path)
    where = str(path)
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        raise ValueError(f"{where}: reading a .pt file needs torch (pip install torch)") from None
    _check_pickle_size(path, where)
    try:
        obj = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds on a bad file
        raise ValueError(f"{where}: not a readable torch file: {one_line(exc)}") from None
    if (not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj)
            or not isinstance(obj.get("format"), str) or obj["format"] not in TORCH_FORMATS):
        raise ValueError(f"{where}: not a file written by 'patterns export' (no known 'format')")
    fmt = obj["format"]
    n, causal = obj.get("n"), obj.get("causal")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {short_repr(n)}")
    if not isinstance(causal, bool):
        raise ValueError(f"{where}: causal must be True or False, got {short_repr(causal)}")
    if fmt != "flex":
        return _read_layout(obj, fmt, n, causal, where, max_nnz)
    meta = obj.get("meta")
    if not isinstance(meta, str) or len(meta) > MAX_META:
        raise ValueError(f"{where}: missing or oversized 'meta'")
    meta = check_meta(loads_json(meta, where, "'meta'"), where)
    if meta["n"] != n:
        raise ValueError(f"{where}: n = {n} but the metadata says n = {meta['n']}")
    csr_names = {k for k in obj if k.startswith(("indptr_", "indices_"))}
    if "recipe" in obj:
        if csr_names:
            raise ValueError(f"{where}: holds both a recipe and CSR tensors")
        return _from_recipe(obj["recipe"], meta, where)
    extra = csr_names - expected_names(meta["num_heads"])
    if extra:
        raise ValueError(f"{where}: unexpected tensors {sorted(extra)[:4]}")

    def headers(name: str) -> tuple[np.dtype, tuple]:
        t = _tensor(obj, name, where)
        dt = _INDEX_DTYPES.get(str(t.dtype))
        if dt is None:
            raise ValueError(f"{where}: {name} has dtype {t.dtype}, expected int32 or int64")
        return dt, tuple(t.shape)

    def read_tensor(name: str, count: int) -> np.ndarray:
        return _numpy(_tensor(obj, name, where), name, where, copy=True).reshape(-1)

    return build(where, meta, read_tensor, headers, max_nnz=max_nnz, mapped=True)


#: most bytes of the pickled dict (its tensors' data lies beside it): the metadata,
#: a recipe and the entries of 2 * MAX_HEADS tensors
MAX_PICKLE = 4 * MAX_META + 512 * MAX_HEADS


def _check_pickle_size(path: Path, where: str) -> None:
    """Refuse a ``.pt`` whose pickle (``*/data.pkl``) is larger than :data:`MAX_PICKLE`.

    What ``patterns export`` pickles is a small dict; the tensors' bytes are
    separate records, mapped, not read. A larger pickle could only be many
    Python objects, which unpickle to several times their size.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            sizes = [zi.file_size for zi in zf.infolist() if zi.filename.endswith("data.pkl")]
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError):
        return  # not a zip: torch.load says what it is
    if sizes and max(sizes) > MAX_PICKLE:
        raise ValueError(f"{where}: the pickled dict has {max(sizes):,} bytes; a file written by "
                         f"'patterns export' has at most {MAX_PICKLE:,}")


#: the torch dtypes of a flex file's CSR tensors
_INDEX_DTYPES = {"torch.int32": np.dtype(np.int32), "torch.int64": np.dtype(np.int64)}


def _tensor(obj: dict, name: str, where: str) -> Any:
    """``obj[name]``: a dense CPU tensor whose strides neither repeat nor overlap its storage.

    ``torch.load`` already refuses a view reaching past its storage; what
    remains is a stride 0 (an expansion: one stored element read ``numel``
    times) or strides that make elements share storage. Either would turn a
    few stored bytes into as many as the declared shape says; neither is
    something ``patterns export`` writes.
    """
    import torch  # noqa: PLC0415

    t = obj.get(name)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{where}: missing tensor {name!r}")
    if t.layout != torch.strided or t.device.type != "cpu" or t.is_quantized:
        raise ValueError(f"{where}: {name} must be a dense CPU tensor, got {t.layout} on {t.device}")
    reach = 0  # the furthest element the dims of smaller stride reach
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1):
        if stride <= reach:
            stored = t.untyped_storage().nbytes() // max(1, t.element_size())
            raise ValueError(
                f"{where}: {name} of shape {tuple(t.shape)} has strides {t.stride()}, a stride-0 or "
                f"overlapping view of {stored:,} stored elements; save a contiguous tensor"
            )
        reach += stride * (size - 1)
    return t


def _numpy(t: Any, name: str, where: str, *, copy: bool) -> np.ndarray:
    """A checked tensor as a NumPy array (a copy, or a view of the mapped file)."""
    try:
        a = t.detach().numpy()
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{where}: {name} cannot be read as an array: {one_line(exc)}") from None
    return np.array(a, copy=True) if copy else a


def _from_recipe(recipe: object, meta: dict[str, Any], where: str) -> Pattern:
    """The pattern a flex file's recipe regenerates, checked against the file's metadata."""
    from .recipe import from_recipe  # noqa: PLC0415

    if not isinstance(recipe, str) or len(recipe) > MAX_META:
        raise ValueError(f"{where}: 'recipe' must be a JSON string of at most {MAX_META:,} bytes")
    pat = from_recipe(loads_json(recipe, where, "'recipe'"), where=where)  # its rule, no CSR built
    if (pat.n, pat.num_heads, pat.name, pat.causal) != (
        meta["n"], meta["num_heads"], meta["name"], meta["causal"]
    ):
        raise ValueError(f"{where}: the recipe does not regenerate the pattern the metadata names")
    return pat


def _read_layout(obj: dict, fmt: str, n: int, causal: bool, where: str,
                 max_nnz: int | None) -> Pattern:
    """A block-layout ``.pt`` (deepspeed, xformers, triton, bsa) back to a token-level Pattern."""
    import torch  # noqa: PLC0415

    from .blocks import expansion_bytes, expansion_pairs, from_block_layout  # noqa: PLC0415

    block = obj.get("block")
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= MAX_N:
        raise ValueError(f"{where}: block must be an integer in [1, {MAX_N}], got {short_repr(block)}")
    key = "base_blockmask" if fmt == "bsa" else "layout"
    t = _tensor(obj, key, where)
    if fmt == "bsa":
        if t.dim() != 4 or t.shape[0] < 1:
            raise ValueError(f"{where}: base_blockmask must be (B, H, nb, nb) with B >= 1, "
                             f"got {tuple(t.shape)}")
        t = t[0]
    nb = -(-n // block)
    if t.dim() != 3 or t.shape[1] != nb or t.shape[2] != nb or not 1 <= t.shape[0] <= MAX_HEADS:
        raise ValueError(
            f"{where}: {key} must have shape (H, {nb}, {nb}) for n={n}, block={block}, with "
            f"1 <= H <= {MAX_HEADS}; got {tuple(t.shape)}"
        )
    if t.dtype not in (torch.bool, torch.int32, torch.int64, torch.uint8, torch.int8):
        raise ValueError(f"{where}: {key} has dtype {t.dtype}, expected an integer or bool tensor")
    lay = _numpy(t, key, where, copy=False)  # (H, nb, nb), a view of the mapped file
    pairs = expansion_pairs(lay, block, n, causal)  # exact, in chunks of block rows
    total = sum(pairs)
    if max_nnz is not None and total > max_nnz:
        raise ValueError(f"{where}: the {key} expands to {total:,} token pairs; max_nnz is {max_nnz:,}")
    check_load(where, f"the {key} {tuple(t.shape)} with block={block} expands to {total:,} token "
               f"pairs (n={n:,})", lay.nbytes + expansion_bytes(lay, pairs, n))  # + its mapped pages
    try:
        return from_block_layout(lay, block, n, causal=causal)
    except ValueError as exc:  # MemoryLimitError stays one
        raise type(exc)(f"{where}: {exc}") from None
