"""Generators against the dense oracles, golden cases and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sparse_patterns as sps
from sparse_patterns import BlockLayout, Pattern, make
from sparse_patterns.testing import dense_oracle

# --------------------------------------------------------------------- golden
# Written out by hand from the definitions (n = 16, l = 4).
STRIDED_16_4 = {
    # i: (A1 = {max(0, i-4) .. i}, A2 = {j <= i : (i-j) % 4 == 0})
    0: ([0], [0]),
    3: ([0, 1, 2, 3], [3]),
    4: ([0, 1, 2, 3, 4], [0, 4]),
    9: ([5, 6, 7, 8, 9], [1, 5, 9]),
    15: ([11, 12, 13, 14, 15], [3, 7, 11, 15]),
}
FIXED_16_4_1 = {
    # i: (A1 = same block of 4, j <= i; A2 = {j <= i : j % 4 == 3})
    0: ([0], []),
    3: ([0, 1, 2, 3], [3]),
    6: ([4, 5, 6], [3]),
    11: ([8, 9, 10, 11], [3, 7, 11]),
    14: ([12, 13, 14], [3, 7, 11]),
}


def _row(m, i):
    return m.indices[m.indptr[i] : m.indptr[i + 1]].tolist()


@pytest.mark.parametrize(("name", "params", "golden"), [
    ("strided", {"stride": 4}, STRIDED_16_4),
    ("fixed", {"stride": 4, "c": 1}, FIXED_16_4_1),
])
def test_golden(name, params, golden):
    pat = make(name, 16, **params)
    for i, (a1, a2) in golden.items():
        assert _row(pat.heads[0], i) == a1
        assert _row(pat.heads[1], i) == a2


def test_golden_picture():
    # the union of strided(16, 4) as text, row 9 checked by hand: 1 5 6 7 8 9
    lines = make("strided", 16, stride=4).to_string().splitlines()
    assert lines[9] == ".2...#111#......"


def test_reference_window_union_equals_paper_union():
    a = make("strided", 50, stride=7).union()
    b = make("strided", 50, stride=7, window="reference").union()
    assert (a != b).nnz == 0
    assert make("strided", 50, stride=7, window="reference").heads[0][20].indices.tolist() == list(
        range(14, 21)
    )


def test_factorized_p2_is_strided_reference():
    n = 49
    f = make("factorized", n, p=2)
    s = make("strided", n, stride=7, window="reference")
    for a, b in zip(f.heads, s.heads, strict=True):
        assert (a != b).nnz == 0


# ------------------------------------------------------------ dense oracles
CASES = [
    ("full", {}),
    ("full", {"causal": False}),
    *[("strided", {"stride": s, "window": w, "causal": c})
      for s in (1, 2, 3, 4, 7, 40) for w in ("paper", "reference") for c in (True, False)],
    *[("fixed", {"stride": s, "c": c, "summary_heads": k, "causal": cz})
      for s, c, k in ((1, 1, 1), (4, 1, 1), (4, 2, 2), (5, 2, 1), (8, 2, 3), (40, 3, 2))
      for cz in (True, False)],
    *[("local", {"window": w, "causal": c}) for w in (0, 1, 3, 50) for c in (True, False)],
    *[("dilated", {"window": w, "dilation": d, "causal": c})
      for w, d in ((0, 1), (2, 3), (4, 2), (3, 40)) for c in (True, False)],
    *[("factorized", {"p": p, "causal": c}) for p in (1, 2, 3, 4) for c in (True, False)],
    *[("longformer", {"window": w, "global_tokens": g, "dilation": d, "causal": c})
      for w, g, d in ((2, 1, 1), (3, 2, 2), (0, 0, 1)) for c in (True, False)],
]


@pytest.mark.parametrize("n", [1, 2, 5, 16, 37])
@pytest.mark.parametrize(("name", "params"), CASES, ids=lambda x: str(x))
def test_generator_matches_oracle(name, n, params):
    if name == "longformer":
        params = dict(params, global_tokens=min(params["global_tokens"], n))
    got = make(name, n, **params).to_dense()
    want = dense_oracle(name, n, **params)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("h", "w", "q", "m"), [(4, 4, 2, 1), (6, 5, 2, 2), (3, 8, 3, 0), (5, 5, 1, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_raster_patterns_match_oracle(h, w, q, m, causal):
    n = h * w
    got = make("local2d", n, height=h, width=w, query_block=q, memory=m, causal=causal)
    want = dense_oracle("local2d", n, height=h, width=w, query_block=q, memory=m, causal=causal)
    np.testing.assert_array_equal(got.to_dense(), want)
    got = make("axial2d", n, height=h, width=w, causal=causal)
    np.testing.assert_array_equal(got.to_dense(), dense_oracle("axial2d", n, height=h, width=w, causal=causal))


def test_bigbird_structure():
    n, b = 50, 4
    pat = make("bigbird", n, block=b, window_blocks=1, global_blocks=1, random_blocks=2, seed=3)
    assert pat == make("bigbird", n, block=b, window_blocks=1, global_blocks=1, random_blocks=2, seed=3)
    assert pat != make("bigbird", n, block=b, window_blocks=1, global_blocks=1, random_blocks=2, seed=4)
    d = pat.to_dense()
    nb = -(-n // b)
    i, j = np.indices((n, n))
    I, J = i // b, j // b
    np.testing.assert_array_equal(d[0], (np.abs(I - J) <= 1) & (j <= i))
    np.testing.assert_array_equal(d[1], ((I < 1) | (J < 1)) & (j <= i))
    lay = pat.to_blocks(b).layout[2]
    for r in range(nb):
        allowed = [c for c in range(r + 1) if abs(r - c) > 1 and c >= 1]
        assert lay[r].sum() == min(2, len(allowed))
        assert set(np.flatnonzero(lay[r])) <= set(allowed)
    assert not np.triu(d.any(0), 1).any()


# --------------------------------------------------------------- properties
names = st.sampled_from(["strided", "fixed", "local", "dilated", "factorized", "longformer", "full"])


@st.composite
def registered(draw):
    name = draw(names)
    n = draw(st.integers(1, 70))
    causal = draw(st.booleans())
    if name == "strided":
        params = {"stride": draw(st.integers(1, 80)), "window": draw(st.sampled_from(["paper", "reference"]))}
    elif name == "fixed":
        s = draw(st.integers(1, 30))
        c = draw(st.integers(1, s))
        params = {"stride": s, "c": c, "summary_heads": draw(st.integers(1, s // c))}
    elif name == "local":
        params = {"window": draw(st.integers(0, 80))}
    elif name == "dilated":
        params = {"window": draw(st.integers(0, 10)), "dilation": draw(st.integers(1, 10))}
    elif name == "factorized":
        params = {"p": draw(st.integers(1, 4))}
    elif name == "longformer":
        params = {"window": draw(st.integers(0, 10)), "global_tokens": draw(st.integers(0, n))}
    else:
        params = {}
    return name, n, dict(params, causal=causal)


@given(registered())
def test_properties(case):
    name, n, params = case
    pat = make(name, n, **params)
    d = pat.to_dense()
    np.testing.assert_array_equal(d, dense_oracle(name, n, **params))
    if pat.causal:
        assert not np.triu(d.any(0), 1).any()
    assert d.any(0)[np.arange(n), np.arange(n)].all(), "every position attends to itself"
    counts = pat.row_counts()
    np.testing.assert_array_equal(counts[:-1], d.sum(axis=2))
    np.testing.assert_array_equal(counts[-1], d.any(0).sum(axis=1))
    i = np.arange(n)
    if name == "strided" and pat.causal:
        l = params["stride"]
        w = l if params["window"] == "paper" else l - 1
        np.testing.assert_array_equal(counts[0], np.minimum(i, w) + 1)
        np.testing.assert_array_equal(counts[1], i // l + 1)
    if name == "fixed" and pat.causal:
        np.testing.assert_array_equal(counts[0], i % params["stride"] + 1)
    if name == "full" and pat.causal:
        np.testing.assert_array_equal(counts[0], i + 1)
    assert pat.nnz == d.any(0).sum()
    assert make(pat.name, n, **dict(pat.params)) == pat, "params regenerate the pattern"


@given(registered(), st.integers(1, 20))
def test_closed_form_blocks_match_pooling(case, block):
    name, n, params = case
    pat = make(name, n, **params)
    fast = pat.to_blocks(block)
    slow = BlockLayout.from_pattern(Pattern(pat.heads, causal=pat.causal), block)
    np.testing.assert_array_equal(fast.layout, slow.layout)
    np.testing.assert_array_equal(fast.full, slow.full)


@given(st.integers(1, 60), st.integers(1, 6), st.integers(0, 2), st.integers(0, 2), st.integers(0, 3), st.booleans())
def test_bigbird_blocks_match_pooling(n, block, wb, gb, rb, causal):
    pat = make("bigbird", n, block=block, window_blocks=wb, global_blocks=gb, random_blocks=rb, causal=causal)
    fast = pat.to_blocks(block)
    slow = BlockLayout.from_pattern(Pattern(pat.heads, causal=causal), block)
    np.testing.assert_array_equal(fast.layout, slow.layout)
    np.testing.assert_array_equal(fast.full, slow.full)


@given(registered(), st.integers(1, 9))
def test_block_expansion_covers_pattern(case, block):
    name, n, params = case
    pat = make(name, n, **params)
    bl = pat.to_blocks(block)
    back = Pattern.from_blocks(bl, causal=pat.causal).to_dense()
    d = pat.to_dense()
    assert not (d & ~back).any(), "Kronecker expansion of the max-pooled layout covers the pattern"
    # full blocks are exactly the tiles where the pattern is complete
    nb = bl.nb
    for h in range(pat.num_heads):
        for I in range(nb):
            for J in range(nb):
                tile = d[h, I * block:(I + 1) * block, J * block:(J + 1) * block]
                assert bl.layout[h, I, J] == tile.any()
                assert bl.full[h, I, J] == tile.all()


def test_block_aligned_round_trip_is_exact():
    pat = make("fixed", 64, stride=8, c=8)  # every tile of 8 is all-or-nothing up to the causal mask
    back = Pattern.from_blocks(pat.to_blocks(8), causal=True)
    np.testing.assert_array_equal(back.to_dense(), pat.to_dense())


# ------------------------------------------------------------- core types
def test_pattern_is_immutable():
    pat = make("strided", 16, stride=4)
    with pytest.raises((ValueError, AttributeError)):
        pat.heads[0].indices[0] = 3
    with pytest.raises(AttributeError):
        pat.n = 3
    with pytest.raises(TypeError):
        pat.params["stride"] = 3


def test_pattern_validation():
    import scipy.sparse as sp

    with pytest.raises(ValueError, match="heads: a pattern needs at least one head"):
        Pattern([])
    with pytest.raises(ValueError, match=r"heads\[0\]: must be square"):
        Pattern([sp.csr_matrix((2, 3), dtype=bool)])
    with pytest.raises(ValueError, match=r"heads\[1\]: has n=3 but heads\[0\] has n=2"):
        Pattern([sp.eye(2, format="csr"), sp.eye(3, format="csr")])
    with pytest.raises(ValueError, match=r"causal pattern has entry \(i=0, j=1\)"):
        Pattern([sp.csr_matrix(np.array([[1, 1], [0, 1]]))])
    # duplicates and unsorted indices are canonicalized
    m = sp.csr_matrix((np.ones(3), np.array([1, 0, 1]), np.array([0, 0, 3])), shape=(2, 2))
    pat = Pattern([m])
    assert pat.heads[0].indices.tolist() == [0, 1] and pat.heads[0].dtype == bool
    assert Pattern.from_dense(np.ones((3, 3), bool)).causal is False


def test_to_dense_limit():
    with pytest.raises(ValueError, match="n: to_dense would allocate"):
        make("local", 1 << 15, window=2).to_dense()
    with pytest.raises(ValueError, match="n: to_string draws n <= 64"):
        make("local", 65, window=2).to_string()


def test_block_layout_validation():
    with pytest.raises(ValueError, match=r"layout: has nb=2 but ceil\(n / block\)"):
        BlockLayout(np.ones((1, 2, 2), bool), block=2, n=5)
    with pytest.raises(ValueError, match="block: must be an integer >= 1"):
        BlockLayout(np.ones((1, 2, 2), bool), block=0, n=4)
    with pytest.raises(ValueError, match="full: a block marked full is not set"):
        BlockLayout(np.zeros((1, 2, 2), bool), block=2, n=4, full=np.ones((1, 2, 2), bool))


def test_large_closed_form_layout_without_csr():
    pat = make("fixed", 2**20, stride=1024, c=32)
    bl = pat.to_blocks(128)
    assert bl.layout.shape == (2, 8192, 8192)
    assert pat._heads is None, "the layout came from the closed form, not the CSR"


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("name", "n", "params", "match"), [
    ("strided", 0, {"stride": 4}, r"n: must be an integer \[1, "),
    ("strided", -3, {"stride": 4}, r"n: must be an integer"),
    ("strided", 16, {"stride": 0}, r"stride: must be an integer >= 1, got 0"),
    ("strided", 16, {"stride": 2.5}, r"stride: must be an integer >= -\d+, got 2.5|stride: must be an integer"),
    ("strided", 16, {"stride": "four"}, r"stride: must be an integer or 'sqrt'/'cbrt', got 'four'"),
    ("strided", 16, {"window": "wide"}, r"window: must be one of 'paper', 'reference'; got 'wide'"),
    ("fixed", 16, {"stride": 4, "c": 0}, r"c: must be an integer \[1, 4\], got 0"),
    ("fixed", 16, {"stride": 4, "c": 5}, r"c: must be an integer \[1, 4\], got 5"),
    ("fixed", 16, {"stride": 4, "c": 2, "summary_heads": 3}, r"summary_heads: k \* c must be <= stride \(4\)"),
    ("nope", 16, {}, r"name: unknown pattern 'nope'; known: "),
    ("strided", 16, {"c": 2}, r"c: pattern 'strided' takes no parameter 'c'; it takes: stride, window, causal"),
    ("local2d", 15, {}, r"height: n=15 is not a square"),
    ("axial2d", 16, {"height": 3, "width": 5}, r"height: height \* width must equal n=16; got 3 x 5"),
    ("strided", 16, {"causal": "maybe"}, r"causal: must be true or false, got 'maybe'"),
])
def test_bad_input(name, n, params, match):
    with pytest.raises(ValueError, match=match):
        make(name, n, **params)


def test_generators_are_exported():
    from sparse_patterns.patterns import resolve

    for name in sps.REGISTRY:
        assert getattr(sps, name)(16, **resolve(name, 16, {})) == make(name, 16)


@given(n=st.integers(1, 300), stride=st.integers(1, 80), c=st.integers(1, 12),
       k=st.integers(1, 4), causal=st.booleans())
def test_fixed_head_nnz_in_closed_form_equals_the_csr(n, stride, c, k, causal):
    """fixed's ``head_nnz`` comes from its rule in O(k), without counts: each head's
    entries of the built CSR."""
    if c > stride or k * c > stride:
        return
    pat = make("fixed", n, stride=stride, c=c, summary_heads=k, causal=causal)
    got = pat.head_nnz
    assert not pat.materialized and pat._counts is None  # no counts, no CSR were made
    assert got == tuple(h.nnz for h in pat.heads)
