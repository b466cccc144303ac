"""verify / hop_matrix / explain against the brute-force BFS oracle and known facts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparse_patterns import BlockLayout, Pattern, make
from sparse_patterns.analysis import MODES, explain, hop_matrix, verify
from sparse_patterns.testing import bfs_depth, bfs_verify

# ------------------------------------------------------------------ random cases


@st.composite
def cases(draw, max_n=24):
    n = draw(st.integers(1, max_n))
    heads_n = draw(st.integers(1, 3))
    causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    kind = draw(st.sampled_from(["random", "runs", "nested", "mixed"]))
    rng = np.random.default_rng(seed)
    hs = np.zeros((heads_n, n, n), bool)
    for h in range(heads_n):
        k = kind if kind != "mixed" else ["random", "runs", "nested"][h % 3]
        dens = rng.random() * 0.4
        if k == "random":
            hs[h] = rng.random((n, n)) < dens
        elif k == "runs":
            for i in range(n):
                for _ in range(rng.integers(0, 3)):
                    s = rng.integers(0, n)
                    hs[h, i, s : s + rng.integers(1, n + 1)] = True
        else:  # rows that contain the previous row (the case the kernel shortcuts)
            cur = np.zeros(n, bool)
            for i in range(n):
                if rng.random() < 0.15:
                    cur[:] = False
                cur |= rng.random(n) < dens * 0.5
                hs[h, i] = cur
        if causal:
            hs[h] = np.tril(hs[h])
    if not hs.any():
        hs[0, n - 1, 0] = True
    mode = draw(st.sampled_from(MODES))
    p = draw(st.integers(1, heads_n)) if mode == "interleaved" else draw(st.integers(1, 4))
    residual = draw(st.booleans())
    return hs, causal, p, mode, residual


def _pattern(hs, causal):
    return Pattern([sp.csr_matrix(h) for h in hs], causal=causal)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_verify_matches_bfs_oracle(case):
    hs, causal, p, mode, residual = case
    pat = _pattern(hs, causal)
    r = verify(pat, p=p, mode=mode, residual=residual, depth=True)
    o = bfs_verify(hs, p, mode, residual, causal)
    assert r.criterion1 == o["criterion1"]
    assert r.criterion2 == o["criterion2"]
    assert r.ok == (o["criterion1"] and o["criterion2"])
    assert r.hops == o["hops"]
    assert r.unreachable == o["unreachable"]
    assert r.not_in_last == o["not_in_last"]
    n = hs.shape[1]
    target = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
    assert r.targets == int(target.sum())
    # counter-examples: the smallest failing pair of each criterion
    miss2 = np.argwhere(o["hop_matrix"] == -1)
    miss1 = np.argwhere(target & ~o["in_last"])
    assert r.counterexample2 == (tuple(int(x) for x in miss2[0]) if len(miss2) else None)
    assert r.counterexample1 == (tuple(int(x) for x in miss1[0]) if len(miss1) else None)
    assert r.depth_checked
    assert r.depth == bfs_depth(hs, p, mode, residual, causal)
    np.testing.assert_array_equal(hop_matrix(pat, p=p, mode=mode, residual=residual),
                                  o["hop_matrix"])


@settings(max_examples=150, deadline=None)
@given(cases(max_n=14))
def test_explain_paths_are_valid_and_shortest(case):
    hs, causal, p, mode, residual = case
    pat = _pattern(hs, causal)
    hm = bfs_verify(hs, p, mode, residual, causal)["hop_matrix"]
    steps = [hs[m] for m in range(p)] if mode == "interleaved" else [hs.any(axis=0)] * p
    n = hs.shape[1]
    for i in range(n):
        for j in range(n):
            e = explain(pat, i, j, p=p, mode=mode, residual=residual)
            if hm[i, j] <= 0:
                assert e.path is None and e.reason
                continue
            assert e.hops == hm[i, j] == len(e.path) - 1
            assert e.path[0] == j and e.path[-1] == i
            for s, (a, b) in enumerate(zip(e.path[:-1], e.path[1:], strict=True)):
                if e.steps[s] == "residual":
                    assert residual and a == b
                else:
                    assert steps[s][b, a], (s, a, b)


# ------------------------------------------------------------------ known facts


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "name, params",
    [("strided", {"stride": 8}), ("strided", {"stride": 5, "window": "reference"}),
     ("fixed", {"stride": 8, "c": 2}), ("fixed", {"stride": 8, "c": 1}),
     ("strided", {"stride": 8, "causal": False}), ("fixed", {"stride": 8, "c": 2, "causal": False})],
)
def test_strided_and_fixed_meet_both_criteria(name, params, mode):
    r = verify(make(name, 96, **params), mode=mode)
    assert r.ok and r.criterion1 and r.criterion2
    assert r.unreachable == 0 and r.counterexample is None
    assert sum(r.hops.values()) == r.targets


def test_bidirectional_fixed_needs_summaries_in_the_last_block():
    # n = 100, l = 8: the last block (96..99) has no summary positions (6, 7 mod 8),
    # so an earlier output cannot read it in 2 steps
    r = verify(make("fixed", 100, stride=8, c=2, causal=False))
    assert not r.ok and r.counterexample == (0, 96) and r.unreachable == 96 * 4


def test_golden_strided_16():
    r = verify(make("strided", 16, stride=4))
    assert (r.ok, r.hops, r.unreachable, r.depth) == (True, {1: 70, 2: 66}, 0, 2)
    assert r.targets == 136
    expected = np.array(
        [[1, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0],
         [2, 1, 1, 1, 0, 0],
         [2, 2, 1, 1, 1, 0],
         [2, 2, 2, 1, 1, 1]]
    )
    np.testing.assert_array_equal(hop_matrix(make("strided", 6, stride=2)), expected)


def test_local_window_fails_with_correct_counterexample():
    w, n = 3, 40
    pat = make("local", n, window=w)
    r = verify(pat, p=2, mode="merged")
    assert not r.ok and not r.criterion1 and not r.criterion2
    # two steps of a window w reach back 2w: the first pair out of reach is (2w + 1, 0)
    assert r.counterexample == (2 * w + 1, 0)
    e = explain(pat, *r.counterexample, p=2, mode="merged")
    assert e.path is None and "no path" in e.reason
    # depth: about ceil((n - 1) / w) steps
    assert r.depth == -(-(n - 1) // w)
    assert r.depth == bfs_depth(pat.to_dense(), 2, "merged", True, True)


def test_never_connects():
    a = np.zeros((6, 6), bool)
    a[np.arange(6), np.arange(6)] = True  # identity only
    r = verify(Pattern.from_dense(a), p=1, depth=True)
    assert not r.ok and r.depth is None and r.depth_checked


def test_fixed_without_residual_interleaved():
    """What happens to fixed without the residual in interleaved mode: the oracle decides."""
    l, c, n = 8, 2, 64
    pat = make("fixed", n, stride=l, c=c)
    r = verify(pat, residual=False, depth=True)
    o = bfs_verify(pat.to_dense(), 2, "interleaved", False, True)
    assert (r.criterion1, r.criterion2, r.hops, r.unreachable, r.not_in_last) == (
        o["criterion1"], o["criterion2"], o["hops"], o["unreachable"], o["not_in_last"])
    # The truth (found by the oracle): criterion 2 holds -- a pair in one block is
    # joined in 1 step by A1, a pair of different blocks in 2 steps (A1 to a summary
    # position, then A2) -- but criterion 1 fails: without the residual R_2 = A2 A1
    # holds (i, j) only through a summary a with j <= a <= i, a in j's block, so a
    # same-block pair before that block's summaries is not connected across 2 steps.
    assert r.criterion2 and not r.criterion1 and r.unreachable == 0
    assert r.counterexample1 == (0, 0) and r.counterexample == (0, 0)
    per_block = (l - c) * (l - c + 1) // 2  # rows 0 .. l-c-1 of a block miss j <= i
    assert r.not_in_last == per_block * (n // l)
    e = explain(pat, 0, 0, residual=False)
    assert e.path == (0, 0) and e.steps == ("A1",) and not e.in_last
    assert r.depth == bfs_depth(pat.to_dense(), 2, "interleaved", False, True)


def test_p_one_step_and_longer_merged():
    pat = make("strided", 30, stride=5)
    assert not verify(pat, p=1, mode="merged").ok
    assert verify(pat, p=3, mode="merged").ok


def test_sequence_of_matrices_and_causal_inference():
    d = make("strided", 12, stride=3).to_dense()
    r1 = verify(list(d))
    r2 = verify(make("strided", 12, stride=3))
    assert r1.hops == r2.hops and r1.causal
    assert verify(d).hops == r2.hops
    assert not verify(d | d.transpose(0, 2, 1)).causal


def test_report_to_dict_is_json_ready():
    import json

    r = verify(make("local", 20, window=2), p=2, mode="merged")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["ok"] is False and d["counterexample"] == list(r.counterexample)
    assert d["hops"] == {str(k): v for k, v in r.hops.items()}
    assert d["budgets"][-1]["head"] == "union"
    assert "fails" in r.summary()


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "kwargs, word",
    [({"p": 0}, "p:"), ({"p": 3}, "p:"), ({"mode": "sideways"}, "mode:"),
     ({"residual": "yes"}, "residual:")],
)
def test_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        verify(make("strided", 16, stride=4), **kwargs)


def test_bad_patterns():
    with pytest.raises(ValueError, match="pattern:"):
        verify(Pattern([sp.csr_matrix((5, 5), dtype=bool)]))
    with pytest.raises(ValueError, match="different n"):
        verify([np.eye(4, dtype=bool), np.eye(5, dtype=bool)])
    with pytest.raises(ValueError, match="pattern:"):
        verify("strided")
    with pytest.raises(ValueError, match="n:"):
        hop_matrix(make("strided", 5000, stride=70))
    with pytest.raises(ValueError, match="i:"):
        explain(make("strided", 16, stride=4), 16, 0)


def test_merged_p_may_exceed_heads():
    assert verify(make("local", 10, window=3), p=4, mode="merged").ok


# ------------------------------------------------------------------ block level


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 3), st.integers(0, 2**32 - 1),
       st.sampled_from(MODES), st.booleans(), st.booleans())
def test_block_level_matches_token_level_of_dense_blocks(nb, block, heads_n, seed, mode,
                                                        residual, causal):
    """With every set block full (a block-sparse library's layout), block-level hop
    distances equal the token-level ones of the expanded pattern for i != j."""
    rng = np.random.default_rng(seed)
    lay = rng.random((heads_n, nb, nb)) < 0.4
    if causal:
        lay &= np.tril(np.ones((nb, nb), bool))
    if not lay.any():
        lay[0, nb - 1, 0] = True
    n = nb * block - int(rng.integers(0, block))
    bl = BlockLayout(lay, block=block, n=n)
    p = int(rng.integers(1, heads_n + 1)) if mode == "interleaved" else int(rng.integers(1, 4))
    r = verify(bl, p=p, mode=mode, residual=residual)
    assert r.level == "block" and r.certified == r.ok and r.partial_pairs == 0
    tok = Pattern.from_blocks(bl, causal=False)
    tlay = lay.any(axis=0)
    tcausal = not np.triu(tlay, 1).any()
    hm = bfs_verify(tok.to_dense(), p, mode, residual, False)["hop_matrix"]
    b = np.arange(n) // block
    # block-level hops: least over the token pairs of each block pair with i != j
    for I in range(nb):
        for J in range(nb):
            if tcausal and J > I:
                continue
            cells = [(i, j) for i in np.flatnonzero(b == I) for j in np.flatnonzero(b == J)
                     if i != j or (block == 1 or (b == I).sum() == 1)]
            if not cells:
                continue
            vals = {int(hm[i, j]) for i, j in cells}
            assert len(vals) == 1  # every token pair of a block pair behaves alike
    token_ok = all(hm[i, j] > 0 for i in range(n) for j in range(n)
                   if (not tcausal or b[j] <= b[i]) and (i != j or block == 1
                                                        or (b == b[i]).sum() == 1))
    assert r.criterion2 == token_ok


def test_block_level_fixed_and_partial_blocks():
    bl = make("fixed", 4096, stride=256, c=16).to_blocks(64)
    r = verify(bl)
    assert r.ok and r.level == "block" and r.n == 4096
    assert not r.certified and r.partial_pairs > 0
    assert verify(make("local", 4096, window=64).to_blocks(64), p=2, mode="merged").ok is False


def test_block_level_bad_input():
    with pytest.raises(ValueError, match="pattern:"):
        verify(BlockLayout(np.zeros((1, 2, 2), bool), block=2, n=4))
    with pytest.raises(ValueError, match="p:"):
        verify(make("strided", 64, stride=8).to_blocks(8), p=5)
