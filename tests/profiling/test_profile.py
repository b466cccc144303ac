"""Tests of ``sparse_patterns.profile``: the table's fields, FLOP counts against closed
forms, the correctness check (a wrong kernel injected through the impl registry is
reported as wrong, never timed), the baselines and the bad-input paths. Small n only;
no timing assertions."""

from __future__ import annotations

import json
import math
import sys
import warnings

import numpy as np
import pytest

import sparse_patterns as sps
from sparse_patterns import kernels
from sparse_patterns.profiling import ProfileTable, profile
from sparse_patterns.profiling import _run as prof

FAST = dict(repeats=2, heads=2, head_dim=8)


@pytest.fixture(autouse=True)
def _small_matmul(monkeypatch):
    """The fp32 matmul reference at 128 x 128: the figure is irrelevant here, time is not."""
    monkeypatch.setattr(prof, "_MATMUL_N", 128)


def _strided_union_rows(n: int, l: int) -> np.ndarray:
    """|S_i| of strided(l), paper window: {max(0, i-l)..i} plus i - m*l for m >= 2."""
    i = np.arange(n)
    return np.minimum(i, l) + 1 + np.maximum(0, i // l - 1)


pytestmark = pytest.mark.xdist_group("profile-small-table")  # one worker: one small_table


# ------------------------------------------------------------------ fields and FLOPs
@pytest.fixture(scope="module")
def small_table() -> ProfileTable:
    return profile(["strided", "full"], [64, 96], impls=("reference", "numba"), baselines=(),
                   params={"stride": 8}, **FAST)


def test_matmul_reference_is_the_faster_of_start_and_end(monkeypatch):
    """A slow spell at one end of the run does not lower the matmul reference (and so
    inflate every ``% matmul``): it is timed at the start and at the end, the faster
    figure kept."""
    figures = iter([(100.0, "torch.matmul fp32 128x128"), (150.0, "torch.matmul fp32 128x128")])
    monkeypatch.setattr(prof, "_matmul_gflops", lambda torch: next(figures))
    t = profile(["strided"], [32], impls=("reference",), baselines=(), params={"stride": 4},
                **FAST)
    assert t.matmul_gflops == 150.0
    assert "start and the end" in t.matmul_source
    assert next(figures, None) is None  # timed exactly twice
    g = t[0].gflops("reference")
    assert t.pct_of_matmul(t[0], "reference") == pytest.approx(100 * g / 150.0)


def test_table_has_every_field(small_table):
    t = small_table
    assert len(t) == 4
    assert [(r.pattern, r.n) for r in t] == [("strided", 64), ("strided", 96), ("full", 64),
                                              ("full", 96)]
    assert t.matmul_gflops > 0 and "matmul" in t.matmul_source
    for key in ("cores", "cpu_capability", "date", "load_before", "load_after"):
        assert key in t.machine
    for r in t:
        assert r.useful_flops > 0 and r.computed_flops >= r.useful_flops
        assert r.flop_ratio >= 1.0 and r.plan_s >= 0 and r.plan["n"] == r.n
        for impl in ("reference", "numba"):
            m = r.get(impl)
            assert m.status == "ok", m.note
            assert len(m.times) == 2 and m.min_s <= m.median_s <= m.max_s
            assert m.first_s > 0 and m.compile_s >= 0
            assert m.peak_bytes is not None and m.peak_bytes >= 0
            assert m.max_err < 1e-4
            assert "oracle on all" in m.note
            assert r.gflops(impl) == pytest.approx(r.useful_flops / m.median_s / 1e9)
            assert t.pct_of_matmul(r, impl) == pytest.approx(
                100 * r.gflops(impl) / t.matmul_gflops)
    d = json.loads(json.dumps(t.to_dict()))
    run = d["rows"][0]["runs"]["numba"]
    for key in ("median_s", "min_s", "max_s", "first_s", "compile_s", "peak_bytes", "max_err",
                "gflops", "pct_matmul", "status"):
        assert key in run
    cols, rows = t.table()
    assert len(rows) == 8 and all(len(r) == len(cols) for r in rows)
    md = t.to_markdown()
    assert md.count("\n| strided |") == 4 and "CPU capability" in md


@pytest.mark.parametrize("n,l", [(64, 8), (100, 7), (96, 10)])
def test_strided_flops_match_closed_form(n, l):
    t = profile(["strided"], [n], impls=("reference",), baselines=(), params={"stride": l},
                mode="merged", batch=2, **FAST)
    r = t[0]
    nnz = int(_strided_union_rows(n, l).sum())
    assert r.nnz == nnz
    assert r.useful_flops == 4 * nnz * 8 * 2 * 2  # 4 * nnz * d per head, B=2, H=2
    assert r.computed_flops == sps.plan(sps.make("strided", n, stride=l), mode="merged",
                                        block=sps.kernels.BLOCK).flops(2, 2, 8)[1]
    # multihead: head h uses pattern head h % 2 (A1 then A2)
    t = profile(["strided"], [n], impls=("reference",), baselines=(), params={"stride": l},
                mode="multihead", heads=3, head_dim=8, repeats=1)
    i = np.arange(n)
    a1, a2 = int((np.minimum(i, l) + 1).sum()), int((i // l + 1).sum())
    assert t[0].useful_flops == 4 * 8 * (a1 + a2 + a1)


@pytest.mark.parametrize("n,block", [(64, 16), (128, 32), (100, 20)])
def test_full_flops_match_closed_form(n, block):
    t = profile(["full"], [n], impls=("reference",), baselines=(), block=block, **FAST)
    r = t[0]
    assert r.useful_flops == 4 * (n * (n + 1) // 2) * 8 * 2
    nb = n // block  # n is a multiple of the block: the lower block triangle, diagonal included
    assert r.computed_flops == 4 * block * block * (nb * (nb + 1) // 2) * 8 * 2
    t = profile(["full"], [n], impls=("reference",), baselines=(), block=block,
                params={"causal": False}, **FAST)
    assert t[0].useful_flops == t[0].computed_flops == 4 * n * n * 8 * 2


# ------------------------------------------------------------------ the correctness check
def _broken(orig, *, row=None):
    """Wrap an impl so that its output is off by 1e-2 (everywhere, or on one query row)."""

    def perturb(o):
        o = o.copy()
        if row is None:
            o += 1e-2
        else:
            o[..., row, :] += 1e-2
        return o

    def impl(*args, **kwargs):
        res = orig(*args, **kwargs)
        if isinstance(res, tuple):
            return (perturb(res[0]), *res[1:])
        return perturb(res)

    return impl


@pytest.mark.parametrize("row", [None, 77])
def test_wrong_kernel_is_reported_wrong_not_fast(monkeypatch, row):
    be = kernels.get_backend("reference")
    monkeypatch.setattr(be, "forward", _broken(be.forward, row=row))
    t = profile(["strided", "fixed"], [96], impls=("numba", "reference"), baselines=(),
                params={"stride": 8}, **FAST)
    for r in t:
        bad, good = r.get("reference"), r.get("numba")
        assert bad.status == "wrong" and not bad.ok
        assert bad.times == () and bad.median_s is None and r.gflops("reference") is None
        assert bad.max_err == pytest.approx(1e-2, rel=1e-3)
        assert good.status == "ok" and good.times
    assert sorted(t.wrong) == [("fixed", 96, "reference"), ("strided", 96, "reference")]
    cols, rows = t.table()
    checks = {r[cols.index("impl")]: r[cols.index("check")] for r in rows}
    assert checks == {"numba": "ok", "reference": "wrong"}
    assert any("WRONG" in note for note in t.notes)


def test_wrong_kernel_caught_on_sampled_rows(monkeypatch):
    """Above 1024 rows the oracle samples rows; the first and the last are always in."""
    monkeypatch.setattr(prof, "_ALL_ROWS", 32)
    monkeypatch.setattr(prof, "_SAMPLED_ROWS", 8)
    be = kernels.get_backend("reference")
    monkeypatch.setattr(be, "forward", _broken(be.forward, row=-1))
    t = profile(["strided"], [64], impls=("reference",), baselines=(), params={"stride": 8},
                **FAST)
    m = t[0].get("reference")
    assert m.status == "wrong" and "8 of 64 rows" in m.note


# ------------------------------------------------------------------ baselines
def test_sdpa_baseline_and_its_checks():
    pytest.importorskip("torch")
    t = profile(["full", "strided"], [64], impls=("numba",), baselines=("sdpa",),
                params={"stride": 8}, **FAST)
    full, strided = t
    sd = full.get("sdpa")
    assert sd.status == "ok" and "is_causal=True" in sd.note and sd.max_err < 1e-4
    assert "sdpa on every row" in full.get("numba").note  # same function: compared on every row
    assert full.speedup("numba", "sdpa") == pytest.approx(
        sd.median_s / full.get("numba").median_s)
    # a sparse causal pattern: SDPA does dense causal work, it is not the same function
    assert "not this pattern" in strided.get("sdpa").note and strided.get("sdpa").max_err is None
    assert "sdpa on every row" not in strided.get("numba").note
    assert strided.get("sdpa").ok and strided.speedup("numba", "sdpa") > 0
    # bidirectional: a dense boolean mask of the pattern, so the same function
    t = profile(["strided"], [64], impls=("reference",), baselines=("sdpa",),
                params={"stride": 8, "causal": False}, **FAST)
    r = t[0]
    assert "dense boolean mask" in r.get("sdpa").note and r.get("sdpa").ok
    assert "sdpa on every row" in r.get("reference").note


def test_sdpa_skipped_when_the_mask_would_not_fit(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(prof, "DENSE_LIMIT", 1000)
    t = profile(["strided"], [64], impls=("reference",), baselines=("sdpa",),
                params={"stride": 8, "causal": False}, **FAST)
    sd = t[0].get("sdpa")
    assert sd.status == "skipped" and "dense boolean mask would take" in sd.note
    assert t[0].get("reference").ok and t[0].speedup("reference", "sdpa") is None
    assert any("sdpa skipped" in n for n in t.notes)


@pytest.mark.parametrize("mode", ["merged", "multihead"])
@pytest.mark.parametrize("name,params", [("strided", {"stride": 5}), ("fixed", {"stride": 8, "c": 2})])
def test_flex_block_mask_from_the_csr_is_exact(mode, name, params):
    """The BlockMask the flex baseline uses attends exactly the pattern (eager flex, tiny n)."""
    torch = pytest.importorskip("torch")
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    pat = sps.make(name, 40, **params)
    bm = prof._flex_block_mask(pat, mode, 4, 16)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 40, 8, generator=g) for _ in range(3))
    with warnings.catch_warnings():  # eager flex_attention warns (once) that it is not compiled
        warnings.simplefilter("ignore", UserWarning)
        out = fa.flex_attention(q, k, v, block_mask=bm, scale=0.5).numpy()
    rows = np.arange(40)
    groups = prof._check_groups(pat, mode, rows)
    ref = prof._oracle_rows(q.numpy(), k.numpy(), v.numpy(), groups, rows, 0.5)
    np.testing.assert_allclose(out, ref, atol=1e-5)


# ------------------------------------------------------------------ bad input
def test_bad_input():
    with pytest.raises(ValueError, match="ns: give at least one"):
        profile(["strided"], [], baselines=())
    with pytest.raises(ValueError, match=r"impls: unknown impl 'nope'; valid: .*numba"):
        profile(["strided"], [64], impls=("nope",), baselines=())
    with pytest.raises(ValueError, match=r"baselines: unknown baseline 'xla'; valid: sdpa, flex"):
        profile(["strided"], [64], baselines=("xla",))
    with pytest.raises(ValueError, match="params: 'c' applies to none"):
        profile(["strided", "full"], [64], params={"c": 2}, baselines=())
    with pytest.raises(ValueError, match="name: unknown pattern"):
        profile(["stridd"], [64], baselines=())
    with pytest.raises(ValueError, match=r"repeats: must be an integer \[1, 1000\]"):
        profile(["strided"], [64], repeats=0, baselines=())
    with pytest.raises(ValueError, match="dtype"):
        profile(["strided"], [64], dtype="int8", baselines=())
    with pytest.raises(ValueError, match="mode"):
        profile(["strided"], [64], mode="sideways", baselines=())
    with pytest.raises(ValueError, match="ns: must be an integer"):
        profile(["strided"], [0], baselines=())


def test_torch_missing_profiles_ours_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    t = profile(["strided"], [64], impls=("reference",), params={"stride": 8}, **FAST)
    assert t.baselines == () and t[0].get("sdpa") is None and t[0].get("reference").ok
    assert any("torch is not installed" in n for n in t.notes)
    assert "numpy" in t.matmul_source and t.machine["cpu_capability"] is None
    with pytest.raises(ValueError, match="nothing to run"):
        profile(["strided"], [64], impls=(), params={"stride": 8}, **FAST)


def test_pattern_objects_and_sqrt_params():
    pat = sps.make("fixed", 48, stride=8, c=2)
    t = profile([pat, "strided"], [49], impls=("reference",), baselines=(),
                params={"stride": "sqrt"}, **FAST)
    assert [(r.pattern, r.n) for r in t] == [("strided", 49), ("fixed", 48)]
    assert t[0].params["stride"] == 7 and t[1].params["c"] == 2
    assert math.isfinite(t[1].useful_flops)


def test_peak_memory_counts_the_kernels_output_as_new_memory():
    """The CPU kernel recycles its outputs (a warm-up call leaves one free); the
    measured call must still count its output, as the baselines' outputs count."""
    from sparse_patterns.kernels import attention

    pat = sps.make("full", 512)  # one piece in natural order: small work buffers
    q, k, v = (np.random.default_rng(s).standard_normal((1, 64, 512, 64)).astype(np.float32)
               for s in range(3))
    def fn():
        return attention(q, k, v, pat, mode="merged")

    fn()  # its output, dropped, waits in the pool
    _, _, peak = prof._measure(fn)
    assert peak >= q.nbytes  # the 8 MiB output


# ------------------------------------------------------------------ FMA peak, impl="flex"
def test_fma_peak_columns_for_useful_and_computed_throughput(monkeypatch):
    monkeypatch.setattr(prof, "_fma_peak", lambda dtype: (200.0, f"FMA peak {dtype} (patched)"))
    t = profile(["strided"], [64], impls=("reference",), baselines=(), params={"stride": 8},
                **FAST)
    r = t[0]
    assert t.fma_peak_gflops == 200.0 and "patched" in t.fma_peak_source
    useful = r.useful_flops / r.get("reference").median_s / 1e9
    computed = r.computed_flops / r.get("reference").median_s / 1e9
    assert t.pct_of_peak(r, "reference") == pytest.approx(100 * useful / 200.0)
    assert t.pct_of_peak(r, "reference", computed=True) == pytest.approx(100 * computed / 200.0)
    run = json.loads(json.dumps(t.to_dict()))["rows"][0]["runs"]["reference"]
    assert run["pct_fma_peak"] == pytest.approx(100 * useful / 200.0)
    assert run["pct_fma_peak_computed"] == pytest.approx(100 * computed / 200.0)
    assert run["pct_matmul"] == pytest.approx(100 * useful / t.matmul_gflops)
    assert t.to_dict()["fma_peak"] == {"gflops": 200.0, "source": "FMA peak float32 (patched)"}
    for wide, cols in ((False, ("% peak", "% matmul")),
                       (True, ("% peak", "% peak computed", "% matmul"))):
        names, rows = t.table(wide=wide)
        cell = dict(zip(names, rows[0], strict=True))
        assert all(c in names for c in cols)
        assert cell["% peak"] == f"{100 * useful / 200.0:.0f}%"
    assert "FMA peak float32 (patched)" in t.to_markdown()
    assert "% peak computed" in t.to_markdown().splitlines()[0]


def test_fma_peak_by_dtype(monkeypatch):
    from sparse_patterns.kernels.cpu import fma_peak
    from sparse_patterns.kernels.cpu._llvm import _AVX512_BF16
    from sparse_patterns.profiling._machine import fma_peak_gflops

    f32 = fma_peak("float32") / 1e9  # cached per process: the same measurement
    assert fma_peak_gflops("float32")[0] == f32 and fma_peak_gflops("float16")[0] == f32
    assert fma_peak_gflops("float64")[0] == f32 / 2
    # bf16 inputs widened to float32 (forced here; by default where vdpbf16ps is slower)
    monkeypatch.setenv("SPARSE_PATTERNS_BF16", "widen")
    rate, what = fma_peak_gflops("bfloat16")
    assert rate == f32 and "widened" in what
    if _AVX512_BF16:  # run on bf16 products: their own peak
        monkeypatch.setenv("SPARSE_PATTERNS_BF16", "products")
        rate, what = fma_peak_gflops("bfloat16")
        assert rate == fma_peak("bfloat16") / 1e9 and what.startswith("FMA peak bfloat16")


def test_flex_impl_runs_its_own_plan_and_is_checked():
    pytest.importorskip("torch.nn.attention.flex_attention")
    t = profile(["strided"], [64], impls=("flex", "reference"), baselines=(), dtype="float64",
                params={"stride": 8}, **FAST)
    r = t[0]
    m = r.get("flex", "impl")
    assert m.status == "ok" and m.max_err < 1e-10 and "eager" in m.note, m.note
    want = kernels.plan(sps.make("strided", 64, stride=8), block=128, mode="merged")
    assert m.computed_flops == want.flops(1, 2, 8)[1] != r.computed_flops
    assert r.gflops("flex", computed=True) == pytest.approx(m.computed_flops / m.median_s / 1e9)


def test_impl_and_baseline_of_one_name_are_told_apart():
    from sparse_patterns.profiling import Measurement, ProfileRow

    ours = Measurement("flex", "impl", "ok", times=(0.5,), first_s=3.0)
    base = Measurement("flex", "baseline", "ok", times=(2.0,), first_s=9.0)
    row = ProfileRow("strided", {}, 64, True, 2, 100, 0.1, 1000, 2000, 0.0, {}, (ours, base))
    assert row.get("flex") is ours and row.get("flex", "baseline") is base
    assert row.speedup("flex", "flex") == 4.0
    t = ProfileTable([row], impls=("flex",), baselines=("flex",), settings={}, machine={},
                     matmul_gflops=1.0, matmul_source="-")
    runs = t.to_dict()["rows"][0]["runs"]
    assert runs["flex"]["kind"] == "impl" and runs["flex (baseline)"]["kind"] == "baseline"
    names, rows = t.table(wide=True)
    got = dict(zip(names, rows[0], strict=True))
    assert got["flex s"] == "2" and got["x flex"] == "4.0x" and got["median s"] == "0.5"


def test_bad_device_and_flex_without_torch(monkeypatch):
    with pytest.raises(ValueError, match=r"^device: .*'tpu'"):
        profile(["strided"], [64], device="tpu", baselines=())
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(kernels.backend, "_LOADED", {})
    with pytest.raises(ValueError, match=r"^impl: 'flex' needs torch"):
        profile(["strided"], [64], impls=("flex",), baselines=(), params={"stride": 8})
