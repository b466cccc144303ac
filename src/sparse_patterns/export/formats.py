"""The one table of export formats: name -> suffix, the module that writes
and reads it, whether it needs torch, its options and a description.

:func:`~sparse_patterns.export.save`, :func:`~sparse_patterns.export.load`,
:func:`~sparse_patterns.export.export_pattern` and ``patterns export`` all
dispatch through :data:`FORMATS`; adding a format is one row here and one
module beside this one. The writers and readers are looked up only when
called, so reading this table imports neither torch nor the format modules.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Format", "FORMATS", "FILE_FORMATS", "TORCH_FORMATS", "LAYOUT_FORMATS", "TORCH_OPTIONS",
    "by_suffix",
]

#: the options of the torch targets (block size, head mode, attention heads)
TORCH_OPTIONS = ("block", "mode", "num_heads")


@dataclass(frozen=True)
class Format:
    """One export format.

    Parameters
    ----------
    name : str
        ``--format`` of ``patterns export``.
    suffix : str
        The file suffix it writes.
    writer, reader : str
        ``"module:function"`` in this package: ``writer(pattern, path, **options)``
        (the ``.pt`` writer, shared by the torch targets, also takes the format's
        name) and ``reader(path, **read_options)``.
    needs_torch : bool
        Writing (and reading) it imports torch.
    description : str
        One line for help texts.
    options : tuple of str
        The keyword options the writer takes (:data:`TORCH_OPTIONS` or none).
    read_options : tuple of str
        The keyword options the reader takes.
    layout : bool
        An ``int64 (H, nb, nb)`` block layout (what ``to_block_layout`` writes).

    Examples
    --------
    >>> FORMATS["deepspeed"].suffix, FORMATS["deepspeed"].needs_torch, FORMATS["npz"].options
    ('.pt', True, ())
    """

    name: str
    suffix: str
    writer: str
    reader: str
    needs_torch: bool
    description: str
    options: tuple[str, ...] = ()
    read_options: tuple[str, ...] = ()
    layout: bool = False

    def _function(self, ref: str) -> Callable[..., Any]:
        module, func = ref.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), func)

    def write(self, pattern: Any, path: str | os.PathLike, **options: Any) -> Path:
        """Write ``pattern`` to ``path`` in this format (atomically); return the path."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"{unknown[0]}: format {self.name!r} takes no such option")
        named = (self.name,) if self.needs_torch else ()  # the .pt writer serves several formats
        return self._function(self.writer)(pattern, path, *named, **options)

    def read(self, path: str | os.PathLike, **options: Any) -> Any:
        """Read a Pattern from ``path`` (options this reader does not take are ignored)."""
        kept = {k: v for k, v in options.items() if k in self.read_options}
        return self._function(self.reader)(path, **kept)


def _torch(name: str, description: str, *, layout: bool = False) -> Format:
    return Format(name, ".pt", "pt:save_torch_export", "pt:read", True, description,
                  options=TORCH_OPTIONS, read_options=("max_nnz",), layout=layout)


#: every format, by name, in the order help texts list them
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        _torch("flex", "FlexAttention BlockMask tensors and the token CSR (block 128)"),
        _torch("deepspeed", "DeepSpeed sparse attention layout, int64 (H, nb, nb) (block 16)",
               layout=True),
        _torch("xformers", "xformers BlockSparseAttention layout, int64 (H, nb, nb) (block 16)",
               layout=True),
        _torch("triton", "Triton blocksparse layout, int64 (H, nb, nb) (block 16)", layout=True),
        _torch("bsa", "Block-Sparse-Attention base_blockmask, bool (1, H, nb, nb) (block 128)"),
        Format("npz", ".npz", "npz:write", "npz:read", False,
               "CSR of every head and JSON metadata, compressed NumPy archive",
               read_options=("max_nnz",)),
        Format("safetensors", ".safetensors", "safetensors:write", "safetensors:read", False,
               "CSR of every head as tensors, metadata in the header", read_options=("max_nnz",)),
        Format("json", ".json", "recipe:write", "recipe:read", False,
               "recipe (name, params, n) that regenerates a registered pattern"),
    )
}

#: the suffixes :func:`~sparse_patterns.export.save` writes (whole patterns, no options)
FILE_FORMATS: tuple[str, ...] = tuple(f.suffix for f in FORMATS.values() if not f.needs_torch)
#: the formats of the torch targets, written to ``.pt``
TORCH_FORMATS: tuple[str, ...] = tuple(f.name for f in FORMATS.values() if f.needs_torch)
#: the libraries whose ``(H, nb, nb)`` integer layout ``to_block_layout`` writes
LAYOUT_FORMATS: tuple[str, ...] = tuple(f.name for f in FORMATS.values() if f.layout)


def by_suffix(suffix: str) -> list[Format]:
    """The formats that write files ending in ``suffix`` (case-insensitive).

    Examples
    --------
    >>> [f.name for f in by_suffix(".NPZ")], len(by_suffix(".pt")), by_suffix(".txt")
    (['npz'], 5, [])
    """
    suffix = suffix.lower()
    return [f for f in FORMATS.values() if f.suffix == suffix]
