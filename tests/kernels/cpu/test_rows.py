"""Row ranges of a pattern, the memory guard of the whole CSR, and streamed consumers.

Every row range is compared with the rows of the materialized CSR (built by the
generator's ``build``), which tests/patterns/test_patterns.py compares with the dense
oracle: so ``rows`` is checked against an independent reference transitively.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from sparse_patterns import BlockLayout, Pattern, config, make
from sparse_patterns.config import MemoryLimitError

FAMILIES = [
    ("full", {}),
    ("strided", {"stride": 5}),
    ("strided", {"stride": 4, "window": "reference"}),
    ("fixed", {"stride": 6, "c": 2, "summary_heads": 2}),
    ("local", {"window": 3}),
    ("dilated", {"window": 3, "dilation": 2}),
    ("factorized", {"p": 3}),
    ("longformer", {"window": 2, "global_tokens": 2, "dilation": 2}),
    ("axial2d", {"height": 7, "width": 7}),
    ("local2d", {"height": 7, "width": 7}),
    ("bigbird", {"block": 4, "window_blocks": 3, "global_blocks": 1, "random_blocks": 1}),
]


def _generated(name: str, params: dict, causal: bool) -> Pattern:
    return make(name, 49, **params, causal=causal)


def _same(a: sp.csr_matrix, b: sp.csr_matrix) -> None:
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("name", "params"), FAMILIES, ids=lambda x: str(x))
def test_rows_equal_the_materialized_rows(name, params, causal, data):
    lazy = _generated(name, params, causal)
    whole = _generated(name, params, causal)
    heads, union = whole.heads, whole.union()
    n = whole.n
    start = data.draw(st.integers(0, n), label="start")
    stop = data.draw(st.integers(start, n), label="stop")
    for k in range(whole.num_heads):
        _same(lazy.rows(start, stop, head=k), heads[k][start:stop])
    _same(lazy.rows(start, stop), union[start:stop])
    assert not lazy.materialized or lazy.rule is None or lazy.rule.rows is None


@settings(max_examples=20, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("name", "params"), FAMILIES, ids=lambda x: str(x))
def test_rows_of_any_tokens_equal_the_materialized_rows(name, params, causal, data):
    lazy = _generated(name, params, causal)
    heads = _generated(name, params, causal).heads
    i = np.array(data.draw(st.lists(st.integers(0, 48), max_size=30), label="i"), dtype=np.int64)
    got = lazy.rows_of(i)
    assert len(got) == len(heads) and not lazy.materialized
    for m, h in zip(got, heads, strict=True):
        _same(m, h[i])


def test_rows_of_without_take_reads_runs_of_rows():
    """A rule with row ranges only answers rows_of through runs of consecutive tokens."""
    from sparse_patterns.pattern import PatternRule

    base = make("strided", 30, stride=5)
    rule = PatternRule(2, base.rule.build, rows=base.rule.rows)
    pat = Pattern.from_rule(rule, 30, name="strided-rows")
    i = np.array([3, 4, 5, 29, 0, 1, 17], dtype=np.int64)
    for m, h in zip(pat.rows_of(i), base.heads, strict=True):
        _same(m, h[i])
    assert all(m.shape == (0, 30) for m in pat.rows_of(np.empty(0, np.int64)))
    with pytest.raises(ValueError, match="i: token indices"):
        pat.rows_of([30])


@pytest.mark.parametrize(("name", "params"), FAMILIES, ids=lambda x: str(x))
def test_counts_nnz_density_without_the_csr_equal_the_csr(name, params):
    for causal in (True, False):
        lazy, whole = _generated(name, params, causal), _generated(name, params, causal)
        want = np.stack([*(np.diff(h.indptr) for h in whole.heads), np.diff(whole.union().indptr)])
        np.testing.assert_array_equal(lazy.row_counts(), want)
        assert lazy.nnz == whole.union().nnz
        assert lazy.head_nnz == tuple(h.nnz for h in whole.heads)
        assert lazy.density == whole.union().nnz / 49**2


@pytest.mark.parametrize("chunk", [1, 3, 8, 49])
def test_iter_rows_covers_every_row_once(chunk):
    pat = make("fixed", 49, stride=6, c=2)
    got = [sp.vstack(m) for m in zip(*(mats for _, _, mats in pat.iter_rows(chunk)), strict=True)]
    for g, h in zip(got, pat.heads, strict=True):
        _same(sp.csr_matrix(g), h)
    spans = [(a, b) for a, b, _ in pat.iter_rows(chunk)]
    assert spans[0][0] == 0 and spans[-1][1] == 49
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(spans, spans[1:], strict=False))


def test_user_layout_answers_rows_by_slicing():
    dense = np.tril(np.random.default_rng(3).random((30, 30)) < 0.3)
    pat = Pattern.from_dense(dense)
    assert pat.rule is None
    np.testing.assert_array_equal(pat.rows(10, 20).toarray(), dense[10:20])


@pytest.mark.parametrize("block", [1, 4, 7, 64])
def test_to_blocks_of_a_user_layout_in_small_chunks_equals_one_chunk(block, monkeypatch):
    dense = np.tril(np.random.default_rng(5).random((3, 50, 50)) < 0.2)
    pat = Pattern.from_dense(dense)
    whole = BlockLayout.from_pattern(pat, block)
    monkeypatch.setattr(Pattern, "chunk_rows", lambda self, entries=0: 1)
    assert BlockLayout.from_pattern(Pattern.from_dense(dense), block) == whole


def test_the_guard_refuses_the_whole_csr_before_building_it():
    pat = make("strided", 4096, stride=64)
    with config.memory_limit(1000), pytest.raises(MemoryLimitError) as err:
        pat.heads  # noqa: B018
    msg = str(err.value)
    assert msg.startswith("heads: the token-level CSR of strided at n=4,096 needs")
    assert "above the memory limit of 1.0 kB" in msg and "pattern.rows" in msg
    assert not pat.materialized
    with config.memory_limit(1000), pytest.raises(MemoryLimitError, match="^union: "):
        pat.union()
    # row ranges, counts and a small enough block level still work under the tiny limit
    with config.memory_limit(1000):
        assert pat.rows(100, 101).nnz == 65  # window {36 .. 100} holds the stride head {36, 100}
        assert pat.to_blocks(1024).nb == 4  # 4 x 4 tiles: 4 * 4 * 4 * 2 = 128 bytes
        with pytest.raises(MemoryLimitError, match=r"^block: .* 64 x 64 tiles and needs 33 kB"):
            pat.to_blocks(64)  # 64 * 64 * 4 * 2 = 32,768 bytes
    assert isinstance(MemoryLimitError("x"), ValueError)


@pytest.mark.parametrize(("start", "stop", "match"), [
    (-1, 3, "start, stop: need 0 <= start <= stop <= n=16, got start=-1, stop=3"),
    (5, 4, "start, stop: need 0 <= start <= stop <= n=16, got start=5, stop=4"),
    (0, 17, "start, stop: need 0 <= start <= stop <= n=16, got start=0, stop=17"),
    (0.5, 3, r"start: must be an int in \[0, 16\], got 0.5"),
])
def test_bad_row_ranges(start, stop, match):
    with pytest.raises(ValueError, match=match):
        make("strided", 16, stride=4).rows(start, stop)


def test_bad_head_and_chunk():
    pat = make("strided", 16, stride=4)
    with pytest.raises(ValueError, match=r"head: must be an int in \[0, 2\), got 2"):
        pat.rows(0, 4, head=2)
    with pytest.raises(ValueError, match="chunk: must be an int >= 1, got 0"):
        next(pat.iter_rows(0))


@pytest.mark.parametrize("bad", [0, -5, 0.0, True, "1GB", float("inf")])
def test_bad_memory_limits(bad):
    with pytest.raises(ValueError, match="memory_limit: must be a positive number of bytes"):
        config.set_memory_limit(bad)
    assert config.get_memory_limit() == config.default_memory_limit()


def _check_rule_rows(pat: Pattern, start: int, stop: int) -> None:
    """The rule's rows and counts against the materialized heads of a fresh pattern."""
    whole = make(pat.name, pat.n, **pat.params)
    mats = pat.rule.rows(start, stop)
    assert len(mats) == pat.num_heads
    for m, h in zip(mats, whole.heads, strict=True):
        assert m.shape == (stop - start, pat.n) and m.dtype == np.bool_
        assert m.has_canonical_format and m.indices.dtype in (np.int32, np.int64)
        _same(m, h[start:stop])


EDGES = [
    ("strided", 5, {"stride": 8}),  # n < stride
    ("strided", 1, {"stride": 3}),
    ("strided", 23, {"stride": 1, "window": "reference"}),
    ("fixed", 5, {"stride": 8, "c": 3, "summary_heads": 2}),  # n < l
    ("fixed", 23, {"stride": 6, "c": 2, "summary_heads": 3}),  # n not a multiple of l, k c = l
    ("fixed", 17, {"stride": 4, "c": 4}),
    ("local", 9, {"window": 0}),
    ("local", 6, {"window": 20}),
    ("dilated", 20, {"window": 4, "dilation": 7}),
    ("longformer", 11, {"window": 3, "global_tokens": 11, "dilation": 3}),
    ("longformer", 11, {"window": 0, "global_tokens": 0}),
    ("factorized", 30, {"p": 1}),
    ("factorized", 30, {"p": 64}),  # steps l^(m-1) far beyond n
    ("axial2d", 24, {"height": 3, "width": 8}),
    ("axial2d", 7, {"height": 7, "width": 1}),
    ("local2d", 24, {"height": 4, "width": 6, "query_block": 3, "memory": 2}),
    ("local2d", 15, {"height": 3, "width": 5, "query_block": 8, "memory": 0}),
    ("bigbird", 23, {"block": 5, "window_blocks": 0, "global_blocks": 0, "random_blocks": 0}),
    ("bigbird", 23, {"block": 5, "window_blocks": 1, "global_blocks": 9, "random_blocks": 3}),
    ("bigbird", 37, {"block": 3, "window_blocks": 2, "global_blocks": 1, "random_blocks": 2,
                     "seed": 7}),
    ("bigbird", 3, {"block": 8}),  # one partial block
    ("full", 1, {}),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("name", "n", "params"), EDGES, ids=lambda x: str(x))
def test_rule_rows_and_counts_on_edge_cases(name, n, params, causal):
    pat = make(name, n, **params, causal=causal)
    assert pat.rule.rows is not None and pat.rule.counts is not None
    spans = {(0, n), (0, 0), (n, n), (n - 1, n), (0, 1), (n // 2, n // 2), (n // 3, n // 2 + 1)}
    for start, stop in sorted(spans):
        _check_rule_rows(pat, start, stop)
    whole = make(name, n, **params, causal=causal)
    counts = pat.rule.counts()
    assert counts.dtype == np.int64 and counts.shape == (pat.num_heads, n)
    np.testing.assert_array_equal(counts, np.stack([np.diff(h.indptr) for h in whole.heads]))
    np.testing.assert_array_equal(
        pat.row_counts(), np.stack([*counts, np.diff(whole.union().indptr)])
    )
    assert not pat.materialized


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [1, 4, 5])
def test_bigbird_rows_equal_the_expansion_of_its_block_layout(block, causal):
    pat = make("bigbird", 47, block=block, window_blocks=1, global_blocks=2, random_blocks=2,
               seed=3, causal=causal)
    expanded = Pattern.from_blocks(pat.to_blocks(block), causal=causal)
    for m, h in zip(pat.rule.rows(0, 47), expanded.heads, strict=True):
        _same(m, h)


@pytest.mark.parametrize(("name", "params"), [
    ("strided", {"stride": 1 << 20}),
    ("strided", {"stride": 7, "window": "reference"}),
    ("fixed", {"stride": 1 << 20, "c": 3, "summary_heads": 2}),
    ("fixed", {"stride": 6, "c": 2}),
    ("local", {"window": 5}),
    ("dilated", {"window": 4, "dilation": 3}),
    ("longformer", {"window": 3, "global_tokens": 4, "dilation": 2}),
    ("full", {}),
])
def test_rows_of_the_largest_causal_pattern_cost_only_their_entries(name, params):
    # at the largest n (2^31 - 1) a pass over every row, or an int64 (n,) array (16 GB),
    # would not fit; the first rows of these causal families do not depend on n
    big = 2**31 - 1
    huge, small = make(name, big, **params), make(name, 60, **params)
    for start, stop in [(0, 60), (17, 18), (31, 31), (40, 57)]:
        for k, (a, b) in enumerate(zip(huge.rule.rows(start, stop), small.heads, strict=True)):
            assert a.shape == (stop - start, big) and a.has_canonical_format
            np.testing.assert_array_equal(a.indptr, b[start:stop].indptr, err_msg=f"head {k}")
            np.testing.assert_array_equal(a.indices, b[start:stop].indices, err_msg=f"head {k}")
        _same(huge.rows(start, stop)[:, :60], small.union()[start:stop])
    assert not huge.materialized


def test_strided_rows_at_large_n_follow_the_definition():
    n, l = 1 << 18, 512
    pat = make("strided", n, stride=l)
    a1, a2 = pat.rule.rows(n - 700, n - 600)
    for r, i in enumerate(range(n - 700, n - 600)):
        np.testing.assert_array_equal(a1[r].indices, np.arange(i - l, i + 1))
        np.testing.assert_array_equal(a2[r].indices, np.arange(i % l, i + 1, l))
    counts = pat.rule.counts()
    i = np.arange(n)
    np.testing.assert_array_equal(counts[0], np.minimum(i, l) + 1)
    np.testing.assert_array_equal(counts[1], i // l + 1)
    assert pat.head_nnz == (int(counts[0].sum()), int(counts[1].sum()))
    assert not pat.materialized


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["strided", "fixed", "local", "dilated", "factorized", "longformer",
                             "full", "global_tokens", "bigbird"]),
       causal=st.booleans(), n=st.integers(1, 60), data=st.data())
def test_spans_of_are_the_rows_of(name, causal, n, data):
    params = {"strided": {"stride": 3}, "fixed": {"stride": 4, "c": 2, "summary_heads": 2},
              "local": {"window": 3}, "dilated": {"window": 2, "dilation": 3}, "bigbird": {"block": 4},
              }.get(name, {})
    pat = make(name, n, causal=causal, **params)
    tokens = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=20)), dtype=np.int64)
    for (ind, lo, hi), m in zip(pat.spans_of(tokens), pat.rows_of(tokens), strict=True):
        for r in range(tokens.size):
            assert ind[lo[r]:hi[r]].tolist() == m.indices[m.indptr[r]:m.indptr[r + 1]].tolist()
