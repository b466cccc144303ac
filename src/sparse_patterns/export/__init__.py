"""Export patterns to the frameworks that run attention, and import them back.

* :func:`to_flex_block_mask` -- a PyTorch FlexAttention ``BlockMask`` built from
  the block layout with partial and full blocks separated, plus an exact
  ``mask_mod``; :func:`from_flex_block_mask` goes back.
* :func:`to_block_layout` / :func:`from_block_layout` -- ``int64 (H, nb, nb)``
  layouts for DeepSpeed, xformers and Triton block-sparse attention.
* :func:`to_bsa_mask` / :func:`from_bsa_mask` -- boolean ``(B, H, nb, nb)``
  block masks for Block-Sparse-Attention (128-token blocks).
* :func:`to_sdpa_mask` / :func:`from_sdpa_mask` -- dense boolean or additive
  masks for ``scaled_dot_product_attention`` (small n only).
* :func:`save` / :func:`load` -- ``.npz``, ``.safetensors`` and ``.json`` recipes,
  loaded safely (no pickle, sizes checked before allocating);
  :func:`export_pattern` writes any format (the torch targets' ``.pt`` too,
  :func:`save_torch_export`), as ``patterns export`` does.

One module per format (``npz``, ``safetensors``, ``recipe``, ``pt``, ``flex``,
``blocks``, ``dense``); one table of formats, :data:`FORMATS` (module
``formats``), through which :func:`save`, :func:`load`, :func:`export_pattern`
and the CLI dispatch. torch is imported only inside the functions that need it.
"""

from __future__ import annotations

from ..util.lazy import lazy_attributes

#: Where each public name lives: loaded on first use, so that reading the table of
#: formats (``patterns export --help``) does not import NumPy, SciPy or torch.
_WHERE = {
    "BSA_BLOCK": "blocks", "LAYOUT_FORMATS": "blocks", "from_block_layout": "blocks",
    "from_bsa_mask": "blocks", "to_block_layout": "blocks", "to_bsa_mask": "blocks",
    "from_sdpa_mask": "dense", "to_sdpa_mask": "dense",
    "ExportResult": "files", "export_pattern": "files", "load": "files", "save": "files",
    "MASK_IMPLS": "flex", "flex_mask_mod": "flex", "from_flex_block_mask": "flex",
    "to_flex_block_mask": "flex",
    "FILE_FORMATS": "formats", "FORMATS": "formats", "Format": "formats",
    "save_torch_export": "pt", "from_recipe": "recipe", "to_recipe": "recipe",
}


__getattr__, __dir__ = lazy_attributes(__name__, {k: f".{m}" for k, m in _WHERE.items()})


__all__ = [
    "save", "load", "to_recipe", "from_recipe", "save_torch_export", "FILE_FORMATS",
    "export_pattern", "ExportResult", "FORMATS", "Format",
    "to_flex_block_mask", "flex_mask_mod", "from_flex_block_mask", "MASK_IMPLS",
    "to_block_layout", "from_block_layout", "to_bsa_mask", "from_bsa_mask", "LAYOUT_FORMATS",
    "BSA_BLOCK", "to_sdpa_mask", "from_sdpa_mask",
]
