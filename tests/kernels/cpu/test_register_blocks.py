"""The fused float32 passes in both register blockings (``_llvm._WIDE``): AVX-512's
blocks (16 accumulators of 16 floats) and the quarter-size blocks compiled without
AVX-512 (AVX2). Either compiles and runs on any x86 CPU (a 512-bit LLVM vector is split
into two 256-bit ones), so both are checked here on every machine, whichever the kernels
use: against NumPy in float64, and against each other bit for bit on finite inputs (each
sum is the same chain of FMAs in the same order, a wide block's extra ``0 x v`` terms
adding nothing; an infinite value row would make NaN a wider block's rows)."""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from sparse_patterns.kernels.cpu import _llvm  # noqa: E402
from sparse_patterns.kernels.cpu._llvm_bwd import (  # noqa: E402
    _dkv32,
    _dq32,
    _dscores32,
    _tile_ranges,
)
from sparse_patterns.kernels.cpu._llvm_fwd import _pv32_dense, _scores32  # noqa: E402

WIDE = [True, False]


FMAS: dict[bool, int] = {}  # the FMA calls in the last pass's LLVM IR, in each blocking


def _run(wide: bool, monkeypatch, body, *args) -> None:
    """``body(*args)`` compiled afresh with the blocks of ``wide`` (the codegen reads
    ``_llvm._WIDE`` as the call is lowered, at the first call); its FMA calls counted in
    ``FMAS`` (the IR's names differ from one compilation to the next)."""
    monkeypatch.setattr(_llvm, "_WIDE", wide)
    f = numba.njit(body)
    f(*args)
    FMAS[wide] = f.inspect_llvm(f.signatures[0]).count("call <16 x float> @llvm.fma")


def _masks(rng, nt: int) -> np.ndarray:
    """``uint64 (nt, 32, 1)`` row masks (bit ``j`` of row ``i``: row ``i`` sees key ``j``)
    of partial tiles: causal, a band, rows and halves of keys seen by no one, random."""
    i, j = np.arange(32)[:, None], np.arange(32)[None, :]
    kinds = [j <= i, (j <= i) & (j > i - 6), (j >= 16) & (i % 5 != 0), (j < 8) & (i < 12),
             rng.random((32, 32)) < 0.3]
    out = np.zeros((nt, 32, 1), np.uint64)
    for t in range(nt):
        seen = kinds[t % len(kinds)]
        out[t, :, 0] = (seen.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(1)
    return out


def _bits(masks: np.ndarray) -> np.ndarray:
    """``bool (nt * 32, 32)``: row, key."""
    w = masks[:, :, 0].reshape(-1)
    return ((w[:, None] >> np.arange(32, dtype=np.uint64)) & np.uint64(1)) == 1


def _scores(wide, monkeypatch, rng, d=64, ntile=5):
    def body(k, koff, qt, st, ntile, d, alpha, tmask, t0, maskt, cmax):
        _scores32(k, koff, qt, st, ntile, d, alpha, tmask, t0, maskt, cmax)

    masks = _masks(rng, 4)
    # transposed masks (bit r of word j: query r sees key j), a full tile between them
    maskt = (_bits(masks).reshape(4, 32, 32).transpose(0, 2, 1).astype(np.uint64)
             << np.arange(32, dtype=np.uint64)).sum(2).astype(np.uint32).reshape(-1)
    tmask = np.array([0, -1, 1, 2, 3], np.int32)
    k = rng.standard_normal(ntile * 32 * d).astype(np.float32)
    qt = rng.standard_normal(d * 32).astype(np.float32)
    st = np.zeros(ntile * 32 * 32, np.float32)
    cmax = np.full(32, -np.inf, np.float32)
    _run(wide, monkeypatch, body, k, 0, qt, st, ntile, d, 0.125, tmask, 0, maskt, cmax)
    seen = np.ones((ntile * 32, 32), bool)  # (key, query)
    for t, m in enumerate(tmask):
        if m >= 0:
            seen[32 * t: 32 * t + 32] = _bits(masks[m: m + 1]).T
    want = np.where(seen, 0.125 * k.reshape(-1, d).astype(np.float64) @ qt.reshape(d, 32), -np.inf)
    return (st, cmax), (want.ravel(), want.max(0))


def _pv(wide, monkeypatch, rng, d=64, nk=96):
    def body(va, st, obuf, alpha, post, lo, hi, d):
        _pv32_dense(va, 0, st, obuf, 0, alpha, post, lo, hi, d, obuf, 0, False)

    va = rng.standard_normal(nk * d).astype(np.float32)
    lo = np.array([0, 10, 40, 95, 7, 0, 50, 20], np.int64)  # keys of each group of 4 queries
    hi = np.array([96, 11, 40, 96, 60, 33, 90, 21], np.int64)
    keep = np.zeros((32, nk), bool)
    for g in range(8):
        keep[4 * g: 4 * g + 4, lo[g]: hi[g]] = True
    st = np.where(keep.T, rng.random((nk, 32)), 0).astype(np.float32)
    o = rng.standard_normal(32 * d).astype(np.float32)
    alpha = rng.random(32).astype(np.float32)
    post = (rng.random(32) + 0.5).astype(np.float32)
    out = o.copy()
    _run(wide, monkeypatch, body, va, st.ravel(), out, alpha, post, lo, hi, d)
    P = st.T.astype(np.float64)
    want = post[:, None] * (o.reshape(32, d) * alpha[:, None] + P @ va.reshape(nk, d))
    return (out,), (want.ravel(),)


def _dscores(wide, monkeypatch, rng, d=64, m=96):
    def body(q, do, roff, kt, vt, m, d, alpha, lc, dl, bits, dscale, pbuf, sbuf):
        _dscores32(q, do, roff, kt, vt, m, d, alpha, lc, dl, bits, dscale, pbuf, sbuf)

    seen = _bits(_masks(rng, m // 32))
    seen[7] = False  # a row without keys
    bits = (seen.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(1).astype(np.uint32)
    roff = (rng.permutation(m + 3)[:m] * d).astype(np.int64)  # rows where they lie
    q, do = (rng.standard_normal((m + 3) * d).astype(np.float32) for _ in range(2))
    kt, vt = (rng.standard_normal(d * 32).astype(np.float32) for _ in range(2))
    lc = (rng.standard_normal(m) + 2).astype(np.float32)
    dl = rng.standard_normal(m).astype(np.float32)
    alpha, dscale = np.float32(0.18), np.float32(0.125)
    pbuf, sbuf = np.full(m * 32, 7.0, np.float32), np.full(m * 32, 7.0, np.float32)
    _run(wide, monkeypatch, body, q, do, roff, kt, vt, m, d, alpha, lc, dl, bits, dscale,
         pbuf, sbuf)
    rows = roff[:, None] + np.arange(d)[None, :]
    s = q[rows].astype(np.float64) @ kt.reshape(d, 32)
    dp = do[rows].astype(np.float64) @ vt.reshape(d, 32)
    p = np.where(seen, np.exp2(float(alpha) * s - lc[:, None]), 0.0)
    ds = np.where(seen, float(dscale) * p * (dp - dl[:, None]), 0.0)
    return (pbuf, sbuf), (p.ravel(), ds.ravel())


def _ranges(rng, nt):
    masks = _masks(rng, nt)
    seen = _bits(masks)  # (row, key) of every tile
    table = _tile_ranges(masks)[:nt].reshape(-1)  # each tile's own mask, in order
    return seen, table


def _dkv(wide, monkeypatch, rng, d=64, nt=5):
    def body(mat, src, roff, acc, nt, rng_, d):
        _dkv32(mat, src, roff, acc, nt, rng_, d)

    seen, table = _ranges(rng, nt)
    mat = np.where(seen, rng.standard_normal(seen.shape), 0.0).astype(np.float32)  # 0 masked
    roff = (rng.permutation(32 * nt) * d).astype(np.int64)
    src = rng.standard_normal(32 * nt * d).astype(np.float32)
    acc0 = rng.standard_normal(32 * d).astype(np.float32)
    acc = acc0.copy()
    _run(wide, monkeypatch, body, mat.ravel(), src, roff, acc, nt, table, d)
    rows = src[roff[:, None] + np.arange(d)[None, :]].astype(np.float64)
    want = acc0.reshape(32, d) + mat.T.astype(np.float64) @ rows
    return (acc,), (want.ravel(),)


def _dq(wide, monkeypatch, rng, d=64, nt=5):
    def body(mat, kv, dst, roff, nt, rng_, d):
        _dq32(mat, kv, dst, roff, nt, rng_, d)

    seen, table = _ranges(rng, nt)
    mat = np.where(seen, rng.standard_normal(seen.shape), 0.0).astype(np.float32)
    kv = rng.standard_normal(32 * d).astype(np.float32)
    roff = (rng.permutation(32 * nt) * d).astype(np.int64)
    dst0 = rng.standard_normal(32 * nt * d).astype(np.float32)
    dst = dst0.copy()
    _run(wide, monkeypatch, body, mat.ravel(), kv, dst, roff, nt, table, d)
    want = dst0.astype(np.float64).reshape(-1, d)
    want[roff // d] += mat.astype(np.float64) @ kv.reshape(32, d)
    return (dst,), (want.ravel(),)


PASSES = {"scores": _scores, "pv": _pv, "dscores": _dscores, "dkv": _dkv, "dq": _dq}


@pytest.mark.parametrize("name", list(PASSES))
@pytest.mark.parametrize("d", [32, 80])
def test_both_blockings_give_the_same_bits_and_match_numpy(name, d, monkeypatch):
    """Each pass (scores, P V; the backward's P and dS, dK/dV, dQ), compiled in AVX-512's
    register blocks and in the AVX2 ones, on the same inputs (partial tiles of every
    kind, rows gathered out of order, ``d`` of whole and partial column blocks):
    identical bits, within float32 rounding of NumPy's float64 result; and the two
    compiled codes hold different numbers of FMAs (the blocking did change)."""
    got = {}
    for wide in WIDE:
        arrays, want = PASSES[name](wide, monkeypatch, np.random.default_rng(5), d=d)
        for a, w in zip(arrays, want, strict=True):
            fin = np.isfinite(w)
            np.testing.assert_array_equal(np.isneginf(a), np.isneginf(w))
            np.testing.assert_allclose(a[fin], w[fin], rtol=2e-5, atol=2e-5)
        got[wide] = arrays
    assert FMAS[True] != FMAS[False] and min(FMAS.values()) > 0
    for a, b in zip(got[True], got[False], strict=True):
        np.testing.assert_array_equal(a, b)
