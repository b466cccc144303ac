"""``impl="flex"``: FlexAttention on each piece of an ExecutionPlan, merged by log-sum-exp.

Against independent references: the dense float64 oracle
(``kernels.reference``) for outputs and log-sum-exp on generated and random
patterns, both modes, both ``mask_mod`` kinds (eager FlexAttention on the CPU,
small n); autograd through a dense masked softmax written here for the
gradients; the pattern's own dense matrix for the plan -> ``BlockMask``
conversion (each piece's ``BlockMask``, decoded token by token with
``from_flex_block_mask``, is the permuted piece; the pieces of a group are
disjoint and cover it). One test compiles (float32 on the CPU, the anchored
log-sum-exp path, its retries, and no recompilation for a plan of the same shapes).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.nn.attention.flex_attention")

import sparse_patterns as sps  # noqa: E402
from sparse_patterns import Pattern, config  # noqa: E402
from sparse_patterns.export import from_flex_block_mask  # noqa: E402
from sparse_patterns.kernels import attention, attention_backward, flex, plan  # noqa: E402
from sparse_patterns.kernels.flex import _masks as fm  # noqa: E402
from sparse_patterns.kernels.reference import reference_backward, reference_forward  # noqa: E402
from sparse_patterns.torch import SparseAttention, sparse_attention  # noqa: E402


def _random_pattern(n: int, p: int, seed: int) -> Pattern:
    """p heads of different densities, one row with no keys, one head with one key per row."""
    rng = np.random.default_rng(seed)
    a = np.stack([rng.random((n, n)) < dd for dd in [0.5, 0.08, 0.25][:p]])
    a[0, 3] = False
    if p > 1:
        a[1] = False
        a[1, np.arange(n), rng.integers(0, n, n)] = True
    return Pattern.from_dense(a, name="random")


CASES = {
    # id: (pattern, mode, block); n not a multiple of block in most
    "strided-merged": (sps.make("strided", 30, stride=5), "merged", 8),
    "strided-multihead": (sps.make("strided", 32, stride=4), "multihead", 8),
    "fixed-merged": (sps.make("fixed", 36, stride=8, c=2), "merged", 8),
    "fixed-multihead": (sps.make("fixed", 36, stride=8, c=2), "multihead", 4),
    "local": (sps.make("local", 28, window=5, causal=False), "multihead", 8),
    "random-multihead": (_random_pattern(24, 3, seed=1), "multihead", 8),
    "random-merged": (_random_pattern(26, 3, seed=2), "merged", 8),
}


def _masks(case: str) -> list[str]:
    pat = CASES[case][0]
    return ["bits"] + (["formula"] if pat.name != "random" else [])


def _inputs(shape, seed, dtype=torch.float64, count=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype) for _ in range(count)]


def _group_dense(pat: Pattern, mode: str) -> np.ndarray:
    """bool (G, n, n): the token mask of each softmax group."""
    return pat.union().toarray()[None] if mode == "merged" else pat.to_dense()


# ------------------------------------------------------------------ the oracle, eager
@pytest.mark.parametrize("case", list(CASES))
def test_output_and_lse_equal_the_float64_oracle(case):
    pat, mode, block = CASES[case]
    pl = plan(pat, block=block, mode=mode)
    q, k, v = _inputs((2, 3, pat.n, 4), seed=hash(case) % 1000)
    want_o, want_l = reference_forward(q.numpy(), k.numpy(), v.numpy(), pat, pl, scale=0.4)
    for mask in _masks(case):
        out, lse = flex.flex_attention_plan(q, k, v, pl, scale=0.4, return_lse=True,
                                            pattern=pat, mask=mask)
        assert out.dtype == torch.float64 and lse.shape == (2, 3, pat.n)
        np.testing.assert_allclose(out.numpy(), want_o, rtol=0, atol=1e-12, err_msg=mask)
        fin = np.isfinite(want_l)
        assert np.array_equal(fin, np.isfinite(lse.numpy())), mask  # -inf exactly where no keys
        np.testing.assert_allclose(lse.numpy()[fin], want_l[fin], rtol=0, atol=1e-12)


def test_attention_api_registers_flex_forward_and_backward():
    pat, mode, block = CASES["fixed-merged"]
    x = [a.numpy() for a in _inputs((1, 2, pat.n, 4), seed=3)]
    out = attention(*x, pat, mode=mode, impl="flex", block=block)
    o, lse = attention(*x, pat, mode=mode, impl="reference", return_lse=True)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, o, atol=1e-12)
    do = np.random.default_rng(0).standard_normal(o.shape)
    got = attention_backward(*x, o, lse, do, pat, mode=mode, impl="flex", block=block)
    want = reference_backward(*x, o, lse, do, pat, plan(pat, block=block, mode=mode),
                              scale=0.5)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-10)


def test_float32_eager_and_half_inputs():
    pat, mode, block = CASES["strided-merged"]
    pl = plan(pat, block=block, mode=mode)
    q, k, v = _inputs((1, 2, pat.n, 8), seed=5, dtype=torch.float32)
    want, _ = reference_forward(q.double().numpy(), k.double().numpy(), v.double().numpy(), pat,
                                pl, scale=1 / np.sqrt(8))
    out = flex.flex_attention_plan(q, k, v, pl, compile=False, pattern=pat)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), want, atol=2e-6)
    half = flex.flex_attention_plan(*(t.bfloat16() for t in (q, k, v)), pl, compile=False)
    assert half.dtype == torch.bfloat16
    np.testing.assert_allclose(half.float().numpy(), want, atol=3e-2)


# ------------------------------------------------------------------ the BlockMask conversion
@pytest.mark.parametrize("packed", [False, True], ids=["bytes", "packed"])
@pytest.mark.parametrize("case", list(CASES))
def test_block_masks_are_the_permuted_pieces(case, packed, monkeypatch):
    """Each piece's BlockMask, read token by token (full blocks whole, partial blocks
    through the mask_mod), mapped back through the piece's permutations: the pieces of a
    group are disjoint and their union is the group's token mask. ``packed``: the bit
    table stays 64 cells a word (as for a plan with too many distinct masks)."""
    pat, mode, block = CASES[case]
    if packed:
        monkeypatch.setattr(fm, "BYTES_LIMIT", 0)
    pl = plan(pat, block=block, mode=mode, cache=False)  # a fresh plan: nothing memoized
    groups = _group_dense(pat, mode)
    n = pat.n
    for mask in _masks(case) if not packed else ["bits"]:
        got = np.zeros((pl.num_groups, n, n), dtype=np.int64)
        for p in range(pl.num_pieces):
            bm = fm.piece_block_mask(pl, p, device="cpu", mask=mask, pattern=pat)
            assert bm.BLOCK_SIZE == (block, block) and bm.shape == (1, 1, n, n)
            dense = bm.to_dense()[0, 0].numpy().astype(bool)
            assert np.array_equal(dense, fm.tile_layouts(pl, p) > 0)  # the plan's tiles
            piece = from_flex_block_mask(bm).heads[0].tocoo()  # in the piece's order
            got[pl.piece_group[p], pl.qperm[p][piece.row], pl.kperm[p][piece.col]] += 1
        assert got.max() <= 1, f"{mask}: a pair in two pieces"
        assert np.array_equal(got.astype(bool), groups), mask


def test_anchored_block_mask_adds_one_full_key_block():
    pat, mode, block = CASES["strided-merged"]  # n = 30, block 8: the last block is padded
    pl = plan(pat, block=block, mode=mode)
    for p in range(pl.num_pieces):
        bm = fm.piece_block_mask(pl, p, device="cpu", mask="bits", anchor=True)
        assert bm.shape == (1, 1, 30, 4 * 8 + 1)
        full = bm.full_kv_num_blocks[0, 0].numpy()
        idx = bm.full_kv_indices[0, 0].numpy()
        assert all(pl.nb in idx[i, :full[i]] for i in range(pl.nb))  # the anchor block
        assert not any(pl.nb - 1 in idx[i, :full[i]] for i in range(pl.nb))  # padding masked
        plain = fm.tile_layouts(pl, p) > 0
        assert np.array_equal(bm.to_dense()[0, 0].numpy()[:, :pl.nb].astype(bool), plain)
        x = torch.arange(30)  # the eager operator evaluates the mask_mod on full blocks too
        assert bm.mask_mod(0, 0, x, torch.full_like(x, 32)).all()  # the anchor: every row
        assert not bm.mask_mod(0, 0, x, torch.full_like(x, 31)).any()  # the padding: none


def test_probe_positions_are_pairs_of_the_piece():
    pat, mode, block = CASES["random-merged"]
    pl = plan(pat, block=block, mode=mode)
    groups = _group_dense(pat, mode)
    for p in range(pl.num_pieces):
        y = fm.probe_positions(pl, p)
        rows = np.flatnonzero(y >= 0)
        assert groups[pl.piece_group[p], pl.qperm[p][rows], pl.kperm[p][y[rows]]].all()


def test_piece_members_match_the_plan():
    pat = sps.make("strided", 64, stride=8)
    assert fm.piece_members(pat, plan(pat, block=8, mode="multihead")) == [(0,), (1,)]
    assert fm.piece_members(pat, plan(pat, block=8, mode="merged")) == [(0,), (1,)]


# ------------------------------------------------------------------ gradients, eager
def _dense_attention(q, k, v, masks: torch.Tensor, scale: float):
    """Masked softmax attention in plain torch, differentiable; rows without keys -> 0."""
    G = masks.shape[0]
    m = masks[torch.arange(q.shape[1]) % G][None]  # (1, H, n, n)
    s = q @ k.transpose(-1, -2) * scale
    mx = s.masked_fill(~m, -torch.inf).amax(-1, keepdim=True).detach()
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    e = torch.exp(s - mx) * m
    tot = e.sum(-1, keepdim=True)
    safe = torch.where(tot == 0, torch.ones_like(tot), tot)
    out = (e / safe) @ v
    lse = torch.log(safe.squeeze(-1)) + mx.squeeze(-1)
    return out, lse.masked_fill(tot.squeeze(-1) == 0, -torch.inf)


@pytest.mark.parametrize("case", ["strided-merged", "fixed-multihead", "random-merged",
                                  "random-multihead"])
def test_gradients_equal_autograd_through_the_dense_reference(case):
    pat, mode, block = CASES[case]
    n = pat.n
    masks = torch.from_numpy(_group_dense(pat, mode))
    x = _inputs((2, 3, n, 4), seed=11)
    wo, wl = _inputs((2, 3, n, 4), seed=12)[0], _inputs((2, 3, n), seed=13)[0]
    a = [t.clone().requires_grad_() for t in x]
    out, lse = flex.flex_attention_plan(*a, plan(pat, block=block, mode=mode), return_lse=True,
                                        pattern=pat)
    keep = torch.isfinite(lse)
    loss = (out * wo).sum() + (torch.where(keep, lse, 0) * wl).sum()
    got = torch.autograd.grad(loss, a)
    b = [t.clone().requires_grad_() for t in x]
    o2, l2 = _dense_attention(*b, masks, 0.5)
    assert torch.equal(keep, torch.isfinite(l2))
    want = torch.autograd.grad((o2 * wo).sum() + (torch.where(keep, l2, 0) * wl).sum(), b)
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()  # rows with no keys: zero, not NaN, gradients
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_sparse_attention_module_trains_through_autograd():
    pat = sps.make("strided", 32, stride=4)
    attn = SparseAttention(pat, mode="merged", impl="flex", block=8)
    assert attn.plan.block == 8 and "impl='flex'" in repr(attn)
    assert SparseAttention(sps.make("strided", 256, stride=16), impl="flex").plan.block == 128
    q = torch.randn(1, 2, 32, 4, dtype=torch.float64, requires_grad=True)
    y = attn(q, q, q)
    y.square().sum().backward()
    z = sparse_attention(q.detach(), q.detach(), q.detach(), pat, mode="merged", impl="reference",
                         block=8)
    torch.testing.assert_close(y.detach(), z, rtol=0, atol=1e-12)
    assert q.grad is not None and torch.isfinite(q.grad).all()


# ------------------------------------------------------------------ compiled (one case)
def test_compiled_cpu_path_matches_the_oracle_without_recompiling():
    """float32 on the CPU: compiled FlexAttention has no log-sum-exp there, so the merged
    pieces carry an anchor key. Exact against the oracle (including rows whose probe score
    is far below their log-sum-exp: the retries); a second plan of the same shapes and a
    multihead plan reuse the graphs (one per input shape)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    n, block = 45, 16  # the last block padded
    q, k, v = _inputs((1, 2, n, 8), seed=21, dtype=torch.float32)
    for pat, big in ((sps.make("strided", n, stride=5), 1.0), (sps.make("strided", n, stride=7),
                                                               1.0),
                     (sps.make("strided", n, stride=7), 30.0)):
        pl = plan(pat, block=block, mode="merged")
        qq = q * big  # scores spanning hundreds: probes far below the row's log-sum-exp
        out, lse = flex.flex_attention_plan(qq, k, v, pl, return_lse=True, mask="bits")
        wo, wl = reference_forward(qq.double().numpy(), k.double().numpy(), v.double().numpy(),
                                   pat, pl, scale=1 / np.sqrt(8))
        np.testing.assert_allclose(out.numpy(), wo, atol=3e-5 * big)
        np.testing.assert_allclose(lse.numpy(), wl, rtol=1e-5, atol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    pat = sps.make("strided", n, stride=5)  # multihead: one piece a group, no anchor
    pl = plan(pat, block=block, mode="multihead")
    out = flex.flex_attention_plan(q, k, v, pl, mask="bits")
    wo, _ = reference_forward(q.double().numpy(), k.double().numpy(), v.double().numpy(), pat,
                              pl, scale=1 / np.sqrt(8))
    np.testing.assert_allclose(out.numpy(), wo, atol=3e-6)
    assert counters["stats"]["unique_graphs"] == 2


# ------------------------------------------------------------------ bad input
def test_without_torch_or_with_a_torch_too_old(monkeypatch):
    pat = sps.make("strided", 16, stride=4)
    x = np.zeros((1, 1, 16, 4))
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "torch", None)
        with pytest.raises(ValueError, match=r"^impl: 'flex' needs torch >= 2.5, which is not"):
            attention(x, x, x, pat, impl="flex")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "torch.nn.attention.flex_attention", None)
        with pytest.raises(ValueError, match=r"needs torch >= 2.5 \(FlexAttention\); found torch"):
            attention(x, x, x, pat, impl="flex")
        with pytest.raises(ValueError, match="FlexAttention"):
            SparseAttention(pat, impl="flex")
        assert not flex.available()
    assert flex.available()


def test_bad_input_one_line_errors():
    pat, mode, block = CASES["strided-merged"]
    pl = plan(pat, block=block, mode=mode)
    q, k, v = _inputs((1, 2, pat.n, 4), seed=1)
    cases = [
        (lambda: flex.check_block(64, "cuda"), r"^block: must be a multiple of 128 .* got 64$"),
        (lambda: flex.flex_attention_plan(q, k.float(), v, pl), r"^k: dtype torch.float32"),
        (lambda: flex.flex_attention_plan(q[:, :, :5], k[:, :, :5], v[:, :, :5], pl),
         r"^q: sequence length n=5 disagrees with the plan's n=30$"),
        (lambda: flex.flex_attention_plan(q, k, v[..., :2], pl), r"^v: shape"),
        (lambda: flex.flex_attention_plan(q.numpy(), k, v, pl), r"^q: impl='flex' takes torch"),
        (lambda: flex.flex_attention_plan(q.int(), k.int(), v.int(), pl), r"^q: dtype int32"),
        (lambda: flex.flex_attention_plan(q, k, v, pl, compile=True),
         r"^compile: FlexAttention compiled on the CPU has no float64"),
        (lambda: flex.flex_attention_plan(q.float().requires_grad_(), k.float(), v.float(), pl,
                                          compile=True), r"has no gradients"),
        (lambda: flex.flex_attention_plan(q, k, v, pl, compile="yes"), r"^compile: must be"),
        (lambda: flex.flex_attention_plan(q, k, v, pl, mask="dense"), r"^mask: "),
        (lambda: flex.flex_attention_plan(q, k, v, pl, mask="formula"),
         r"^mask: 'formula' needs the Pattern"),
        (lambda: flex.flex_attention_plan(q, k, v, pl, scale=float("nan")), r"^scale: "),
        (lambda: attention(q.numpy(), k, v, pat, impl="flex"), r"^q, k, v: mix NumPy"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg) as e:
            fn()
        assert "\n" not in str(e.value)


def test_eager_memory_is_checked_before_anything_is_allocated():
    pat = sps.make("strided", 512, stride=16)
    pl = plan(pat, block=64, mode="merged")
    q = torch.zeros(1, 1, 512, 4, dtype=torch.float64)
    with config.memory_limit(1 << 20), pytest.raises(config.MemoryLimitError,
                                                     match=r"^compile: eager FlexAttention"):
        flex.flex_attention_plan(q, q, q, pl)
