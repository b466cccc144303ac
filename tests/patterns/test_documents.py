"""Packed documents (issue 21, item 1): a family applied inside each document equals
the family generated on each document alone and placed on the block diagonal
(``testing.document_oracle``, built from the families' dense definitions), with
rows, counts and the kernel checked against dense references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparse_patterns as sps
from sparse_patterns.documents import document_offsets, within
from sparse_patterns.kernels import attention
from sparse_patterns.testing import attention_masks, attention_oracle, dense_oracle, document_oracle

FAMILIES = {
    "strided": {"stride": 3}, "fixed": {"stride": 4, "c": 1}, "local": {"window": 2},
    "dilated": {"window": 2, "dilation": 2}, "longformer": {"window": 2, "global_tokens": 1},
    "factorized": {"p": 2}, "full": {},
}


def _dense(pat) -> np.ndarray:
    return np.stack([h.toarray() for h in pat.heads])


def _oracle(pat, lengths) -> np.ndarray:
    params = {k: v for k, v in pat.params.items() if k != "documents"}
    return document_oracle(pat.name, lengths, **params)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(FAMILIES)), causal=st.booleans(),
       lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_packed_equals_each_document_alone_on_the_block_diagonal(name, causal, lengths):
    n = sum(lengths)
    pat = sps.make(name, n, documents=lengths, causal=causal, **FAMILIES[name])
    want = _oracle(pat, lengths)
    assert (_dense(pat) == want).all()
    counts = pat.row_counts()
    assert (counts[:-1] == want.sum(axis=2)).all() and (counts[-1] == want.any(0).sum(1)).all()
    assert pat.params["documents"] == tuple(lengths) and pat.causal == causal


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(FAMILIES)), data=st.data(),
       lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4))
def test_rows_and_rows_of_read_the_oracle(name, data, lengths):
    n = sum(lengths)
    pat = sps.make(name, n, documents=lengths, **FAMILIES[name])
    want = _oracle(pat, lengths)
    tokens = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=12)), dtype=np.int64)
    for h, m in enumerate(pat.rows_of(tokens)):
        assert (m.toarray() == want[h][tokens]).all()
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    assert (pat.rows(a, b).toarray() == want.any(0)[a:b]).all()


def test_offsets_and_lengths_agree_and_the_stride_restarts():
    by_len = sps.make("strided", 12, stride=4, documents=[5, 7])
    by_off = sps.make("strided", 12, stride=4, documents=[0, 5, 12])
    assert (_dense(by_len) == _dense(by_off)).all()
    # token 11 is position 6 of the document starting at 5: stride head {6 - 4, 6} -> {7, 11}
    assert by_len.rows_of([11])[1].indices.tolist() == [7, 11]
    assert sps.strided(12, 4, documents=[5, 7]) == by_len  # the generator's own keyword
    assert sps.make("strided", 12, stride=4, documents=[5, 7]) == by_len


def test_sqrt_follows_n_and_unset_defaults_follow_each_document():
    pat = sps.make("strided", 64, documents=[16, 48], stride="sqrt")
    assert pat.params["stride"] == 8  # resolved once, at n
    assert (_dense(pat) == document_oracle("strided", [16, 48], stride=8)).all()


@settings(max_examples=25, deadline=None)
@given(data=st.data(), lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_within_intersects_any_layout(data, lengths):
    n = sum(lengths)
    dense = np.array(data.draw(st.lists(st.booleans(), min_size=n * n, max_size=n * n))).reshape(n, n)
    user = sps.Pattern.from_dense(np.tril(dense)[None])
    cut = within(user, lengths)
    offs = document_offsets(lengths, n)
    doc = np.repeat(np.arange(len(lengths)), lengths)
    assert (_dense(cut)[0] == (np.tril(dense) & (doc[:, None] == doc[None, :]))).all()
    assert offs[-1] == n and cut.params["documents"] == tuple(lengths)


def test_within_keeps_the_whole_sequence_phase():
    # strided cut at a boundary that is not a multiple of the stride keeps the global phase
    cut = within(sps.make("strided", 10, stride=4), [3, 7])
    assert (_dense(cut) == (dense_oracle("strided", 10, stride=4)
                            & document_oracle("full", [3, 7], causal=False)[0])).all()


@pytest.mark.parametrize("documents, match", [
    ([3, 4], "lengths sum to 7, not n=8"),
    ([4, 0, 4], r"lengths must be integers \[1, 8\]"),
    ([0, 5, 5, 8], "strictly increasing"),
    ([0, 5, 7], "must end at n=8"),
    ([], "at least one document"),
    ("4,4", "1-D sequence"),
])
def test_bad_documents(documents, match):
    with pytest.raises(ValueError, match=f"^documents: .*{match}"):
        sps.make("local", 8, window=2, documents=documents)


def test_a_document_the_family_cannot_take_is_named():
    with pytest.raises(ValueError, match=r"^documents: document 1 \(length 3\): height"):
        sps.make("axial2d", 7, documents=[4, 3])


@pytest.mark.parametrize("mode", ["merged", "multihead"])
def test_kernel_on_packed_documents_equals_the_oracle(mode):
    lengths = [37, 64, 1, 26]
    pat = sps.make("strided", sum(lengths), stride=6, documents=lengths)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, pat.n, 8)).astype(np.float32) for _ in range(3))
    out = attention(q, k, v, pat, mode=mode, block=16)
    ref, _ = attention_oracle(q, k, v, attention_masks(pat, mode, 2))
    assert np.abs(out - ref).max() < 1e-5


def test_packed_layers_do_not_leak():
    lengths = [20, 44]
    layers = [sps.make("local", 64, window=4, documents=lengths), sps.make("full", 64, documents=lengths)]
    rep = sps.verify_schedule(layers, documents=lengths)
    assert rep.leak is False and rep.layers_to_connect == 2


def _bfs_per_document(dense, lengths, **kw):
    """Hop counts summed over documents, and the first failing pair, by brute force."""
    from sparse_patterns.testing import bfs_hops

    hops, bad, o = {}, None, 0
    for length in lengths:
        h, _ = bfs_hops(dense[:, o:o + length, o:o + length], **kw)
        for k in np.unique(h[h > 0]):
            hops[int(k)] = hops.get(int(k), 0) + int((h == k).sum())
        if bad is None and (h < 0).any():
            i, j = np.argwhere(h < 0)[0]
            bad = (int(i) + o, int(j) + o)
        o += length
    return hops, bad


@pytest.mark.parametrize("name, params, kw", [
    ("strided", {"stride": 3}, {}),
    ("fixed", {"stride": 4, "c": 1}, {}),
    ("local", {"window": 2}, {"p": 2, "mode": "merged"}),   # fails in the longer documents
    ("factorized", {"p": 2}, {}),
])
def test_verify_checks_each_document(name, params, kw):
    lengths = [5, 1, 12, 9]
    pat = sps.make(name, sum(lengths), documents=lengths, **params)
    rep = sps.verify(pat, **kw)
    dense = _oracle(pat, lengths)
    hops, bad = _bfs_per_document(dense, lengths, **kw)
    assert rep.hops == hops and rep.targets == sum(L * (L + 1) // 2 for L in lengths)
    assert rep.ok == (bad is None) and rep.method.startswith("per-document")
    if bad is not None:  # the first failing document's pair, in sequence positions
        assert rep.counterexample is not None
        doc = np.searchsorted(np.cumsum(lengths), rep.counterexample[0], side="right")
        assert doc == np.searchsorted(np.cumsum(lengths), bad[0], side="right")
        i, j = rep.counterexample
        o = int(np.concatenate([[0], np.cumsum(lengths)])[doc])
        from sparse_patterns.testing import bfs_hops

        h, _ = bfs_hops(dense[:, o:o + lengths[doc], o:o + lengths[doc]], **kw)
        assert h[i - o, j - o] < 0


def test_verify_of_a_cut_layout_checks_each_document():
    lengths = [7, 9]
    cut = within(sps.make("strided", 16, stride=3), lengths)
    rep = sps.verify(cut)
    hops, bad = _bfs_per_document(_dense(cut), lengths)
    assert rep.hops == hops and rep.ok == (bad is None)
    assert rep.method == "per-document (generic)"
