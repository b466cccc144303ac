"""Torch integration: :class:`SparseAttention`, an ``nn.Module`` that trains on the CPU.

The module runs its backend's forward (saving the log-sum-exp) and backward
(gradients by recomputation, no ``n x n`` storage) inside a
``torch.autograd.Function``. A backend that torch autograd differentiates
(``Backend.autograd``: ``"torch"``, the plan's pieces on PyTorch's attention
kernels with their own backwards; ``"flex"``) bypasses that function. ``impl="auto"``
(the default) picks the backend by the tensors' device when called: ``"torch"`` on
CUDA, ``"numba"`` on the CPU.

Its backward is itself differentiable, exactly: under ``create_graph=True`` (a
gradient penalty, a Hessian-vector product) the gradients are recomputed with
torch operations on the pattern's attended pairs only (gathers and
``index_add``, never an ``n x n`` array), and autograd differentiates those.
That path holds ``O(B * nnz * d)`` tensors; their bytes are estimated first and
refused above :func:`sparse_patterns.config.get_memory_limit`. This module
imports torch; ``import sparse_patterns`` does not import it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from . import config
from .kernels import attention, attention_backward, backend_names, get_backend, plan
from .kernels.backend import choose
from .kernels.exact_rows import nonfinite_rows
from .pattern import Pattern

__all__ = ["SparseAttention", "sparse_attention", "check_impl"]


def check_impl(impl: Any) -> str:
    """The name of ``impl`` if it can train (a backward, or torch autograd); a one-line
    ``ValueError`` if not.

    Examples
    --------
    >>> check_impl("auto"), check_impl("numba")
    ('auto', 'numba')
    """
    name = getattr(impl, "value", impl)
    if name == "auto":
        return name
    valid = ["auto"]
    for k in backend_names():
        try:
            be = get_backend(k)
        except (ImportError, ValueError):
            continue
        if be.has_backward or be.autograd:
            valid.append(k)
    if not isinstance(name, str) or name not in valid:
        raise ValueError(
            f"impl: unknown implementation {impl!r}; valid (with a backward): {', '.join(valid)}"
        )
    get_backend(name).require()  # a library it needs: one line, when the module is made
    return name


def _pairs(pattern: Pattern, mode: str, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(rows, cols)`` int64 index tensors of every softmax group's attended pairs."""
    mats = [pattern.union()] if mode == "merged" else list(pattern.heads)
    out = []
    for m in mats:
        rows = np.repeat(np.arange(m.shape[0], dtype=np.int64), np.diff(m.indptr))
        out.append((torch.from_numpy(rows).to(device),
                    torch.from_numpy(m.indices.astype(np.int64)).to(device)))
    return out


def _graph_bytes(pattern: Pattern, mode: str, shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of :func:`_torch_attention` and the graph that differentiating it twice keeps.

    Per attention head and attended pair: the gathered ``q``, ``k`` and ``v`` rows,
    their products and the gradients of each (about 12 ``d``-vectors), a few
    scalars, and the int64 indices.
    """
    B, H, _, d = shape
    G = 1 if mode == "merged" else pattern.num_heads
    nnz = [pattern.nnz] if mode == "merged" else list(pattern.head_nnz)
    per_head = sum(nnz[h % G] for h in range(H))
    return B * per_head * (12 * d + 8) * itemsize + 16 * sum(nnz)


def _torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: Pattern,
                     mode: str, scale: float | None) -> torch.Tensor:
    """Sparse attention written in differentiable torch operations on the attended pairs only.

    Gradients of every order follow from autograd. The softmax is shifted by each
    row's largest score, detached: the shift cancels, so every derivative is exact.
    """
    B, H, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    pairs = _pairs(pattern, mode, q.device)
    outs = []
    for h in range(H):
        rows, cols = pairs[h % len(pairs)]
        s = (q[:, h, rows] * k[:, h, cols]).sum(-1) * scale  # (B, nnz)
        top = torch.full((B, n), -torch.inf, dtype=s.dtype, device=s.device)
        top = top.scatter_reduce(1, rows.expand(B, -1), s.detach(), "amax")
        e = torch.exp(s - top[:, rows])
        tot = torch.zeros((B, n), dtype=s.dtype, device=s.device).index_add(1, rows, e)
        p = e / tot[:, rows]
        o = torch.zeros((B, n, d), dtype=s.dtype, device=s.device)
        outs.append(o.index_add(1, rows, p[..., None] * v[:, h, cols]))
    return torch.stack(outs, 1)


def _differentiable_grads(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          grad_out: torch.Tensor) -> list[torch.Tensor | None]:
    """``(dq, dk, dv)`` as functions of ``q, k, v, grad_out`` that autograd can differentiate."""
    mode = ctx.plan.mode
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    itemsize = torch.empty((), dtype=compute).element_size()
    need = _graph_bytes(ctx.pattern, mode, tuple(q.shape), itemsize)
    limit = config.get_memory_limit()
    if need > limit:
        raise config.MemoryLimitError(
            f"create_graph: differentiating SparseAttention's backward recomputes attention "
            f"with torch operations on the pattern's attended pairs; at (B, H, n, d) = "
            f"{tuple(q.shape)} that needs {config.format_bytes(need)}, above the memory limit "
            f"of {config.format_bytes(limit)} (sparse_patterns.config.set_memory_limit)"
        )
    needs = ctx.needs_input_grad[:3]
    with torch.enable_grad():
        # one alias per argument: q, k and v may be one tensor, and each gets its own partial
        args = [t.view_as(t) if want else t.detach() for t, want in zip((q, k, v), needs, strict=True)]
        out = _torch_attention(*(a.to(compute) for a in args), ctx.pattern, mode, ctx.scale)
        wanted = [a for a, want in zip(args, needs, strict=True) if want]
        grads = iter(torch.autograd.grad(out.to(q.dtype), wanted, grad_out, create_graph=True,
                                         allow_unused=True))
    res = []
    for a, want in zip(args, needs, strict=True):
        g = next(grads) if want else None
        res.append(torch.zeros_like(a) if want and g is None else g)
    return res


class _SparseAttentionFunction(torch.autograd.Function):
    """Autograd bridge: forward saves ``(q, k, v, out, lse)``; backward recomputes.

    Without ``create_graph`` the backward runs the kernel's
    :func:`~sparse_patterns.kernels.attention_backward`; with it (grad mode on
    inside backward), :func:`_differentiable_grads`.
    """

    @staticmethod
    def forward(ctx, q, k, v, execution_plan, pattern, scale, impl):  # type: ignore[override]
        target = execution_plan if impl == "numba" else pattern
        out, lse = attention(q.detach(), k.detach(), v.detach(), target,
                             mode=execution_plan.mode, impl=impl, scale=scale,
                             return_lse=True, block=execution_plan.block)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.target, ctx.plan, ctx.scale, ctx.impl = target, execution_plan, scale, impl
        ctx.pattern = pattern
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: gradients that are differentiable
            dq, dk, dv = _differentiable_grads(ctx, q, k, v, grad_out)
            return dq, dk, dv, None, None, None, None
        dq, dk, dv = attention_backward(
            q.detach(), k.detach(), v.detach(), out, lse, grad_out.contiguous(), ctx.target,
            mode=ctx.plan.mode, impl=ctx.impl, scale=ctx.scale, block=ctx.plan.block,
        )
        return dq, dk, dv, None, None, None, None


@torch.compiler.disable(recursive=True)
def _run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: Pattern, mode: str,
         scale: float | None, impl: str, block: int | None) -> torch.Tensor:
    """The backend for these tensors (``impl``, or ``"auto"`` by their device), its plan at
    ``block`` or the backend's default there, and the differentiable call.

    ``torch.compile`` of a model holding :class:`SparseAttention` breaks its graph here
    and runs the call as it is: the kernels (NumPy and numba on the CPU; the plan's
    pieces, each on its own compiled kernel, on CUDA) are not traced."""
    be, pat, pl = choose(impl, {"q": q, "k": k, "v": v}, pattern, mode, block)
    if be.autograd:
        out = be.differentiable(q, k, v, pl, pattern=pat, scale=scale)
        if not nonfinite_rows(out.detach()).shape[0]:
            return out
        # a non-finite row, maybe one that a fused kernel's masked pairs spoilt (0 * NaN):
        # the backend's own graph would carry that into the gradients too, so this call
        # runs through attention() and attention_backward(), which recompute such rows
        # exactly (the common, finite case costs one sum of ``out``)
    # The kernels read C-contiguous arrays. A model's q, k, v are usually views (heads
    # permuted out of one projection); made contiguous here, in the graph, the function
    # saves the copies its forward read, and its backward does not copy them again.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return _SparseAttentionFunction.apply(q, k, v, pl, pattern, scale, be.name)


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: Pattern, *,
                     mode: str = "multihead", scale: float | None = None, impl: str = "auto",
                     block: int | None = None) -> torch.Tensor:
    """Differentiable sparse attention on ``(B, H, n, d)`` tensors.

    Parameters and conventions as :func:`sparse_patterns.kernels.attention`;
    gradients flow to ``q``, ``k`` and ``v``. ``block`` defaults to the backend's
    tile size on the tensors' device (32 on the CPU, 128 on CUDA).

    Examples
    --------
    >>> import torch, sparse_patterns as sps
    >>> x = torch.randn(1, 2, 16, 8, dtype=torch.float64, requires_grad=True)
    >>> y = sparse_attention(x, x, x, sps.make("strided", 16, stride=4))
    >>> y.sum().backward()
    >>> x.grad.shape
    torch.Size([1, 2, 16, 8])
    """
    return _run(q, k, v, pattern, mode, scale, check_impl(impl), block)


class SparseAttention(torch.nn.Module):
    """Attention restricted to a sparse pattern, as a module (no parameters).

    ``forward(q, k, v)`` takes ``(B, H, n, d)`` tensors with ``n == pattern.n``.
    The execution plan is built once, when the module is made.

    Parameters
    ----------
    pattern : Pattern
        The token pattern.
    mode : {"multihead", "merged"}
        ``multihead``: head ``h`` uses pattern head ``h % p``; ``merged``: the union.
    scale : float, optional
        Score scale, ``1 / sqrt(d)`` by default.
    impl : str
        ``"auto"`` (default: by the tensors' device when called, ``"torch"`` on
        CUDA and ``"numba"`` on the CPU), or a backend that can train
        (:func:`sparse_patterns.kernels.backend_names`: ``"numba"``, ``"torch"``,
        ``"flex"``, ``"cuda"``, ``"reference"``); checked here, when the module is made.
    block : int, optional
        Tile size of the plan; default the backend's on the tensors' device (32 on
        the CPU, 128 on CUDA).

    Raises
    ------
    ValueError
        An unknown ``impl`` (the message lists the valid ones), ``mode`` or ``block``.

    Notes
    -----
    Second derivatives are exact: under ``create_graph=True`` the backward is
    recomputed with differentiable torch operations on the attended pairs (see
    the module docstring), refused with a ``MemoryLimitError`` when it would
    pass the memory limit.

    Examples
    --------
    >>> import torch, sparse_patterns as sps
    >>> attn = SparseAttention(sps.make("fixed", 16, stride=4, c=1), mode="merged")
    >>> q = torch.randn(2, 4, 16, 8, requires_grad=True)
    >>> attn(q, q, q).shape
    torch.Size([2, 4, 16, 8])
    """

    def __init__(self, pattern: Pattern, *, mode: str = "multihead",
                 scale: float | None = None, impl: str = "auto",
                 block: int | None = None) -> None:
        super().__init__()
        self.impl = check_impl(impl)
        be = get_backend("numba" if self.impl == "auto" else self.impl)
        # checks pattern, block and mode; the plan of the backend's first device
        self.plan = plan(pattern, block=be.default_block(be.devices[0]) if block is None
                         else block, mode=mode)
        self.block = block
        self.pattern = pattern
        self.mode = self.plan.mode
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        block = self.plan.block if self.block is None and q.device.type == "cpu" else self.block
        return _run(q, k, v, self.pattern, self.mode, self.scale, self.impl, block)

    def extra_repr(self) -> str:
        return f"{self.pattern!r}, mode={self.mode!r}, impl={self.impl!r}"
