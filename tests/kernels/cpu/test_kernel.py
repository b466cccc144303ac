"""The attention kernels against the dense float64 oracle of ``sparse_patterns.testing``."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import random_patterns as _random_patterns

import sparse_patterns as sps
from sparse_patterns import Pattern
from sparse_patterns.kernels import (
    Backend,
    Impl,
    attention,
    attention_backward,
    backend_names,
    get_backend,
    plan,
    register_backend,
)
from sparse_patterns.kernels.backend import unregister
from sparse_patterns.kernels.reference import reference_backward
from sparse_patterns.testing import attention_masks, attention_oracle

TOL = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-6)}


def qkv(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


def check(pat, mode, dtype, *, H=3, d=8, block=16, impl="numba", B=2, seed=0):
    q, k, v = qkv((B, H, pat.n, d), dtype, seed)
    out, lse = attention(q, k, v, pat, mode=mode, impl=impl, return_lse=True, block=block)
    ref, ref_lse = attention_oracle(q, k, v, attention_masks(pat, mode, H))
    assert out.dtype == dtype and out.shape == q.shape
    np.testing.assert_allclose(out, ref, **TOL[dtype])
    np.testing.assert_allclose(lse, ref_lse, **TOL[dtype])
    return out, lse


def test_golden_strided_16_every_impl_and_mode():
    pat = sps.make("strided", 16, stride=4)
    for impl in ("numba", "reference"):
        for mode in ("multihead", "merged"):
            for dtype in (np.float64, np.float32):
                check(pat, mode, dtype, block=4, impl=impl)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(
    "name, n, params, block",
    [
        ("strided", 64, {"stride": 8}, 16),
        ("strided", 77, {"stride": 9}, 16),  # n a multiple of neither block nor stride
        ("strided", 50, {"stride": 7, "causal": False}, 8),
        ("fixed", 96, {"stride": 16, "c": 4}, 16),
        ("fixed", 70, {"stride": 12, "c": 3, "summary_heads": 2}, 32),
        ("local", 40, {"window": 6}, 64),
        ("full", 150, {}, 8),  # 19 tiles in a row: several online-softmax chunks
        ("bigbird", 48, {"block": 4, "seed": 2}, 8),
    ],
)
def test_patterns_match_oracle(name, n, params, block, mode, dtype):
    check(sps.make(name, n, **params), mode, dtype, block=block)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("name, n, params, block, reorder", [
    ("strided", 45, {"stride": 6}, 8, False),  # residue groups straddle blocks
    ("strided", 400, {"stride": 4}, 2, True),  # a work item's keys span > 16 blocks
    ("fixed", 600, {"stride": 16, "c": 2}, 4, True),  # summary keys put first, once
    ("fixed", 130, {"stride": 16, "c": 4}, 8, False),
])
def test_key_orders_copied_per_work_item_or_once(mode, name, n, params, block, reorder):
    """Both ways of putting a piece's keys in its order (a copy per work item, or one
    reordering of the used key blocks per call) give the oracle's result."""
    from sparse_patterns.kernels.cpu._schedule import _block_steps, _item_span

    pat = sps.make(name, n, **params)
    pl = plan(pat, mode=mode, block=block)
    _, kstep = _block_steps(pl.kperm, block)
    spans = [_item_span(pl.tile_ptr[p * pl.nb: (p + 1) * pl.nb + 1], pl.tile_col, 8)
             for p in range(pl.num_pieces) if (kstep[p] != 1).any()]
    assert spans and any(s > 16 for s in spans) == reorder
    for dtype in (np.float64, np.float32):
        check(pat, mode, dtype, block=block)


def test_work_items_copy_each_of_their_rows_once_in_run_order():
    """A gathered piece split in several work items (here a residue order whose
    classes straddle the items): each item copies every key position of its tiles and
    every query position of its blocks exactly once, keys by runs of grid rows and,
    within a run, class by class (see ``_copy_orders``); and the forward through those
    copies gives the oracle's result."""
    from sparse_patterns.kernels.cpu._schedule import (
        _COPY_RUN,
        _LOCAL_ROWS,
        _forward_steps,
        _residues,
    )

    pat = sps.make("strided", 3000, stride=37)  # 37 classes of 81-82 tokens
    block = 4
    pl = plan(pat, mode="merged", block=block)
    # float32 items, and bf16's (twice the rows)
    steps = [(st, rows) for rows in (_LOCAL_ROWS, 2 * _LOCAL_ROWS)
             for st in _forward_steps(pl, 8, rows) if st[3] > 0]
    assert len(steps) >= 2
    for step, rows in steps:
        p, items, kperm, copies = step[0], step[4], step[8], step[9]
        s = int(_residues(pl)[p])
        assert s == 37 and items == rows // block
        kx0, kptr, korder, qptr, qorder = copies
        assert kx0.size == -(-pl.nb // items) >= 2
        for w, I0 in enumerate(range(0, pl.nb, items)):
            I1 = min(pl.nb, I0 + items)
            cols = pl.tile_col[pl.tile_ptr[p * pl.nb + I0]: pl.tile_ptr[p * pl.nb + I1]]
            x0, x1 = cols.min() * block, min(pl.n, (cols.max() + 1) * block)
            assert kx0[w] == x0
            keys = korder[kptr[w]: kptr[w + 1]]
            np.testing.assert_array_equal(np.sort(keys), np.arange(x0, x1))
            queries = qorder[qptr[w]: qptr[w + 1]]
            np.testing.assert_array_equal(np.sort(queries), np.arange(I0 * block, min(pl.n, I1 * block)))
            for pos, perm in ((keys, kperm), (queries, pl.qperm[p])):
                run = perm[pos] // (_COPY_RUN * s)  # the run of grid rows of each token
                assert (np.diff(run) >= 0).all()
                same = np.diff(run) == 0
                assert (np.diff(pos)[same] > 0).all()  # within a run, in the piece's order
    for dtype in (np.float64, np.float32):
        check(pat, "merged", dtype, H=2, d=8, B=1, block=block)


def test_keys_that_every_work_item_sees_are_reordered_once_not_copied_per_item():
    """A gathered piece whose work items each span no more than twice their queries
    in keys, but all the same keys (fixed's summary keys): one reordering of its
    used key rows per call instead of a copy per item, which an item spanning its
    own keys (a residue order) keeps; both give the oracle's result."""
    from sparse_patterns.kernels.cpu._schedule import _LOCAL_ROWS, _forward_steps, _item_span

    for pat, want in ((sps.make("fixed", 2048, stride=128, c=16), "keys("),
                      (sps.make("strided", 2048, stride=64), "residue(")):
        pl = plan(pat, mode="merged", block=32)
        nb = pl.nb
        steps = {pl.piece_kind[st[0]]: st for st in _forward_steps(pl, 8)}
        (kind,) = [k for k in steps if k.startswith(want)]
        p, span, items, reorder = steps[kind][0], steps[kind][3], steps[kind][4], steps[kind][5]
        ptr = pl.tile_ptr[p * nb: (p + 1) * nb + 1]
        cols = pl.tile_col[ptr[0]: ptr[-1]]
        used = int(cols.max()) + 1
        per_item = max(8, -(-_LOCAL_ROWS // 32))  # blocks of a gathered piece's items
        spans = _item_span(ptr, pl.tile_col, per_item)
        assert spans <= 2 * per_item  # not the span test: the count of items decides
        if want == "keys(":
            assert -(-nb // per_item) * spans > 2 * used
            assert reorder == (0, min(pl.n, used * 32)) and span == 0 and items == 8
        else:
            assert reorder is None and span == spans and items == per_item
        check(pat, "merged", np.float32, H=2, d=16, block=32, B=1)


@pytest.mark.parametrize(
    "name, n, params, block, d",
    [
        ("strided", 200, {"stride": 16}, 32, 16),  # residue order: query rows gathered
        ("strided", 150, {"stride": 10}, 16, 48),  # n a multiple of neither
        ("fixed", 160, {"stride": 32, "c": 4}, 32, 32),
        ("strided", 200, {"stride": 16}, 32, 64),
        ("fixed", 96, {"stride": 32, "c": 4}, 32, 128),
        ("full", 64, {"causal": False}, 32, 64),  # full tiles only: no masks at all
    ],
)
def test_query_tiles_transposed_in_registers(name, n, params, block, d):
    """Query blocks of 16 or 32 rows with ``d`` a multiple of 16 take the vector
    transpose (:func:`_transpose16`); the last, partial block the scalar loop. With
    32-token float32 tiles the scores are one register-blocked pass (:func:`_scores32`)."""
    pat = sps.make(name, n, **params)
    for mode in ("multihead", "merged"):
        for dtype in (np.float64, np.float32):
            check(pat, mode, dtype, H=2, d=d, block=block, B=1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transpose16_against_numpy(dtype):
    import numba

    from sparse_patterns.kernels.cpu._llvm import _transpose16

    @numba.njit
    def run(src, roff, i0, c0, dst, doff, dld):
        _transpose16(src, roff, i0, c0, dst, doff, dld)

    rng = np.random.default_rng(5)
    src = rng.standard_normal(40 * 24).astype(dtype)  # 40 rows of 24
    rows = rng.permutation(40)[:20]  # arbitrary rows, in any order
    roff = (rows * 24).astype(np.int64)
    dst = np.zeros(20 * 30, dtype)
    run(src, roff, 3, 5, dst, 7, 30)  # rows roff[3:19], columns 5..20
    want = np.zeros_like(dst)
    for c in range(16):
        want[7 + c * 30: 7 + c * 30 + 16] = src.reshape(40, 24)[rows[3:19], 5 + c]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_copy_nt_writes_whole_rows_and_nothing_else(dtype):
    """The non-temporal row copy: ``count`` elements from any offset of the source
    to a cache-line-aligned destination, the rest of the destination untouched."""
    import numba

    from sparse_patterns.kernels.cpu._llvm import _copy_nt
    from sparse_patterns.kernels.cpu._pool import _aligned

    @numba.njit
    def run(dst, doff, src, soff, count):
        _copy_nt(dst, doff, src, soff, count)

    src = np.random.default_rng(6).standard_normal(300).astype(dtype)
    dst = _aligned(400, src)
    dst[:] = -7.0
    lanes = 64 // dst.itemsize
    run(dst, 2 * lanes, src, 5, 4 * lanes)  # 4 vectors; source offset off its lines
    want = np.full(400, -7.0, dtype)
    want[2 * lanes: 6 * lanes] = src[5: 5 + 4 * lanes]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_aligned_buffers_start_on_a_cache_line(dtype):
    """The kernels' work buffers start on 64-byte boundaries, whatever the allocator
    returns, and have the size and dtype asked for."""
    from sparse_patterns.kernels.cpu._pool import _aligned

    like = np.zeros(3, dtype)
    for size in (0, 1, 15, 16, 1000, 2048 * 64):
        a = _aligned(size, like)
        assert a.dtype == dtype and a.shape == (size,) and a.flags.c_contiguous
        assert a.ctypes.data % 64 == 0
        a[:] = 1  # writable over its whole length
        assert a.sum() == size


@pytest.mark.parametrize("avx512", [True, False])
def test_exp32_matches_the_vectorized_loop_bit_for_bit(avx512, monkeypatch):
    """The register-kept exponential pass of the fused 32-token path gives the same
    bits as :func:`_exp_cols` (the path other tile sizes take), including a column
    whose max is ``-inf``, NaN and ``-inf`` scores, and exponents below float32's
    normal range; with AVX-512's ``vscalefps`` and with the bit construction that
    other CPUs get."""
    import numba

    from sparse_patterns.kernels.cpu import _llvm as cpu  # _AVX512 is read there
    from sparse_patterns.kernels.cpu._llvm_fwd import _exp32
    from sparse_patterns.kernels.cpu._softmax import _exp_cols

    if avx512 and not cpu._AVX512:
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setattr(cpu, "_AVX512", avx512)  # read when the function below compiles

    @numba.njit
    def fused(st, nk, cmax, csum):
        _exp32(st, nk, cmax, csum)

    @numba.njit
    def loop(st, nk, cmax, msub, csum):
        _exp_cols(st.reshape((nk, 32)), nk, 32, cmax, msub, csum, False)

    rng = np.random.default_rng(11)
    nk = 70
    st = (rng.standard_normal(nk * 32) * 40).astype(np.float32)
    st[rng.random(st.size) < 0.1] = -np.inf
    st[[5, 300, 1000]] = np.nan
    # column 3 has no key so far (below): these are the exponents themselves
    st[[3, 35, 67, 99, 131, 163]] = [-130.0, -126.5, -125.9, -149.7, -150.2, -np.inf]
    cmax = st.reshape(nk, 32).max(axis=0)  # NaN where a column has one
    cmax[[3, 17]] = -np.inf  # columns with no key so far
    cmax = cmax.astype(np.float32)
    a, b = st.copy(), st.copy()
    sa, sb = np.zeros(32, np.float32), np.zeros(32, np.float32)
    fused(a, nk, cmax, sa)
    loop(b, nk, cmax, np.zeros(32, np.float32), sb)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    np.testing.assert_array_equal(sa.view(np.uint32), sb.view(np.uint32))
    np.testing.assert_array_equal(a[[3, 35, 99, 131, 163]], 0.0)  # below 2**-126: 0
    finite = np.isfinite(st) & np.isfinite(cmax)[None, :].repeat(nk, 0).reshape(-1)
    with np.errstate(invalid="ignore"):  # inf - inf where not `finite`
        x = st - np.repeat(cmax[None, :], nk, 0).reshape(-1)  # the float32 difference
    np.testing.assert_allclose(a[finite], np.exp2(x[finite].astype(np.float64)),
                               rtol=3e-7, atol=1e-37)


def test_scores32_skips_only_query_halves_that_no_key_of_a_group_sees():
    """The fused score pass against NumPy on tiles whose masks leave, per group of 8
    keys, both 16-query halves, only the low one, only the high one, or neither
    visible (the pass computes only the visible halves): every score is
    ``alpha K Q^T`` where its bit is set and ``-inf`` elsewhere, full tiles unmasked,
    the column max over the visible scores; a NaN key in a visible half stays NaN."""
    import numba

    from sparse_patterns.kernels.cpu._llvm_fwd import _scores32

    @numba.njit
    def run(k, koff, qt, st, ntile, d, alpha, tmask, t0, maskt, cmax):
        _scores32(k, koff, qt, st, ntile, d, alpha, tmask, t0, maskt, cmax)

    rng = np.random.default_rng(11)
    d, ntile, koff = 48, 3, 5
    low, high = np.uint32(0x0000FFFF), np.uint32(0xFFFF0000)
    words = np.zeros((2, 32), np.uint32)  # 2 masks, the query bits of each key
    words[0, 0:8] = rng.integers(1, 2**32, 8, dtype=np.uint32)  # both halves (random)
    words[0, 8:16] = rng.integers(1, 2**16, 8, dtype=np.uint32) & low  # low half only
    words[0, 16:24] = (rng.integers(1, 2**16, 8, dtype=np.uint32) << np.uint32(16)) & high
    words[0, 27] = np.uint32(1) << np.uint32(31)  # keys 24..31: one bit, high half
    words[1] = np.tril(np.ones((32, 32), bool), -1).astype(np.uint32).T.dot(
        np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)  # key c: r > c
    words[1, 8:16] = 0  # a group that sees nothing
    maskt = np.concatenate([words.reshape(-1), np.full(32, 0xFFFFFFFF, np.uint32)])
    tmask = np.array([7, 0, -1, 1], np.int32)  # t0 = 1: tiles with masks 0, full, 1
    k = rng.standard_normal(koff + ntile * 32 * d).astype(np.float32)
    k[koff + (2 * 32 + 20) * d + 3] = np.nan  # tile 2 (mask 1), key 20: seen by r > 20
    qt = rng.standard_normal(d * 32).astype(np.float32)
    st = np.full(ntile * 32 * 32, 7.0, np.float32)
    cmax = np.full(32, -np.inf, np.float32)
    cmax[5] = 50.0
    alpha = 0.3
    run(k, koff, qt, st, ntile, d, alpha, tmask, 1, maskt, cmax)
    kk = k[koff:].reshape(ntile * 32, d).astype(np.float64)
    want = alpha * kk @ qt.reshape(d, 32).astype(np.float64)  # (keys, queries)
    bits = np.ones((ntile * 32, 32), bool)
    for t, m in enumerate(tmask[1:]):
        if m >= 0:
            w = maskt[m * 32: m * 32 + 32]
            bits[t * 32: t * 32 + 32] = (w[:, None] >> np.arange(32, dtype=np.uint32)) & 1 == 1
    want[~bits] = -np.inf
    got = st.reshape(ntile * 32, 32)
    assert np.isnan(got[2 * 32 + 20, 21:]).all() and not np.isnan(got[2 * 32 + 20, :21]).any()
    np.testing.assert_array_equal(np.isneginf(got), ~bits)
    ok = bits & ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-5)
    col = np.where(ok, want, -np.inf).max(axis=0)
    col[5] = max(col[5], 50.0)
    clean = np.arange(32) <= 20  # columns that no NaN score reaches
    np.testing.assert_allclose(cmax[clean], col[clean], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, n, params",
    [
        ("local", 300, {"window": 20}),  # band tiles: one half of a key group masked
        ("local", 300, {"window": 45}),
        ("strided", 1000, {"stride": 40}),
        ("fixed", 512, {"stride": 64, "c": 8}),
    ],
)
def test_fused_scores_on_band_and_diagonal_tiles_match_the_oracle(name, n, params):
    """32-token float32 tiles cut by a band or a diagonal (whose corners the score
    pass leaves out) give the dense oracle's output and log-sum-exp."""
    check(sps.make(name, n, **params), "merged", np.float32, H=2, d=64, block=32, B=1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, params", [(1500, {"stride": 64, "c": 16}), (1200, {"stride": 48, "c": 16})])
def test_two_pieces_in_one_query_order_run_as_a_pair(n, params, dtype, reverse, monkeypatch):
    """fixed's two pieces (its blocks in natural order; the summary keys, reordered once
    per call) read the same query rows: they run block by block in one pass (``_forward_pair``, no
    ``_forward_piece``), which gives the dense oracle's output and log-sum-exp; also with
    its heads swapped, where the first piece of the pair is the reordered one."""
    from sparse_patterns.kernels.cpu import _forward as fw

    calls = {"pair": 0, "piece": 0}

    def spy(name, fn):
        def wrapped(*args):
            calls[name] += 1
            return fn(*args)
        return wrapped

    monkeypatch.setattr(fw, "_forward_pair", spy("pair", fw._forward_pair))
    monkeypatch.setattr(fw, "_forward_piece", spy("piece", fw._forward_piece))
    pat = sps.make("fixed", n, **params)
    if reverse:
        pat = pat.with_heads(pat.heads[::-1])
    kinds = [k.split("(")[0] for k in plan(pat, mode="merged", block=32).piece_kind]
    assert kinds[0] == "keys" if reverse else kinds == ["identity", "keys"]
    check(pat, "merged", dtype, H=2, d=64, block=32, B=1)
    assert calls == {"pair": 1, "piece": 0}


@pytest.mark.parametrize("mode", ["merged", "multihead"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pieces_run_head_by_head_match_the_oracle(dtype, mode, monkeypatch):
    """strided's residue piece (copied per work item) and its window (in place) run in
    one call over every head, a thread taking each head through both (``_forward_two``),
    the state sent to memory; the output and log-sum-exp are the dense oracle's. In
    multihead mode (a piece per group) every head runs in one call a piece."""
    from sparse_patterns.kernels.cpu import _forward as fw

    B, H, n, d = 2, 3, 1024, 64
    calls = []

    def spy(fn, tag):
        names = list(inspect.signature(fn.py_func).parameters)

        def call(*args):
            kw = dict(zip(names, args, strict=True))
            calls.append((tag, kw["BH"]))
            return fn(*args)
        return call

    monkeypatch.setattr(fw, "_forward_piece", spy(fw._forward_piece, "piece"))
    monkeypatch.setattr(fw, "_forward_two", spy(fw._forward_two, "two"))
    pat = sps.make("strided", n, stride=32)
    pl = plan(pat, mode=mode, block=32)
    assert pl.num_pieces == 2
    check(pat, mode, dtype, H=H, d=d, block=32, B=B)
    if mode == "multihead":  # a piece per group: nothing passes from one piece to another
        assert calls == [("piece", B * H)] * 2
        return
    assert calls == [("two", B * H)]


@pytest.mark.parametrize("name, n, params", [
    ("strided", 1000, {"stride": 40}),  # partial last block and tiles
    ("strided", 2048, {"stride": 64}),
])
@pytest.mark.parametrize("bf", [False, True])
def test_pieces_by_head_repeat_bit_for_bit(name, n, params, bf):
    """Both of strided's pieces on one head per thread (``_forward_two``) give the same
    outputs and log-sum-exp from one call to the next (recycled buffers, the state through
    memory), bit for bit: float32, and bf16 products with the output as float32 or as bf16
    words (the state handed over as words), on more heads than threads."""
    from sparse_patterns.kernels.cpu import bf16_applies, forward, forward_bf16

    pl = plan(sps.make(name, n, **params), mode="merged", block=32)
    rng = np.random.default_rng(n)
    x = [rng.standard_normal((2, 3, n, 64), dtype=np.float32) for _ in range(3)]
    w = [(a.view(np.uint32) >> 16).astype(np.uint16) for a in x]
    if bf and not bf16_applies(pl, 64):
        pytest.skip("no bf16 products for this plan here")

    def run():
        if not bf:
            return [np.array(a, copy=True) for a in forward(*x, pl, scale=0.125)]
        return [np.array(a, copy=True) for words in (False, True)
                for a in forward_bf16(*w, pl, scale=0.125, words=words)]

    on = run()
    off = run()
    for a, b in zip(on, off, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["merged", "multihead"])
@pytest.mark.parametrize("name, n, params", [
    ("strided", 1000, {"stride": 40}),  # the last block 8 rows, its keys a partial tile
    ("local", 1024, {"window": 96}),  # the last block's next: none
    ("fixed", 999, {"stride": 64, "c": 8}),  # pieces run in pairs
])
def test_prefetching_forward_matches_the_oracle(name, n, params, mode):
    """The blocks used in place ask for the next block's rows (software prefetch), a hint:
    the outputs match the oracle, and are bit for bit the same from one call to the next,
    on the fused 32-token float32 path, a partial last block included."""
    pat = sps.make(name, n, **params)
    on = check(pat, mode, np.float32, H=2, d=64, block=32, B=1)
    off = check(pat, mode, np.float32, H=2, d=64, block=32, B=1)
    for a, b in zip(on, off, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [16, 48, 64, 80, 128])
def test_pv32_against_numpy(d, dtype):
    """The query-major ``O = diag(post) (diag(alpha) O + P V)`` of the fused path:
    each group of 4 queries gets exactly the key rows ``lo[g] .. hi[g]`` (an empty
    range, one row and the whole chunk included), for ``d`` of whole and partial
    column blocks (2 vectors, then 1), ``O`` at an offset into a larger array, in place
    or written to another array. A block of 8 queries reads the union of its two
    groups' ranges, where ``P`` is 0 outside each group's (as masked keys' is)."""
    import numba

    from sparse_patterns.kernels.cpu._llvm_fwd import _pv32_dense

    @numba.njit
    def run(va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff):
        _pv32_dense(va, koff, st, obuf, ooff, alpha, post, lo, hi, d, dbuf, doff, False)

    rng = np.random.default_rng(d)
    nk, koff, ooff = 96, 3 * d, 2 * d + 16
    va = rng.standard_normal(koff + nk * d + 5).astype(dtype)
    st = rng.random(nk * 32).astype(dtype)
    obuf = rng.standard_normal(ooff + 32 * d + 7).astype(dtype)
    alpha = rng.random(32).astype(dtype)
    alpha[5] = 1.0
    post = rng.random(32).astype(dtype) + 0.5
    post[:8] = 1.0
    lo = np.array([0, 10, 40, 95, 7, 0, 50, 20], np.int64)
    hi = np.array([96, 11, 40, 96, 60, 33, 90, 21], np.int64)
    keep = np.zeros((32, nk), bool)
    for g in range(8):
        keep[4 * g: 4 * g + 4, lo[g]: hi[g]] = True
    st = np.where(keep.T, st.reshape(nk, 32), 0).astype(dtype).ravel()
    out = obuf.copy()
    run(va, koff, st, out, ooff, alpha, post, lo, hi, d, out, ooff)  # in place
    P = st.reshape(nk, 32).T.astype(np.float64)  # queries x keys
    V = va[koff: koff + nk * d].reshape(nk, d).astype(np.float64)
    O = obuf[ooff: ooff + 32 * d].reshape(32, d)
    want = post[:, None] * (O * alpha[:, None] + np.where(keep, P, 0.0) @ V)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[ooff: ooff + 32 * d].reshape(32, d), want, **tol)
    untouched = np.ones(out.size, bool)
    untouched[ooff: ooff + 32 * d] = False
    np.testing.assert_array_equal(out[untouched], obuf[untouched])
    src, dst = obuf.copy(), np.zeros(32 * d + 9, dtype)  # read from one array, written to another
    run(va, koff, st, src, ooff, alpha, post, lo, hi, d, dst, 9)
    np.testing.assert_array_equal(src, obuf)
    np.testing.assert_array_equal(dst[9:], out[ooff: ooff + 32 * d])
    assert not dst[:9].any()


def test_group_rows_bound_what_each_query_group_sees():
    """For every partial-tile mask of a 32-token plan and every group of 4 queries,
    :func:`_group_rows` gives the first key any of them sees and one past the last:
    the keys outside are masked for the whole group (what :func:`_pv32_dense` skips)."""
    from sparse_patterns.kernels.cpu._schedule import _group_rows, _masks_t

    pl = plan(sps.make("strided", 300, stride=40), mode="merged", block=32)
    assert pl.masks.shape[0] > 0
    rows = _group_rows(_masks_t(pl)).reshape(-1, 8, 2)
    assert rows.shape[0] == pl.masks.shape[0] + 1
    np.testing.assert_array_equal(rows[-1], [[0, 32]] * 8)  # the full tile
    bits = np.unpackbits(pl.masks.view(np.uint8), axis=-1, bitorder="little")[..., :32]
    for m in range(pl.masks.shape[0]):
        for g in range(8):
            seen = np.flatnonzero(bits[m, 4 * g: 4 * g + 4].any(axis=0))  # keys
            want = (seen[0], seen[-1] + 1) if seen.size else (32, 0)
            assert tuple(rows[m, g]) == want, (m, g)


@pytest.mark.parametrize("chunk", [1, 2, 24])
def test_chunk_ranges_bound_what_each_query_group_sees_in_each_chunk(chunk):
    """For every chunk of ``chunk`` tiles of every query block of every piece,
    :func:`_chunk_ranges` gives, per group of 4 queries, the first key row of the chunk
    that any of them sees and one past the last (0, 0 if none): brute force over the
    plan's masks (a full tile: every key seen)."""
    from sparse_patterns.kernels.cpu._schedule import _chunk_ranges, _group_rows, _masks_t

    pl = plan(sps.make("strided", 300, stride=40), mode="merged", block=32)
    cptr, ranges = _chunk_ranges(pl, _group_rows(_masks_t(pl)), chunk)
    bits = np.unpackbits(pl.masks.view(np.uint8), axis=-1, bitorder="little")[..., :32]
    nb, rows = pl.nb, 0
    for b in range(pl.tile_ptr.size - 1):
        t0, t1 = int(pl.tile_ptr[b]), int(pl.tile_ptr[b + 1])
        assert cptr[b] == rows
        for k, c0 in enumerate(range(t0, t1, chunk)):
            c1 = min(t1, c0 + chunk)
            got = ranges[(cptr[b] + k) * 16: (cptr[b] + k + 1) * 16]
            for g in range(8):
                seen = [(t - c0) * 32 + j for t in range(c0, c1) for j in range(32)
                        if pl.tile_mask[t] < 0 or bits[pl.tile_mask[t], 4 * g: 4 * g + 4, j].any()]
                want = (seen[0], seen[-1] + 1) if seen else (0, 0)
                assert (got[g], got[8 + g]) == want, (b, k, g)
            rows += 1
    assert cptr[-1] == rows and ranges.size == 16 * rows and b + 1 == pl.tile_ptr.size - 1 >= nb

def random_patterns():
    return _random_patterns(max_n=30, densities=(0.0, 0.05, 0.2, 0.6, 1.0), single_key=0.4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pat=random_patterns(), mode=st.sampled_from(["multihead", "merged"]),
       block=st.sampled_from([1, 4, 8, 64]), dtype=st.sampled_from([np.float64, np.float32]))
def test_random_patterns_match_oracle(pat, mode, block, dtype):
    out, lse = check(pat, mode, dtype, H=4, d=5, block=block, B=1)
    masks = attention_masks(pat, mode, 4)
    empty = ~masks.any(axis=2)  # (H, n): rows with no keys
    assert (out[0][empty] == 0).all()
    assert np.isneginf(lse[0][empty]).all()


def test_row_without_keys_gives_zeros():
    m = np.tril(np.ones((8, 8), bool))
    m[3] = False
    pat = Pattern.from_dense(m)
    q, k, v = qkv((1, 1, 8, 4))
    out, lse = attention(q, k, v, pat, return_lse=True, block=4)
    assert (out[0, 0, 3] == 0).all() and np.isneginf(lse[0, 0, 3])
    dq, dk, dv = attention_backward(q, k, v, out, lse, np.ones_like(out), pat, block=4)
    assert (dq[0, 0, 3] == 0).all()


def test_plan_can_be_passed_and_mode_must_agree():
    pat = sps.make("strided", 32, stride=4)
    pl = plan(pat, mode="merged", block=8)
    q, k, v = qkv((1, 2, 32, 4))
    np.testing.assert_allclose(attention(q, k, v, pl, mode="merged"),
                               attention(q, k, v, pat, mode="merged", block=8), rtol=1e-12)
    with pytest.raises(ValueError, match="mode"):
        attention(q, k, v, pl, mode="multihead")


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, n, params, block", [
    ("strided", 45, {"stride": 6}, 8),
    ("strided", 600, {"stride": 9}, 4),  # residue piece in several backward work items
    ("fixed", 130, {"stride": 16, "c": 4}, 8),  # columns of more than one chunk of tiles
    # 32-key blocks: float32 masks and exponentials in one pass (_exp_rows32); n not a
    # multiple of 32, so the last block takes the loops
    ("strided", 200, {"stride": 16}, 32),
    ("fixed", 300, {"stride": 32, "c": 4}, 32),
])
def test_backward_matches_dense_reference(mode, dtype, name, n, params, block):
    pat = sps.make(name, n, **params)
    q, k, v = qkv((2, 3, n, 8), dtype)
    do = qkv((2, 3, n, 8), dtype, seed=1)[0]
    out, lse = attention(q, k, v, pat, mode=mode, return_lse=True, block=block)
    got = attention_backward(q, k, v, out, lse, do, pat, mode=mode, block=block)
    pl = plan(pat, mode=mode, block=block)
    want = reference_backward(q, k, v, out, lse, do, pat, pl, scale=1 / np.sqrt(8))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, w, **TOL[dtype])


@pytest.mark.parametrize("name, n, params", [
    ("strided", 1000, {"stride": 40}),  # the last key block partial; residue work items
    ("fixed", 999, {"stride": 64, "c": 8}),  # long columns, in ranges of query blocks
])
def test_prefetching_backward_matches_the_reference(name, n, params):
    """The fused backward asks for the next key block's rows (software prefetch), a hint:
    the gradients match the dense reference, and are bit for bit the same from one call
    to the next."""
    pat = sps.make(name, n, **params)
    q, k, v = qkv((1, 2, n, 64), np.float32)
    do = qkv((1, 2, n, 64), np.float32, seed=1)[0]
    out, lse = attention(q, k, v, pat, mode="merged", return_lse=True, block=32)
    on = attention_backward(q, k, v, out, lse, do, pat, mode="merged", block=32)
    want = reference_backward(q, k, v, out, lse, do, pat, plan(pat, mode="merged", block=32),
                              scale=1 / np.sqrt(64))
    for g, w in zip(on, want, strict=True):
        np.testing.assert_allclose(g, w, **TOL[np.float32])
    off = attention_backward(q, k, v, out, lse, do, pat, mode="merged", block=32)
    for a, b in zip(on, off, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n, stride, block", [(600, 9, 4), (3000, 37, 32), (200, 16, 32)])
def test_backward_items_are_closed_under_the_tiles(n, stride, block):
    """The backward's work items of a residue piece: disjoint block ranges that every
    tile of the piece lies within (query and key block in one item), whose positions,
    in copy order, are each range's positions once, in runs of grid rows and class
    by class (as the forward's copies); the natural-order piece has none."""
    from sparse_patterns.kernels.cpu._schedule import _COPY_RUN, _backward_items

    pl = plan(sps.make("strided", n, stride=stride), mode="merged", block=block)
    item_ptr, items, order, most = _backward_items(pl)
    kinds = list(pl.piece_kind)
    assert item_ptr[kinds.index("identity") + 1] == item_ptr[kinds.index("identity")]
    p = kinds.index(f"residue({stride})")
    mine = items[item_ptr[p]: item_ptr[p + 1]]
    assert len(mine) >= 1
    nb = pl.nb
    t0, t1 = pl.tile_ptr[p * nb], pl.tile_ptr[(p + 1) * nb]
    rows, cols = pl.tile_rows()[t0:t1], pl.tile_col[t0:t1]
    item_of = np.full(nb, -1)
    for w, (b0, b1, o0) in enumerate(mine):
        assert (item_of[b0:b1] == -1).all()  # disjoint
        item_of[b0:b1] = w
        x = order[o0: o0 + min(n, b1 * block) - b0 * block]
        np.testing.assert_array_equal(np.sort(x), np.arange(b0 * block, min(n, b1 * block)))
        assert most >= x.size
        tok = pl.qperm[p][x]
        run = tok // (_COPY_RUN * stride)
        assert (np.diff(run) >= 0).all()  # runs of grid rows, one after another
        same = np.diff(run) == 0
        assert (np.diff(x)[same] > 0).all()  # within a run: by position (class by class)
    assert (item_of[rows] >= 0).all() and (item_of[rows] == item_of[cols]).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_backward_key_tiles_transposed_in_registers(dtype):
    """Key blocks of 16 rows with ``d`` = 32 take the vector transpose for ``K^T`` and
    ``V^T`` (the last block, of 8 rows, the scalar loop); a residue order gathers them."""
    pat = sps.make("strided", 72, stride=12)
    q, k, v = qkv((1, 2, 72, 32), dtype)
    do = qkv((1, 2, 72, 32), dtype, seed=1)[0]
    for mode in ("multihead", "merged"):
        out, lse = attention(q, k, v, pat, mode=mode, return_lse=True, block=16)
        got = attention_backward(q, k, v, out, lse, do, pat, mode=mode, block=16)
        want = reference_backward(q, k, v, out, lse, do, pat, plan(pat, mode=mode, block=16),
                                  scale=1 / np.sqrt(32))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, **TOL[dtype])


def test_backward_by_finite_differences():
    pat = sps.make("fixed", 12, stride=4, c=1)
    q, k, v = qkv((1, 2, 12, 3))
    do = qkv((1, 2, 12, 3), seed=3)[0]
    out, lse = attention(q, k, v, pat, mode="merged", return_lse=True, block=4)
    grads = attention_backward(q, k, v, out, lse, do, pat, mode="merged", block=4)
    eps = 1e-6
    for which, g in enumerate(grads):
        for idx in [(0, 0, 5, 1), (0, 1, 11, 2), (0, 1, 0, 0)]:
            args = [q.copy(), k.copy(), v.copy()]
            args[which][idx] += eps
            up = (attention(*args, pat, mode="merged", block=4) * do).sum()
            args[which][idx] -= 2 * eps
            down = (attention(*args, pat, mode="merged", block=4) * do).sum()
            assert abs((up - down) / (2 * eps) - g[idx]) < 1e-6


def test_half_precision_numpy_float16():
    pat = sps.make("strided", 32, stride=4)
    q, k, v = (a.astype(np.float16) for a in qkv((1, 2, 32, 8)))
    out = attention(q, k, v, pat)
    assert out.dtype == np.float16
    ref, _ = attention_oracle(q, k, v, attention_masks(pat, "multihead", 2))
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-3, atol=2e-3)


def test_nan_and_inf_propagate_without_crashing():
    pat = sps.make("strided", 32, stride=4)
    masks = attention_masks(pat, "merged", 1)[0]
    q, k, v = qkv((1, 1, 32, 4), np.float32)
    q[0, 0, 5, 0] = np.nan
    v[0, 0, 20, 1] = np.inf
    out = attention(q, k, v, pat, mode="merged", block=8)
    assert np.isnan(out[0, 0, 5]).all()
    attends20 = masks[:, 20]
    assert not np.isfinite(out[0, 0, attends20, 1]).any()
    ref, _ = attention_oracle(q, k, v, masks[None])
    clean = np.isfinite(ref).all(axis=-1)[0, 0]
    assert not np.isfinite(out[0, 0, ~clean]).all(axis=-1).any()  # what the oracle poisons
    # rows that share a tile with the inf value may get NaN too (0 * inf), as in fused
    # torch kernels; every other row is exact
    ok = clean & np.isfinite(out[0, 0]).all(axis=-1)
    assert ok.sum() >= 8
    np.testing.assert_allclose(out[0, 0, ok], ref[0, 0, ok], rtol=1e-5, atol=1e-6)
    k[0, 0, 3, :] = np.inf
    out = attention(q, k, v, pat, mode="merged", block=8)  # must not crash
    assert out.shape == q.shape


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("block", [8, 32])
@pytest.mark.parametrize("key", [10, 0])
def test_nan_key_poisons_only_the_rows_that_attend_it(block, dtype, key):
    """A NaN key makes NaN exactly the rows whose pattern holds it: masking comes
    before the running max (a masked NaN score must not reach the softmax), also in
    the fused 32-token float32 score pass; key 0 is row 0's only key (a row whose
    every score is NaN is NaN, not a row without keys)."""
    pat = sps.make("strided", 64, stride=8)
    masks = attention_masks(pat, "merged", 1)[0]
    q, k, v = qkv((1, 1, 64, 64), dtype)
    k[0, 0, key, 3] = np.nan
    out, lse = attention(q, k, v, pat, mode="merged", block=block, return_lse=True)
    hit = masks[:, key]
    assert np.isnan(lse[0, 0, hit]).all() and not np.isnan(lse[0, 0, ~hit]).any()
    assert np.isnan(out[0, 0, hit]).all()
    ref, _ = attention_oracle(q, k, v, masks[None])
    np.testing.assert_allclose(out[0, 0, ~hit], ref[0, 0, ~hit], **TOL[dtype])


def test_injected_wrong_kernel_is_caught():
    pat = sps.make("strided", 24, stride=4)

    class Wrong(Backend):
        name = "wrong"

        def forward(self, q, k, v, plan, **kw):
            out = get_backend("numba").forward(q, k, v, plan, **kw)
            if kw.get("return_lse"):
                return out[0] + 1e-3, out[1]
            return out + 1e-3

    register_backend(Wrong())
    try:
        assert "wrong" in backend_names()
        with pytest.raises(AssertionError):
            check(pat, "merged", np.float64, impl="wrong", block=8)
    finally:
        unregister("wrong")


def test_impl_enum_and_unknown_impl():
    pat = sps.make("full", 8)
    q, k, v = qkv((1, 1, 8, 2))
    np.testing.assert_allclose(attention(q, k, v, pat, impl=Impl.NUMBA),
                               attention(q, k, v, pat, impl="reference"), rtol=1e-12)
    with pytest.raises(ValueError, match="impl: unknown implementation 'fast'; valid: numba, "):
        attention(q, k, v, pat, impl="fast")


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda q, k, v: (q, k[:, :, :-1], v), r"k: shape \(1, 2, 15, 4\) disagrees with q's"),
        (lambda q, k, v: (q, k, v[..., :3]), r"v: shape .* disagrees"),
        (lambda q, k, v: (q[0], k[0], v[0]), r"q: must be shaped \(B, H, n, d\)"),
        (lambda q, k, v: (q[:, :, :8], k[:, :, :8], v[:, :, :8]), "n=8 disagrees with the pattern's n=16"),
        (lambda q, k, v: (q.astype(np.int32), k, v), "q: dtype int32 is not supported"),
        (lambda q, k, v: (q, k.astype(np.float32), v), "k: dtype float32 disagrees with q's float64"),
        (lambda q, k, v: (q, list(k), v), "expected NumPy arrays or torch tensors"),
    ],
)
def test_bad_inputs_name_what_disagrees(change, match):
    pat = sps.make("strided", 16, stride=4)
    q, k, v = change(*qkv((1, 2, 16, 4)))
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, pat)


def test_bad_options():
    pat = sps.make("full", 8)
    q, k, v = qkv((1, 1, 8, 2))
    with pytest.raises(ValueError, match="mode"):
        attention(q, k, v, pat, mode="both")
    with pytest.raises(ValueError, match="scale"):
        attention(q, k, v, pat, scale=float("nan"))
    with pytest.raises(ValueError, match="pattern"):
        attention(q, k, v, np.ones((8, 8)))
    with pytest.raises(ValueError, match="return_lse"):
        attention(q, k, v, pat, return_lse=1)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    pat = sps.make("strided", 32, stride=4)
    q, k, v = qkv((1, 2, 32, 8), np.float32)
    want = attention(q, k, v, pat)
    for dt, tol in [(torch.float32, 1e-5), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)]:
        tq, tk, tv = (torch.from_numpy(a).to(dt) for a in (q, k, v))
        out, lse = attention(tq, tk, tv, pat, return_lse=True)
        assert isinstance(out, torch.Tensor) and out.dtype == dt
        assert lse.dtype == torch.float32
        np.testing.assert_allclose(out.float().numpy(), want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="mix NumPy arrays and torch tensors"):
        attention(torch.from_numpy(q), k, v, pat)


def test_recycled_arrays_are_per_thread_and_released():
    """Each thread recycles its own outputs (where the state between a group's
    pieces also lives): calls from several threads at once, switching between their
    pieces, each get their own result; ``release_workspace`` frees the arrays."""
    import sys
    import threading

    from sparse_patterns.kernels.cpu import _pool as cpu  # the pool's state

    pat = sps.make("strided", 2048, stride=32)
    assert len(plan(pat, mode="merged").piece_kind) == 2  # two pieces: state between them
    inputs = [qkv((1, 4, 2048, 32), np.float32, seed=s) for s in range(4)]  # 1 MiB: pooled
    want = [attention(*x, pat, mode="merged") for x in inputs]
    got: dict[int, list] = {}

    def work(i):  # each result dropped at once: its arrays are recycled by the next call
        got[i] = [np.array_equal(attention(*inputs[i], pat, mode="merged"), want[i])
                  for _ in range(6)]

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert all(all(got[i]) for i in range(4))
    cpu.release_workspace()
    assert cpu._WORKSPACE.pool == []


def test_recycled_arrays_are_never_handed_out_while_referenced():
    """The forward's output and the backward's gradients come from a per-thread
    pool: an array that anything still references (the result itself, a view of it,
    a tensor made from it) is never handed out again; once dropped, its memory is
    reused; ``release_workspace`` empties the pool."""
    import torch

    from sparse_patterns.kernels.cpu import _pool as cpu  # the pool's state

    cpu.release_workspace()
    pat = sps.make("strided", 2048, stride=32)  # two pieces
    x = qkv((1, 4, 2048, 64), np.float32)  # 2 MiB outputs: pooled
    want = attention(*x, pat, mode="merged")
    # pooled arrays start on cache lines: the residue piece writes its state back
    # with non-temporal stores (_copy_nt); against the dense oracle
    ref, _ = attention_oracle(*x, attention_masks(pat, "merged", 4))
    np.testing.assert_allclose(want, ref, **TOL[np.float32])
    first = attention(*x, pat, mode="merged")
    view = first[0, 1:3]
    tensor = torch.from_numpy(first)
    kept = first.copy()
    ptr = first.ctypes.data
    del first
    later = [attention(*x, pat, mode="merged") for _ in range(3)]
    assert all(o.ctypes.data != ptr for o in later)  # the view and the tensor hold it
    np.testing.assert_array_equal(view, kept[0, 1:3])
    np.testing.assert_array_equal(tensor.numpy(), kept)
    for o in later:
        np.testing.assert_array_equal(o, want)
    assert len({o.ctypes.data for o in later}) == 3  # held: three arrays
    del view, tensor
    pool = cpu._WORKSPACE.pool
    size = len(pool)
    assert any(0 <= ptr - a.ctypes.data < 64 for a in pool)  # kept (on a cache line inside)
    again = attention(*x, pat, mode="merged")
    np.testing.assert_array_equal(again, want)
    assert len(pool) == size  # nothing new: the freed array served
    del later
    o, lse = attention(*x, pat, mode="merged", return_lse=True)
    grads = attention_backward(*x, o, lse, np.ones_like(o), pat, mode="merged")
    assert len({g.ctypes.data for g in grads} | {o.ctypes.data, again.ctypes.data}) == 5
    assert len(cpu._WORKSPACE.pool) <= cpu._POOL_ARRAYS
    small = attention(*qkv((1, 1, 2048, 64), np.float32), pat, mode="merged")  # 512 KiB
    assert all(not 0 <= small.ctypes.data - a.ctypes.data < a.nbytes for a in cpu._WORKSPACE.pool)
    assert all(a.ctypes.data % 64 == 0 for a in (o, again, *grads))  # on cache lines
    cpu.release_workspace()
    assert cpu._WORKSPACE.pool == []
