"""The ``.pt`` files of the torch targets (``patterns export --format flex``,
``deepspeed``, ``xformers``, ``triton``, ``bsa``): a plain dict of tensors, ints
and strings that ``torch.load(path, weights_only=True)`` reads, and the way
back to a Pattern. torch is imported inside the functions.

``torch.save`` writes whole tensors, so a ``.pt`` cannot be streamed: its
tensors are block-level (``(H, nb, nb)``, checked against the memory limit
first) and a generated pattern's token level goes in as its recipe (a few
hundred bytes at any n), never as its CSR; only a pattern that holds its CSR
already (a user layout, a loaded file) stores it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._atomic import atomic_write
from .._validate import MAX_N, check_choice
from ..pattern import Pattern
from ._codec import (
    FORMAT_VERSION,
    MAX_HEADS,
    MAX_META,
    arrays_of,
    build,
    check_meta,
    expected_names,
    meta_of,
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


def read(path: str | os.PathLike, *, max_nnz: int = 1 << 34) -> Pattern:
    """Read a ``.pt`` written by :func:`save_torch_export` back into a Pattern.

    ``torch.load(weights_only=True)``: no code is unpickled. ``flex`` files
    hold the token pattern's CSR, checked like a ``.npz``; the block layouts
    (``deepspeed``, ``xformers``, ``triton``, ``bsa``) are checked for shape and
    dtype, and their Kronecker expansion is bounded by ``max_nnz`` token pairs
    before it is built.

    Examples
    --------
    >>> import os, tempfile
    >>> from sparse_patterns import make
    >>> pat = make("fixed", 64, stride=16, c=8)
    >>> f = save_torch_export(pat, os.path.join(tempfile.mkdtemp(), "f.pt"), "flex", block=16)
    >>> read(f) == pat
    True
    """
    import torch  # noqa: PLC0415

    path = Path(path)
    where = str(path)
    try:
        obj = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds on a bad file
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{where}: not a readable torch file: {msg}") from None
    if not isinstance(obj, dict) or obj.get("format") not in TORCH_FORMATS:
        raise ValueError(f"{where}: not a file written by 'patterns export' (no known 'format')")
    fmt = obj["format"]
    n, causal = obj.get("n"), obj.get("causal")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: n must be an integer in [1, {MAX_N}], got {n!r}")
    if not isinstance(causal, bool):
        raise ValueError(f"{where}: causal must be True or False, got {causal!r}")
    if fmt == "flex":
        meta = obj.get("meta")
        if not isinstance(meta, str) or len(meta) > MAX_META:
            raise ValueError(f"{where}: missing or oversized 'meta'")
        try:
            meta = check_meta(json.loads(meta), where)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: 'meta' is not valid JSON: {exc}") from None
        if meta["n"] != n:
            raise ValueError(f"{where}: n = {n} but the metadata says n = {meta['n']}")
        csr_names = {k for k in obj if k.startswith(("indptr_", "indices_"))}
        if "recipe" in obj:
            if csr_names:
                raise ValueError(f"{where}: holds both a recipe and CSR tensors")
            return _from_recipe(obj["recipe"], meta, where)
        extra = csr_names - expected_names(meta["num_heads"])
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

        return build(where, meta, read, headers)
    return _read_layout(obj, fmt, n, causal, where, max_nnz)


def _from_recipe(recipe: object, meta: dict[str, Any], where: str) -> Pattern:
    """The pattern a flex file's recipe regenerates, checked against the file's metadata."""
    from .recipe import from_recipe  # noqa: PLC0415

    if not isinstance(recipe, str) or len(recipe) > MAX_META:
        raise ValueError(f"{where}: 'recipe' must be a JSON string of at most {MAX_META:,} bytes")
    try:
        recipe = json.loads(recipe)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: 'recipe' is not valid JSON: {exc}") from None
    pat = from_recipe(recipe, where=where)  # a generated pattern: its rule, no CSR built
    if (pat.n, pat.num_heads, pat.name, pat.causal) != (
        meta["n"], meta["num_heads"], meta["name"], meta["causal"]
    ):
        raise ValueError(f"{where}: the recipe does not regenerate the pattern the metadata names")
    return pat


def _read_layout(obj: dict, fmt: str, n: int, causal: bool, where: str, max_nnz: int) -> Pattern:
    """A block-layout ``.pt`` (deepspeed, xformers, triton, bsa) back to a token-level Pattern."""
    import torch  # noqa: PLC0415

    from .blocks import from_block_layout  # noqa: PLC0415

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
