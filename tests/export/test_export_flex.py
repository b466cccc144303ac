"""FlexAttention export: the mask_mod against the dense oracles at every
position, BlockMask -> Pattern round trips (which catch a block wrongly marked
full), and flex_attention (eager and compiled on the CPU) against a dense
masked-softmax reference."""

from __future__ import annotations

import numpy as np
import pytest

from sparse_patterns import Pattern, make
from sparse_patterns.testing import dense_oracle

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

from sparse_patterns.export import (  # noqa: E402
    flex_mask_mod,
    from_flex_block_mask,
    to_flex_block_mask,
)

CASES = [
    ("full", {}),
    ("full", {"causal": False}),
    ("strided", {"stride": 5}),
    ("strided", {"stride": 4, "window": "reference"}),
    ("strided", {"stride": 6, "causal": False}),
    ("fixed", {"stride": 8, "c": 2}),
    ("fixed", {"stride": 8, "c": 2, "summary_heads": 3}),
    ("fixed", {"stride": 7, "c": 3, "causal": False}),
    ("local", {"window": 5}),
    ("local", {"window": 3, "causal": False}),
    ("dilated", {"window": 3, "dilation": 3}),
    ("dilated", {"window": 2, "dilation": 2, "causal": False}),
    ("longformer", {"window": 3, "global_tokens": 2}),
    ("longformer", {"window": 2, "global_tokens": 3, "dilation": 2, "causal": False}),
    ("axial2d", {}),
    ("axial2d", {"causal": False}),
    ("factorized", {"p": 3}),
    ("factorized", {"p": 2, "causal": False}),
    ("local2d", {"query_block": 2, "memory": 1}),
]


def _eval_mask(mm, n: int, h: int) -> np.ndarray:
    """Evaluate a mask_mod on the whole n x n grid by broadcasting (test sizes only)."""
    q = torch.arange(n)[:, None]
    kv = torch.arange(n)[None, :]
    return torch.broadcast_to(mm(torch.tensor(0), torch.tensor(h), q, kv), (n, n)).numpy()


@pytest.mark.parametrize("impl", ["auto", "csr"])
@pytest.mark.parametrize(("name", "params"), CASES)
def test_mask_mod_equals_dense_oracle(name, params, impl):
    n = 49 if name in ("axial2d", "local2d") else 40
    pat = make(name, n, **params)
    ref = dense_oracle(name, n, **pat.params)  # (p, n, n), from the definitions
    p = ref.shape[0]
    mm = flex_mask_mod(pat, impl=impl, num_heads=p + 1, block_size=8)
    for h in range(p + 1):  # head p wraps to pattern head 0
        np.testing.assert_array_equal(_eval_mask(mm, n, h), ref[h % p], err_msg=f"head {h}")
    merged = flex_mask_mod(pat, mode="merged", impl=impl, block_size=16)
    np.testing.assert_array_equal(_eval_mask(merged, n, 0), ref.any(axis=0))


def test_binary_search_fallback(monkeypatch):
    """Above TILE_BITS_LIMIT the csr mask_mod binary-searches the CSR rows."""
    from sparse_patterns.export import flex as flex_mod

    monkeypatch.setattr(flex_mod, "TILE_BITS_LIMIT", 0)
    pat = make("longformer", 45, window=4, global_tokens=2, dilation=2)
    ref = pat.to_dense()
    mm = flex_mask_mod(pat, impl="csr", block_size=8)
    for h in range(2):
        np.testing.assert_array_equal(_eval_mask(mm, 45, h), ref[h])
    assert from_flex_block_mask(to_flex_block_mask(pat, impl="csr", block_size=8)) == pat


def test_formula_used_for_families_and_bigbird():
    pat = make("bigbird", 64, block=8, random_blocks=1, seed=3)
    dense = pat.to_dense()
    mm = flex_mask_mod(pat, impl="formula")
    for h in range(3):
        np.testing.assert_array_equal(_eval_mask(mm, 64, h), dense[h])
    with pytest.raises(ValueError, match="impl: no formula for pattern 'local2d'"):
        flex_mask_mod(make("local2d", 16, query_block=2, memory=1), impl="formula")


def test_formula_not_trusted_when_heads_differ_from_params():
    pat = make("strided", 32, stride=4)
    # same name and params, other heads (e.g. a hand-edited file): the CSR lookup is used
    fake = Pattern([pat.heads[1], pat.heads[0]], name="strided", params=pat.params)
    with pytest.raises(ValueError, match="impl: no formula"):
        flex_mask_mod(fake, impl="formula")
    mm = flex_mask_mod(fake)
    np.testing.assert_array_equal(_eval_mask(mm, 32, 0), pat.heads[1].toarray())


GOLDEN = """\
#...............
##..............
###.............
####............
#####...........
.#####..........
..#####.........
...#####........
#...#####.......
.#...#####......
..#...#####.....
...#...#####....
#...#...#####...
.#...#...#####..
..#...#...#####.
...#...#...#####"""


def test_golden_strided_16():
    """n = 16, stride 4, written out literally: CSR -> BlockMask -> Pattern."""
    pat = make("strided", 16, stride=4)
    assert pat.to_string().replace("1", "#").replace("2", "#") == GOLDEN
    for bs in (2, 4, 16):
        back = from_flex_block_mask(to_flex_block_mask(pat, block_size=bs))
        assert back.to_string() == pat.to_string()


@pytest.mark.parametrize("block_size", [4, 8, 128])
@pytest.mark.parametrize(
    ("name", "params"),
    [("strided", {"stride": 6}), ("fixed", {"stride": 8, "c": 4, "summary_heads": 2}),
     ("bigbird", {"block": 8, "random_blocks": 1}), ("longformer", {"window": 4}),
     ("fixed", {"stride": 8, "c": 4, "causal": False}), ("local2d", {})],
)
def test_block_mask_round_trip(name, params, block_size):
    n = 64
    pat = make(name, n, **params)
    bm = to_flex_block_mask(pat, block_size=block_size)
    assert from_flex_block_mask(bm) == pat
    # the block level equals the max-pooled layout, split into full / partial
    bl = pat.to_blocks(block_size)
    dense_blocks = bm.to_dense()[0].numpy().astype(bool)  # (H, nb, nb), partial | full
    np.testing.assert_array_equal(dense_blocks, bl.layout)
    full = np.zeros_like(bl.layout)
    fn, fi = bm.full_kv_num_blocks[0].numpy(), bm.full_kv_indices[0].numpy()
    for h in range(full.shape[0]):
        for r in range(full.shape[1]):
            full[h, r, fi[h, r, : fn[h, r]]] = True
    np.testing.assert_array_equal(full, bl.full)
    if name == "bigbird" and block_size <= 8:
        assert full.any()  # the full-block path is exercised


def test_merged_and_num_heads():
    pat = make("fixed", 48, stride=8, c=2)
    bm = to_flex_block_mask(pat, mode="merged", block_size=8)
    assert bm.shape == (1, 1, 48, 48)
    u = from_flex_block_mask(bm)
    assert u.num_heads == 1 and (u.heads[0] != pat.union()).nnz == 0
    bm5 = to_flex_block_mask(pat, num_heads=5, block_size=8)
    back = from_flex_block_mask(bm5)
    for h in range(5):
        assert (back.heads[h] != pat.heads[h % 2]).nnz == 0


def test_custom_pattern_uses_csr():
    rng = np.random.default_rng(0)
    a = np.tril(rng.random((2, 50, 50)) < 0.2)
    a[:, np.arange(50), np.arange(50)] = True
    pat = Pattern.from_dense(a)
    assert from_flex_block_mask(to_flex_block_mask(pat, block_size=8)) == pat


def test_bad_arguments():
    pat = make("strided", 16, stride=4)
    with pytest.raises(ValueError, match="mode: must be one of"):
        to_flex_block_mask(pat, mode="sum")
    with pytest.raises(ValueError, match="num_heads: must be an integer"):
        to_flex_block_mask(pat, num_heads=0)
    with pytest.raises(ValueError, match="block_size: must be an integer"):
        to_flex_block_mask(pat, block_size=0)
    with pytest.raises(ValueError, match="impl: must be one of"):
        to_flex_block_mask(pat, impl="dense")


def test_large_n_uses_no_dense_mask():
    """n = 65,536: the BlockMask is built from the closed-form layout (seconds, no n x n)."""
    pat = make("fixed", 65536, stride=256, c=32)
    bm = to_flex_block_mask(pat)
    assert bm.shape == (1, 2, 65536, 65536)
    assert bm.kv_indices.shape == (1, 2, 512, 512)


# ------------------------------------------------------------------ attention
def dense_reference(q, k, v, masks):
    """Masked softmax attention in float64: masks bool (H, n, n); empty rows give 0."""
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~masks, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (w @ v.double()).float()


ATTN_CASES = [
    ("strided", {"stride": 6}),
    ("fixed", {"stride": 8, "c": 2, "summary_heads": 2}),
    ("bigbird", {"block": 8, "random_blocks": 1, "seed": 1}),
]


def _qkv(n, H, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, H, n, d, generator=g) for _ in range(3)]


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(("name", "params"), ATTN_CASES)
def test_flex_attention_eager_equals_reference(name, params, mode):
    n, H = 72, 4
    pat = make(name, n, **params)
    bm = to_flex_block_mask(pat, mode=mode, num_heads=H, block_size=16)
    q, k, v = _qkv(n, H)
    import warnings  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = flex.flex_attention(q, k, v, block_mask=bm)
    dense = pat.to_dense()
    masks = np.stack([dense[h % pat.num_heads] if mode == "multihead" else dense.any(0)
                      for h in range(H)])
    ref = dense_reference(q, k, v, torch.from_numpy(masks))
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def _stacked() -> Pattern:
    """strided, fixed and bigbird heads in one custom pattern (one compile covers all)."""
    n = 256
    heads = []
    for name, params in ATTN_CASES:
        heads += list(make(name, n, **params).heads)
    return Pattern(heads, name="custom")


def test_flex_attention_compiled_equals_reference():
    """Compiled on the CPU (one compile per mask_mod: kept to two)."""
    compiled = torch.compile(flex.flex_attention)
    pat = _stacked()  # 7 heads: strided A1 A2, fixed A1 A2.0 A2.1, bigbird window global random
    H = pat.num_heads
    q, k, v = _qkv(pat.n, H, d=16, seed=1)
    bm = to_flex_block_mask(pat, block_size=32)
    out = compiled(q, k, v, block_mask=bm)
    ref = dense_reference(q, k, v, torch.from_numpy(pat.to_dense()))
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    # the arithmetic mask_mod of a registered family, compiled
    strided = make("strided", 256, stride=16)
    q, k, v = _qkv(256, 4, d=16, seed=2)
    out = compiled(q, k, v, block_mask=to_flex_block_mask(strided, num_heads=4, block_size=32))
    masks = strided.to_dense()[[0, 1, 0, 1]]
    torch.testing.assert_close(out, dense_reference(q, k, v, torch.from_numpy(masks)),
                               atol=2e-5, rtol=2e-5)
