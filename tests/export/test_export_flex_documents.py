"""FlexAttention export of packed documents and of pattern expressions: the
document-id ``mask_mod`` (each family's formula in positions counted from its
document's start) against the families on each document alone, expressions
against dense boolean algebra of the oracles, and flex_attention run eagerly
against the dense attention oracle."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sparse_patterns import make
from sparse_patterns.documents import within
from sparse_patterns.patterns.registry import REGISTRY
from sparse_patterns.testing import ORACLES, attention_oracle, dense_oracle

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

from sparse_patterns.export import (  # noqa: E402
    flex_mask_mod,
    from_flex_block_mask,
    to_flex_block_mask,
)
from sparse_patterns.patterns import formulas as formulas_mod  # noqa: E402

LENGTHS = (1, 3, 9, 2, 12, 5)  # n = 32; 1, 2 and 3 are shorter than the strides

CASES = [
    ("full", {}, LENGTHS),
    ("full", {"causal": False}, LENGTHS),
    ("strided", {"stride": 4}, LENGTHS),
    ("strided", {"stride": 4, "window": "reference", "causal": False}, LENGTHS),
    ("fixed", {"stride": 4, "c": 1, "summary_heads": 2}, LENGTHS),
    ("fixed", {"stride": 5, "c": 2, "causal": False}, LENGTHS),
    ("local", {"window": 4}, LENGTHS),
    ("local", {"window": 2, "causal": False}, LENGTHS),
    ("dilated", {"window": 2, "dilation": 3}, LENGTHS),
    ("dilated", {"window": 1, "dilation": 2, "causal": False}, LENGTHS),
    ("longformer", {"window": 2, "global_tokens": 1, "dilation": 2}, LENGTHS),
    ("longformer", {"window": 3, "global_tokens": 1, "causal": False}, LENGTHS),
    ("global_tokens", {"tokens": 1}, LENGTHS),
    ("global_tokens", {"tokens": 1, "causal": False}, LENGTHS),
    ("axial2d", {}, (1, 4, 9, 16, 4)),  # a square per document: width 1, 2, 3, 4
    ("axial2d", {"causal": False}, (9, 1, 16)),
    ("axial2d", {"width": 3}, (3, 9, 6, 12)),
    ("factorized", {"p": 2}, LENGTHS),  # l = 1, 2, 3, 2, 4, 3: per-document formulas
    ("factorized", {"p": 3, "causal": False}, (1, 8, 27, 2, 5)),
    ("bigbird", {"block": 4, "random_blocks": 1, "seed": 2}, (1, 7, 16, 9, 3)),
    ("bigbird", {"block": 3, "random_blocks": 1, "seed": 5, "causal": False}, (10, 1, 14, 2)),
]


def _global_oracle(n: int, tokens: int, causal: bool = True) -> np.ndarray:
    i, j = np.indices((n, n))
    m = (i < tokens) | (j < tokens)
    return (m & (j <= i) if causal else m)[None]


def _document(name: str, length: int, params: dict) -> np.ndarray:
    """``bool (p, L, L)``: the family on one document alone, from its definition."""
    if name == "global_tokens":
        return _global_oracle(length, **params)
    if name in ORACLES:  # the document's own params (axial2d: its own square)
        return dense_oracle(name, length, **make(name, length, **params).params)
    return make(name, length, **params).to_dense()  # bigbird: no independent oracle


def _packed_oracle(name: str, lengths, params: dict) -> np.ndarray:
    """``bool (p, n, n)``: the documents alone, on the block diagonal."""
    parts = [_document(name, int(length), params) for length in lengths]
    n = sum(lengths)
    out = np.zeros((parts[0].shape[0], n, n), dtype=bool)
    o = 0
    for part in parts:
        out[:, o:o + part.shape[1], o:o + part.shape[1]] = part
        o += part.shape[1]
    return out


def _eval(mm, size: int, h: int) -> np.ndarray:
    """A mask_mod on the whole ``size x size`` grid, eagerly, by broadcasting."""
    q, kv = torch.arange(size)[:, None], torch.arange(size)[None, :]
    return torch.broadcast_to(mm(torch.tensor(0), torch.tensor(h), q, kv), (size, size)).numpy()


def test_every_family_with_a_formula_is_covered():
    assert {name for name, spec in REGISTRY.items() if spec.flex} <= {c[0] for c in CASES}


@pytest.mark.parametrize(("name", "params", "lengths"), CASES)
def test_block_mask_of_packed_documents_equals_the_documents(name, params, lengths):
    n = sum(lengths)
    pat = make(name, n, documents=list(lengths), **params)
    ref = _packed_oracle(name, lengths, params)  # (p, n, n)
    np.testing.assert_array_equal(pat.to_dense(), ref)
    p = ref.shape[0]
    bm = to_flex_block_mask(pat, num_heads=p + 1, block_size=4, impl="formula")
    pad = -(-n // 4) * 4 + 3  # past n: the padding of the last block and beyond
    for h in range(p + 1):  # head p wraps to pattern head 0
        got = _eval(bm.mask_mod, pad, h)
        np.testing.assert_array_equal(got[:n, :n], ref[h % p], err_msg=f"head {h}")
        assert not got[:, n:].any()
    back = from_flex_block_mask(bm)
    for h in range(p + 1):
        np.testing.assert_array_equal(back.heads[h].toarray(), ref[h % p])
    merged = flex_mask_mod(pat, mode="merged", impl="formula", block_size=8)
    np.testing.assert_array_equal(_eval(merged, n, 0), ref.any(axis=0))


def test_documents_as_cu_seqlens_offsets():
    pat = make("strided", 32, stride=4, documents=[0, 1, 4, 13, 15, 27, 32])  # = LENGTHS
    ref = _packed_oracle("strided", LENGTHS, {"stride": 4})
    mm = flex_mask_mod(pat, impl="formula")
    for h in range(2):
        np.testing.assert_array_equal(_eval(mm, 32, h), ref[h])


def test_shared_and_per_length_formulas(monkeypatch):
    """strided's formula is one closure for every length; factorized's l differs by
    length, and past DOCUMENT_FORMULAS_LIMIT formulas the csr bit table is used (exact)."""
    monkeypatch.setattr(formulas_mod, "DOCUMENT_FORMULAS_LIMIT", 1)
    strided = make("strided", 32, stride=4, documents=list(LENGTHS))
    flex_mask_mod(strided, impl="formula")  # one formula for 6 lengths: no error
    fac = make("factorized", 32, p=2, documents=list(LENGTHS))
    with pytest.raises(ValueError, match="impl: no formula for pattern 'factorized'"):
        flex_mask_mod(fac, impl="formula")
    ref = _packed_oracle("factorized", LENGTHS, {"p": 2})
    mm = flex_mask_mod(fac, block_size=4)  # auto: the bit table
    for h in range(2):
        np.testing.assert_array_equal(_eval(mm, 32, h), ref[h])


def test_large_n_builds_no_dense_mask():
    """n = 2^18 in four documents (a dense mask would be 64 GB): O(n) tensors; rows
    checked against the pattern's."""
    n = 1 << 18
    lengths = [1, 1000, 130_000, n - 131_001]
    pat = make("strided", n, stride=512, documents=lengths)
    mm = flex_mask_mod(pat, impl="formula")
    rows = np.array([0, 1000, 100_000, n - 1])  # one token of each document
    kv = torch.arange(n)
    for h, m in enumerate(pat.rows_of(rows)):
        for r, q in enumerate(rows):
            got = mm(torch.tensor(0), torch.tensor(h), torch.tensor(int(q)), kv)
            assert got.nonzero().ravel().numpy().tolist() == m[r].indices.tolist()


# ------------------------------------------------------------------ expressions
L2 = (4, 1, 7, 3, 9, 8)  # n = 32, other boundaries than LENGTHS


def _expressions():
    n, docs = 32, list(LENGTHS)
    s = make("strided", n, stride=4, documents=docs)
    g = make("global_tokens", n, tokens=1, documents=docs)
    loc = make("local", n, window=2, causal=False, documents=list(L2))
    full = make("full", n, documents=docs)
    g2 = make("global_tokens", n, tokens=2)
    fx = make("fixed", n, stride=4, c=1, documents=docs)
    s2 = make("strided", n, stride=2, documents=list(L2))
    fac = make("factorized", n, p=2, documents=docs)
    s3 = make("strided", n, stride=3)

    def o(name, lengths, **params):
        return _packed_oracle(name, lengths, params)

    def go(tokens, **kw):
        return _global_oracle(n, tokens, **kw)

    return [
        (s + g, np.concatenate([o("strided", LENGTHS, stride=4), o("global_tokens", LENGTHS, tokens=1)])),
        (loc | full & g2, o("local", L2, window=2, causal=False) | (o("full", LENGTHS) & go(2))),
        (fx - s2, o("fixed", LENGTHS, stride=4, c=1) & ~o("strided", L2, stride=2)),
        (fac & s3, o("factorized", LENGTHS, p=2) & dense_oracle("strided", n, stride=3)),
        ((s | fac) + g2 + full, np.concatenate([
            o("strided", LENGTHS, stride=4) | o("factorized", LENGTHS, p=2), go(2), o("full", LENGTHS)])),
    ]


@pytest.mark.parametrize("k", range(5))
def test_expressions_of_packed_documents(k):
    pat, ref = _expressions()[k]
    n, p = pat.n, pat.num_heads
    np.testing.assert_array_equal(pat.to_dense(), ref)
    bm = to_flex_block_mask(pat, block_size=8, impl="formula")
    for h in range(p):
        got = _eval(bm.mask_mod, 36, h)
        np.testing.assert_array_equal(got[:n, :n], ref[h], err_msg=f"{pat.name} head {h}")
        assert not got[:, n:].any()
    assert from_flex_block_mask(bm) == pat
    merged = flex_mask_mod(pat, mode="merged", impl="formula", block_size=8)
    np.testing.assert_array_equal(_eval(merged, n, 0), ref.any(axis=0))


def test_expression_with_a_cut_layout_uses_the_bit_table():
    """within() re-anchors nothing, so it has no formula: the expression falls back (exact)."""
    cut = within(make("strided", 32, stride=4), list(LENGTHS))
    pat = cut | make("local", 32, window=1, documents=list(L2)) + make("full", 32)
    with pytest.raises(ValueError, match="impl: no formula"):
        flex_mask_mod(pat, impl="formula")
    ref = pat.to_dense()
    mm = flex_mask_mod(pat, block_size=8)
    for h in range(pat.num_heads):
        np.testing.assert_array_equal(_eval(mm, 32, h), ref[h])


# ------------------------------------------------------------------ attention
@pytest.mark.parametrize("mode", ["multihead", "merged"])
def test_flex_attention_eager_on_packed_documents_equals_oracle(mode):
    n, H = 32, 4
    docs = list(LENGTHS)
    pat = make("strided", n, stride=4, documents=docs) + make("global_tokens", n, tokens=1,
                                                                  documents=docs)
    bm = to_flex_block_mask(pat, mode=mode, num_heads=H, block_size=8, impl="formula")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, n, 8, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = flex.flex_attention(q, k, v, block_mask=bm)
    ref = np.concatenate([_packed_oracle("strided", LENGTHS, {"stride": 4}),
                          _packed_oracle("global_tokens", LENGTHS, {"tokens": 1})])
    masks = np.stack([ref[h % 3] if mode == "multihead" else ref.any(0) for h in range(H)])
    want, _ = attention_oracle(q.numpy(), k.numpy(), v.numpy(), masks)
    np.testing.assert_allclose(out.numpy(), want, atol=2e-5, rtol=2e-5)


def test_flex_attention_eager_factorized_documents_equals_oracle():
    """Per-length formulas (l = 1 .. 4) in the eager kernel."""
    n, H = 32, 2
    pat = make("factorized", n, p=2, documents=list(LENGTHS))
    bm = to_flex_block_mask(pat, block_size=8, impl="formula")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, H, n, 8, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex.flex_attention(q, k, v, block_mask=bm)
    masks = _packed_oracle("factorized", LENGTHS, {"p": 2})
    want, _ = attention_oracle(q.numpy(), k.numpy(), v.numpy(), masks)
    np.testing.assert_allclose(out.numpy(), want, atol=2e-5, rtol=2e-5)


def test_document_ids_checked_against_the_memory_limit():
    from sparse_patterns import config

    pat = make("strided", 4096, stride=64, documents=[2048, 2048])
    with config.memory_limit(4096), pytest.raises(config.MemoryLimitError,
                                                  match="documents: the document ids of strided"):
        flex_mask_mod(pat, impl="formula")
