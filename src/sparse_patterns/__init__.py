"""sparse-patterns: the sparse attention patterns of the Sparse Transformer and its successors.

Generate a pattern, verify the promises it must keep, draw it, export it to the
framework that trains your model, and run it in a fused sparse-attention kernel.

Conventions (kept everywhere in the package):

* Rows are queries ``i``, columns are keys ``j``: entry ``(i, j)`` set means
  output ``i`` attends to input ``j``. Indices are zero-based; ``n`` is the
  sequence length.
* A :class:`Pattern` holds ``p`` heads ``A^(1) .. A^(p)`` (boolean CSR, n x n),
  plus ``name``, ``params`` and ``causal``. ``S_i`` of the merged pattern is the
  union of the heads' rows.
* **causal**: every entry has ``j <= i``; bidirectional variants drop that.
* **strided(l)**: ``A1_i = {max(0, i-l) .. i}`` (l + 1 positions, as in the
  paper; ``window="reference"`` keeps l, as OpenAI's code does) and
  ``A2_i = {j <= i : (i - j) mod l == 0}``.
* **fixed(l, c)**: ``A1_i = {j <= i : floor(j/l) == floor(i/l)}`` and
  ``A2_i = {j <= i : j mod l in [l-c, l)}``; summary head h uses
  ``[l-(h+1)c, l-hc)``.
* Randomness (BigBird) comes only from a ``seed`` argument.
* Block layouts are ``bool (H, nb, nb)`` with ``nb = ceil(n / block)``; token ->
  block is max-pooling, block -> token the Kronecker expansion. A block is
  *full* when every token pair in it is set, *partial* otherwise.

Reference: R. Child, S. Gray, A. Radford, I. Sutskever, "Generating Long
Sequences with Sparse Transformers", arXiv:1904.10509, 2019.

Examples
--------
>>> import sparse_patterns as sps
>>> pat = sps.make("strided", 16, stride=4)
>>> pat
Pattern(strided(stride=4, window='paper', causal=True), n=16, heads=2, causal=True)

Subpackages load on first use: ``sps.analysis``, ``sps.kernels``, ``sps.export``,
``sps.render``, ``sps.profiling``, ``sps.torch``.

>>> sps.export.to_block_layout(pat, 4).shape
torch.Size([2, 4, 4])
"""

from __future__ import annotations

import importlib
from typing import Any

from .pattern import MODES, BlockLayout, Mode, Pattern, PatternRule
from .patterns import REGISTRY, make
from .patterns.axial import axial2d
from .patterns.bigbird import bigbird
from .patterns.factorized import factorized
from .patterns.fixed import fixed
from .patterns.full import full
from .patterns.local import dilated, local, local2d
from .patterns.longformer import longformer
from .patterns.strided import strided

__version__ = "0.1.0"

# Heavier pieces (numba kernels, torch, matplotlib) load on first use.
_LAZY = {
    "verify": "sparse_patterns.analysis",
    "explain": "sparse_patterns.analysis",
    "scaling": "sparse_patterns.analysis",
    "VerifyReport": "sparse_patterns.analysis",
    "attention": "sparse_patterns.kernels",
    "plan": "sparse_patterns.kernels",
    "profile": "sparse_patterns.profiling",
    "save": "sparse_patterns.export",
    "load": "sparse_patterns.export",
}

#: Subpackages, imported on first attribute access (``sps.export.save``, ``sps.render``).
_SUBPACKAGES = ("analysis", "kernels", "export", "render", "profiling", "testing", "torch")

__all__ = [
    "Pattern", "BlockLayout", "PatternRule", "Mode", "MODES", "REGISTRY", "make",
    "full", "strided", "fixed", "local", "dilated", "local2d", "axial2d", "factorized",
    "longformer", "bigbird", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'sparse_patterns' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
