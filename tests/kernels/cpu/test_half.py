"""bfloat16 and float16 inputs: the conversions, the accuracy bounds the docs state, and
the fallback for a CPU without AVX512_BF16."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import sparse_patterns as sps  # noqa: E402
from sparse_patterns.kernels import attention, attention_backward, plan  # noqa: E402
from sparse_patterns.kernels.cpu import _llvm, amx_applies, bf16_applies, fma_peak  # noqa: E402
from sparse_patterns.kernels.cpu._amx import amx_here  # noqa: E402
from sparse_patterns.kernels.cpu._convert import narrow, widen  # noqa: E402
from sparse_patterns.torch import SparseAttention  # noqa: E402

#: relative rounding of one output element (half an ulp), as attention's docstring states
ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
KINDS = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def hostile_floats(size: int, seed: int = 0) -> np.ndarray:
    """float32 over the whole exponent range, with zeros, infinities, ties and NaNs."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(size) * np.exp(rng.uniform(-40, 40, size))).astype(np.float32)
    x[::97] = np.inf
    x[1::89] = -np.inf
    x[2::83] = 0.0
    x[3::79] = -0.0
    x[4::73] = np.nan
    x[5::71] = 1.00390625  # a bf16 tie: rounds to even (1.0)
    x[6::67] = 65520.0  # float16 overflow: rounds to inf
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size", [1, 15, 16, 17, 100_003])
def test_conversions_match_torch(dtype, size):
    """Narrowing rounds as torch does (ties to even, overflow to inf), bit for bit
    except for NaN payloads (still NaN) and bf16 subnormals (flushed, see _convert)."""
    x = hostile_floats(size)
    x[np.abs(x) < 2.0**-126] = 0.0  # no float32 subnormals
    want = torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(np.uint16)
    got = narrow(x, KINDS[dtype])
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    back = widen(got, KINDS[dtype])
    assert np.isnan(back[nan]).all()
    np.testing.assert_array_equal(back, torch.from_numpy(want.view(np.int16)).view(dtype).float())


def test_narrow_writes_into_a_tensor_storage():
    t = torch.empty(3, 5, dtype=torch.bfloat16)
    x = np.arange(15, dtype=np.float32).reshape(3, 5) / 7
    narrow(x, "bfloat16", out=t.view(torch.int16).numpy())
    assert torch.equal(t, torch.from_numpy(x).to(torch.bfloat16))


def dense_attention(q, k, v, pattern, mode):
    """float64 softmax attention through a dense boolean mask (torch autograd: gradients)."""
    heads = [pattern.union()] if mode == "merged" else list(pattern.heads)
    outs = []
    for h in range(q.shape[1]):
        allowed = torch.from_numpy(heads[h % len(heads)].toarray().astype(bool))
        s = (q[:, h] @ k[:, h].transpose(-1, -2)) / q.shape[-1] ** 0.5
        p = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1)
        p = torch.where(allowed.any(-1, keepdim=True), p, 0.0)  # a row with no key: 0
        outs.append(p @ v[:, h])
    return torch.stack(outs, 1)


def dense_terms(q, k, v, do, pattern, mode):
    """What bf16 products round, float64 through dense masks: per head ``|P| |v|``
    (the output), ``|dS| |k|`` (dq, scale included), ``|dS|^T |q|`` (dk), ``P^T |dO|``
    (dv), ``P`` and ``dS`` being the probabilities and the score gradients."""
    heads = [pattern.union()] if mode == "merged" else list(pattern.heads)
    scale = q.shape[-1] ** -0.5
    terms = [[], [], [], []]
    for h in range(q.shape[1]):
        allowed = torch.from_numpy(heads[h % len(heads)].toarray().astype(bool))
        s = (q[:, h] @ k[:, h].transpose(-1, -2)) * scale
        p = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1)
        p = torch.where(allowed.any(-1, keepdim=True), p, 0.0)
        o = p @ v[:, h]
        dp = do[:, h] @ v[:, h].transpose(-1, -2)
        ds = p * (dp - (do[:, h] * o).sum(-1, keepdim=True))
        for t, x in zip(terms, (p @ v[:, h].abs(), scale * ds.abs() @ k[:, h].abs(),
                                scale * ds.abs().transpose(-1, -2) @ q[:, h].abs(),
                                p.transpose(-1, -2) @ do[:, h].abs()), strict=True):
            t.append(x)
    return [torch.stack(t, 1) for t in terms]


CASES = [("strided", {"stride": 8}), ("fixed", {"stride": 8, "c": 2}),
         ("local", {"window": 12}), ("bigbird", {"block": 8, "random_blocks": 2})]


needs_bf16_products = pytest.mark.skipif(not _llvm._AVX512_BF16,
                                         reason="the CPU has no AVX512_BF16")
needs_amx = pytest.mark.skipif(not (_llvm._AVX512_BF16 and amx_here()),
                               reason="the CPU has no AMX-BF16 that this process may use")
#: how bf16 inputs are computed: widened to float32, or on bf16 products
BF16_PATHS = ["widen", pytest.param("products", marks=needs_bf16_products)]
#: the forward's bf16 products: ``vdpbf16ps`` (forced), or AMX (where ``auto`` takes it)
PRODUCTS = [pytest.param("products", marks=needs_bf16_products),
            pytest.param("amx", marks=needs_amx)]


@needs_bf16_products
@pytest.mark.parametrize("fresh", [True, False])
def test_pv_on_words_equals_widen_pv_narrow(fresh):
    """:func:`_pv32_dense_bf16` reading the state's bf16 words (or none, ``fresh``) and
    writing the output's words, over one key block (what a strided window block does),
    gives the words of widening the state, running it on float32 rows and narrowing
    the result, bit for bit; rows outside the block are left as they were."""
    import numba

    from sparse_patterns.kernels.cpu._convert import _narrow16, _widen16
    from sparse_patterns.kernels.cpu._llvm_fwd import _pv32_dense_bf16

    @numba.njit
    def by_floats(va, st, state, alpha, post, lo, hi, d, obuf, out, fresh):
        if not fresh:
            _widen16(state, obuf, 0, 32 * d, True)
        _pv32_dense_bf16(va, 0, st, obuf, 0, alpha, post, lo, hi, d, obuf, 0, fresh)
        _narrow16(obuf, out, 0, 32 * d, True)

    @numba.njit
    def by_words(va, st, state, alpha, post, lo, hi, d, obuf, out, fresh):
        if fresh:
            _pv32_dense_bf16(va, 0, st, obuf, 0, alpha, post, lo, hi, d, out, d, True)
        else:
            _pv32_dense_bf16(va, 0, st, state, d, alpha, post, lo, hi, d, out, d, False)

    rng = np.random.default_rng(11)
    d, nk = 64, 160

    def words(x):
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    va = words(rng.standard_normal(nk * d)).view(np.float32)  # rows of d / 2 words
    st = words(rng.uniform(0, 1, nk * 32)).view(np.float32)  # 80 pairs x 32 queries
    state = words(rng.standard_normal(34 * d) * 3)  # rows 1 .. 32 hold the block's state
    alpha = rng.uniform(0.1, 1, 32).astype(np.float32)
    post = (1 / rng.uniform(1, 9, 32)).astype(np.float32)
    lo = np.array([0, 3, 0, 40, 0, 0, 17, 0], np.int64)
    hi = np.array([160, 97, 128, 160, 33, 160, 160, 64], np.int64)
    obuf, want = np.zeros(32 * d, np.float32), np.zeros(32 * d, np.uint16)
    by_floats(va, st, state[d:], alpha, post, lo, hi, d, obuf, want, fresh)
    got = np.full(34 * d, 7, np.uint16)
    by_words(va, st, state, alpha, post, lo, hi, d, np.zeros(32 * d, np.float32), got, fresh)
    np.testing.assert_array_equal(got[d: 33 * d], want)
    assert (got[:d] == 7).all() and (got[33 * d:] == 7).all()


def bf16_path(monkeypatch, path: str) -> None:
    """Set ``SPARSE_PATTERNS_BF16`` for ``path``: ``amx`` is ``auto`` on a CPU with AMX."""
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", "auto" if path == "amx" else path)


def forward_products(plan_, d: int, path: str) -> bool:
    """Whether the forward runs on the bf16 products of ``path`` (see :data:`PRODUCTS`)."""
    return amx_applies(plan_, d) if path == "amx" else bf16_applies(plan_, d)


@pytest.mark.parametrize(("dtype", "path"), [
    (torch.bfloat16, "widen"), pytest.param(torch.bfloat16, "products", marks=needs_bf16_products),
    pytest.param(torch.bfloat16, "amx", marks=needs_amx), (torch.float16, "widen")])
@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(("name", "params"), CASES)
def test_forward_and_gradients_within_the_stated_bounds(dtype, path, mode, name, params,
                                                        monkeypatch):
    """Against float64 autograd through dense masked attention on the same (rounded)
    input values: each element of the output and of ``dv`` within its rounding (half an
    ulp of its dtype) of the exact value, plus 1e-5 of the largest (float32
    arithmetic); ``dq`` and ``dk`` also carry the output's rounding, through
    ``rowsum(dO * O)``: within 4 ulps at 1 of their largest element. On bf16 products,
    each also within 2**-8 (the rounding of ``P`` or ``dS`` to bf16) of the sum of
    absolute products that it rounds (:func:`dense_terms`); by AMX (``amx``) the same
    bound (the forward's products by AMX, the backward's as ``auto`` decides)."""
    bf16_path(monkeypatch, path)
    pat = sps.make(name, 96, **params)
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 3, 96, 32, generator=g).to(dtype) for _ in range(4))
    pl = sps.plan(pat, mode=mode)
    assert bf16_applies(pl, 32) == (path == "products") or path == "amx"
    assert amx_applies(pl, 32) == (path == "amx")
    x64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = dense_attention(*x64, pat, mode)
    ref_grads = torch.autograd.grad(ref, x64, do.double())
    out, lse = attention(q, k, v, pat, mode=mode, return_lse=True)
    grads = attention_backward(q, k, v, out, lse, do, pat, mode=mode)
    through_o = 8 * ROUNDING[dtype]
    extras = ([2.0**-8 * t for t in dense_terms(*(t.double() for t in (q, k, v, do)), pat, mode)]
              if path != "widen" else [0.0] * 4)
    for got, want, floor, extra in zip((out, *grads), (ref, *ref_grads),
                                       (1e-5, through_o, through_o, 1e-5), extras, strict=True):
        assert got.dtype == dtype
        want = want.detach()
        bound = ROUNDING[dtype] * want.abs() + floor * want.abs().max() + extra
        assert ((got.double() - want).abs() <= bound).all()


@needs_amx
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("chunk", [1, 2])
def test_amx_forward_on_chunks_of_fewer_scores_than_its_output_rows(d, chunk):
    """AMX's ``P V`` stores its ``32 x d`` float32 sums over the chunk's scores (``32 x 32``
    a tile): with chunks of 1 or 2 tiles and ``d`` 64 or 128 they need more room than the
    scores take, which the per-thread buffers give them. The output against float64 on the
    same values within the bound of :func:`test_bf16_products_against_the_oracle`, and
    the same words as ``chunk`` 24 up to that rounding."""
    from sparse_patterns.kernels.cpu import forward_bf16

    n = 512
    pat = sps.make("strided", n, stride=32)
    pl = plan(pat, mode="merged", block=32)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, n, d, generator=g).to(torch.bfloat16) for _ in range(3))
    w = [t.view(torch.int16).numpy() for t in (q, k, v)]
    out, lse = forward_bf16(*w, pl, scale=0.125, chunk=chunk, amx=True)
    whole, _ = forward_bf16(*w, pl, scale=0.125, amx=True)
    ref, ref_lse = attention(*(t.double() for t in (q, k, v)), pat, mode="merged", scale=0.125,
                             impl="reference", return_lse=True)
    want = ref.numpy()
    bound = 2.0**-8 * np.abs(want) + 2.0**-8 * v.double().abs().max().item()
    assert (np.abs(out - want) <= bound + 1e-5 * np.abs(want).max()).all()
    assert (np.abs(out - whole) <= 2 * bound).all()
    np.testing.assert_allclose(lse, ref_lse.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", PRODUCTS)
@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(("name", "params"), [
    ("strided", {"stride": 64}), ("fixed", {"stride": 128, "c": 16}), ("local", {"window": 100}),
    ("bigbird", {"block": 32, "random_blocks": 2})])
def test_bf16_products_against_the_oracle(name, params, mode, path, monkeypatch):
    """bf16 products on patterns long enough for every way the kernels move rows
    (residue pieces copied per work item, summary keys reordered once per call, pieces
    run as a pair, chunks gathered from scattered key blocks; the backward's work items
    and gathered query rows): the output against float64 on the same values within its
    rounding plus that of ``P`` (2**-8 of the largest ``|v|``), the log-sum-exp within
    float32 rounding (the scores are exact bf16 products summed in float32), and the
    gradients against the float32 backward on the same values within their rounding
    plus 2**-7 of the largest (``P`` and ``dS`` rounded to bf16). ``path``: the forward's
    products by ``vdpbf16ps`` or by AMX (:data:`PRODUCTS`)."""
    bf16_path(monkeypatch, path)
    n = 2048
    pat = sps.make(name, n, **params)
    assert forward_products(sps.plan(pat, mode=mode), 64, path)
    g = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.randn(1, 2, n, 64, generator=g).to(torch.bfloat16) for _ in range(4))
    out, lse = attention(q, k, v, pat, mode=mode, return_lse=True)
    x64 = [t.double() for t in (q, k, v)]
    ref = attention(*x64, pat, mode=mode, impl="reference", return_lse=True)
    want = ref[0]
    bound = 2.0**-8 * want.abs() + 2.0**-8 * v.double().abs().max() + 1e-5 * want.abs().max()
    assert ((out.double() - want).abs() <= bound).all()
    torch.testing.assert_close(lse.double(), ref[1], rtol=1e-5, atol=1e-5)
    grads = attention_backward(q, k, v, out, lse, do, pat, mode=mode)
    widened = attention_backward(*(t.float() for t in (q, k, v, out)), lse, do.float(), pat,
                                 mode=mode)  # float32 on the same values, the same o
    for got, want in zip(grads, widened, strict=True):
        assert got.dtype == torch.bfloat16
        err = (got.double() - want.double()).abs()
        assert (err <= 2.0**-8 * want.abs() + 2.0**-7 * want.abs().max()).all()


@pytest.mark.parametrize("path", PRODUCTS)
@pytest.mark.parametrize(("name", "params", "mode"), [
    ("fixed", {"stride": 128, "c": 16}, "merged"), ("strided", {"stride": 32}, "multihead")])
def test_bf16_backward_in_query_ranges(name, params, mode, path, monkeypatch):
    """The bf16 backward with the key blocks taking 3 query blocks at a time (``_QRANGE``;
    the default's 128 cover these n at once): the gradients against the float32 backward
    within the bound of the test above, products by ``vdpbf16ps`` or by AMX."""
    from sparse_patterns.kernels.cpu import _backward

    bf16_path(monkeypatch, path)
    n = 1024
    pat = sps.make(name, n, **params)
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, n, 64, generator=g).to(torch.bfloat16) for _ in range(4))
    out, lse = attention(q, k, v, pat, mode=mode, return_lse=True)
    widened = attention_backward(*(t.float() for t in (q, k, v, out)), lse, do.float(), pat,
                                 mode=mode)
    monkeypatch.setattr(_backward, "_QRANGE", 3)
    grads = attention_backward(q, k, v, out, lse, do, pat, mode=mode)
    for got, want in zip(grads, widened, strict=True):
        err = (got.double() - want.double()).abs()
        assert (err <= 2.0**-8 * want.abs() + 2.0**-7 * want.abs().max()).all()


def test_bf16_exponentials_within_their_stated_error():
    """The bf16 forward's exponential pass (a degree-4 polynomial in the fraction
    ``x - floor(x)``): each probability within its bf16 rounding (2**-8) plus 3e-6 of
    2**(s - max) in float64, stored as pairs of keys per query; exactly 0 for a masked
    (-inf) score or one more than 126 below its column's max, NaN for a NaN score; each
    column sum, of the float32 values before rounding, within 3e-6 of float64's; and the
    polynomial itself within 2.7e-6 of 2**r on [0, 1) in float32."""
    import numba

    from sparse_patterns.kernels.cpu._llvm import _AVX512_BF16, _EXP2_POLY_BF16
    from sparse_patterns.kernels.cpu._llvm_fwd import _exp32_bf16

    if not _AVX512_BF16:  # its AVX-512 instructions run only on the bf16-products path
        pytest.skip("this CPU has no AVX512_BF16: bf16 inputs are widened, this pass never runs")

    r = np.linspace(0.0, 1.0, 100_001)[:-1].astype(np.float32)
    y = np.full_like(r, _EXP2_POLY_BF16[0])
    for c in _EXP2_POLY_BF16[1:]:
        y = (y * r + np.float32(c)).astype(np.float32)
    assert (np.abs(y / 2.0 ** r.astype(np.float64) - 1) <= 2.7e-6).all()

    @numba.njit
    def run(st, nk, cmax, csum):
        _exp32_bf16(st, nk, cmax, csum)

    def probabilities(s):
        cmax = s.max(axis=0)
        st, csum = s.reshape(-1).copy(), np.zeros(32, np.float32)
        run(st, s.shape[0], cmax, csum)
        words = st.view(np.uint32)[: s.shape[0] // 2 * 32].reshape(-1, 32)
        got = np.empty(s.shape)
        got[0::2] = (words << 16).view(np.float32)  # low halves: keys 2p
        got[1::2] = (words & 0xFFFF0000).view(np.float32)  # high halves: keys 2p + 1
        return got, csum, cmax

    rng = np.random.default_rng(4)
    s = (rng.standard_normal((64, 32)) * 6).astype(np.float32)
    s[5, :8] = -np.inf  # masked
    s[9, 8:16] = s[:, 8:16].max(axis=0) - 126.5  # below the clamp
    s[9, 16:24] = s[:, 16:24].max(axis=0) - 125.5  # above it: 2**-125.5
    got, csum, cmax = probabilities(s)
    want = 2.0 ** (s.astype(np.float64) - cmax)  # (keys, queries)
    assert (got[5, :8] == 0).all() and (got[9, 8:16] == 0).all()
    assert (np.abs(got - want) <= (2.0**-8 + 3e-6) * want + (want < 2.0**-126)).all()
    np.testing.assert_allclose(csum, want.sum(axis=0), rtol=3e-6)
    s[3, 0] = np.nan
    got, csum, _ = probabilities(s)
    assert np.isnan(got[3, 0]) and np.isnan(csum[0]) and not np.isnan(csum[1:]).any()


@pytest.mark.parametrize(("name", "params", "mode", "want"), [
    ("strided", {"stride": 64}, "merged", [1, 2]),  # residue classes, then the window
    ("strided", {"stride": 64}, "multihead", [0, 0]),  # one piece per softmax group
    ("fixed", {"stride": 128, "c": 16}, "merged", [0, 0]),  # a pair: the state in the cache
    ("dilated", {"window": 64}, "merged", [0]),  # one copied piece, first and last
])
def test_bf16_state_goes_as_words_only_between_a_copied_piece_and_the_last(name, params,
                                                                           mode, want):
    """The bf16 forward hands a softmax group's partial output on as bf16 words only from
    a copied piece to its group's last piece, run alone a call later (hand-checked:
    strided's residue classes, then its window, in ``merged`` mode)."""
    from sparse_patterns.kernels.cpu._schedule import _forward_steps, _state_words

    pl = plan(sps.make(name, 2048, **params), mode=mode, block=32)
    assert _state_words(_forward_steps(pl, 8), [int(g) for g in pl.piece_group]) == want


@needs_bf16_products
def test_bf16_products_prefetching_forward_repeats_bit_for_bit(monkeypatch):
    """With bf16 products the blocks used in place prefetch the next block's rows (the
    values from their pairs' array), a hint: bit for bit the same output and log-sum-exp
    from one call to the next."""
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", "products")
    pat = sps.make("strided", 1024, stride=40)
    assert bf16_applies(plan(pat, mode="merged", block=32), 64)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 1024, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    on = attention(q, k, v, pat, mode="merged", return_lse=True)
    off = attention(q, k, v, pat, mode="merged", return_lse=True)
    assert torch.equal(on[0].view(torch.int16), off[0].view(torch.int16))
    assert torch.equal(on[1], off[1])


@pytest.mark.parametrize("path", PRODUCTS)
def test_bf16_backward_prefetching_repeats_bit_for_bit(path, monkeypatch):
    """The bf16 backward asks for the next key block's rows and their pairs, a hint: bit
    for bit the same gradients from one call to the next (products by ``vdpbf16ps`` or by
    AMX)."""
    bf16_path(monkeypatch, path)
    pat = sps.make("strided", 1024, stride=40)
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, 1024, 64, generator=g).to(torch.bfloat16) for _ in range(4))
    o, lse = attention(q, k, v, pat, mode="merged", return_lse=True)
    on = attention_backward(q, k, v, o, lse, do, pat, mode="merged")
    off = attention_backward(q, k, v, o, lse, do, pat, mode="merged")
    for a, b in zip(on, off, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("path", PRODUCTS)
@pytest.mark.parametrize(("B", "H", "name", "params", "mode"), [
    (1, 1, "strided", {"stride": 40}, "merged"),  # one head: fewer heads than threads
    (2, 3, "strided", {"stride": 40}, "multihead"),  # heads share the threads' rows
    (1, 4, "fixed", {"stride": 64, "c": 8}, "multihead"),  # keys no tile reaches (A2)
    (1, 2, "local", {"window": 72}, "merged"),  # one piece, no work items
])
@pytest.mark.parametrize("qrange", [128, 3])
def test_bf16_backward_words_equal_narrowed_float32_gradients(B, H, name, params, mode, qrange,
                                                              path, monkeypatch):
    """``backward_bf16(words=True)`` (what ``attention_backward`` on bf16 tensors takes)
    accumulates each head's gradients in float32 rows its thread reuses and rounds them
    as the head's last piece finishes them (``qrange`` 3: in 11 ranges of query blocks,
    key blocks across their ends) or when the head is done: bit for bit :func:`narrow`
    of the float32 gradients of the whole call, every head, rows no tile reaches
    included (zero)."""
    from sparse_patterns.kernels.cpu import _backward as bw
    from sparse_patterns.kernels.cpu import backward_bf16
    from sparse_patterns.kernels.cpu._convert import narrow

    bf16_path(monkeypatch, path)
    monkeypatch.setattr(bw, "_QRANGE", qrange)
    n = 1024
    pat = sps.make(name, n, **params)
    pl = plan(pat, mode=mode, block=32)
    assert forward_products(pl, 64, path)
    g = torch.Generator().manual_seed(6)
    q, k, v, do = (torch.randn(B, H, n, 64, generator=g).to(torch.bfloat16) for _ in range(4))
    o, lse = attention(q, k, v, pl, mode=mode, return_lse=True)
    w = [t.contiguous().view(torch.int16).numpy() for t in (q, k, v, o)]
    args = (*w, lse.numpy(), do.view(torch.int16).numpy(), pl)
    wide = backward_bf16(*args, scale=0.125, amx=path == "amx")
    words = backward_bf16(*args, scale=0.125, words=True, amx=path == "amx")
    via_torch = attention_backward(q, k, v, o, lse, do, pl, mode=mode)
    for a, b, t in zip(wide, words, via_torch, strict=True):
        assert a.dtype == np.float32 and b.dtype == np.uint16 and b.shape == (B, H, n, 64)
        np.testing.assert_array_equal(narrow(a, "bfloat16"), b)
        np.testing.assert_array_equal(t.view(torch.int16).numpy().view(np.uint16), b)
    if name == "fixed":  # the summary head's other keys: dk rows of zeros
        assert (words[1] == 0).all(axis=-1).any()


@needs_bf16_products
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.integers(1, 6), heads=st.lists(st.sampled_from([0.0, 0.03, 0.2, 1.0]),
                                                 min_size=1, max_size=3),
       seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(["multihead", "merged"]),
       qrange=st.sampled_from([1, 2, 3, 128]))
def test_bf16_backward_words_on_random_patterns(blocks, heads, seed, mode, qrange):
    """Random causal patterns (heads of any density, empty ones included) and ranges of
    query blocks: the words the backward rounds as it goes are bit for bit
    :func:`narrow` of its float32 gradients; by ``vdpbf16ps`` and, where the CPU has it,
    by AMX, the two within the bound of :func:`test_bf16_products_against_the_oracle` of
    each other (exact bf16 products summed in another order, ``P`` and ``dS`` rounded)."""
    import scipy.sparse as sparse

    from sparse_patterns.kernels.cpu import _backward as bw
    from sparse_patterns.kernels.cpu import backward_bf16

    n, rng = 32 * blocks, np.random.default_rng(seed)
    pat = sps.Pattern([sparse.csr_matrix(np.tril(rng.random((n, n)) < p)) for p in heads])
    pl = plan(pat, mode=mode, block=32)
    w = [(rng.standard_normal((1, 2, n, 32), np.float32).view(np.uint32) >> 16)
         .astype(np.uint16) for _ in range(5)]
    lse = rng.standard_normal((1, 2, n)).astype(np.float32) + 3.0
    before = bw._QRANGE
    grads = []
    try:
        bw._QRANGE = qrange
        for amx in (False, True) if amx_here() else (False,):
            wide = backward_bf16(*w[:4], lse, w[4], pl, scale=0.2, amx=amx)
            words = backward_bf16(*w[:4], lse, w[4], pl, scale=0.2, words=True, amx=amx)
            for a, b in zip(wide, words, strict=True):
                np.testing.assert_array_equal(narrow(a, "bfloat16"), b)
            grads.append([a.copy() for a in wide])
    finally:
        bw._QRANGE = before
    if len(grads) == 2:
        for got, want in zip(*grads, strict=True):
            err = np.abs(got.astype(np.float64) - want)
            assert (err <= 2.0**-8 * np.abs(want) + 2.0**-7 * np.abs(want).max() + 1e-6).all()


def _nan_filled(shape: tuple, dtype) -> np.ndarray:
    """An array of NaN (float) or NaN bf16 words (``uint16``), for ``_buffer``: a row
    the kernel leaves unwritten then shows."""
    dtype = np.dtype(dtype)
    return np.full(shape, 0x7FC1 if dtype.kind in "iu" else np.nan, dtype)


@pytest.mark.parametrize("path", PRODUCTS)
@pytest.mark.parametrize(("B", "H", "n", "name", "params", "mode"), [
    (1, 2, 1024, "strided", {"stride": 40}, "merged"),  # last piece in place (the window)
    (2, 3, 1024, "strided", {"stride": 40}, "multihead"),  # a copied piece, first and last
    (1, 2, 1024, "fixed", {"stride": 64, "c": 8}, "merged"),  # a copied last piece
    (1, 2, 2048, "fixed", {"stride": 16, "c": 4}, "merged"),  # a pair: rows kept in scratch
    (1, 4, 1024, "fixed", {"stride": 64, "c": 8}, "multihead"),
    (1, 1, 1024, "dilated", {"window": 64}, "merged"),  # one copied piece
    (1, 3, 1024, "bigbird", {}, "multihead"),
])
def test_bf16_forward_words_equal_narrowed_float32_output(B, H, n, name, params, mode, path,
                                                          monkeypatch):
    """``forward_bf16(words=True)`` (what ``attention`` on bf16 tensors takes) rounds each
    block's output rows as the last piece finishes them, in place or from a work item's
    rows: bit for bit :func:`narrow` of the float32 output, the same log-sum-exp, every
    word written (the output arrays come filled with NaN words)."""
    from sparse_patterns.kernels.cpu import _forward as fw
    from sparse_patterns.kernels.cpu import forward_bf16

    bf16_path(monkeypatch, path)
    monkeypatch.setattr(fw, "_buffer", _nan_filled)
    pl = plan(sps.make(name, n, **params), mode=mode, block=32)
    assert forward_products(pl, 64, path)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, n, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    w = [t.view(torch.int16).numpy() for t in (q, k, v)]
    amx = path == "amx"
    wide, lse = forward_bf16(*w, pl, scale=0.125, amx=amx)
    words, lse_w = forward_bf16(*w, pl, scale=0.125, words=True, amx=amx)
    assert words.dtype == np.uint16 and words.shape == (B, H, n, 64)
    np.testing.assert_array_equal(narrow(wide, "bfloat16"), words)
    np.testing.assert_array_equal(lse, lse_w)
    via_torch = attention(q, k, v, pl, mode=mode, scale=0.125)
    np.testing.assert_array_equal(via_torch.view(torch.int16).numpy().view(np.uint16), words)


@needs_bf16_products
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.integers(1, 6), heads=st.lists(st.sampled_from([0.0, 0.03, 0.2, 1.0]),
                                                 min_size=1, max_size=3),
       seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(["multihead", "merged"]))
def test_bf16_forward_words_on_random_patterns(blocks, heads, seed, mode):
    """Random causal patterns (heads of any density, empty ones included: rows without
    keys, query blocks without tiles): the output words are bit for bit :func:`narrow`
    of the float32 output, every word written (the arrays come filled with NaN words);
    by ``vdpbf16ps`` and, where the CPU has it, by AMX, the two within the rounding of
    ``P`` to bf16 of each other (exact bf16 products summed in another order)."""
    import scipy.sparse as sparse

    from sparse_patterns.kernels.cpu import _forward as fw
    from sparse_patterns.kernels.cpu import forward_bf16

    n, rng = 32 * blocks, np.random.default_rng(seed)
    pat = sps.Pattern([sparse.csr_matrix(np.tril(rng.random((n, n)) < p)) for p in heads])
    pl = plan(pat, mode=mode, block=32)
    w = [(rng.standard_normal((1, 2, n, 32), np.float32).view(np.uint32) >> 16)
         .astype(np.uint16) for _ in range(3)]
    outs = []
    for amx in (False, True) if amx_here() else (False,):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fw, "_buffer", _nan_filled)
            wide, lse = forward_bf16(*w, pl, scale=0.2, amx=amx)
            words, lse_w = forward_bf16(*w, pl, scale=0.2, words=True, amx=amx)
        np.testing.assert_array_equal(narrow(wide, "bfloat16"), words)
        np.testing.assert_array_equal(lse, lse_w)
        outs.append((wide, lse))
    if len(outs) == 2:  # |P| <= 1 and each P within 2**-8 of the other's: |dO| <= 2**-7 max|v|
        vmax = np.abs(widen(w[2], "bfloat16")).max()
        np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=0, atol=2.0**-7 * vmax + 1e-6)
        np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-5)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.tuples(st.integers(-1, 40), st.integers(0, 8)), max_size=30),
       size=st.integers(1, 8), words=st.sampled_from([1, 4, 1024]))
def test_ring_slots_against_a_model(calls, size, words):
    """:func:`._pool._ring_slots` (the AMX forward's ring of paired value tiles) against a
    model of what each slot holds: a tile is said to be held exactly where its slot was
    last given that tile; one chunk's tiles never share a slot; ``at < 0`` (rows copied
    for one chunk) uses slots ``0 ..`` and forgets every tile held."""
    from sparse_patterns.kernels.cpu._pool import _ring_slots

    ring, slots, held = np.full(size, -1, np.int64), np.empty(8, np.int64), {}
    for start, ntile in calls:
        ntile = min(ntile, size)
        at = -1 if start < 0 else 3 * start  # tiles need not start on a multiple of words
        _ring_slots(ring, slots, at, np.empty(0, np.int64), ntile, words)
        if at < 0:
            assert slots[:ntile].tolist() == list(range(ntile))
            held = {}
            continue
        used = set()
        for t in range(ntile):
            s, new = (int(slots[t]), True) if slots[t] >= 0 else (-1 - int(slots[t]), False)
            assert 0 <= s < size and s not in used
            used.add(s)
            assert new == (held.get(s) != at + t * words)
            held[s] = at + t * words


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(0, 30), max_size=8, unique=True), max_size=20),
       size=st.integers(1, 8))
def test_ring_slot_of_tiles_anywhere_against_a_model(chunks, size):
    """:func:`._pool._ring_slot` on calls of tiles anywhere (the AMX backward's query
    tiles; 5 words each, so that some start within another's words): within a call no two
    tiles share a slot, and a tile is said to be held exactly where its slot holds it."""
    from sparse_patterns.kernels.cpu._pool import _ring_slot

    ring, held = np.full(size, -1, np.int64), {}
    for starts in chunks:
        used, taken = 0, set()
        for a in [3 * x for x in starts][:size]:
            code, used = _ring_slot(ring, used, a, 5)
            s, new = (code, True) if code >= 0 else (-1 - code, False)
            assert 0 <= s < size and s not in taken
            taken.add(s)
            assert new == (held.get(s) != a)
            held[s] = a
        assert used == sum(1 << s for s in taken)


@needs_amx
@pytest.mark.parametrize("item_blocks", [1, 3])
def test_amx_backward_on_work_items_of_few_blocks(item_blocks, monkeypatch):
    """Work items of a few blocks (strided's residue classes, a block each at stride 32):
    each item's rows take the buffer rows that the item before took, so the AMX
    backward's ring of paired q and dO tiles must start empty on each; the gradients
    are those of the default items (64 blocks, one item a head here), bit for bit."""
    from sparse_patterns.kernels.cpu import _schedule, backward_bf16

    g = torch.Generator().manual_seed(3)
    q, k, v, do = ((torch.randn(1, 2, 1024, 64, generator=g) * 2).to(torch.bfloat16)
                   for _ in range(4))
    w = [t.view(torch.int16).numpy() for t in (q, k, v, do)]
    grads = []
    for blocks in (_schedule._ITEM_BLOCKS, item_blocks):
        monkeypatch.setattr(_schedule, "_ITEM_BLOCKS", blocks)
        pl = plan(sps.make("strided", 1024, stride=32), mode="multihead", block=32)
        items = _schedule._backward_items(pl)[1]
        assert amx_applies(pl, 64) and (items[:, 1] - items[:, 0]).max() <= blocks
        o, lse = attention(q, k, v, pl, mode="multihead", scale=0.125, return_lse=True)
        o, lse = o.view(torch.int16).numpy(), lse.numpy()
        grads.append([np.array(x) for x in backward_bf16(*w[:3], o, lse, w[3], pl, scale=0.125,
                                                         amx=True)])
    for a, b in zip(*grads, strict=True):
        np.testing.assert_array_equal(a, b)


@needs_bf16_products
def test_amx_asked_for_where_absent_is_a_one_line_error(monkeypatch):
    """``forward_bf16(amx=True)`` where this process cannot run AMX: a ``ValueError``
    naming ``amx``, before any output is computed; ``amx_applies`` is then false."""
    from sparse_patterns.kernels.cpu import _bf16, forward_bf16

    monkeypatch.setattr(_bf16, "amx_here", lambda: False)
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", "auto")
    pl = plan(sps.make("strided", 64, stride=8), block=32)
    assert not amx_applies(pl, 32)
    w = np.zeros((1, 1, 64, 32), np.uint16)
    with pytest.raises(ValueError, match=r"^amx: .*amx=True") as err:
        forward_bf16(w, w, w, pl, scale=0.2, amx=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("n, d", [(1, 32), (63, 64), (130, 128), (6, 96)])
def test_delta_bf16_against_float64(n, d):
    """The bf16 backward's ``delta`` of a head's rows (d of one 16-lane step and of
    several, products widened in registers) is the float64 row sum of the widened
    products, within float32 summation error."""
    from sparse_patterns.kernels.cpu._rows import _delta_bf16

    rng = np.random.default_rng(n)
    do, o = ((rng.standard_normal((n, d), np.float32).view(np.uint32) >> 16).astype(np.uint16)
             for _ in range(2))
    out = np.full(n, np.nan, np.float32)
    _delta_bf16(*(w.reshape(-1).view(np.float32) for w in (do, o)), n, d // 2, out)
    wide = [(w.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for w in (do, o)]
    want = (wide[0] * wide[1]).sum(axis=1)
    scale = (np.abs(wide[0]) * np.abs(wide[1])).sum(axis=1)
    assert (np.abs(out - want) <= 1e-6 * scale).all()


@pytest.mark.parametrize("kind", ["torch bfloat16", "numpy float16"])
def test_half_outputs_in_recycled_arrays_stay_the_callers(kind):
    """Outputs of 1 MiB and more come from the kernel's recycled arrays: one still held is
    never written by a later call, and equals a fresh computation."""
    pat = sps.make("strided", 4096, stride=64)
    rng = np.random.default_rng(5)
    make = ((lambda a: torch.from_numpy(a).to(torch.bfloat16)) if kind.startswith("torch")
            else (lambda a: a.astype(np.float16)))
    ins = [[make(rng.standard_normal((1, 2, 4096, 64), dtype=np.float32)) for _ in range(3)]
           for _ in range(3)]
    first = attention(*ins[0], pat)
    words = (lambda t: t.view(torch.int16).numpy()) if kind.startswith("torch") else (
        lambda a: a.view(np.int16))
    keep = words(first).copy()
    second = attention(*ins[1], pat)
    addr = (lambda t: t.data_ptr()) if kind.startswith("torch") else (lambda a: a.ctypes.data)
    assert addr(first) != addr(second)
    np.testing.assert_array_equal(words(first), keep)
    del second  # its array goes back to the pool; the next call may write it
    third = attention(*ins[2], pat)
    np.testing.assert_array_equal(words(first), keep)
    again = attention(*ins[2], pat)
    assert (third == again).all() and third.dtype == again.dtype


@needs_bf16_products
def test_bf16_products_key_runs_from_an_odd_token(monkeypatch):
    """A piece whose key blocks are runs of tokens that start at an odd token (summary
    keys 0..31 and 33..64 of two documents): a ``P V`` step pairs keys 2p and 2p + 1 of
    the run, whatever their tokens. Golden failure of a layout that paired even tokens
    with the next: outputs off by 2.4."""
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", "products")
    pat = sps.make("global_tokens", 128, tokens=32, documents=[33, 95])
    assert 33 in sps.plan(pat, mode="multihead").kperm[0][32:64]
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, 2, 128, 32, generator=g).to(torch.bfloat16) for _ in range(4))
    out, lse = attention(q, k, v, pat, mode="multihead", return_lse=True)
    ref = attention(*(t.double() for t in (q, k, v)), pat, mode="multihead", impl="reference")
    bound = 2.0**-8 * ref.abs() + 2.0**-8 * v.double().abs().max() + 1e-5 * ref.abs().max()
    assert ((out.double() - ref).abs() <= bound).all()
    grads = attention_backward(q, k, v, out, lse, do, pat, mode="multihead")
    widened = attention_backward(*(t.float() for t in (q, k, v, out)), lse, do.float(), pat,
                                 mode="multihead")
    for got, want in zip(grads, widened, strict=True):
        err = (got.double() - want.double()).abs()
        assert (err <= 2.0**-8 * want.abs() + 2.0**-7 * want.abs().max()).all()


def test_bf16_mode_bad_value(monkeypatch):
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", "fast")
    q = torch.randn(1, 1, 64, 32).to(torch.bfloat16)
    with pytest.raises(ValueError, match="SPARSE_PATTERNS_BF16 must be one of auto, products, "
                                         "widen, got 'fast'"):
        attention(q, q, q, sps.make("strided", 64, stride=8))


@pytest.mark.parametrize(("n", "d", "block"), [(64, 48, 32), (80, 32, 32), (64, 32, 16)])
def test_bf16_products_asked_for_where_they_cannot_run(n, d, block, monkeypatch):
    """d or n not a multiple of 32, or 16-token tiles: widened to float32 even with
    ``SPARSE_PATTERNS_BF16=products``, as accurate as the widened path states."""
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", "products")
    pat = sps.make("strided", n, stride=8)
    assert not bf16_applies(sps.plan(pat, block=block), d)
    q, k, v = (torch.randn(1, 2, n, d).to(torch.bfloat16) for _ in range(3))
    out = attention(q, k, v, pat, block=block).double()
    ref = attention(*(t.double() for t in (q, k, v)), pat, impl="reference", block=block)
    assert ((out - ref).abs() <= 2.0**-8 * ref.abs() + 1e-5 * ref.abs().max()).all()


@pytest.mark.parametrize("path", BF16_PATHS)
def test_bf16_nan_and_inf_propagate(path, monkeypatch):
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", path)
    pat = sps.make("strided", 64, stride=8)
    q, k, v = (torch.randn(1, 2, 64, 32).to(torch.bfloat16) for _ in range(3))
    assert bf16_applies(sps.plan(pat, mode="multihead"), 32) == (path == "products")
    q[0, 1, 9, 3] = float("nan")
    v[0, 0, 40, 2] = float("inf")
    out = SparseAttention(pat)(q, k, v)
    assert out.dtype == torch.bfloat16
    assert torch.isnan(out[0, 1, 9]).all()
    # every row of head 0 that attends key 40 (pattern head 0) has a non-finite column 2
    rows = np.flatnonzero(pat.heads[0].toarray()[:, 40])
    assert rows.size and not torch.isfinite(out[0, 0, rows, 2]).any()


@pytest.mark.parametrize(("grad_dtype", "match"), [
    (torch.float32, "do: dtype float32 disagrees with q's bfloat16"),
    (torch.float16, "do: dtype float16 disagrees with q's bfloat16"),
])
def test_grad_dtype_must_match(grad_dtype, match):
    pat = sps.make("strided", 16, stride=4)
    q = torch.randn(1, 1, 16, 8).to(torch.bfloat16)
    out, lse = attention(q, q, q, pat, return_lse=True)
    with pytest.raises(ValueError, match=match):
        attention_backward(q, q, q, out, lse, out.to(grad_dtype), pat)


@pytest.mark.parametrize(("bad", "match"), [
    (torch.int32, "q: dtype int32 is not supported"),
    (torch.complex64, "q: dtype complex64 is not supported"),
])
def test_unsupported_dtypes(bad, match):
    pat = sps.make("strided", 16, stride=4)
    q = torch.zeros(1, 1, 16, 8, dtype=bad)
    with pytest.raises(ValueError, match=match):
        attention(q, q, q, pat)


def test_mixed_half_dtypes():
    pat = sps.make("strided", 16, stride=4)
    q = torch.randn(1, 1, 16, 8)
    with pytest.raises(ValueError, match="k: dtype float16 disagrees with q's bfloat16"):
        attention(q.to(torch.bfloat16), q.half(), q.to(torch.bfloat16), pat)


def test_fma_peak_arguments():
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
        fma_peak("float64")
    with pytest.raises(ValueError, match="threads must be an integer from 1 to"):
        fma_peak("float32", threads=0)


def test_bf16_peak_uses_vdpbf16ps_where_the_cpu_has_it():
    from sparse_patterns.kernels.cpu import _peak

    assert _peak._kind("bfloat16") == int(_llvm._AVX512_BF16)
    assert _peak._kind("float32") == 0
    assert _peak._kind("bfloat16-amx") == (2 if amx_here() else int(_llvm._AVX512_BF16))


@needs_amx
def test_amx_peak_counts_tile_products():
    """The AMX peak loop runs (four tiles of ``tdpbf16ps``, 16,384 FLOPs each) and is
    counted as such: well above the ``vdpbf16ps`` loop's 64 FLOPs an instruction
    (at least 4x on any AMX CPU: 16 cycles a ``tdpbf16ps`` against 1-2 a ``vdpbf16ps``)."""
    assert fma_peak("bfloat16-amx", 1) > 4 * fma_peak("bfloat16", 1)


def test_fallback_without_avx512_bf16(tmp_path):
    """On a CPU without AVX512_BF16 (numba told to compile for this CPU's features
    less that one, in a fresh numba cache): the conversions still round like torch,
    bf16 attention is widened to float32 even where bf16 products are asked for, as
    accurate, and the bf16 peak is the float32 one."""
    code = textwrap.dedent("""
        import numpy as np, torch, sparse_patterns as sps
        from sparse_patterns.kernels import attention
        from sparse_patterns.kernels.cpu import _llvm, fma_peak
        from sparse_patterns.kernels.cpu._convert import narrow
        assert not _llvm._AVX512_BF16
        x = (np.random.default_rng(0).standard_normal(1001) * 1e3).astype(np.float32)
        x[::7] = 1.00390625
        want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(narrow(x, "bfloat16"), want)
        pat = sps.make("strided", 64, stride=8)
        q = torch.randn(1, 2, 64, 32).to(torch.bfloat16)
        from sparse_patterns.kernels.cpu import amx_applies, bf16_applies
        assert not bf16_applies(sps.plan(pat), 32)  # even asked for products: widened
        assert not amx_applies(sps.plan(pat), 32)
        o16, lse = attention(q, q, q, pat, return_lse=True)
        from sparse_patterns.testing import attention_masks, attention_oracle
        out = o16.double().numpy()
        x = q.double().numpy()  # the float64 oracle (no float64 kernel to compile)
        ref, _ = attention_oracle(x, x, x, attention_masks(pat, "multihead", 2))
        assert (np.abs(out - ref) <= 2.0**-8 * np.abs(ref) + 1e-5).all()
        from sparse_patterns.kernels import attention_backward
        grads = attention_backward(q, q, q, o16, lse, q, pat)
        want = attention_backward(*(t.float() for t in (q, q, q, o16)), lse, q.float(), pat)
        assert all(torch.equal(a, b.to(torch.bfloat16)) for a, b in zip(grads, want))
        from sparse_patterns.kernels.cpu import _peak
        assert _peak._kind("bfloat16") == 0 and fma_peak("bfloat16", 1) > 1e9
        assert _peak._kind("bfloat16-amx") == 0
        print("ok")
    """)
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features().flatten()
    if "+avx512bf16" not in features and "+amx-bf16" not in features:
        pytest.skip("this CPU has neither AVX512_BF16 nor AMX-BF16: the whole suite runs the "
                    "fallback here, without a cold compile in a fresh cache")
    for f in ("avx512bf16", "amx-bf16", "amx-tile"):  # AMX (where there) goes too
        features = features.replace(f"+{f}", f"-{f}")
    env = dict(os.environ, NUMBA_CPU_NAME=llvm.get_host_cpu_name(), NUMBA_CPU_FEATURES=features,
               NUMBA_CACHE_DIR=str(tmp_path), SPARSE_PATTERNS_BF16="products")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "ok"


@pytest.mark.parametrize("path", [*BF16_PATHS, pytest.param("amx", marks=needs_amx)])
def test_profile_peak_follows_the_bf16_path(path, monkeypatch):
    """``patterns profile``'s % of peak for bfloat16 divides by the peak of the arithmetic
    that runs: AMX's where the forward takes it, ``vdpbf16ps`` on bf16 products, the
    float32 FMA peak where bf16 inputs are widened (an Intel Xeon's ``vdpbf16ps`` peak
    is half its float32 one)."""
    from sparse_patterns.profiling._machine import fma_peak_gflops

    bf16_path(monkeypatch, path)
    rate, what = fma_peak_gflops("bfloat16")
    if path == "amx":
        assert what.startswith("FMA peak bfloat16-amx") and rate == fma_peak("bfloat16-amx") / 1e9
    elif path == "products":
        assert what.startswith("FMA peak bfloat16") and rate == fma_peak("bfloat16") / 1e9
    else:
        assert "widened" in what and rate == fma_peak("float32") / 1e9
