"""ExecutionPlan: permutations are permutations, tiles cover the pattern exactly."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import random_patterns as _random_patterns

import sparse_patterns as sps
from sparse_patterns import Pattern
from sparse_patterns.kernels import ExecutionPlan, plan


def decode(pl: ExecutionPlan) -> list[Counter]:
    """Every (i, j) pair the plan computes, counted, per softmax group."""
    groups = [Counter() for _ in range(pl.num_groups)]
    nb = pl.nb
    for p in range(pl.num_pieces):
        g = int(pl.piece_group[p])
        for I in range(nb):
            for t in range(pl.tile_ptr[p * nb + I], pl.tile_ptr[p * nb + I + 1]):
                J = int(pl.tile_col[t])
                for r, c in pl.tile_pairs(t, I):
                    i = int(pl.qperm[p, I * pl.block + r])
                    j = int(pl.kperm[p, J * pl.block + c])
                    groups[g][(i, j)] += 1
    return groups


def expected(pattern: Pattern, mode: str) -> list[set]:
    heads = [pattern.union()] if mode == "merged" else list(pattern.heads)
    out = []
    for h in heads:
        c = h.tocoo()
        out.append(set(zip(c.row.tolist(), c.col.tolist(), strict=True)))
    return out


def check_exact(pattern: Pattern, mode: str, block: int) -> ExecutionPlan:
    pl = plan(pattern, block=block, mode=mode, cache=False)
    n = pattern.n
    for p in range(pl.num_pieces):
        assert np.array_equal(np.sort(pl.qperm[p]), np.arange(n))
        assert np.array_equal(np.sort(pl.kperm[p]), np.arange(n))
    got = decode(pl)
    want = expected(pattern, mode)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert set(g) == w, "the tiles must cover exactly the pattern"
        assert max(g.values(), default=1) == 1, "no pair may be computed twice"
    assert pl.useful_pairs.tolist() == [len(w) for w in want]
    # computed pairs = the tile areas, and no tile area is counted for a pair outside n
    area = 0
    for p in range(pl.num_pieces):
        for I, J, _ in pl.tiles(p):
            area += min(block, n - I * block) * min(block, n - J * block)
    assert int(pl.computed_pairs.sum()) == area
    return pl


def test_golden_strided_16():
    pat = sps.make("strided", 16, stride=4)
    pl = check_exact(pat, "multihead", 4)
    assert pl.piece_kind == ("identity", "residue(4)")
    # the stride head in i mod 4 order: four groups of four, each lower-triangular
    assert pl.qperm[1].tolist() == [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]
    assert pl.tiles(1)[:, :2].tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert pl.useful_pairs.tolist() == [70, 40]
    check_exact(pat, "merged", 4)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(
    "name, n, params, block",
    [
        ("strided", 64, {"stride": 8}, 8),
        ("strided", 70, {"stride": 9}, 16),
        ("strided", 50, {"stride": 7, "window": "reference"}, 8),
        ("strided", 40, {"stride": 6, "causal": False}, 8),
        ("fixed", 64, {"stride": 8, "c": 2}, 8),
        ("fixed", 75, {"stride": 10, "c": 3, "summary_heads": 2}, 16),
        ("fixed", 33, {"stride": 8, "c": 2, "causal": False}, 4),
        ("local", 30, {"window": 5}, 8),
        ("full", 17, {}, 8),
        ("longformer", 40, {"window": 3, "global_tokens": 2}, 8),
        ("bigbird", 48, {"block": 4, "seed": 1}, 8),
    ],
)
def test_tiles_cover_exactly(name, n, params, block, mode):
    check_exact(sps.make(name, n, **params), mode, block)


@pytest.mark.parametrize(
    "name, n, params, block",
    [
        ("strided", 16384, {}, 64),
        ("fixed", 16384, {"stride": 128, "c": 16}, 64),
        ("strided", 4096, {}, 32),  # l = 64: a 64-block would be about 2.0
        ("fixed", 4096, {"stride": 64, "c": 8}, 64),
    ],
)
def test_ratio_under_two_at_sqrt_n(name, n, params, block):
    pat = sps.make(name, n, **params)
    for mode in ("multihead", "merged"):
        pl = plan(pat, mode=mode, block=block)
        assert pl.ratio < 2, pl


def test_strided_is_permuted_and_fixed_keys_compacted():
    pl = plan(sps.make("strided", 1024, stride=32), mode="merged")
    assert pl.piece_kind == ("identity", "residue(32)")
    pl = plan(sps.make("fixed", 1024, stride=32, c=4), mode="merged")
    assert pl.piece_kind[0] == "identity" and pl.piece_kind[1].startswith("keys(")
    # summary keys first: a row's summary columns (c apart in groups) are runs of
    # consecutive positions, counted and masked as runs; the tiles stay exact
    for pat, block in ((sps.make("fixed", 1024, stride=32, c=4), 32),
                       (sps.make("fixed", 600, stride=24, c=5, summary_heads=2), 16)):
        for mode in ("merged", "multihead"):
            pl = check_exact(pat, mode, block)
            assert any(k.startswith("keys(") for k in pl.piece_kind)


def random_patterns():
    return _random_patterns(max_n=40, densities=(0.0, 0.02, 0.1, 0.5, 1.0), single_key=0.3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pat=random_patterns(), mode=st.sampled_from(["multihead", "merged"]),
       block=st.sampled_from([1, 3, 4, 8, 64]))
def test_random_patterns_cover_exactly(pat, mode, block):
    check_exact(pat, mode, block)


def test_plan_is_cached_and_immutable():
    pat = sps.make("strided", 64, stride=8)
    a = plan(pat, mode="merged")
    assert plan(pat, mode="merged") is a
    assert plan(pat, mode="merged", block=16) is not a
    assert plan(sps.make("strided", 64, stride=8), mode="merged") is not a
    with pytest.raises(ValueError):
        a.qperm[0, 0] = 1
    with pytest.raises(AttributeError):
        a.qperm = None
    assert a.describe()["pieces"] == list(a.piece_kind)
    assert "ExecutionPlan(" in repr(a)
    ptr, order = a.column_index()
    assert ptr[-1] == a.num_tiles and sorted(order.tolist()) == list(range(a.num_tiles))
    assert a.full_tiles.shape[1] == 3 and a.partial_tiles.shape == (a.num_partial, 4)
    assert len(a.full_tiles) + len(a.partial_tiles) == a.num_tiles


def test_flops():
    pat = sps.make("strided", 64, stride=8)
    pl = plan(pat, mode="multihead")
    u, c = pl.flops(2, 3, 16)  # heads 0, 1, 0
    nnz = pat.head_nnz
    assert u == 2 * 4 * 16 * (2 * nnz[0] + nnz[1])
    assert c >= u
    assert pl.useful_flops == 4 * sum(nnz)
    assert pl.ratio == pl.computed_flops / pl.useful_flops


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block": 0}, "block"),
        ({"block": 2.5}, "block"),
        ({"mode": "both"}, "mode"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan(sps.make("full", 8), **kwargs)


def test_bad_pattern():
    with pytest.raises(ValueError, match="pattern"):
        plan(np.ones((4, 4)))


def _plan_arrays(pl: ExecutionPlan) -> dict:
    names = ("piece_group", "qperm", "kperm", "tile_ptr", "tile_col", "tile_mask", "masks",
             "useful_pairs", "computed_pairs")
    return {k: getattr(pl, k) for k in names} | {"kind": pl.piece_kind}


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(
    "name, n, params",
    [
        ("strided", 300, {"stride": 17}),
        ("fixed", 257, {"stride": 16, "c": 3, "summary_heads": 2}),
        ("bigbird", 200, {"block": 8, "seed": 3}),
        ("local2d", 144, {}),
    ],
)
def test_tiny_chunks_give_the_plan_of_one_chunk(monkeypatch, name, n, params, mode):
    from sparse_patterns.kernels.planning import _pieces as planning

    pat = sps.make(name, n, **params)
    monkeypatch.setattr(planning, "CHUNK_ROWS", n)
    whole = _plan_arrays(plan(pat, block=8, mode=mode, cache=False))
    for rows, threads in ((1, 2), (8, 2), (24, 2), (8, 1)):  # whole query blocks of 8
        monkeypatch.setattr(planning, "CHUNK_ROWS", rows)
        # one thread: the chunks run in this thread, without a pool (a search's workers)
        monkeypatch.setattr(sps.kernels.planning, "planning_threads", lambda t=threads: t)
        got = _plan_arrays(plan(pat, block=8, mode=mode, cache=False))
        for k, v in whole.items():
            assert np.array_equal(got[k], v) if k != "kind" else got[k] == v, k
    # a user layout (no rule: rows sliced from its CSR) streams the same way
    user = Pattern(list(pat.heads), name="custom")
    got = _plan_arrays(plan(user, block=8, mode=mode, cache=False))
    assert all(np.array_equal(got[k], v) if k != "kind" else got[k] == v for k, v in whole.items())


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(
    "name, n, params, kinds",
    [
        ("strided", 400, {"stride": 20}, ("identity", "residue(20)")),
        ("fixed", 390, {"stride": 30, "c": 4}, None),
    ],
)
def test_orders_chosen_on_sampled_blocks_stay_exact(monkeypatch, name, n, params, kinds, mode):
    """With fewer sampled query blocks than the plan has, the plan is still exact."""
    from sparse_patterns.kernels.planning import _pieces as planning

    monkeypatch.setattr(planning, "SAMPLE_BLOCKS", 3)
    pl = check_exact(sps.make(name, n, **params), mode, 8)
    if kinds is not None:
        assert pl.piece_kind == kinds


def test_partial_tiles_share_distinct_masks():
    pl = plan(sps.make("strided", 1024, stride=32), block=8, mode="merged", cache=False)
    flat = pl.masks.reshape(pl.masks.shape[0], -1)
    assert len({row.tobytes() for row in flat}) == flat.shape[0]  # each mask stored once
    assert pl.num_partial == int((pl.tile_mask >= 0).sum()) > 4 * flat.shape[0]
    assert set(np.unique(pl.tile_mask[pl.tile_mask >= 0])) == set(range(flat.shape[0]))


@pytest.mark.parametrize("limit", [0, 1, 3, 1 << 16])
def test_mask_table_maps_every_tile_to_its_own_mask(limit):
    from sparse_patterns.kernels.planning._pieces import MaskTable

    rng = np.random.default_rng(limit)
    pool = np.arange(8, dtype=np.uint64).reshape(4, 2, 1)  # 4 distinct masks
    table = MaskTable(limit)
    for _ in range(5):  # chunks of masks drawn from the pool, some tiles full (-1)
        masks = pool[rng.integers(0, 4, size=6)]
        tm = rng.integers(-1, 6, size=9)
        idx = table.add(masks, tm)
        assert ((idx < 0) == (tm < 0)).all()
        got = table.array(2)
        for m, i in zip(tm, idx, strict=True):
            if m >= 0:
                assert (got[i] == masks[m]).all()
    assert table.array(2).shape[0] <= (4 if limit >= 4 else 30)


@pytest.mark.parametrize("threads, want", [("1", 1), ("3", 3), ("16", 4)])
def test_planning_threads_follow_numba_threads(threads, want):
    """A process given ``NUMBA_NUM_THREADS`` threads (a search's worker: one) builds its
    plans with as many threads, at most 4."""
    import subprocess
    import sys

    code = "from sparse_patterns.kernels.planning import planning_threads; print(planning_threads())"
    env = {**os.environ, "NUMBA_NUM_THREADS": threads}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == [str(want)]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 200), data=st.data())
def test_used_first_is_the_used_keys_then_the_others(n, data):
    """The keys a piece's sampled rows hold, in order, then the rest: NumPy's answer."""
    from sparse_patterns.kernels.planning._tiling import used_first

    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=3 * n)), dtype=np.int32)
    out = np.empty(n, np.int32)
    used = np.zeros(n, bool)
    used[idx] = True
    assert used_first(idx, n, out) == used.sum()
    np.testing.assert_array_equal(out, np.concatenate([np.flatnonzero(used),
                                                       np.flatnonzero(~used)]))
