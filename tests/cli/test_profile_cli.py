"""Tests of ``patterns profile``: --json parses, --plot writes a figure, pattern
parameters are shared across patterns, bad input exits 2 with one line, a wrong
kernel exits 1. Small n only."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sparse_patterns import kernels
from sparse_patterns.cli import app
from sparse_patterns.profiling import _run as prof

BASE = ["--impls", "reference", "--repeats", "1", "--heads", "2", "--head-dim", "8"]
FAST = [*BASE, "--baselines", "none"]


@pytest.fixture(autouse=True)
def _small_matmul(monkeypatch):
    monkeypatch.setattr(prof, "_MATMUL_N", 128)


def run(*args: str):
    return CliRunner().invoke(app, ["profile", *args])


def test_json_parses_and_params_are_shared():
    r = run("strided", "fixed", "--n", "64,100", "--stride", "sqrt", "--c", "2", "--json", *FAST)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [(x["pattern"], x["n"]) for x in d["rows"]] == [
        ("strided", 64), ("strided", 100), ("fixed", 64), ("fixed", 100)]
    assert [x["params"]["stride"] for x in d["rows"]] == [8, 10, 8, 10]  # sqrt follows n
    assert d["rows"][2]["params"]["c"] == 2  # --c goes to fixed only
    run_ = d["rows"][0]["runs"]["reference"]
    assert run_["status"] == "ok" and run_["median_s"] > 0 and run_["gflops"] > 0
    assert d["settings"]["heads"] == 2 and d["baselines"] == [] and d["matmul"]["gflops"] > 0


def test_table_markdown_and_plot(tmp_path):
    out = tmp_path / "profile.png"
    r = run("full", "--n", "32,64", "--plot", str(out), *FAST)
    assert r.exit_code == 0, r.output
    assert "full" in r.stdout and "CPU capability" in r.stdout
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.png"]  # no temporary left
    r = run("full", "--n", "32", "--markdown", *FAST)
    assert r.exit_code == 0 and r.stdout.startswith("| pattern | n |")


@pytest.mark.parametrize(
    "args,message",
    [
        (["strided", "--n", ""], "n: expected at least one integer"),
        (["strided"], "n: --n is required"),
        (["--n", "64"], "patterns: name at least one pattern"),
        (["stridd", "--n", "64"], "name: unknown pattern 'stridd'"),
        (["strided", "--n", "64", "--c", "2"], "--c: none of the patterns strided takes it"),
        (["strided", "--n", "64", "--impls", "bogus"], "impls: unknown impl 'bogus'; valid:"),
        (["strided", "--n", "64", "--baselines", "xla"], "baselines: unknown baseline 'xla'"),
        (["strided", "--n", "64", "--plot", "x.gif"], "output: unknown file suffix '.gif'"),
        (["strided", "--n", "64", "--repeats", "0"], "repeats: must be an integer"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: " + message) and r.stderr.count("\n") == 1
    assert "Traceback" not in r.output


def test_wrong_kernel_exits_1(monkeypatch):
    be = kernels.get_backend("reference")
    orig = be.forward

    def broken(*args, **kwargs):
        res = orig(*args, **kwargs)
        if isinstance(res, tuple):
            return (res[0] + 0.5, *res[1:])
        return res + 0.5

    monkeypatch.setattr(be, "forward", broken)
    r = run("strided", "--n", "32", "--stride", "4", *FAST)
    assert r.exit_code == 1
    assert "reference is WRONG" in r.stdout and "error: wrong output or failure: reference on strided n=32" in r.stderr


@pytest.fixture
def columns_80(monkeypatch):
    """The command's console 80 columns wide, whatever COLUMNS said when it was made."""
    from rich.console import Console

    monkeypatch.setattr("sparse_patterns.cli.profile.console", Console(width=80))


@pytest.mark.parametrize("baselines", ["none", "sdpa"])
def test_default_table_fits_80_columns(baselines, columns_80):
    """Piped into an 80-column terminal: no cell cut to "…", no line over 80 characters."""
    if baselines != "none":
        pytest.importorskip("torch")
    r = CliRunner().invoke(app, ["profile", "longformer", "strided", "--n", "64,1000", *BASE,
                                 "--baselines", baselines], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout
    lines = r.stdout.splitlines()
    header = next(line.split() for line in lines if line.startswith("pattern "))
    assert header == ["pattern", "n", "impl", "ms", "GF/s", "%pk", "%mm",
                      *(["xsdpa"] if baselines == "sdpa" else []), "check"]
    assert "longformer" in r.stdout and "1,000" in r.stdout and "CPU capability" in r.stdout


def test_wide_shows_every_column(columns_80):
    pytest.importorskip("torch")
    r = CliRunner().invoke(app, ["profile", "strided", "--n", "64", "--stride", "8", *BASE,
                                 "--baselines", "sdpa", "--wide"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    header = next(line.split() for line in r.stdout.splitlines() if line.startswith("pattern "))
    assert header == ["pattern", "n", "dens", "GFLOP", "c/u", "impl", "median", "min-max",
                      "1st-med", "GF/s", "%pk", "%pkc", "%mm", "MB", "sdpa", "xsdpa", "check"]
    row = next(line.split() for line in r.stdout.splitlines() if line.startswith("strided"))
    assert len(row) == len(header) and row[-1] == "ok"
