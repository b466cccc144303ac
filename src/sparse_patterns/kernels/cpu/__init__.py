"""The CPU kernel (``impl="numba"``): fused sparse attention over an ExecutionPlan.

:func:`forward` and :func:`backward` take C-contiguous float32 or float64
``(B, H, n, d)`` arrays that :func:`sparse_patterns.kernels.attention` has
validated, and a plan (:func:`forward_bf16` and :func:`backward_bf16` the words of
bf16 ones, on bf16 products, where :func:`amx_applies` or :func:`bf16_applies`); their
outputs come from a per-thread pool of recycled arrays (:func:`release_workspace` frees
it). Nothing of size ``n x n`` is ever allocated.
Its backend object (``impl="numba"``) is :data:`.backend.BACKEND`.
The implementation modules are private; each one's docstring says what its code does
and why, and ``docs/kernel-notes.md`` holds the measurements behind those choices:

- ``_forward``: the forward, one online softmax per token across the pieces of its
  softmax group (``_forward_piece``: the work items; ``_forward_pair``: two pieces
  block by block); ``_forward_block``: one query block (``_qblock``);
- ``_softmax``: the forward's online-softmax loops on score tiles of any size (its
  general path: float64, tiles other than 32 tokens);
- ``_backward``: the backward, recomputed from the saved log-sum-exp
  (``_backward_head``: one head; ``_backward``: the heads in parallel);
  ``_backward_block``: one key block of its fused path (``_kblock32``);
  ``_backward_blas``: its general path (BLAS per chunk: float64, other tiles);
- ``_bf16``: when bf16 inputs run on bf16 products (:func:`amx_applies`,
  :func:`bf16_applies`);
- ``_amx``: Intel AMX (the tiles' permission, their configuration and instructions),
  the bf16 products of the forward and the backward where the CPU has it;
- ``_rows``: whole-array row moves (a piece's order, bf16 rows by pairs);
- ``_schedule``: what both derive from the plan once per plan (block steps,
  ``residue(s)`` pieces, work items and their copy orders, transposed masks);
- ``_llvm``: vector primitives written in LLVM IR (row copies and pairs, 16 x 16
  transposes, the float32 exponential, bf16 products and conversions);
- ``_llvm_fwd``: the forward's fused 32-token passes (scores with masks and max,
  exponentials, ``P V``), float32 and bf16 (``vdpbf16ps`` or AMX);
- ``_llvm_bwd``: the backward's fused float32 32-token passes (S and dP with the
  probabilities and dS in registers, dV and dK, dQ), no BLAS call per tile;
- ``_convert``: bf16 and fp16 words widened to float32 and narrowed back;
- ``_peak``: the machine's measured FMA peak (:func:`fma_peak`);
- ``_blas``: BLAS ``?gemm`` from ``@njit`` code, :func:`single_threaded_blas`,
  numba's thread count per call;
- ``_pool``: work buffers on cache lines and the per-thread pool of outputs.

The ``@njit(cache=True)`` functions call each other across these modules (numba
links a callee's LLVM IR into its caller, and LLVM optimizes them together), but
numba invalidates a cached function only when its own file changes: after editing
``_llvm.py``, ``_amx.py``, ``_llvm_fwd.py``, ``_llvm_bwd.py``, ``_rows.py``, ``_softmax.py``,
``_blas.py``, ``_pool.py`` or ``_schedule.py``, delete this package's
``__pycache__/*.nbi`` and ``*.nbc`` files, or the callers keep the old code.
"""

from __future__ import annotations

from ._backward import backward, backward_bf16
from ._bf16 import (
    BF16_MODES,
    amx_applies,
    amx_products_here,
    bf16_applies,
    bf16_products_here,
)
from ._blas import single_threaded_blas
from ._convert import HALF_KINDS, narrow, widen
from ._forward import forward, forward_bf16
from ._peak import fma_peak
from ._pool import _buffer as pooled_array
from ._pool import release_workspace

__all__ = ["forward", "forward_bf16", "amx_applies", "amx_products_here", "bf16_applies",
           "bf16_products_here",
           "BF16_MODES", "backward", "backward_bf16",
           "release_workspace", "single_threaded_blas", "fma_peak", "HALF_KINDS", "narrow", "widen",
           "pooled_array"]
