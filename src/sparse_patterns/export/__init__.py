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
  loaded safely (no pickle, sizes checked before allocating).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

from .blocks import (
    BSA_BLOCK,
    LAYOUT_FORMATS,
    from_block_layout,
    from_bsa_mask,
    to_block_layout,
    to_bsa_mask,
)
from .dense import from_sdpa_mask, to_sdpa_mask
from .files import FILE_FORMATS, from_recipe, load, save, save_torch_export, to_recipe
from .flex import MASK_IMPLS, flex_mask_mod, from_flex_block_mask, to_flex_block_mask

__all__ = [
    "save", "load", "to_recipe", "from_recipe", "save_torch_export", "FILE_FORMATS",
    "to_flex_block_mask", "flex_mask_mod", "from_flex_block_mask", "MASK_IMPLS",
    "to_block_layout", "from_block_layout", "to_bsa_mask", "from_bsa_mask", "LAYOUT_FORMATS",
    "BSA_BLOCK", "to_sdpa_mask", "from_sdpa_mask",
]
