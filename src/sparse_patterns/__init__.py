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
``sps.render``, ``sps.profiling``, ``sps.torch``, and ``sps.search(...)`` (a parameter
grid verified and planned on Dask; needs the ``search`` extra).

>>> sps.export.to_block_layout(pat, 4).shape
torch.Size([2, 4, 4])
"""

from __future__ import annotations

from .util.lazy import lazy_attributes
from .util.threads import choose as _choose_threading_layer
from .util.threads import settle as _settle_numba

__version__ = "0.1.0"

_settle_numba()  # numba's cache and thread settings decided now, not in a traceback later
_choose_threading_layer()  # numba's TBB layer where installed: fork- and thread-safe

#: Public names and the module each comes from, imported on first access, so that
#: ``import sparse_patterns`` (and the ``patterns`` command's ``--help``) loads
#: neither NumPy nor SciPy until a name is used.
_LAZY = {
    **dict.fromkeys(("Pattern", "BlockLayout", "PatternRule", "Mode", "MODES"),
                    "sparse_patterns.pattern"),
    **dict.fromkeys(("REGISTRY", "make"), "sparse_patterns.patterns"),
    "full": "sparse_patterns.patterns.full",
    "strided": "sparse_patterns.patterns.strided",
    "fixed": "sparse_patterns.patterns.fixed",
    **dict.fromkeys(("local", "dilated", "local2d"), "sparse_patterns.patterns.local"),
    "axial2d": "sparse_patterns.patterns.axial",
    "factorized": "sparse_patterns.patterns.factorized",
    "longformer": "sparse_patterns.patterns.longformer",
    "bigbird": "sparse_patterns.patterns.bigbird",
    "global_tokens": "sparse_patterns.patterns.global_tokens",
    **dict.fromkeys(("expression_recipe", "from_expression"), "sparse_patterns.algebra"),
    # heavier pieces (numba kernels, torch, matplotlib)
    **dict.fromkeys(("verify", "verify_schedule", "explain", "scaling", "VerifyReport"),
                    "sparse_patterns.analysis"),
    **dict.fromkeys(("attention", "plan"), "sparse_patterns.kernels"),
    "profile": "sparse_patterns.profiling",
    **dict.fromkeys(("save", "load"), "sparse_patterns.export"),
    # ``sps.search`` is the subpackage, itself callable (a name here would be rebound
    # to the module by its first import)
    "SearchResult": "sparse_patterns.search",
}

#: Subpackages, imported on first attribute access (``sps.export.save``, ``sps.render``).
_SUBPACKAGES = ("analysis", "kernels", "export", "render", "profiling", "testing", "torch",
                "search")
#: Modules that resolve as attributes too (``sps.config.set_memory_limit``).
_MODULES = ("config", "layout", "pattern", "patterns", "algebra")

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, (*_SUBPACKAGES, *_MODULES))
