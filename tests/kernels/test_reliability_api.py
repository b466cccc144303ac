"""Issue 20, the Python API and the kernels: correct or refused, no process-wide side effects.

Each fix is checked against an independent reference: second derivatives
against finite differences (``gradgradcheck``) and torch's dense masked SDPA;
NaN propagation of ``impl="reference"`` against the row-by-row definition
(``testing.attention_oracle`` and a loop written here for the gradients); memory
estimates against the peak traced by ``tracemalloc``; BigBird's random draw
against the row-by-row draw it replaced; every refusal is a one-line
``ValueError`` that names the parameter.
"""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest

import sparse_patterns as sps
from sparse_patterns import config
from sparse_patterns.catalog import CATALOG, Param
from sparse_patterns.kernels import Backend, attention, get_backend, plan, register_backend
from sparse_patterns.kernels.backend import unregister
from sparse_patterns.kernels.cpu._blas import _openblas_controls, blas_thread_counts
from sparse_patterns.kernels.reference import (
    reference_backward,
    reference_bytes,
    reference_forward,
)
from sparse_patterns.pattern import Pattern
from sparse_patterns.patterns import resolve
from sparse_patterns.patterns.bigbird import _bigbird_blocks, _entries_bound
from sparse_patterns.testing import attention_masks, attention_oracle, dense_oracle
from sparse_patterns.util.checks import NO_LOWER_BOUND, check_int


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


# ------------------------------------------------------------------ 1. double backward
def _torch():
    return pytest.importorskip("torch")


def _dense_sdpa(q, k, v, pattern, mode):
    torch = _torch()
    mask = torch.from_numpy(np.ascontiguousarray(attention_masks(pattern, mode, q.shape[1])))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("impl", ["numba", "reference"])
def test_gradgradcheck_against_finite_differences(mode, impl):
    torch = _torch()
    from sparse_patterns.torch import SparseAttention

    pat = sps.make("fixed", 12, stride=4, c=1)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, 12, 4, dtype=torch.float64, generator=g, requires_grad=True)
               for _ in range(3))
    attn = SparseAttention(pat, mode=mode, block=4, impl=impl)
    assert torch.autograd.gradgradcheck(attn, (q, k, v), eps=1e-6, atol=1e-7)


def test_gradgradcheck_self_attention_one_tensor():
    """q, k and v are one tensor: each argument still gets its own partial derivative."""
    torch = _torch()
    from sparse_patterns.torch import sparse_attention

    pat = sps.make("strided", 10, stride=3)
    x = torch.randn(2, 2, 10, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: sparse_attention(t, t, t, pat, block=4), (x,),
                                        eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-9), ("float32", 2e-4)])
def test_gradient_penalty_matches_dense_sdpa(mode, dtype, tol):
    """The issue's repro: a gradient penalty through SparseAttention was off by 10.9."""
    torch = _torch()
    from sparse_patterns.torch import SparseAttention

    dt = getattr(torch, dtype)
    pat = sps.make("bigbird", 24, block=4, random_blocks=1, seed=2)
    g = torch.Generator().manual_seed(5)
    base = [torch.randn(2, 3, 24, 8, dtype=dt, generator=g) for _ in range(3)]
    attn = SparseAttention(pat, mode=mode, block=8)
    results = []
    for f in (attn, lambda a, b, c: _dense_sdpa(a, b, c, pat, mode)):
        q, k, v = (t.clone().requires_grad_() for t in base)
        out = f(q, k, v)
        gq, gv = torch.autograd.grad((out * out.sin()).sum(), (q, v), create_graph=True)
        assert gq.requires_grad and gv.requires_grad
        penalty = (gq ** 2).sum() + (gv * gq).sum()
        penalty.backward()
        results.append([gq.detach(), gv.detach(), q.grad, k.grad, v.grad])
    for ours, ref in zip(*results, strict=True):
        torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)


def test_first_order_gradients_unchanged_without_create_graph():
    torch = _torch()
    from sparse_patterns.torch import SparseAttention

    pat = sps.make("strided", 16, stride=4)
    x = torch.randn(1, 2, 16, 4, dtype=torch.float64, requires_grad=True)
    out = SparseAttention(pat, block=4)(x, x, x)
    (plain,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
    (graph,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    assert not plain.requires_grad and graph.requires_grad
    torch.testing.assert_close(plain, graph.detach(), rtol=1e-12, atol=1e-12)


def test_double_backward_refused_above_the_memory_limit():
    torch = _torch()
    from sparse_patterns.torch import SparseAttention

    pat = sps.make("full", 32)
    q = torch.randn(1, 2, 32, 8, dtype=torch.float64, requires_grad=True)
    out = SparseAttention(pat, block=8)(q, q, q)
    with config.memory_limit(10_000), pytest.raises(config.MemoryLimitError) as err:
        torch.autograd.grad(out.sum(), q, create_graph=True)
    msg = one_line(err)
    assert msg.startswith("create_graph:") and "memory limit of 10 kB" in msg


# ------------------------------------------------------------------ 2. reference: NaN, memory
def _grad_oracle(q, k, v, do, masks, scale):
    """Row-by-row gradients of masked softmax attention, float64, IEEE throughout."""
    B, H, n, d = q.shape
    dq, dk, dv = (np.zeros((B, H, n, d)) for _ in range(3))
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(B):
            for h in range(H):
                for i in range(n):
                    keys = np.flatnonzero(masks[h, i])
                    if keys.size == 0:
                        continue
                    s = scale * (k[b, h, keys] @ q[b, h, i])
                    w = np.exp(s - s.max())
                    p = w / w.sum()
                    dv[b, h, keys] += p[:, None] * do[b, h, i][None, :]
                    dp = v[b, h, keys] @ do[b, h, i]
                    ds = p * (dp - p @ dp)
                    dq[b, h, i] = scale * (ds @ k[b, h, keys])
                    dk[b, h, keys] += scale * ds[:, None] * q[b, h, i][None, :]
    return dq, dk, dv


def _same_nonfinite(a, b):
    assert np.array_equal(np.isnan(a), np.isnan(b))
    assert np.array_equal(np.isposinf(a), np.isposinf(b))
    assert np.array_equal(np.isneginf(a), np.isneginf(b))
    ok = np.isfinite(b)
    np.testing.assert_allclose(a[ok], b[ok], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
def test_reference_propagates_nan_and_inf_like_the_row_by_row_definition(mode):
    pat = sps.make("strided", 24, stride=4)
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((2, 3, 24, 4)) for _ in range(4))
    q[0, 0, 5, 1] = np.nan
    k[1, 2, 7, 0] = np.nan
    v[0, 1, 9, 2] = np.inf
    v[1, 0, 3, 3] = -np.inf
    v[1, 0, 11, 3] = np.inf  # rows attending 3 and 11 get inf - inf = NaN
    v[0, 0, 20, 0] = np.nan
    k[0, 2, 2, :] = 40.0  # large but finite scores: probabilities that underflow to 0
    masks = attention_masks(pat, mode, 3)
    pl = plan(pat, mode=mode)
    out, lse = reference_forward(q, k, v, pat, pl, scale=0.5)
    with np.errstate(invalid="ignore"):
        want_out, want_lse = attention_oracle(q, k, v, masks, scale=0.5)
    _same_nonfinite(out, want_out)
    _same_nonfinite(lse, want_lse)
    assert np.isnan(out[0, 0, 5]).all() and np.isnan(lse[0, 0, 5])  # the issue: it was 0
    grads = reference_backward(q, k, v, out, lse, do, pat, pl, scale=0.5)
    for got, want in zip(grads, _grad_oracle(q, k, v, do, masks, 0.5), strict=True):
        _same_nonfinite(got, want)


def test_reference_nan_query_row_agrees_with_numba_and_torch():
    torch = _torch()
    pat = sps.make("strided", 16, stride=4)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 16, 4)) for _ in range(3))
    q[0, 1, 7, 2] = np.nan
    ref = attention(q, k, v, pat, impl="reference")
    fast = attention(q, k, v, pat, impl="numba", block=4)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    sdpa = _dense_sdpa(tq, tk, tv, pat, "multihead").numpy()
    rows = np.isnan(ref).any(-1)
    assert rows.sum() == 1 and rows[0, 1, 7]
    assert np.array_equal(rows, np.isnan(fast).any(-1))
    assert np.array_equal(rows, np.isnan(sdpa).any(-1))
    np.testing.assert_allclose(ref[~rows], sdpa[~rows], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backward", [False, True])
def test_reference_bytes_bound_the_traced_peak(backward):
    """Worst case for the estimate: every value, query and upstream gradient non-finite."""
    n = 384
    pat = sps.make("full", n, causal=False)
    pl = plan(pat, mode="merged")
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((1, 2, n, 4)) for _ in range(4))
    v[..., 0] = np.inf
    k[..., 1] = np.nan
    do[..., 2] = -np.inf
    q[:, :, ::2, 3] = np.inf
    pat.union()  # the pattern's own CSR is not the reference's to count
    out, lse = reference_forward(q, k, v, pat, pl, scale=0.5)
    tracemalloc.start()
    try:
        if backward:
            reference_backward(q, k, v, out, lse, do, pat, pl, scale=0.5)
        else:
            reference_forward(q, k, v, pat, pl, scale=0.5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    need = reference_bytes(q.shape, backward=backward)
    assert peak <= need, (peak, need)
    assert need <= 3 * peak  # and not absurdly loose


def test_reference_refuses_before_allocating():
    """The issue: n = 8192, H = 8 allocated more than 6 GB without a word."""
    pat = sps.make("strided", 8192, stride=128)
    q = np.zeros((1, 8, 8192, 16), dtype=np.float32)
    need = reference_bytes(q.shape)
    assert need > 1 << 30
    tracemalloc.start()
    try:
        with config.memory_limit(1 << 30), pytest.raises(config.MemoryLimitError) as err:
            attention(q, q, q, pat, impl="reference")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = one_line(err)
    assert msg.startswith("impl: 'reference'") and "(1, 8, 8192, 16)" in msg
    assert config.format_bytes(need) in msg and "memory limit of 1.1 GB" in msg
    assert peak < 64 << 20, peak  # the inputs' copies at most, never (n, n)


# ------------------------------------------------------------------ 3. impl checked early
def test_unknown_impl_rejected_when_the_module_is_made():
    torch = _torch()
    from sparse_patterns.kernels import Impl
    from sparse_patterns.torch import SparseAttention, sparse_attention

    pat = sps.make("full", 8)
    with pytest.raises(ValueError) as err:
        SparseAttention(pat, impl="numab")
    msg = one_line(err)
    assert msg.startswith("impl: unknown implementation 'numab'")
    assert all(name in msg for name in ("numba", "reference", "cuda"))
    q = torch.zeros(1, 1, 8, 2)
    with pytest.raises(ValueError, match="impl: unknown implementation 'numab'"):
        sparse_attention(q, q, q, pat, impl="numab")
    assert SparseAttention(pat, impl=Impl.REFERENCE).impl == "reference"
    class ForwardOnly(Backend):  # no backward: cannot train
        name, has_backward = "forward_only", False
        forward = get_backend("reference").forward

    register_backend(ForwardOnly())
    try:
        with pytest.raises(ValueError, match="impl: unknown implementation 'forward_only'"):
            SparseAttention(pat, impl="forward_only")
    finally:
        unregister("forward_only")


# ------------------------------------------------------------------ 4. BLAS threads
def test_concurrent_attention_restores_the_blas_thread_count():
    controls = _openblas_controls()
    if not controls:
        pytest.skip("no OpenBLAS loaded in this process")
    before = blas_thread_counts()
    for setter, _ in controls:
        setter(2)  # a count other than the kernels' 1, so that a lost restore shows
    try:
        start = blas_thread_counts()
        assert start != [1] * len(start)
        pat = sps.make("strided", 256, stride=16)
        x = np.random.default_rng(0).standard_normal((2, 4, 256, 32))
        want = attention(x, x, x, pat)
        errors, barrier = [], threading.Barrier(3)

        def hammer() -> None:
            try:
                barrier.wait()
                for _ in range(40):
                    np.testing.assert_array_equal(attention(x, x, x, pat), want)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert blas_thread_counts() == start
    finally:
        for (setter, _), old in zip(controls, before, strict=True):
            setter(old)


# ------------------------------------------------------------------ 5. from_dense
@pytest.mark.parametrize(("dense", "match"), [
    (np.array([[1, 0], [2, 1]]), r"dense: values must be 0 or 1 \(or bool\), got 2 at \(1, 0\)"),
    (np.array([[1, 0], [0.5, 1]]), r"got 0.5 at \(1, 0\)"),
    (np.array([[1, np.nan], [0, 1]]), r"got nan at \(0, 1\)"),
    (np.array([[1, 0], [-1, 1]]), r"got -1 at \(1, 0\)"),
    (np.array([[[1, 0], [0, 1]], [[1, 0], [1, np.inf]]]), r"got inf at \(1, 1, 1\)"),
    (np.array([[1, 0], [0, 1]], dtype=object), "dense: must be a bool, integer or float array"),
    (np.array([["1", "0"], ["0", "1"]]), r"dense: must be a bool, integer or float array .*<U1"),
    (np.array([[1 + 0j, 0], [0, 1]]), "complex128"),
])
def test_from_dense_refuses_values_other_than_0_and_1(dense, match):
    with pytest.raises(ValueError, match=match) as err:
        Pattern.from_dense(dense)
    one_line(err)


@pytest.mark.parametrize("dtype", [bool, np.int8, np.uint16, np.int64, np.float32, np.float64])
def test_from_dense_accepts_exact_zeros_and_ones(dtype):
    mask = np.tril(np.random.default_rng(4).random((3, 9, 9)) < 0.4)
    pat = Pattern.from_dense(mask.astype(dtype))
    assert pat.causal
    assert [h.toarray().tolist() for h in pat.heads] == mask.tolist()


# ------------------------------------------------------------------ 6. generators
def _int_params():
    for name, fam in CATALOG.items():
        for p in fam.params:
            if p.type is int and p.name != "seed":
                yield name, p.name


@pytest.mark.parametrize(("name", "param"), list(_int_params()))
@pytest.mark.parametrize("value", [10**30, -(10**30), 2**63])
def test_every_integer_parameter_has_a_range(name, param, value):
    """``strided --stride 10**30`` was an OverflowError traceback."""
    with pytest.raises(ValueError) as err:
        sps.make(name, 64, **{param: value})
    msg = one_line(err)
    assert msg.startswith(f"{param}: must be an integer"), msg
    if value > 0:
        assert "[" in msg, msg  # the message quotes the range
    kw = resolve(name, 64, {})
    kw[param] = value
    with pytest.raises(ValueError) as err:  # the generator itself, not only make()
        sps.REGISTRY[name].func(64, **kw)
    assert one_line(err).startswith(f"{param}: must be an integer")


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_generators_bound_n(name):
    kw = resolve(name, 64, {})
    with pytest.raises(ValueError, match=r"n: must be an integer \[1, 2147483647\]"):
        sps.REGISTRY[name].func(2**40, **kw)


def test_large_but_valid_sizes_cost_o_n():
    """Parameters far beyond n are valid and change nothing beyond n: no allocation grows
    with them (``fixed`` built its summary offsets with ``np.arange(c)``)."""
    big = 2**31 - 1
    tracemalloc.start()
    try:
        cases = [
            (sps.make("fixed", 64, stride=big, c=big), dense_oracle("fixed", 64, stride=big, c=big)),
            (sps.make("strided", 64, stride=big), dense_oracle("strided", 64, stride=big)),
            (sps.make("longformer", 64, window=big, dilation=big),
             dense_oracle("longformer", 64, window=big, global_tokens=1, dilation=big)),
            (sps.make("local2d", 64, query_block=big, memory=big),
             dense_oracle("local2d", 64, height=8, width=8, query_block=big, memory=big)),
        ]
        for pat, want in cases:
            assert np.array_equal(pat.to_dense(), want), pat
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak


def test_bigbird_block_beyond_n_is_one_block_of_full_attention():
    """The issue: ``show bigbird --n 1024 --block 1000000000`` passed 6 GB."""
    tracemalloc.start()
    try:
        pat = sps.make("bigbird", 1024, block=10**9)
        window = pat.heads[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    assert (window != sps.make("full", 1024).heads[0]).nnz == 0
    assert pat.params["block"] == 10**9


def test_bigbird_random_blocks_refused_before_allocating():
    """``bigbird --n 65536 --block 1 --random-blocks 65536`` ended in a MemoryError traceback."""
    tracemalloc.start()
    try:
        with pytest.raises(config.MemoryLimitError) as err:
            sps.make("bigbird", 65536, block=1, random_blocks=65536)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = one_line(err)
    assert msg.startswith("random_blocks: bigbird at n=65,536 with block=1")
    assert "above the memory limit" in msg
    assert peak < 1 << 20, peak
    # saturating counts are fine where they fit: every allowed block drawn
    pat = sps.make("bigbird", 64, block=4, window_blocks=1, global_blocks=1, random_blocks=10**6)
    union = pat.union().toarray()
    assert union.sum() == np.tril(np.ones((64, 64), bool)).sum()


def _draw_by_allowed_array(nb, wb, gb, rb, seed, causal):
    """The random head as it was drawn before: the allowed blocks of each row, materialized."""
    I = np.arange(nb, dtype=np.int64)
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(nb):
        taken = (np.abs(I - r) <= wb) | (r < gb) | (I < gb)
        if causal:
            taken |= I > r
        allowed = np.flatnonzero(~taken)
        k = min(rb, allowed.size)
        rows.append(np.sort(rng.choice(allowed, size=k, replace=False)) if k else allowed[:0])
    return rows


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("nb", "wb", "gb", "rb"), [
    (1, 1, 1, 2), (7, 0, 0, 3), (17, 1, 2, 2), (40, 3, 1, 100), (33, 50, 0, 1),
    (12000, 1, 1, 3),  # populations above 10,000: numpy draws by Floyd's algorithm
])
def test_bigbird_draw_equals_the_materialized_draw(nb, wb, gb, rb, causal):
    seed = nb * 7 + rb
    win, glob, (bptr, bidx) = _bigbird_blocks(nb, wb, gb, rb, seed, causal)
    want = _draw_by_allowed_array(nb, wb, gb, rb, seed, causal)
    assert np.array_equal(np.diff(bptr), [r.size for r in want])
    assert np.array_equal(bidx, np.concatenate(want))
    need = _entries_bound(nb, wb, gb, rb, causal)
    assert need["window_blocks"] == 24 * win[1].size
    assert need["global_blocks"] == 24 * glob[1].size
    assert need["random_blocks"] >= 16 * bidx.size


def test_check_int_leaves_out_the_no_bound_sentinel():
    """The issue: a type error said "must be an integer >= -4611686018427387904"."""
    with pytest.raises(ValueError) as err:
        Param("window", int, 8, "w").convert(2.5, 16)
    assert one_line(err) == "window: must be an integer, got 2.5"
    with pytest.raises(ValueError, match=r"^x: must be an integer <= 4, got 9$"):
        check_int("x", 9, NO_LOWER_BOUND, 4)
    with pytest.raises(ValueError, match=r"^x: must be an integer \[1, 4\], got about 10\^10000$"):
        check_int("x", 10**10000, 1, 4)  # str() of it would itself raise
    assert check_int("x", -(10**18), NO_LOWER_BOUND) == -(10**18)


def test_counts_at_an_absurd_n_are_refused_before_allocating():
    pat = sps.make("strided", 2**31 - 1)
    tracemalloc.start()
    try:
        for read in (pat.row_counts, lambda: pat.nnz, lambda: pat.head_nnz):
            with pytest.raises(config.MemoryLimitError, match=r"^n: \|A_i\| of strided at n=2,147,483,647"):
                read()
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
