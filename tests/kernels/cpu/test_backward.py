"""The CPU backward against torch autograd through dense masked attention in float64.

The reference is built here, independently of the package: a dense boolean mask per
attention head from the pattern's CSR rows, masked softmax attention in float64 torch,
and autograd. Float32 with 32-token tiles and ``d`` a multiple of 16 takes the fused
path of the kernel (``_kblock32``); float64, other tiles or other ``d`` the BLAS path.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import random_patterns

import sparse_patterns as sps
from sparse_patterns import Pattern
from sparse_patterns.kernels import attention, attention_backward, plan

torch = pytest.importorskip("torch")


def dense_masks(pattern: Pattern, mode: str, H: int) -> np.ndarray:
    """``bool (H, n, n)`` from the CSR rows: head ``h`` attends pattern head ``h % p``
    (``multihead``) or the union of all heads (``merged``)."""
    n = pattern.n
    heads = np.zeros((pattern.num_heads, n, n), bool)
    for m, csr in enumerate(pattern.heads):
        rows = np.repeat(np.arange(n), np.diff(csr.indptr))
        heads[m, rows, csr.indices] = True
    if mode == "merged":
        return np.repeat(heads.any(0)[None], H, axis=0)
    return heads[np.arange(H) % pattern.num_heads]


def dense_grads(q, k, v, do, masks, scale):
    """``(dq, dk, dv)`` float64 of ``sum(out * do)``, ``out`` = masked softmax attention
    (a row without keys gives 0), by torch autograd."""
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    m = torch.from_numpy(np.ascontiguousarray(masks))
    has = m.any(-1, keepdim=True)
    s = (tq @ tk.transpose(-1, -2)) * scale
    s = torch.where(has, s.masked_fill(~m, float("-inf")), 0.0)  # no -inf-only rows
    p = torch.where(has, torch.softmax(s, -1), 0.0)
    (p @ tv * torch.tensor(do, dtype=torch.float64)).sum().backward()
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


def inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(4))


def run(pattern, mode, dtype, *, H=2, B=1, d=16, block=32, seed=0, pl=None):
    """Kernel and reference gradients on random inputs."""
    q, k, v, do = inputs((B, H, pattern.n, d), dtype, seed)
    pl = pl if pl is not None else plan(pattern, mode=mode, block=block)
    out, lse = attention(q, k, v, pl, mode=mode, return_lse=True)
    got = attention_backward(q, k, v, out, lse, do, pl, mode=mode)
    want = dense_grads(q, k, v, do, dense_masks(pattern, mode, H), 1 / np.sqrt(d))
    return got, want


def assert_close(got, want, dtype):
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype and g.shape == w.shape
        scale = max(1.0, float(np.abs(w).max()))
        if dtype == np.float64:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11 * scale)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5 * scale)


# --------------------------------------------------------------------- random patterns
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pat=random_patterns(max_n=80, densities=(0.0, 0.05, 0.3, 1.0), single_key=0.4),
       mode=st.sampled_from(["multihead", "merged"]), d=st.sampled_from([16, 32, 48, 64]),
       seed=st.integers(0, 3))
def test_fused_float32_matches_autograd_on_random_patterns(pat, mode, d, seed):
    """32-token float32 tiles (the fused path): partial tiles of every shape, rows
    without keys, a last block shorter than 32."""
    got, want = run(pat, mode, np.float32, H=3, d=d, seed=seed)
    assert_close(got, want, np.float32)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pat=random_patterns(max_n=40, densities=(0.0, 0.1, 0.5, 1.0), single_key=0.4),
       mode=st.sampled_from(["multihead", "merged"]), block=st.sampled_from([4, 8, 32]),
       dtype=st.sampled_from([np.float64, np.float32]), d=st.sampled_from([3, 8]))
def test_blas_path_matches_autograd_on_random_patterns(pat, mode, block, dtype, d):
    """Float64 (exact), and float32 with tiles other than 32 or ``d`` not a multiple of 16."""
    got, want = run(pat, mode, dtype, H=2, d=d, block=block)
    assert_close(got, want, dtype)


# --------------------------------------------------------------------- the plans' pieces
@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("name, n, params, d", [
    ("strided", 256, {"stride": 16}, 64),  # natural band + residue piece, whole tiles
    ("strided", 600, {"stride": 9}, 16),  # residue piece; last block of 24 rows
    ("strided", 1100, {"stride": 33}, 32),
    ("fixed", 1000, {"stride": 128, "c": 16}, 64),  # keys piece: columns of many chunks
    ("fixed", 300, {"stride": 32, "c": 4}, 48),
])
def test_fused_float32_on_the_plans_pieces(mode, name, n, params, d):
    got, want = run(sps.make(name, n, **params), mode, np.float32, B=2, H=3, d=d)
    assert_close(got, want, np.float32)


@pytest.mark.parametrize("qrange", [1, 3])
@pytest.mark.parametrize("name, n, params", [
    ("fixed", 1000, {"stride": 128, "c": 16}),  # long columns, split across query ranges
    ("strided", 600, {"stride": 9}),  # residue piece (work items: not split) and band
    ("local", 500, {"window": 70}),
])
def test_key_blocks_take_the_query_blocks_a_range_at_a_time(monkeypatch, qrange, name, n,
                                                            params):
    """With ``_QRANGE`` query blocks a pass (1: each tile of a column in a pass of its
    own; 3: columns cut at every third block), dk and dv add up the passes' partial
    sums and dq rows are set on first use as before."""
    from sparse_patterns.kernels.cpu import _backward

    monkeypatch.setattr(_backward, "_QRANGE", qrange)
    pat = sps.make(name, n, **params)
    for mode in ("multihead", "merged"):
        got, want = run(pat, mode, np.float32, B=2, H=3, d=32)
        assert_close(got, want, np.float32)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pat=random_patterns(max_n=140, densities=(0.05, 0.3, 1.0), single_key=0.3),
       mode=st.sampled_from(["multihead", "merged"]), qrange=st.integers(1, 3))
def test_query_ranges_on_random_patterns(pat, mode, qrange):
    from sparse_patterns.kernels.cpu import _backward

    saved = _backward._QRANGE
    _backward._QRANGE = qrange
    try:
        got, want = run(pat, mode, np.float32, H=2, d=16)
    finally:
        _backward._QRANGE = saved
    assert_close(got, want, np.float32)


@pytest.mark.parametrize("blocks", [1, 4])
def test_residue_piece_in_small_work_items_or_gathered(monkeypatch, blocks):
    """With work items of at most ``blocks`` blocks the residue piece runs in one item
    per residue class (4: a class is 3 blocks), or in none, when its block ranges are
    larger than two items (1): then every chunk gathers its query rows, which are not
    runs of tokens."""
    from sparse_patterns.kernels.cpu import _schedule

    monkeypatch.setattr(_schedule, "_ITEM_BLOCKS", blocks)
    pat = sps.make("strided", 960, stride=10)
    for mode in ("multihead", "merged"):
        pl = plan(pat, mode=mode, block=32)  # a new plan: its work items not yet derived
        item_ptr, items, _, _ = _schedule._backward_items(pl)
        p = list(pl.piece_kind).index("residue(10)")
        assert item_ptr[p + 1] - item_ptr[p] == (0 if blocks == 1 else 10)
        for dtype in (np.float32, np.float64):
            got, want = run(pat, mode, dtype, d=32, pl=plan(pat, mode=mode, block=32))
            assert_close(got, want, dtype)


@pytest.mark.parametrize(("name", "params", "mode"), [
    ("strided", {"stride": 10}, "merged"), ("strided", {"stride": 10}, "multihead"),
    ("fixed", {"stride": 32, "c": 4}, "merged"), ("local", {"window": 40}, "merged")])
def test_pieces_in_work_items_run_first(name, params, mode):
    """The backward runs the pieces it runs in work items (residue classes, rows out of
    token order) first, so that their first writes store and the pieces in token order
    add; the others after them, each kind in plan order. Any order gives the oracle's
    gradients (float32 and the exact float64 path)."""
    from sparse_patterns.kernels.cpu._schedule import _backward_items, _backward_order

    pat = sps.make(name, 960, **params)
    pl = plan(pat, mode=mode, block=32)
    order = _backward_order(pl).tolist()
    items = np.diff(_backward_items(pl)[0]) > 0
    assert sorted(order) == list(range(pl.num_pieces))
    assert [not items[p] for p in order] == sorted(not x for x in items)
    for kind in (False, True):
        ps = [p for p in order if items[p] == kind]
        assert ps == sorted(ps)
    if name == "strided" and mode == "merged":
        assert order == [1, 0] and pl.piece_kind[1] == "residue(10)"  # then the window
    if name == "fixed":
        assert order == list(range(pl.num_pieces))  # no work items: the plan's order
    for dtype in (np.float32, np.float64):
        got, want = run(pat, mode, dtype, d=32, pl=pl)
        assert_close(got, want, dtype)


def test_rows_without_keys_get_zero_gradients():
    m = np.tril(np.ones((70, 70), bool))
    m[[3, 40, 69]] = False  # rows without keys, in full and partial tiles
    m[:, 50] = False  # a key nobody attends
    pat = Pattern.from_dense(m)
    got, want = run(pat, "merged", np.float32, d=16)
    assert_close(got, want, np.float32)
    dq, dk, dv = got
    assert (dq[:, :, [3, 40, 69]] == 0).all()
    assert (dk[:, :, 50] == 0).all() and (dv[:, :, 50] == 0).all()


def test_one_key_rows_and_large_scores():
    """Rows that attend a single key (P = 1) and scores far from 0 (an exponent that a
    poor shift by the log-sum-exp would overflow or underflow)."""
    n = 96
    m = np.eye(n, dtype=bool)
    m[40:, :8] = True
    pat = Pattern.from_dense(m)
    q, k, v, do = inputs((1, 2, n, 16), np.float32, seed=3)
    q *= 6.0
    out, lse = attention(q, k, v, pat, return_lse=True)
    got = attention_backward(q, k, v, out, lse, do, pat)
    want = dense_grads(q, k, v, do, dense_masks(pat, "multihead", 2), 0.25)
    assert_close(got, want, np.float32)


# --------------------------------------------------------------------- NaN
def keys_sharing_a_tile(pl, i):
    """``bool (n,)``: the keys of every tile of the plan that holds query ``i``."""
    n, nb, b = pl.n, pl.nb, pl.block
    out = np.zeros(n, bool)
    for p in range(pl.num_pieces):
        I = int(np.flatnonzero(pl.qperm[p] == i)[0]) // b
        for J in pl.tile_col[pl.tile_ptr[p * nb + I]: pl.tile_ptr[p * nb + I + 1]]:
            out[pl.kperm[p][J * b: min(n, (J + 1) * b)]] = True
    return out


@pytest.mark.parametrize("dtype, block", [(np.float32, 32), (np.float64, 32), (np.float64, 8)])
def test_nan_query_reaches_what_the_pattern_says(dtype, block):
    """A NaN in query row ``i``: ``dq[i]`` and the ``dk``, ``dv`` rows of the keys ``i``
    attends are NaN; every other ``dq`` row and ``dv`` row is exact (the gradients of the
    same inputs with row ``i`` left out: ``q[i] = do[i] = 0``). A ``dk`` row of a key
    that ``i`` does not attend may be NaN through ``0 * NaN`` in a tile that holds row
    ``i`` (as in fused torch kernels); every other one is exact."""
    pat = sps.make("strided", 256, stride=16)
    n, i = pat.n, 77
    q, k, v, do = inputs((1, 1, n, 16), dtype, seed=5)
    attends = dense_masks(pat, "merged", 1)[0, i]
    q0, do0 = q.copy(), do.copy()
    q0[0, 0, i] = 0.0
    do0[0, 0, i] = 0.0
    want = dense_grads(q0, k, v, do0, dense_masks(pat, "merged", 1), 0.25)
    q[0, 0, i, 5] = np.nan
    pl = plan(pat, mode="merged", block=block)
    out, lse = attention(q, k, v, pl, mode="merged", return_lse=True)
    dq, dk, dv = attention_backward(q, k, v, out, lse, do, pl, mode="merged")
    assert np.isnan(dq[0, 0, i]).all()
    assert np.isnan(dk[0, 0, attends]).all() and np.isnan(dv[0, 0, attends]).all()
    rest = np.arange(n) != i
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dq[0, 0, rest], want[0][0, 0, rest], **tol)
    np.testing.assert_allclose(dv[0, 0, ~attends], want[2][0, 0, ~attends], **tol)
    clean = ~keys_sharing_a_tile(pl, i)
    assert clean.sum() > n // 2
    np.testing.assert_allclose(dk[0, 0, clean], want[1][0, 0, clean], **tol)
    shared = ~attends & ~clean
    np.testing.assert_allclose(dk[0, 0, shared][np.isfinite(dk[0, 0, shared])],
                               want[1][0, 0, shared][np.isfinite(dk[0, 0, shared])], **tol)


# --------------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("name, n, params, block", [
    ("strided", 20, {"stride": 4}, 4),
    ("fixed", 24, {"stride": 8, "c": 2}, 8),
    ("strided", 40, {"stride": 6}, 32),  # 32-token tiles, a partial last block
])
def test_gradcheck_fp64(mode, name, n, params, block):
    from sparse_patterns.torch import SparseAttention, sparse_attention

    pat = sps.make(name, n, **params)
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, 2, n, 3, dtype=torch.float64, generator=g, requires_grad=True)
               for _ in range(3))
    assert torch.autograd.gradcheck(SparseAttention(pat, mode=mode, block=block), (q, k, v),
                                    eps=1e-6, atol=1e-8)
    assert torch.autograd.gradcheck(
        lambda a, b, c: sparse_attention(a, b, c, pat, mode=mode, block=block, scale=0.7),
        (q, k, v), eps=1e-6, atol=1e-8)


def test_tile_ranges_bound_the_nonzero_entries():
    """What the fused passes skip: for each partial mask, the rows of a tile that see one
    of keys ``4g .. 4g+3`` and the keys that one of rows ``4g .. 4g+3`` sees lie within
    the ranges, the first and last of them on their bounds."""
    from sparse_patterns.kernels.cpu._llvm_bwd import _tile_ranges

    pat = sps.make("strided", 1000, stride=9)
    pl = plan(pat, mode="merged", block=32)
    table = _tile_ranges(pl.masks)
    assert table.shape == (pl.masks.shape[0] + 1, 32)
    bits = np.unpackbits(pl.masks.view(np.uint8), axis=-1, bitorder="little")[..., :32]
    full = np.ones((1, 32, 32), np.uint8)
    for dense, row in zip(np.concatenate([bits, full]).astype(bool), table, strict=True):
        for g in range(8):
            rows = np.flatnonzero(dense[:, 4 * g: 4 * g + 4].any(1))
            keys = np.flatnonzero(dense[4 * g: 4 * g + 4].any(0))
            assert tuple(row[2 * g: 2 * g + 2]) == ((rows[0], rows[-1] + 1) if rows.size
                                                    else (0, 0))
            assert tuple(row[16 + 2 * g: 18 + 2 * g]) == ((keys[0], keys[-1] + 1) if keys.size
                                                          else (0, 0))
