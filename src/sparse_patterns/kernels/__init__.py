"""Fused sparse attention that executes a pattern's :class:`ExecutionPlan`.

:func:`plan` cuts a pattern into block-compact pieces; :func:`attention` runs
them with an implementation chosen by name: ``"numba"`` (the CPU kernel of
:mod:`sparse_patterns.kernels.cpu`), ``"reference"`` (the dense masked-softmax
oracle, for small ``n``), ``"cuda"`` (:mod:`sparse_patterns.kernels.cuda`) or
``"flex"`` (:mod:`sparse_patterns.kernels.flex`: each piece through torch's
FlexAttention in its block-compact order, merged by log-sum-exp), both imported on
first use. :data:`IMPLS` maps each name to its callable, so another
implementation can be registered (:func:`register_impl`). Each built-in entry
runs the one input check (``kernels._inputs``: pattern, mode and block to a
plan, the arrays, the scale) once, then hands validated arrays and the plan to
its backend, whose ``forward(q, k, v, plan, *, scale)`` and
``backward(q, k, v, o, lse, do, plan, *, scale)`` have one signature.
:func:`attention_backward` gives ``(dq, dk, dv)`` by recomputation from the
forward's log-sum-exp; :class:`sparse_patterns.torch.SparseAttention` wraps both
in an autograd function.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from .._validate import check_bool
from ..pattern import Pattern
from ._inputs import HostArrays, check_scale, resolve
from .planning import BLOCK, MODES, ExecutionPlan, clear_plan_cache, plan

__all__ = [
    "BLOCK",
    "ExecutionPlan", "plan", "MODES", "clear_plan_cache", "Impl", "IMPLS", "BACKWARD_IMPLS",
    "register_impl", "attention", "attention_backward",
]


class Impl(str, Enum):
    """Names of the built-in implementations (any key of :data:`IMPLS` is accepted)."""

    NUMBA = "numba"
    REFERENCE = "reference"
    CUDA = "cuda"
    FLEX = "flex"


# ----------------------------------------------------------------------- impls
# Each entry runs the one input check of ``_inputs`` (pattern, mode and block to a plan;
# the arrays; the scale) and hands validated arrays and the plan to its backend.
def _numba_forward(q, k, v, pattern, *, mode="multihead", scale=None, return_lse=False,
                   block=BLOCK):
    from . import cpu

    _, pl = resolve(pattern, mode, block)
    x = HostArrays({"q": q, "k": k, "v": v}, pl.n, widen_half=False)
    s = check_scale(scale, x.shape[3])
    d = x.shape[3]
    if x.dtype_name == "bfloat16" and (cpu.amx_applies(pl, d) or cpu.bf16_applies(pl, d)):
        w = x.words  # the output comes back as bf16 words, rounded as blocks finish
        o, lse = cpu.forward_bf16(w["q"], w["k"], w["v"], pl, scale=s, words=True)
        return (x.out_words(o), x.out(lse, lse=True)) if return_lse else x.out_words(o)
    else:
        a = x.widen()
        o, lse = cpu.forward(a["q"], a["k"], a["v"], pl, scale=s)
    return (x.out(o), x.out(lse, lse=True)) if return_lse else x.out(o)


def _reference_forward(q, k, v, pattern, *, mode="multihead", scale=None, return_lse=False,
                       block=BLOCK):
    from .reference import reference_forward

    pat, pl = resolve(pattern, mode, block, needs_pattern=Impl.REFERENCE.value)
    x = HostArrays({"q": q, "k": k, "v": v}, pl.n)
    a = x.np
    o, lse = reference_forward(a["q"], a["k"], a["v"], pat, pl,
                               scale=check_scale(scale, x.shape[3]))
    return (x.out(o), x.out(lse, lse=True)) if return_lse else x.out(o)


def _cuda_forward(q, k, v, pattern, *, mode="multihead", scale=None, return_lse=False,
                  block=BLOCK):
    from . import cuda  # checks the device arrays and the scale itself (``_inputs``)

    _, pl = resolve(pattern, mode, block, max_block=cuda.MAX_BLOCK)
    out, lse = cuda.forward(q, k, v, pl, scale=scale)
    return (out, lse) if return_lse else out


def _numba_backward(q, k, v, o, lse, do, pattern, *, mode="multihead", scale=None, block=BLOCK):
    from . import cpu

    _, pl = resolve(pattern, mode, block)
    x = HostArrays({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}, pl.n,
                   widen_half=False)
    s = check_scale(scale, x.shape[3])
    d = x.shape[3]
    if x.dtype_name == "bfloat16" and (cpu.amx_applies(pl, d) or cpu.bf16_applies(pl, d)):
        w = x.words  # the gradients come back as bf16 words, narrowed head by head
        return tuple(x.out_words(g) for g in cpu.backward_bf16(
            w["q"], w["k"], w["v"], w["o"], x.np["lse"], w["do"], pl, scale=s, words=True))
    a = x.widen()
    grads = cpu.backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], pl, scale=s)
    return tuple(x.out(g) for g in grads)


def _reference_backward(q, k, v, o, lse, do, pattern, *, mode="multihead", scale=None,
                        block=BLOCK):
    from .reference import reference_backward

    pat, pl = resolve(pattern, mode, block, needs_pattern=Impl.REFERENCE.value)
    x = HostArrays({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}, pl.n)
    a = x.np
    grads = reference_backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], pat, pl,
                               scale=check_scale(scale, x.shape[3]))
    return tuple(x.out(g) for g in grads)


def _cuda_backward(q, k, v, o, lse, do, pattern, *, mode="multihead", scale=None, block=BLOCK):
    from . import cuda

    _, pl = resolve(pattern, mode, block, max_block=cuda.MAX_BLOCK)
    return cuda.backward(q, k, v, o, lse, do, pl, scale=scale)


def _flex_forward(q, k, v, pattern, **kw):
    from . import flex  # imports torch; a one-line ValueError without FlexAttention

    return flex.forward(q, k, v, pattern, **kw)


def _flex_backward(q, k, v, o, lse, do, pattern, **kw):
    from . import flex

    return flex.backward(q, k, v, o, lse, do, pattern, **kw)


#: Forward implementations: name -> ``fn(q, k, v, pattern, *, mode, scale, return_lse, block)``.
IMPLS: dict[str, Callable[..., Any]] = {
    Impl.NUMBA.value: _numba_forward,
    Impl.REFERENCE.value: _reference_forward,
    Impl.CUDA.value: _cuda_forward,
    Impl.FLEX.value: _flex_forward,
}

#: Backward implementations: name -> ``fn(q, k, v, o, lse, do, pattern, *, mode, scale, block)``.
BACKWARD_IMPLS: dict[str, Callable[..., Any]] = {
    Impl.NUMBA.value: _numba_backward,
    Impl.REFERENCE.value: _reference_backward,
    Impl.CUDA.value: _cuda_backward,
    Impl.FLEX.value: _flex_backward,
}


def register_impl(name: str, forward: Callable[..., Any],
                  backward: Callable[..., Any] | None = None) -> None:
    """Make ``impl=name`` available to :func:`attention` (and :func:`attention_backward`).

    Examples
    --------
    >>> register_impl("mine", IMPLS["reference"])
    >>> "mine" in IMPLS
    True
    >>> del IMPLS["mine"]
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    if not callable(forward):
        raise ValueError(f"forward: must be callable, got {type(forward).__name__}")
    IMPLS[name] = forward
    if backward is not None:
        BACKWARD_IMPLS[name] = backward


def _impl_name(impl: Any, table: dict[str, Any]) -> str:
    name = impl.value if isinstance(impl, Impl) else impl
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"impl: unknown implementation {impl!r}; valid: {', '.join(table)}")
    return name


# ----------------------------------------------------------------------- public
def attention(
    q: Any, k: Any, v: Any, pattern: Pattern | ExecutionPlan, *, mode: str = "multihead",
    impl: str | Impl = "numba", scale: float | None = None, return_lse: bool = False,
    block: int = BLOCK,
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
        (rounded to bf16 once; ``tests/test_half.py``). Torch
        tensors must be on the CPU for ``"numba"`` and ``"reference"``; gradients are
        not tracked (use :class:`sparse_patterns.torch.SparseAttention`).
    pattern : Pattern or ExecutionPlan
        The token pattern (its plan is built once and cached), or a plan.
    mode : {"multihead", "merged"}
        ``multihead``: attention head ``h`` uses pattern head ``h % p``, each
        with its own softmax; ``merged``: every head uses the union of the heads.
    impl : str or Impl
        A key of :data:`IMPLS`: ``"numba"`` (CPU kernel), ``"reference"`` (dense
        oracle, small ``n``), ``"cuda"``, ``"flex"`` (torch FlexAttention per
        piece; on CUDA ``block`` must be a multiple of 128), or a registered name.
    scale : float, optional
        Score scale, ``1 / sqrt(d)`` by default.
    return_lse : bool
        Also return the log-sum-exp of each row's scaled scores.
    block : int
        Tile size of the plan, in ``[1, 4096]``; default :data:`BLOCK` (32).

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
        unsupported dtype, mixed array kinds, an unknown ``impl`` (the message
        lists the valid ones) or ``mode``; for ``impl="reference"``, a
        :class:`~sparse_patterns.config.MemoryLimitError` (a ``ValueError``)
        when its dense ``(n, n)`` scores would pass the memory limit.

    Notes
    -----
    NaN or inf in the inputs propagate as in torch: a row whose scores or
    attended values hold NaN gets NaN. A fused kernel computes whole tiles, so a
    NaN key may also reach rows that share a tile with it without attending it
    (as in torch's fused kernels); the kernel never crashes. ``"reference"``
    is exact here too: a non-finite key or value reaches exactly the rows that
    attend it.

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
    name = _impl_name(impl, IMPLS)
    return_lse = check_bool("return_lse", return_lse)
    return IMPLS[name](q, k, v, pattern, mode=mode, scale=scale, return_lse=return_lse,
                       block=block)


def attention_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, pattern: Pattern | ExecutionPlan, *,
    mode: str = "multihead", impl: str | Impl = "numba", scale: float | None = None,
    block: int = BLOCK,
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
        ``tests/test_half.py``).

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
    name = _impl_name(impl, BACKWARD_IMPLS)
    return BACKWARD_IMPLS[name](q, k, v, o, lse, do, pattern, mode=mode, scale=scale,
                                block=block)
