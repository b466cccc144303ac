"""The profiler's CUDA paths: ``device="cuda"`` (torch CUDA tensors, CUDA events,
``max_memory_allocated``) on a GPU, skipped without one; ``impl="cuda"`` on a host
profile, which hands the kernel numba-cuda device arrays: under numba's CUDA simulator
(in a fresh process, where ``NUMBA_ENABLE_CUDASIM`` is read before ``numba.cuda`` is
imported) it runs and is checked against the oracle, and with neither a GPU nor the
simulator it is skipped with the reason. Bad input: ``--device cuda`` without a GPU is
one line and exit status 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sparse_patterns.cli import app
from sparse_patterns.profiling import _run as prof
from sparse_patterns.profiling import profile

FAST = dict(repeats=1, heads=2, head_dim=8, params={"stride": 4})


def _gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(autouse=True)
def _small_matmul(monkeypatch):
    monkeypatch.setattr(prof, "_MATMUL_N", 128)


@pytest.mark.skipif(_gpu(), reason="a GPU is visible: --device cuda is valid here")
def test_device_cuda_without_a_gpu_is_one_line_exit_2():
    r = CliRunner().invoke(app, ["profile", "strided", "--n", "64", "--stride", "8",
                                 "--impl", "numba", "--device", "cuda", "--baselines", "none"])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "device: 'cuda' needs a CUDA GPU" in lines[0]
    assert "Traceback" not in r.output
    with pytest.raises(ValueError, match=r"^device: 'cuda' needs a CUDA GPU visible to torch"):
        profile(["strided"], [16], impls=("numba",), baselines=(), device="cuda", **FAST)


def test_unknown_device_lists_the_valid_ones():
    r = CliRunner().invoke(app, ["profile", "strided", "--n", "64", "--stride", "8",
                                 "--device", "tpu", "--baselines", "none"])
    assert r.exit_code == 2 and "device" in r.output and "cuda" in r.output


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU visible to torch")
def test_cuda_profile_on_a_gpu():  # pragma: no cover - runs where a GPU is lent
    pytest.importorskip("numba.cuda")
    t = profile(["strided"], [512], impls=("numba", "flex", "cuda"), baselines=("sdpa", "flex"),
                device="cuda", dtype="float16", repeats=2, heads=2, head_dim=64,
                params={"stride": 16})
    r = t[0]
    assert t.settings["device"] == "cuda" and t.fma_peak_gflops is None
    for name, kind in (("numba", "impl"), ("flex", "impl"), ("cuda", "impl"),
                       ("sdpa", "baseline"), ("flex", "baseline")):
        m = r.get(name, kind)
        assert m.status == "ok", (name, kind, m.note)
        assert m.median_s > 0 and m.peak_bytes is not None
    assert r.get("flex", "impl").peak_bytes > 0 and "flash" in r.get("sdpa").note
    assert r.get("flex", "impl").computed_flops is not None
    d = t.to_dict()["rows"][0]["runs"]
    assert "flex" in d and "flex (baseline)" in d


_CHILD = """
import json, sys
from sparse_patterns.profiling import _run as prof, profile
prof._MATMUL_N = 64
prof._fma_peak = lambda dtype: (1.0, "patched")
t = profile(["strided"], [16], impls=("cuda", "reference"), baselines=(), repeats=1, heads=2,
            head_dim=4, params={"stride": 4}, block=8, dtype=sys.argv[1])
m = t[0].get("cuda")
print(json.dumps({"status": m.status, "note": m.note, "err": m.max_err, "times": len(m.times)}))
"""


def _child(sim: str, dtype: str = "float64") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_ENABLE_CUDASIM")}
    env["NUMBA_ENABLE_CUDASIM"] = sim
    r = subprocess.run([sys.executable, "-c", _CHILD, dtype], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_impl_cuda_on_the_simulator_gets_device_arrays():
    """On a host profile the CUDA kernel gets numba device arrays, not NumPy arrays (which
    it refuses): under the simulator it runs, and is checked against the oracle."""
    pytest.importorskip("numba.cuda")
    got = _child("1")
    assert got["status"] == "ok", got
    assert got["err"] < 1e-10 and got["times"] == 1 and "numba-cuda" in got["note"]
    half = _child("1", "float16")  # numba device arrays hold float32 / float64 only
    assert half["status"] == "skipped" and "use --device cuda" in half["note"]


@pytest.mark.skipif(_gpu(), reason="a GPU is visible")
def test_impl_cuda_without_gpu_or_simulator_is_skipped_with_the_reason():
    pytest.importorskip("numba.cuda")
    got = _child("0")
    assert got["status"] == "skipped" and "needs a CUDA GPU" in got["note"], got
