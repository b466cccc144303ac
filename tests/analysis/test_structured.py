"""The structured verification (offsets, periodic) against the generic token-level ``verify``.

Every family it covers (strided with both windows, local, dilated, fixed with c
and summary heads), every mode, with and without the residual, causal and
bidirectional, on n below, at and above the period, multiples or not.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from sparse_patterns import make
from sparse_patterns.analysis import verify
from sparse_patterns.analysis.structured import (
    StructuredResult,
    fixed_hops,
    offset_hops,
    offsets_of,
    structured_hops,
)
from sparse_patterns.testing import dense_oracle

MODE_CASES = [  # (mode, p offset from the number of heads or an absolute p)
    ("interleaved", None), ("merged", None), ("multihead", None), ("interleaved", 1), ("merged", 3),
]


def check_same(pat, mode, p, residual):
    """The structured result equals the generic report field by field."""
    if mode == "interleaved" and p is not None and p > pat.num_heads:
        p = pat.num_heads
    want = verify(pat, p=p, mode=mode, residual=residual, depth=True, method="generic")
    got = structured_hops(pat, p=p, mode=mode, residual=residual, depth=True)
    assert isinstance(got, StructuredResult)
    what = (pat.name, dict(pat.params), pat.n, mode, p, residual)
    assert got.hops == want.hops, what
    assert got.hops_histogram[0] == 0, what
    assert (got.ok, got.criterion1, got.criterion2) == (want.ok, want.criterion1, want.criterion2), what
    assert (got.unreachable, got.not_in_last) == (want.unreachable, want.not_in_last), what
    assert got.counterexample == want.counterexample, what
    assert got.counterexample1 == want.counterexample1, what
    assert got.counterexample2 == want.counterexample2, what
    assert (got.depth, got.depth_checked) == (want.depth, want.depth_checked), what
    assert (got.p, got.mode, got.residual, got.n, got.causal, got.targets) == (
        want.p, want.mode, want.residual, want.n, want.causal, want.targets), what
    ks = [k for k, v in want.hops.items() if v]
    assert got.max_hops == (max(ks) if ks else None), what


def all_modes(pat):
    for (mode, p), residual in itertools.product(MODE_CASES, (True, False)):
        check_same(pat, mode, p, residual)


# ------------------------------------------------------------------------ families
NS = (1, 2, 3, 5, 8, 16, 17, 31, 64, 100)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", ["paper", "reference"])
@pytest.mark.parametrize("stride", [1, 2, 3, 5, 8])
def test_strided(stride, window, causal):
    for n in NS:
        all_modes(make("strided", n, stride=stride, window=window, causal=causal))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [0, 1, 3, 7])
def test_local(window, causal):
    for n in NS:
        all_modes(make("local", n, window=window, causal=causal))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("window", "dilation"), [(0, 2), (1, 2), (3, 2), (2, 3), (4, 1), (3, 5)])
def test_dilated(window, dilation, causal):
    for n in NS:
        all_modes(make("dilated", n, window=window, dilation=dilation, causal=causal))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("stride", "c", "heads"), [
    (1, 1, 1), (2, 1, 1), (2, 1, 2), (4, 1, 1), (4, 2, 2), (5, 2, 1), (8, 1, 3), (8, 3, 2), (8, 8, 1),
])
def test_fixed(stride, c, heads, causal):
    for n in NS:
        all_modes(make("fixed", n, stride=stride, c=c, summary_heads=heads, causal=causal))


@pytest.mark.parametrize(("name", "params", "n"), [
    ("strided", {"stride": 45}, 2000),
    ("strided", {"stride": 31, "window": "reference"}, 1999),
    ("strided", {"stride": 12, "causal": False}, 700),
    ("local", {"window": 40}, 1500),
    ("local", {"window": 9, "causal": False}, 1100),
    ("dilated", {"window": 6, "dilation": 7}, 1300),
    ("fixed", {"stride": 45, "c": 4}, 2000),
    ("fixed", {"stride": 40, "c": 3, "summary_heads": 3}, 1999),
    ("fixed", {"stride": 64, "c": 8, "causal": False}, 1000),
    ("fixed", {"stride": 100, "c": 5, "summary_heads": 2, "causal": False}, 1234),
])
def test_larger_n(name, params, n):
    pat = make(name, n, **params)
    for mode, residual in [("interleaved", True), ("merged", False), ("interleaved", False)]:
        check_same(pat, mode, None, residual)


@settings(max_examples=40, deadline=None)
@given(
    family=st.sampled_from(["strided", "local", "dilated", "fixed"]),
    n=st.integers(1, 300),
    a=st.integers(1, 24),
    b=st.integers(1, 6),
    causal=st.booleans(),
    mode=st.sampled_from(["interleaved", "merged"]),
    residual=st.booleans(),
)
def test_random(family, n, a, b, causal, mode, residual):
    if family == "strided":
        pat = make("strided", n, stride=a, window="paper" if b % 2 else "reference", causal=causal)
    elif family == "local":
        pat = make("local", n, window=a - 1, causal=causal)
    elif family == "dilated":
        pat = make("dilated", n, window=a % 7, dilation=b, causal=causal)
    else:
        c = max(1, a // b)
        pat = make("fixed", n, stride=a, c=c, summary_heads=max(1, min(b, a // c)), causal=causal)
    check_same(pat, mode, None, residual)


def heads_from_offsets(n, offsets):
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return [sp.csr_matrix(np.isin(i - j, d)) for d in offsets]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    offsets=st.lists(st.lists(st.integers(-12, 12), min_size=1, max_size=5), min_size=1, max_size=3),
    mode=st.sampled_from(["interleaved", "merged"]),
    p=st.integers(1, 4),
    residual=st.booleans(),
)
def test_random_offsets(n, offsets, mode, p, residual):
    """Arbitrary offset sets (detours beyond the band need the boundary columns) against verify."""
    offsets = [np.array(d) for d in offsets]
    heads = heads_from_offsets(n, offsets)
    if all(h.nnz == 0 for h in heads):
        return
    p = min(p, len(heads)) if mode == "interleaved" else p
    causal = all(sp.triu(h, 1).nnz == 0 for h in heads)
    if causal:
        offsets = [d[d >= 0] for d in offsets]
    want = verify(heads, p=p, mode=mode, residual=residual, depth=True)
    got = offset_hops(n, offsets, p=p, mode=mode, residual=residual, causal=causal, depth=True)
    assert got.hops == want.hops
    assert (got.ok, got.criterion1, got.criterion2) == (want.ok, want.criterion1, want.criterion2)
    assert (got.unreachable, got.not_in_last) == (want.unreachable, want.not_in_last)
    assert (got.counterexample1, got.counterexample2) == (want.counterexample1, want.counterexample2)
    assert (got.depth, got.depth_checked, got.targets) == (want.depth, want.depth_checked, want.targets)


# ------------------------------------------------------------------------- helpers
@pytest.mark.parametrize(("name", "params"), [
    ("strided", {"stride": 3}), ("strided", {"stride": 4, "window": "reference", "causal": False}),
    ("local", {"window": 2}), ("local", {"window": 3, "causal": False}),
    ("dilated", {"window": 2, "dilation": 3}), ("dilated", {"window": 1, "dilation": 4, "causal": False}),
])
def test_offsets_of_rebuild_the_heads(name, params):
    n = 23
    pat = make(name, n, **params)
    want = dense_oracle(name, n, **params)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    for h, d in enumerate(offsets_of(pat)):
        assert np.array_equal(np.isin(i - j, d), want[h])


def test_depth_beyond_p():
    r = offset_hops(64, [np.arange(3)], p=2, mode="merged")
    assert not r.ok and r.depth == 32 and r.depth_checked
    r = offset_hops(64, [np.arange(3)], p=2, mode="merged", causal=False, depth=False)
    assert r.depth is None and not r.depth_checked


def test_structured_hops_declines():
    assert structured_hops(make("bigbird", 32)) is None
    pat = make("strided", 16, stride=4)
    assert structured_hops(pat.with_heads(pat.heads)) is None  # no rule: a user layout


def test_bad_input():
    with pytest.raises(ValueError, match="offsets"):
        offset_hops(8, [])
    with pytest.raises(ValueError, match="offsets"):
        offset_hops(8, [np.array([-1, 0])])
    with pytest.raises(ValueError, match="offsets"):
        offset_hops(8, [np.array([9])])
    with pytest.raises(ValueError, match="mode"):
        offset_hops(8, [np.arange(2)], mode="bogus")
    with pytest.raises(ValueError, match="p"):
        offset_hops(8, [np.arange(2)], p=2)
    with pytest.raises(ValueError, match="summary_heads"):
        fixed_hops(8, 4, c=2, summary_heads=3)
    with pytest.raises(ValueError, match="c"):
        fixed_hops(8, 4, c=5)
    with pytest.raises(ValueError, match="pattern"):
        offsets_of(make("fixed", 8, stride=4))
