"""Block layouts (DeepSpeed / xformers / Triton / Block-Sparse-Attention) and
dense SDPA masks: round trips against a dense NumPy max-pool + Kronecker
reference, exactness on block-aligned patterns, DeepSpeed's unidirectional
Fixed layout, and SDPA against a dense reference."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparse_patterns import Pattern, make

torch = pytest.importorskip("torch")

from sparse_patterns.export import (  # noqa: E402
    from_block_layout,
    from_bsa_mask,
    from_sdpa_mask,
    to_block_layout,
    to_bsa_mask,
    to_sdpa_mask,
)


def pool_expand(dense: np.ndarray, block: int, causal: bool) -> np.ndarray:
    """Reference: max-pool (H, n, n) to blocks, Kronecker-expand, crop, causal mask."""
    H, n, _ = dense.shape
    nb = -(-n // block)
    pad = np.zeros((H, nb * block, nb * block), dtype=bool)
    pad[:, :n, :n] = dense
    lay = pad.reshape(H, nb, block, nb, block).any(axis=(2, 4))
    out = np.kron(lay, np.ones((block, block), dtype=bool))[:, :n, :n].astype(bool)
    if causal:
        out &= np.tril(np.ones((n, n), dtype=bool))
    return out, lay


PATTERNS = [
    ("strided", {"stride": 5}),
    ("fixed", {"stride": 8, "c": 2, "summary_heads": 2}),
    ("fixed", {"stride": 6, "c": 2, "causal": False}),
    ("bigbird", {"block": 4, "random_blocks": 1}),
    ("local", {"window": 3}),
    ("longformer", {"window": 2, "global_tokens": 3, "causal": False}),
    ("axial2d", {}),
]


@pytest.mark.parametrize("fmt", ["deepspeed", "xformers", "triton"])
@pytest.mark.parametrize("block", [1, 4, 7, 16])
@pytest.mark.parametrize(("name", "params"), PATTERNS)
def test_layout_round_trip_is_pooled_kronecker(name, params, block, fmt):
    n = 36
    pat = make(name, n, **params)
    lay = to_block_layout(pat, block, format=fmt)
    assert lay.dtype == torch.int64 and lay.shape == (pat.num_heads, -(-n // block), -(-n // block))
    ref, ref_lay = pool_expand(pat.to_dense(), block, pat.causal)
    np.testing.assert_array_equal(lay.numpy().astype(bool), ref_lay)
    back = from_block_layout(lay, block, n, causal=pat.causal)
    np.testing.assert_array_equal(back.to_dense(), ref)
    # the expansion covers the pattern; it equals it exactly when block == 1
    assert not (pat.to_dense() & ~back.to_dense()).any()
    if block == 1:
        assert back == pat


@pytest.mark.parametrize(
    ("name", "params", "block"),
    [
        ("fixed", {"stride": 8, "c": 4}, 4),  # chunks and summaries are whole blocks
        ("fixed", {"stride": 16, "c": 4, "summary_heads": 2}, 4),
        ("fixed", {"stride": 8, "c": 4, "causal": False}, 4),
        ("bigbird", {"block": 8, "random_blocks": 2, "seed": 5}, 8),
        ("full", {}, 8),
    ],
)
def test_block_aligned_patterns_round_trip_exactly(name, params, block):
    pat = make(name, 64, **params)
    back = from_block_layout(to_block_layout(pat, block), block, 64, causal=pat.causal)
    assert back == pat


def test_golden_layout_strided_16():
    pat = make("strided", 16, stride=4)
    lay = to_block_layout(pat, 4)
    assert lay[0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert lay[1].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_modes_and_num_heads():
    pat = make("strided", 40, stride=6)
    lay = to_block_layout(pat, 8, num_heads=5)
    one = to_block_layout(pat, 8)
    for h in range(5):
        assert torch.equal(lay[h], one[h % 2])
    merged = to_block_layout(pat, 8, mode="merged")
    assert merged.shape[0] == 1
    _, ref_lay = pool_expand(pat.to_dense().any(0, keepdims=True), 8, True)
    np.testing.assert_array_equal(merged.numpy().astype(bool), ref_lay)
    assert to_block_layout(pat, 8, mode="merged", num_heads=3).shape[0] == 3


def deepspeed_fixed_unidirectional(num_heads, nb, local, glob, patterns):
    """DeepSpeed's FixedSparsityConfig(attention="unidirectional").make_layout, rewritten:
    local windows of `local` blocks (lower triangle within the window) and, per head,
    vertical global columns starting at their own row (so with glob > 1 some of them
    lie above the diagonal)."""
    lay = np.zeros((num_heads, nb, nb), dtype=np.int64)
    for h in range(num_heads):
        for i in range(0, nb, local):
            end = min(i + local, nb)
            for row in range(i, end):
                lay[h, row, i : row + 1] = 1
        first = local - (1 + h % patterns) * glob
        end = nb - nb % local
        for i in range(first, end, local):
            lay[h, i:, i : i + glob] = 1
        if end < nb:
            start = min(end + first, nb - glob)
            lay[h, start:, start : start + glob] = 1
    return lay


@pytest.mark.parametrize(("nb", "local", "glob", "k"), [(8, 4, 2, 1), (12, 4, 1, 2), (10, 4, 2, 2)])
def test_deepspeed_fixed_unidirectional_layout_imports_exactly(nb, local, glob, k):
    block = 4
    n = nb * block
    ds = deepspeed_fixed_unidirectional(k, nb, local, glob, k)
    above = np.triu(ds, 1).any()
    assert above == (glob > 1)  # DeepSpeed keeps blocks above the diagonal...
    back = from_block_layout(torch.from_numpy(ds), block, n, causal=True)  # ...the mask drops them
    pat = make("fixed", n, stride=local * block, c=glob * block, summary_heads=k)
    for h in range(k):
        a1_a2 = pat.heads[0] + pat.heads[1 + h]
        if nb % local == 0:
            assert (back.heads[h] != a1_a2).nnz == 0
        # ours: the same tokens, no block above the diagonal
        ours = Pattern([a1_a2])
        mine = to_block_layout(ours, block)[0].numpy()
        assert not np.triu(mine, 1).any()
        np.testing.assert_array_equal(
            from_block_layout(mine, block, n).to_dense()[0], ours.to_dense()[0]
        )


def test_from_block_layout_rejects_bad_input():
    with pytest.raises(ValueError, match=r"layout: has nb=3 blocks per side but ceil\(n / block\)"):
        from_block_layout(np.ones((3, 3)), 4, 16)
    with pytest.raises(ValueError, match="layout: entries must be 0 or 1"):
        from_block_layout(np.full((2, 2), 2), 4, 8)
    with pytest.raises(ValueError, match="layout: expected shape"):
        from_block_layout(np.ones((2, 3)), 4, 8)
    with pytest.raises(ValueError, match="block: must be an integer"):
        from_block_layout(np.ones((2, 2)), 0, 8)
    with pytest.raises(ValueError, match="format: must be one of"):
        to_block_layout(make("local", 8, window=1), 4, format="cutlass")


@pytest.mark.parametrize(("name", "params"), PATTERNS[:4])
def test_bsa_mask_round_trip(name, params):
    n = 300
    pat = make(name, n, **params)
    m = to_bsa_mask(pat, batch=2)
    assert m.dtype == torch.bool and m.shape == (2, pat.num_heads, 3, 3)
    ref, ref_lay = pool_expand(pat.to_dense(), 128, pat.causal)
    np.testing.assert_array_equal(m[1].numpy(), ref_lay)
    np.testing.assert_array_equal(from_bsa_mask(m, n, causal=pat.causal).to_dense(), ref)


def test_bsa_exact_when_aligned():
    pat = make("bigbird", 1024, block=128, random_blocks=1, seed=2)
    assert from_bsa_mask(to_bsa_mask(pat), 1024) == pat


# ------------------------------------------------------------------ dense SDPA masks
def test_sdpa_masks_equal_dense_reference():
    pat = make("strided", 48, stride=5)  # no empty rows (their SDPA output is backend-defined)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 48, 16, generator=g) for _ in range(3))
    dense = pat.to_dense()
    masks = torch.from_numpy(dense[[0, 1, 0, 1]])
    s = (q @ k.transpose(-1, -2)) / 4.0
    ref = torch.softmax(s.masked_fill(~masks, float("-inf")), -1) @ v
    F = torch.nn.functional
    for additive in (False, True):
        m = to_sdpa_mask(pat, additive=additive, num_heads=4)
        assert m.shape == (4, 48, 48)
        assert m.dtype == (torch.float32 if additive else torch.bool)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    merged = to_sdpa_mask(pat, mode="merged")
    assert merged.shape == (1, 48, 48)
    np.testing.assert_array_equal(merged[0].numpy(), dense.any(0))


@pytest.mark.parametrize(("name", "params"), PATTERNS)
def test_sdpa_round_trip(name, params):
    pat = make(name, 36, **params)
    for additive in (False, True):
        back = from_sdpa_mask(to_sdpa_mask(pat, additive=additive))
        assert back == pat


def test_sdpa_refuses_large():
    pat = make("strided", 65536, stride=256)
    with pytest.raises(ValueError, match=r"n: a dense \(H, n, n\) mask would have"):
        to_sdpa_mask(pat)
    with pytest.raises(ValueError, match="dtype: must be a torch floating dtype"):
        to_sdpa_mask(make("local", 8, window=1), additive=True, dtype=torch.int32)
    with pytest.raises(ValueError, match="mask: expected a bool or float mask"):
        from_sdpa_mask(np.zeros((4, 4), dtype=np.int64))
    assert from_sdpa_mask(sp.eye(3).toarray() > 0).nnz == 3
