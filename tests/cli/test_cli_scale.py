"""Tests of the command line at sizes that do not fit: ``--help`` loads no NumPy, a
size above the memory limit exits 2 with one line saying what it would need and
what to use instead, before writing anything, and ``profile`` refuses inputs that
exceed the memory available. The limits are forced tiny (sparse_patterns.config,
a patched probe), never reached with a huge n."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sparse_patterns import config
from sparse_patterns.cli import app
from sparse_patterns.profiling import _run as prof

runner = CliRunner()
HEAVY = ("numpy", "scipy", "numba", "torch", "matplotlib")


@pytest.fixture(autouse=True)
def _small_matmul(monkeypatch):
    monkeypatch.setattr(prof, "_MATMUL_N", 128)


@pytest.mark.parametrize("argv", [["--help"], ["verify", "--help"], ["profile", "--help"],
                                  ["show", "--help"], ["render", "--help"]])
def test_help_imports_no_numpy(argv):
    code = (
        "import sys\n"
        "from sparse_patterns.cli import main\n"
        f"sys.argv = ['patterns', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "LOADED []"


def test_list_imports_no_numpy_and_matches_the_registry():
    code = (
        "import sys\n"
        "from sparse_patterns.cli import main\n"
        "sys.argv = ['patterns', 'list', '--json']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    listed, loaded = out.stdout.rsplit("LOADED", 1)
    assert loaded.strip() == "[]"
    from sparse_patterns.patterns import REGISTRY, describe  # the generators themselves

    assert json.loads(listed) == json.loads(json.dumps(describe()))
    assert [r["name"] for r in json.loads(listed)] == sorted(REGISTRY)


def test_import_package_is_light_and_api_unchanged():
    code = (
        "import sys, sparse_patterns as sps\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
        "print(sps.make('strided', 16, stride=4).nnz, sps.Pattern.__name__, sps.plan.__name__)\n"
        "print(sorted(set(sps.__all__) - set(dir(sps))), callable(sps.fixed))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "[]"
    assert lines[1].split()[1:] == ["Pattern", "plan"] and int(lines[1].split()[0]) > 0
    assert lines[2] == "[] True"


def _refused(args: list[str], limit: int = 100) -> str:
    with config.memory_limit(limit):
        res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in res.output
    assert "needs" in err and "memory limit" in err and "from the command line:" in err
    return err


def test_show_picture_above_the_limit_exits_2():
    err = _refused(["show", "strided", "--n", "16", "--stride", "4"])
    assert "686 B" in err  # 2 heads: 16*5 + 16*3... entries, CSR bytes from csr_bytes
    assert "registered pattern by name" in err


def test_analyze_reads_closed_form_counts_under_any_limit():
    """analyze needs no CSR (|A_i| in closed form), so a tiny memory limit does not stop it."""
    with config.memory_limit(100):
        res = runner.invoke(app, ["analyze", "strided", "--n", "64", "--stride", "8", "--json"])
    assert res.exit_code == 0, res.output
    import json

    table = json.loads(res.stdout)
    assert table["max_row"] == [15] and table["nnz"] == [708]  # 8 + 7 at i = 63; as the dense oracle


def test_unguarded_memory_error_exits_2_with_a_hint_and_writes_nothing(monkeypatch, tmp_path):
    import sparse_patterns.render as render

    def too_big(*args, **kwargs):
        raise MemoryError("Unable to allocate 16.0 GiB for an array")

    monkeypatch.setattr(render, "render_view", too_big)
    out = tmp_path / "m.png"
    res = runner.invoke(app, ["render", "strided", "--n", "64", "--stride", "8", "-o", str(out)])
    assert res.exit_code == 2 and not out.exists()
    assert res.stderr.strip() == (
        "error: out of memory: Unable to allocate 16.0 GiB for an array; from the command line: "
        "draw block densities: --view matrix --tile 1024")


def test_profile_inputs_above_the_memory_available_exit_2(monkeypatch):
    monkeypatch.setattr(prof, "available_bytes", lambda: 10_000)
    res = runner.invoke(app, ["profile", "strided", "--n", "64", "--heads", "2", "--head-dim", "8",
                              "--baselines", "none", "--impls", "reference"])
    assert res.exit_code == 2
    err = res.stderr.strip()
    # q, k, v and out of 1 x 2 x 64 x 8 float32 (4 KiB each) and one float32 draw: 20,480 bytes
    assert err == ("error: n: profiling at n=64 needs 20 kB for q, k, v and the output "
                   "(1 x 2 x 64 x 8 float32 each), more than the 10 kB of memory available; "
                   "use a smaller n, --heads, --batch or --head-dim")


def test_profile_skips_baselines_above_the_limit_and_reports_ours():
    pytest.importorskip("torch")
    # n=64, B=1, H=2, d=64, float32 (output 32,768 bytes). Hand-computed estimates (the
    # docstring of profiling._baselines): sdpa with a mask: scores and softmax 2*1*2*64*64*4
    # = 65,536 + the mask 1*64*64 = 4,096 + 2 outputs 65,536 = 135,168; flex: BlockMask
    # 16*1*1*1 = 16 + 2 outputs 65,536 + log-sum-exp 1*2*64*4 = 512: 66,064. Ours (a CSR
    # of a few kB) fits the limit of 50,000 bytes; both baselines do not.
    with config.memory_limit(50_000):
        res = runner.invoke(app, ["profile", "strided", "--n", "64", "--stride", "8", "--no-causal",
                                  "--heads", "2", "--head-dim", "64", "--repeats", "1",
                                  "--impls", "numba", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    meas = data["rows"][0]["runs"]
    assert meas["numba"]["status"] == "ok" and meas["numba"]["times"]
    for name, need in (("sdpa", "135 kB"), ("flex", "66 kB")):
        assert meas[name]["status"] == "skipped"
        assert f"would need about {need}" in meas[name]["note"]
        assert "above the memory limit of 50 kB" in meas[name]["note"]
    assert sum("skipped: would need" in n for n in data["notes"]) == 2


def test_profile_skips_baselines_that_would_take_too_long(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(prof, "_BASELINE_SECONDS", 0)
    t = prof.profile(["strided"], [64], impls=("reference",), heads=2, head_dim=8, repeats=1,
                     params={"stride": 8})
    for name in ("sdpa", "flex"):
        m = t[0].get(name)
        assert m.status == "skipped" and "would take at least" in m.note and not m.times
    assert t[0].get("reference").ok
