"""Fused sparse attention that executes a pattern's :class:`ExecutionPlan`.

:func:`plan` cuts a pattern into block-compact pieces; :func:`attention` runs
them on a backend (:mod:`sparse_patterns.kernels.backend`: one interface, each
backend imported on first use): ``"numba"`` (the CPU kernels of
:mod:`sparse_patterns.kernels.cpu`), ``"torch"`` (each piece on PyTorch's own
attention kernels, :mod:`sparse_patterns.kernels.torch_path`: the GPU path),
``"flex"`` (every piece through FlexAttention), ``"cuda"`` (numba-cuda, the portable
reference GPU kernel) or ``"reference"`` (the dense float64 oracle, small ``n``).
``impl="auto"``, the default, takes ``"torch"`` for CUDA tensors and ``"numba"`` on
the CPU, and the tile size follows the device (32 on the CPU, 128 on CUDA). The
inputs are described and the plan built once per call; the backend validates its
arrays and runs. :func:`attention_backward` gives ``(dq, dk, dv)`` by recomputation
from the forward's log-sum-exp; :class:`sparse_patterns.torch.SparseAttention`
wraps both in an autograd function.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from ..pattern import Pattern
from ..util.checks import check_bool
from .backend import AUTO, Backend, Inputs, choose
from .backend import get as get_backend
from .backend import names as backend_names
from .backend import register as register_backend
from .exact_rows import repair_backward, repair_forward
from .planning import BLOCK, MODES, ExecutionPlan, clear_plan_cache, plan

__all__ = [
    "BLOCK",
    "ExecutionPlan", "plan", "MODES", "clear_plan_cache", "Impl", "Backend", "Inputs", "AUTO",
    "get_backend", "backend_names", "register_backend", "attention", "attention_backward",
]


class Impl(str, Enum):
    """Names of the built-in backends, and ``"auto"``."""

    AUTO = "auto"
    NUMBA = "numba"
    TORCH = "torch"
    FLEX = "flex"
    CUDA = "cuda"
    REFERENCE = "reference"


# ----------------------------------------------------------------------- public
def attention(
    q: Any, k: Any, v: Any, pattern: Pattern | ExecutionPlan, *, mode: str = "multihead",
    impl: str | Impl = "auto", scale: float | None = None, return_lse: bool = False,
    block: int | None = None,
) -> Any:
    """Sparse attention of ``pattern``: softmax over the attended keys of each query.

    ``out[b, h, i] = sum_j softmax_j(scale * q[b,h,i] . k[b,h,j]) v[b,h,j]`` over
    the ``j`` that query ``i`` attends in the softmax group of head ``h``.

    Parameters
    ----------
    q, k, v : numpy.ndarray or torch.Tensor, shape (B, H, n, d)
        One kind and one dtype: float16, bfloat16 (torch), float32 or float64.
        float16 and bfloat16 are widened to float32 in one pass and computed in
        float32 (products and softmax statistics), the output rounded to the input's
        dtype (ties to even). Where :func:`~sparse_patterns.kernels.cpu.amx_applies`
        (a CPU with AMX-BF16) or :func:`~sparse_patterns.kernels.cpu.bf16_applies` (a
        CPU whose ``vdpbf16ps`` peak is at least 1.3x its float32 FMA peak; both at
        32-token tiles, ``n`` and ``d`` multiples of 32; ``SPARSE_PATTERNS_BF16``
        overrides), bfloat16 runs on bf16 products instead (AMX tiles or
        ``vdpbf16ps``, exact bf16 products summed in float32): float32 softmax
        statistics and sums, the probabilities rounded to bf16 before ``P V``.
        Accuracy against the float64 oracle on the same input values, per element:
        float64 exact to rounding; float32 within ~1e-6 relative; bfloat16 and
        float16 within half an ulp of their dtype (2**-8, 2**-11 relative) plus 1e-5
        of the largest output, and on bf16 products also within 2**-8 of
        ``sum_j P_ij |v_j|`` (the rounding of ``P``) and, where the pieces of a
        ``merged`` pattern hand a partial output on through memory (strided's
        residue classes to its window), 2**-8 of that part's ``sum_j P_ij |v_j|``
        (rounded to bf16 once; ``tests/kernels/cpu/test_half.py``). Torch
        tensors must be on the CPU for ``"numba"`` and ``"reference"``; gradients are
        not tracked (use :class:`sparse_patterns.torch.SparseAttention`).
    pattern : Pattern or ExecutionPlan
        The token pattern (its plan is built once and cached), or a plan.
    mode : {"multihead", "merged"}
        ``multihead``: attention head ``h`` uses pattern head ``h % p``, each
        with its own softmax; ``merged``: every head uses the union of the heads.
    impl : str or Impl
        ``"auto"`` (default: ``"torch"`` for CUDA tensors, ``"numba"`` on the CPU; the
        error lists every candidate's reasons when none can run), ``"numba"`` (CPU
        kernel), ``"torch"`` (the plan's pieces on PyTorch's attention kernels, the
        GPU path), ``"flex"`` (FlexAttention per piece; on CUDA ``block`` a multiple
        of 128), ``"cuda"`` (numba-cuda), ``"reference"`` (dense oracle, small ``n``),
        or a name given to :func:`register_backend`.
    scale : float, optional
        Score scale, ``1 / sqrt(d)`` by default.
    return_lse : bool
        Also return the log-sum-exp of each row's scaled scores.
    block : int, optional
        Tile size of the plan, in ``[1, 4096]``; default the backend's on the
        inputs' device (:data:`BLOCK`, 32, on the CPU; 128 on CUDA).

    Returns
    -------
    out : like ``q`` (same kind and dtype)
        A row with no keys (only possible in a user-supplied pattern) is 0.
    lse : ``(B, H, n)``, only with ``return_lse``
        Natural log, in the compute dtype (float32, or float64 for float64
        inputs); ``-inf`` for a row with no keys.

    Raises
    ------
    ValueError
        Shapes that disagree (``q``, ``k``, ``v``, ``n`` vs the pattern), an
        unsupported dtype, mixed array kinds or devices, an unknown ``impl`` (the
        message lists the valid ones) or ``mode``, ``"auto"`` with no backend that
        can run the inputs; for ``impl="reference"``, a
        :class:`~sparse_patterns.config.MemoryLimitError` (a ``ValueError``)
        when its dense ``(n, n)`` scores would pass the memory limit.

    Notes
    -----
    NaN and inf reach exactly the rows that attend them, in every backend (for
    NumPy arrays and torch tensors; numba-cuda device arrays of ``impl="cuda"``
    stay as its kernel wrote them), as in the dense reference: a row whose attended scores or values hold NaN or
    inf is not finite (NaN where IEEE arithmetic on its own pairs gives NaN), and
    every other row gets its finite value, also across document boundaries. A
    fused kernel multiplies the masked pairs of a partial tile too (``0 * NaN``
    is NaN), so after the backend one sum of ``out`` (and ``lse``) checks for
    non-finite values; only when there is one are the non-finite rows found and
    recomputed exactly from their own pairs
    (:mod:`~sparse_patterns.kernels.exact_rows`), in the compute dtype.
    :func:`attention_backward` does the same for ``dq``, ``dk`` and ``dv``.

    References
    ----------
    R. Child et al., "Generating Long Sequences with Sparse Transformers",
    arXiv:1904.10509, 2019.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 16, stride=4)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 8))
    >>> out = sps.attention(x, x, x, pat, mode="merged")
    >>> ref = sps.attention(x, x, x, pat, mode="merged", impl="reference")
    >>> out.shape, bool(np.allclose(out, ref, rtol=1e-10, atol=1e-12))
    ((1, 2, 16, 8), True)
    """
    return_lse = check_bool("return_lse", return_lse)
    be, pat, pl = choose(impl, {"q": q, "k": k, "v": v}, pattern, mode, block)
    res = be.forward(q, k, v, pl, pattern=pat, scale=scale, return_lse=return_lse)
    out, lse = res if return_lse else (res, None)
    # a fused kernel multiplies the masked pairs of a partial tile too (0 * NaN = NaN):
    # rows that are not finite are recomputed exactly from their own pairs
    repair_forward(q, k, v, pl, _scale(scale, q), out, lse)
    return res


def attention_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, pattern: Pattern | ExecutionPlan, *,
    mode: str = "multihead", impl: str | Impl = "auto", scale: float | None = None,
    block: int | None = None,
) -> tuple[Any, Any, Any]:
    """Gradients ``(dq, dk, dv)`` of :func:`attention`, recomputed from its log-sum-exp.

    Nothing of size ``n x n`` is stored: the probabilities of each tile are
    recomputed as ``exp(scale * q . k - lse)``.

    Parameters
    ----------
    q, k, v : (B, H, n, d)
        The forward's inputs.
    o, lse : (B, H, n, d) and (B, H, n)
        The forward's output and log-sum-exp (``return_lse=True``).
    do : (B, H, n, d)
        Gradient of the loss with respect to ``o``.
    pattern, mode, impl, scale, block
        As for :func:`attention` (a plan fixes ``mode`` and ``block``).

    Returns
    -------
    dq, dk, dv : like ``q``
        Rows with no keys get zero gradients. For bfloat16 and float16 inputs,
        computed in float32 and rounded: ``dv`` as accurate as the forward's
        output; ``dq`` and ``dk`` also carry the rounding of ``o`` (through
        ``rowsum(do * o)``): within 8 half-ulps (2**-5 for bfloat16, 2**-8 for
        float16) of their largest element. On bf16 products (as for
        :func:`attention`), ``P`` and ``dS`` are rounded to bf16 between the
        products: each gradient also within 2**-8 of the sum of absolute products it
        adds (``P^T |dO|``, ``scale |dS| |K|``, ``scale |dS|^T |Q|``;
        ``tests/kernels/cpu/test_half.py``).

    Raises
    ------
    ValueError
        As :func:`attention`; also when ``impl`` has no backward.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 16, stride=4)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 8))
    >>> o, lse = sps.attention(x, x, x, pat, return_lse=True)
    >>> dq, dk, dv = attention_backward(x, x, x, o, lse, np.ones_like(o), pat)
    >>> dq.shape
    (1, 2, 16, 8)
    """
    be, pat, pl = choose(impl, {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}, pattern,
                         mode, block, backward=True)
    dq, dk, dv = be.backward(q, k, v, o, lse, do, pl, pattern=pat, scale=scale)
    repair_backward(q, k, v, o, lse, do, pl, _scale(scale, q), dq, dk, dv)
    return dq, dk, dv


def _scale(scale: float | None, q: Any) -> float:
    """The score scale the backends used: ``1 / sqrt(d)`` by default."""
    return 1.0 / math.sqrt(int(q.shape[3])) if scale is None else float(scale)  # (B, H, n, d)
