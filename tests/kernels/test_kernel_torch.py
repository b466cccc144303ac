"""SparseAttention: gradcheck, gradients vs autograd through dense masked SDPA, training."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sparse_patterns as sps  # noqa: E402
from sparse_patterns.testing import attention_masks  # noqa: E402
from sparse_patterns.torch import SparseAttention, sparse_attention  # noqa: E402


def dense_sdpa(q, k, v, pattern, mode):
    mask = torch.from_numpy(np.ascontiguousarray(attention_masks(pattern, mode, q.shape[1])))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
def test_gradcheck_fp64(mode):
    pat = sps.make("strided", 12, stride=3)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 12, 4, dtype=torch.float64, generator=g, requires_grad=True)
               for _ in range(3))
    attn = SparseAttention(pat, mode=mode, block=4)
    assert torch.autograd.gradcheck(attn, (q, k, v), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_gradients_match_dense_masked_sdpa(mode, dtype, tol):
    pat = sps.make("fixed", 40, stride=8, c=2)
    g = torch.Generator().manual_seed(1)
    base = [torch.randn(2, 3, 40, 8, dtype=dtype, generator=g) for _ in range(3)]
    grad_out = torch.randn(2, 3, 40, 8, dtype=dtype, generator=g)
    ours = [t.clone().requires_grad_() for t in base]
    theirs = [t.clone().requires_grad_() for t in base]
    out = SparseAttention(pat, mode=mode, block=16)(*ours)
    ref = dense_sdpa(*theirs, pat, mode)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    out.backward(grad_out)
    ref.backward(grad_out)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol)


def test_reference_impl_through_autograd():
    pat = sps.make("strided", 16, stride=4)
    q = torch.randn(1, 2, 16, 4, dtype=torch.float64, requires_grad=True)
    a = sparse_attention(q, q, q, pat, impl="reference", block=4)
    b = sparse_attention(q, q, q, pat, impl="numba", block=4)
    torch.testing.assert_close(a, b)
    (ga,) = torch.autograd.grad(a.sum(), q)
    (gb,) = torch.autograd.grad(b.sum(), q)
    torch.testing.assert_close(ga, gb)


def test_module_trains():
    torch.manual_seed(0)
    pat = sps.make("strided", 32, stride=4)
    proj = torch.nn.Linear(8, 3 * 8)
    attn = SparseAttention(pat, mode="merged", block=8)
    x = torch.randn(4, 32, 8)
    target = torch.roll(x, 1, dims=1)
    opt = torch.optim.Adam(proj.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        q, k, v = proj(x).view(4, 32, 3, 1, 8).permute(2, 0, 3, 1, 4)
        out = attn(q, k, v)[:, 0]
        loss = torch.nn.functional.mse_loss(out, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert "mode='merged'" in repr(attn)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients(dtype):
    pat = sps.make("strided", 16, stride=4)
    q = torch.randn(1, 2, 16, 8, dtype=dtype, requires_grad=True)
    out = SparseAttention(pat, block=4)(q, q, q)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert q.grad.dtype == dtype and torch.isfinite(q.grad).all()


def test_nan_query_gives_nan_row_like_torch():
    pat = sps.make("strided", 16, stride=4)
    q, k, v = (torch.randn(1, 1, 16, 4) for _ in range(3))
    q[0, 0, 7, 2] = float("nan")
    ours = SparseAttention(pat, block=4)(q, k, v)
    ref = dense_sdpa(q, k, v, pat, "multihead")
    assert torch.equal(torch.isnan(ours).any(-1), torch.isnan(ref).any(-1))


def test_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        SparseAttention(sps.make("full", 8), mode="both")
