"""Torch integration: :class:`SparseAttention`, an ``nn.Module`` that trains on the CPU.

The module runs :func:`sparse_patterns.kernels.attention` (forward, saving the
log-sum-exp) and :func:`sparse_patterns.kernels.attention_backward` (gradients by
recomputation, no ``n x n`` storage) inside a ``torch.autograd.Function``. This
module imports torch; ``import sparse_patterns`` does not import it.
"""

from __future__ import annotations

import torch

from .kernels import BLOCK, attention, attention_backward, plan
from .pattern import Pattern

__all__ = ["SparseAttention", "sparse_attention"]


class _SparseAttentionFunction(torch.autograd.Function):
    """Autograd bridge: forward saves ``(q, k, v, out, lse)``; backward recomputes."""

    @staticmethod
    def forward(ctx, q, k, v, execution_plan, pattern, scale, impl):  # type: ignore[override]
        target = execution_plan if impl == "numba" else pattern
        out, lse = attention(q.detach(), k.detach(), v.detach(), target,
                             mode=execution_plan.mode, impl=impl, scale=scale,
                             return_lse=True, block=execution_plan.block)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.target, ctx.plan, ctx.scale, ctx.impl = target, execution_plan, scale, impl
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(
            q.detach(), k.detach(), v.detach(), out, lse, grad_out.contiguous(), ctx.target,
            mode=ctx.plan.mode, impl=ctx.impl, scale=ctx.scale, block=ctx.plan.block,
        )
        return dq, dk, dv, None, None, None, None


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: Pattern, *,
                     mode: str = "multihead", scale: float | None = None, impl: str = "numba",
                     block: int = BLOCK) -> torch.Tensor:
    """Differentiable sparse attention on ``(B, H, n, d)`` tensors.

    Parameters and conventions as :func:`sparse_patterns.kernels.attention`;
    gradients flow to ``q``, ``k`` and ``v``.

    Examples
    --------
    >>> import torch, sparse_patterns as sps
    >>> x = torch.randn(1, 2, 16, 8, dtype=torch.float64, requires_grad=True)
    >>> y = sparse_attention(x, x, x, sps.make("strided", 16, stride=4))
    >>> y.sum().backward()
    >>> x.grad.shape
    torch.Size([1, 2, 16, 8])
    """
    pl = plan(pattern, block=block, mode=mode)
    return _SparseAttentionFunction.apply(q, k, v, pl, pattern, scale, impl)


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
        ``"numba"`` (default) or another key of
        :data:`sparse_patterns.kernels.BACKWARD_IMPLS`.
    block : int
        Tile size of the plan.

    Examples
    --------
    >>> import torch, sparse_patterns as sps
    >>> attn = SparseAttention(sps.make("fixed", 16, stride=4, c=1), mode="merged")
    >>> q = torch.randn(2, 4, 16, 8, requires_grad=True)
    >>> attn(q, q, q).shape
    torch.Size([2, 4, 16, 8])
    """

    def __init__(self, pattern: Pattern, *, mode: str = "multihead",
                 scale: float | None = None, impl: str = "numba", block: int = BLOCK) -> None:
        super().__init__()
        self.plan = plan(pattern, block=block, mode=mode)  # checks pattern, block and mode
        self.pattern = pattern
        self.mode = self.plan.mode
        self.scale = scale
        self.impl = impl

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _SparseAttentionFunction.apply(q, k, v, self.plan, self.pattern, self.scale,
                                              self.impl)

    def extra_repr(self) -> str:
        return f"{self.pattern!r}, mode={self.mode!r}, impl={self.impl!r}"
