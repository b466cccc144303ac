"""NaN and inf reach exactly the rows that attend them, in every backend.

Against the dense float64 reference (``impl="reference"`` on the same values,
its IEEE arithmetic on each row's own pairs): for one NaN or inf in ``v``, a NaN
in ``k`` or a ``-inf`` in ``q``, the set of non-finite rows of ``out``, ``lse``,
``dq``, ``dk`` and ``dv`` equals the reference's, and every finite row matches
it to the dtype's tolerance; on strided (merged and multihead), fixed, local and
packed documents, for the CPU backends (numba, reference, torch; flex on a few
float64 cases, eager). The row and column decoding of
:mod:`sparse_patterns.kernels.exact_rows` is checked against the pattern's own
CSR rows; a hypothesis property puts one non-finite entry anywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sparse_patterns as sps
from sparse_patterns.kernels import attention, attention_backward, plan
from sparse_patterns.kernels.exact_rows import key_queries, nonfinite_rows, row_keys

PATTERNS = {
    "strided-merged": (sps.make("strided", 48, stride=6), "merged"),
    "strided-multihead": (sps.make("strided", 48, stride=6), "multihead"),
    "fixed": (sps.make("fixed", 48, stride=8, c=2), "merged"),
    "local": (sps.make("local", 48, window=5), "multihead"),
    "documents": (sps.make("strided", 48, stride=4, documents=[17, 21, 10]), "merged"),
}

#: where the one non-finite entry goes: (array, b, h, i, c, value)
INPUTS = {
    "nan-v": ("v", 0, 0, 13, 3, np.nan),
    "inf-v": ("v", 0, 1, 30, 0, np.inf),
    "nan-k": ("k", 0, 0, 22, 1, np.nan),
    "neginf-q": ("q", 0, 1, 19, 2, -np.inf),
}

TOL = {np.float64: (1e-10, 1e-12), np.float32: (2e-5, 2e-6)}


def _inputs(n: int, where: tuple, seed: int = 0, d: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = {name: rng.standard_normal((1, 2, n, d)) for name in ("q", "k", "v", "do")}
    name, b, h, i, c, val = where
    x[name][b, h, i, c] = val
    return x


def _check(got: np.ndarray, want: np.ndarray, dtype: type, what: str) -> None:
    got = np.asarray(got, dtype=np.float64)
    bad_got = ~np.isfinite(got).all(axis=-1) if got.ndim == 4 else ~np.isfinite(got)
    bad_want = ~np.isfinite(want).all(axis=-1) if want.ndim == 4 else ~np.isfinite(want)
    if got.ndim == 3:  # lse: -inf (no keys) is a value, not a contamination
        bad_got = np.isnan(got) | (got == np.inf)
        bad_want = np.isnan(want) | (want == np.inf)
    np.testing.assert_array_equal(np.argwhere(bad_got), np.argwhere(bad_want), err_msg=what)
    rtol, atol = TOL[dtype]
    kept = want[~bad_want]
    scale = max(1.0, float(np.abs(kept[np.isfinite(kept)]).max(initial=0.0)))
    np.testing.assert_allclose(got[~bad_want], want[~bad_want], rtol=rtol, atol=atol * scale,
                               err_msg=what)


def _reference(x: dict[str, np.ndarray], pat, mode: str):
    out, lse = attention(x["q"], x["k"], x["v"], pat, mode=mode, impl="reference",
                         return_lse=True)
    grads = attention_backward(x["q"], x["k"], x["v"], out, lse, x["do"], pat, mode=mode,
                               impl="reference")
    return out, lse, grads


def _run_case(impl: str, case: str, inp: str, dtype: type) -> None:
    pat, mode = PATTERNS[case]
    x = _inputs(pat.n, INPUTS[inp])
    out_r, lse_r, grads_r = _reference(x, pat, mode)
    a = {k: v.astype(dtype) for k, v in x.items()}
    out, lse = attention(a["q"], a["k"], a["v"], pat, mode=mode, impl=impl, return_lse=True)
    _check(out, out_r, dtype, "out")
    _check(lse, lse_r, dtype, "lse")
    grads = attention_backward(a["q"], a["k"], a["v"], out, lse, a["do"], pat, mode=mode,
                               impl=impl)
    for name, g, gr in zip(("dq", "dk", "dv"), grads, grads_r, strict=True):
        _check(g, gr, dtype, name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("inp", list(INPUTS))
@pytest.mark.parametrize("case", list(PATTERNS))
@pytest.mark.parametrize("impl", ["numba", "reference"])
def test_nonfinite_rows_match_reference(impl: str, case: str, inp: str, dtype: type) -> None:
    _run_case(impl, case, inp, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("inp", list(INPUTS))
@pytest.mark.parametrize("case", list(PATTERNS))
def test_nonfinite_rows_match_reference_torch(case: str, inp: str, dtype: type) -> None:
    pytest.importorskip("torch.nn.attention.flex_attention")
    _run_case("torch", case, inp, dtype)


@pytest.mark.parametrize("inp", ["nan-v", "nan-k"])
def test_nonfinite_rows_match_reference_flex(inp: str) -> None:
    """FlexAttention, eager on the CPU in float64 (float32 would compile)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    _run_case("flex", "strided-merged", inp, np.float64)


def test_torch_tensors_in_and_out() -> None:
    """Tensors are repaired in place as arrays are; the result stays a tensor."""
    torch = pytest.importorskip("torch")
    pat, mode = PATTERNS["documents"]
    x = _inputs(pat.n, INPUTS["nan-v"])
    out_r, lse_r, _ = _reference(x, pat, mode)
    t = {k: torch.from_numpy(v.astype(np.float32)) for k, v in x.items()}
    out, lse = attention(t["q"], t["k"], t["v"], pat, mode=mode, impl="numba", return_lse=True)
    assert isinstance(out, torch.Tensor)
    _check(out.numpy(), out_r, np.float32, "out")
    _check(lse.numpy(), lse_r, np.float32, "lse")


@pytest.mark.parametrize("impl", ["numba", "torch"])
def test_sparse_attention_gradients(impl: str) -> None:
    """The autograd function's gradients are exact row by row too: numba's backward, and
    torch's (differentiated by autograd unless a row is not finite)."""
    torch = pytest.importorskip("torch")
    if impl == "torch":
        pytest.importorskip("torch.nn.attention.flex_attention")
    from sparse_patterns.torch import sparse_attention

    pat, mode = PATTERNS["strided-merged"]
    x = _inputs(pat.n, INPUTS["inf-v"])
    out_r, _, grads_r = _reference(x, pat, mode)
    t = {k: torch.from_numpy(v.copy()).requires_grad_(k != "do") for k, v in x.items()}
    out = sparse_attention(t["q"], t["k"], t["v"], pat, mode=mode, impl=impl)
    out.backward(t["do"])
    _check(out.detach().numpy(), out_r, np.float64, "out")
    for name, gr in zip("qkv", grads_r, strict=True):
        _check(t[name].grad.numpy(), gr, np.float64, f"d{name}")


@pytest.mark.parametrize("impl", ["numba", "torch"])
def test_float16_products_that_overflow_float16_stay_finite(impl: str) -> None:
    """q.k of 4e5 overflows float16 (max 65504): the backends compute it in float32."""
    torch = pytest.importorskip("torch")
    if impl == "torch":
        pytest.importorskip("torch.nn.attention.flex_attention")
    pat, mode = PATTERNS["strided-multihead"]
    rng = np.random.default_rng(3)
    q = (rng.choice([-1.0, 1.0], (1, 2, pat.n, 8)) * 250).astype(np.float16)
    k = (rng.choice([-1.0, 1.0], (1, 2, pat.n, 8)) * 250).astype(np.float16)
    v = rng.standard_normal((1, 2, pat.n, 8)).astype(np.float16)
    ref = attention(*(a.astype(np.float64) for a in (q, k, v)), pat, mode=mode,
                    impl="reference", scale=1.0)
    out = attention(*(torch.from_numpy(a) for a in (q, k, v)), pat, mode=mode, impl=impl,
                    scale=1.0)
    out = out.float().numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=2**-10, atol=2**-10 * np.abs(ref).max())


@pytest.mark.parametrize("case", ["strided-merged", "local", "documents"])
def test_row_keys_and_key_queries_are_the_pattern(case: str) -> None:
    """The pairs decoded from the plan's tiles are the pattern's CSR rows and columns."""
    pat, mode = PATTERNS[case]
    for block in (4, 32):
        pl = plan(pat, block=block, mode=mode)
        mats = [pat.union().tocsr()] if mode == "merged" else [h.tocsr() for h in pat.heads]
        rows = np.arange(pat.n)
        for g, m in enumerate(mats):
            ptr, keys = row_keys(pl, g, rows)
            cptr, qs = key_queries(pl, g, rows)
            mt = m.T.tocsr()
            for i in range(pat.n):
                assert sorted(keys[ptr[i]:ptr[i + 1]].tolist()) == \
                    m.indices[m.indptr[i]:m.indptr[i + 1]].tolist()
                assert sorted(qs[cptr[i]:cptr[i + 1]].tolist()) == \
                    sorted(mt.indices[mt.indptr[i]:mt.indptr[i + 1]].tolist())


def test_all_finite_reports_nothing_and_overflowing_sums_only_cost_a_check() -> None:
    x = np.full((1, 2, 8, 4), 3e38, np.float32)  # every sum overflows; every value finite
    rows = nonfinite_rows(x)
    assert rows.shape == (16, 3)  # reported, and recomputing them changes nothing
    assert nonfinite_rows(np.ones((1, 2, 8, 4), np.float32)).shape == (0, 3)
    lse = np.zeros((1, 2, 8))
    lse[0, 1, 3] = -np.inf  # a row without keys is not a contamination
    assert nonfinite_rows(np.ones((1, 2, 8, 4)), lse=lse).shape == (0, 3)


def test_overflowing_finite_rows_are_kept() -> None:
    """Huge finite values: the check reports the rows, the recomputation keeps them."""
    pat = sps.make("local", 16, window=3)
    v = np.full((1, 1, 16, 4), 3e38, np.float32)
    q = np.zeros((1, 1, 16, 4), np.float32)
    out = attention(q, q, v, pat, impl="numba")
    np.testing.assert_allclose(out, v, rtol=1e-6)


@given(st.sampled_from(["q", "k", "v"]), st.integers(0, 1), st.integers(0, 39),
       st.integers(0, 7), st.sampled_from([np.nan, np.inf, -np.inf]),
       st.sampled_from(["merged", "multihead"]))
def test_one_nonfinite_entry_anywhere(name: str, h: int, i: int, c: int, val: float,
                                      mode: str) -> None:
    pat = sps.make("strided", 40, stride=5, documents=[13, 27])
    x = _inputs(pat.n, (name, 0, h, i, c, val), seed=7)
    out_r, lse_r, grads_r = _reference(x, pat, mode)
    out, lse = attention(x["q"], x["k"], x["v"], pat, mode=mode, impl="numba", return_lse=True)
    _check(out, out_r, np.float64, "out")
    _check(lse, lse_r, np.float64, "lse")
    grads = attention_backward(x["q"], x["k"], x["v"], out, lse, x["do"], pat, mode=mode,
                               impl="numba")
    for gname, g, gr in zip(("dq", "dk", "dv"), grads, grads_r, strict=True):
        _check(g, gr, np.float64, gname)
