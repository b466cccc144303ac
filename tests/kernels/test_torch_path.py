"""``impl="torch"``: each piece of a plan on PyTorch's kernels, merged by log-sum-exp.

Against independent references: the dense float64 oracle (``kernels.reference``)
for outputs and log-sum-exp, and its backward for the gradients, on every piece
kind (residue classes as batched causal SDPA, with and without the merged offset
``t0``; FlexAttention with a formula or the bit table), for strided, fixed, local,
bigbird, packed documents, an algebra expression and a user pattern with a row
that has no key; ``n`` not a multiple of the stride or of the block. Runs on the
CPU (SDPA's CPU flash kernel, eager FlexAttention), where the GPU path's logic is
the same.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.nn.attention.flex_attention")

import sparse_patterns as sps  # noqa: E402
from sparse_patterns import Pattern  # noqa: E402
from sparse_patterns.algebra import combine  # noqa: E402
from sparse_patterns.kernels import attention, attention_backward, plan  # noqa: E402
from sparse_patterns.kernels.reference import reference_backward, reference_forward  # noqa: E402
from sparse_patterns.kernels.torch_path import Classes, piece_shapes, plan_attention  # noqa: E402
from sparse_patterns.torch import SparseAttention, sparse_attention  # noqa: E402


def _no_key_row(n: int) -> Pattern:
    rng = np.random.default_rng(3)
    a = np.tril(rng.random((2, n, n)) < 0.3)
    a[0, 5] = False
    a[1, 5] = False
    return Pattern.from_dense(a, name="user")


CASES = {
    # id: (pattern, mode, block, residue pieces expected on SDPA)
    "strided-merged": (sps.make("strided", 30, stride=4), "merged", 8, 1),
    "strided-merged-ref-window": (sps.make("strided", 29, stride=5, window="reference"),
                                  "merged", 8, 1),
    "strided-multihead": (sps.make("strided", 27, stride=5), "multihead", 16, 1),
    "strided-n-below-stride": (sps.make("strided", 6, stride=8), "multihead", 4, 1),
    "dilated-classes": (sps.make("dilated", 26, window=40, dilation=3), "multihead", 8, 1),
    "fixed-merged": (sps.make("fixed", 36, stride=8, c=2), "merged", 8, 0),
    "local": (sps.make("local", 28, window=5), "multihead", 8, 0),
    "bigbird": (sps.make("bigbird", 32, block=4, window_blocks=1, global_blocks=1, random_blocks=1, seed=0),
                "merged", 8, 0),
    "documents": (sps.make("strided", 30, stride=4, documents=[13, 17]), "merged", 8, 0),
    "expression": (combine("+", sps.make("local", 24, window=2),
                           sps.make("strided", 24, stride=5)), "multihead", 8, 0),
    "user-no-key-row": (_no_key_row(20), "merged", 8, 0),
}


def _inputs(shape, seed, dtype=torch.float64, count=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(count)]


@pytest.mark.parametrize("case", list(CASES))
def test_output_lse_and_gradients_equal_the_float64_oracle(case):
    pat, mode, block, sdpa = CASES[case]
    pl = plan(pat, block=block, mode=mode)
    assert sum(isinstance(s, Classes) for s in piece_shapes(pl, pat)) == sdpa
    q, k, v = (t.requires_grad_(True) for t in _inputs((2, 3, pat.n, 8), seed=len(case)))
    out, lse = plan_attention(q, k, v, pl, pattern=pat, scale=0.4, return_lse=True)
    a = [t.detach().numpy() for t in (q, k, v)]
    want_o, want_l = reference_forward(*a, pat, pl, scale=0.4)
    np.testing.assert_allclose(out.detach().numpy(), want_o, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse.numpy()), np.isinf(want_l))
    fin = np.isfinite(want_l)
    np.testing.assert_allclose(lse.numpy()[fin], want_l[fin], atol=1e-12)
    do = _inputs(out.shape, seed=99, count=1)[0]
    out.backward(do)
    want = reference_backward(*a, want_o, want_l, do.numpy(), pat, pl, scale=0.4)
    for t, w in zip((q, k, v), want, strict=True):
        np.testing.assert_allclose(t.grad.numpy(), w, atol=1e-11)


def test_without_the_pattern_every_piece_runs_on_flex_and_agrees():
    pat = sps.make("strided", 30, stride=4)
    pl = plan(pat, block=8, mode="merged")
    q, k, v = _inputs((1, 2, 30, 8), seed=5)
    assert piece_shapes(pl, None) == [None, None]
    np.testing.assert_allclose(plan_attention(q, k, v, pl), plan_attention(q, k, v, pl,
                               pattern=pat), atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_low_precision_against_the_oracle_on_the_rounded_inputs(dtype, tol):
    pat = sps.make("strided", 64, stride=8)
    q, k, v = _inputs((1, 2, 64, 16), seed=7, dtype=dtype)
    out = attention(q, k, v, pat, mode="merged", impl="torch", block=16)
    assert out.dtype == dtype
    ref = attention(*(t.double() for t in (q, k, v)), pat, mode="merged", impl="reference")
    assert (out.double() - ref).abs().max().item() < tol


def test_numpy_in_numpy_out_and_the_backward_entry_point():
    pat = sps.make("fixed", 24, stride=8, c=2)
    q, k, v, do = (t.numpy() for t in _inputs((1, 2, 24, 4), seed=11, count=4))
    o, lse = attention(q, k, v, pat, mode="merged", impl="torch", block=8, return_lse=True)
    assert isinstance(o, np.ndarray)
    ro, rl = attention(q, k, v, pat, mode="merged", impl="reference", return_lse=True)
    np.testing.assert_allclose(o, ro, atol=1e-12)
    g = attention_backward(q, k, v, o, lse, do, pat, mode="merged", impl="torch", block=8)
    want = attention_backward(q, k, v, ro, rl, do, pat, mode="merged", impl="reference")
    for a, b in zip(g, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-11)


def test_sparse_attention_and_the_module_train_through_it():
    pat = sps.make("strided", 32, stride=4)
    q = torch.randn(1, 2, 32, 8, dtype=torch.float64, requires_grad=True)
    y = sparse_attention(q, q, q, pat, mode="merged", impl="torch", block=8)
    y.square().sum().backward()
    g1 = q.grad.clone()
    q.grad = None
    z = SparseAttention(pat, mode="merged", impl="reference")(q, q, q)
    z.square().sum().backward()
    np.testing.assert_allclose(g1, q.grad, atol=1e-10)


def test_bad_inputs_name_the_argument():
    pat = sps.make("strided", 16, stride=4)
    x = torch.zeros(1, 1, 16, 8)
    with pytest.raises(ValueError, match="^k: dtype"):
        attention(x, x.double(), x, pat, impl="torch")
    with pytest.raises(ValueError, match="^q: sequence length"):
        attention(x[:, :, :8], x[:, :, :8], x[:, :, :8], pat, impl="torch")
    with pytest.raises(ValueError, match="^q, k, v: mix"):
        attention(x, x.numpy(), x, pat, impl="torch")


def test_tensors_on_two_devices_are_refused_in_one_line():
    pat = sps.make("strided", 16, stride=4)
    x = torch.zeros(1, 1, 16, 8)
    with pytest.raises(ValueError, match=r"^k: on meta, q on cpu; put q, k, v"):
        attention(x, x.to("meta"), x, pat)


def test_the_gpu_reasons_name_the_argument_and_the_allowed_values():
    from sparse_patterns.kernels import get_backend
    from sparse_patterns.kernels.backend import Inputs

    be = get_backend("torch")
    pl = plan(sps.make("strided", 256, stride=16), block=64, mode="merged")
    why = be.reasons(Inputs("torch", "cuda", "float64", (1, 8, 256, 70)), pl)
    assert any(r.startswith("q: dtype float64 on CUDA") for r in why)
    assert any(r.startswith("q: head dimension 70") and "multiples of 8 up to 256" in r
               for r in why)
    assert any(r.startswith("block: 64") and "multiples of 128" in r for r in why)
    assert be.reasons(Inputs("torch", "cuda", "bfloat16", (1, 8, 256, 64)),
                      plan(sps.make("strided", 256, stride=16), block=128)) == []
    assert be.default_block("cuda") == 128 and get_backend("numba").default_block("cpu") == 32


def test_auto_takes_numba_on_the_cpu_and_lists_every_reason_when_nothing_runs():
    from sparse_patterns.kernels import cuda
    from sparse_patterns.kernels.backend import choose

    pat = sps.make("strided", 16, stride=4)
    be, _, pl = choose("auto", {"q": torch.zeros(1, 1, 16, 8)}, pat, "merged", None)
    assert (be.name, pl.block) == ("numba", 32)

    class DeviceArray:  # what numba device arrays look like from outside: on a GPU
        __cuda_array_interface__: dict = {}
        shape, dtype = (1, 1, 16, 8), "float32"

    if cuda.available():
        assert choose("auto", {"q": DeviceArray()}, pat, "merged", None)[0].name == "cuda"
        return
    with pytest.raises(ValueError) as err:
        choose("auto", {"q": DeviceArray()}, pat, "merged", None)
    msg = str(err.value)
    assert msg.startswith("impl: 'auto' found no backend for numba float32 inputs on cuda")
    assert "torch: q: a numba array" in msg and "cuda: numba-cuda" in msg and "\n" not in msg


@pytest.mark.parametrize("impl", ["numba", "reference", "torch", "flex"])
def test_a_scale_that_overflows_the_compute_dtype_is_refused(impl):
    pat = sps.make("strided", 16, stride=4)
    x = torch.ones(1, 1, 16, 8)
    with pytest.raises(ValueError, match=r"^scale: 1e\+39 overflows float32, the compute dtype"):
        attention(x, x, x, pat, impl=impl, scale=1e39, block=8)
    x = x.double()  # float64 computes it
    assert torch.isfinite(attention(x, x, x, pat, impl=impl, scale=1e39, block=8)).all()
