"""`patterns verify` and `patterns analyze` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sparse_patterns.cli import app

runner = CliRunner()


def test_verify_passes_exit_0():
    res = runner.invoke(app, ["verify", "strided", "--n", "256", "--stride", "16"])
    assert res.exit_code == 0, res.output
    assert "VERIFIED" in res.stdout and "PASS" in res.stdout


def test_verify_default_is_readme_strided(monkeypatch):
    import sparse_patterns.cli.verify as cv

    monkeypatch.setattr(cv, "DEFAULT", ("strided", 1024, ["--stride", "32"]))
    res = runner.invoke(app, ["verify", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["name"] == "strided" and d["n"] == 1024 and d["params"]["stride"] == 32


def test_verify_fails_exit_1_with_counterexample():
    res = runner.invoke(app, ["verify", "local", "--n", "64", "--window", "4", "--mode", "merged",
                              "--p", "2"])
    assert res.exit_code == 1, res.output
    assert "NOT VERIFIED" in res.stdout and "(9, 0)" in res.stdout
    res = runner.invoke(app, ["verify", "local", "--n", "64", "--window", "4", "--mode", "merged",
                              "--steps", "2", "--json"])
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert d["counterexample"] == [9, 0] and d["explanation"]["path"] is None
    assert d["depth"] == 16 and d["p"] == 2


def test_verify_no_residual_and_block():
    res = runner.invoke(app, ["verify", "fixed", "--n", "64", "--stride", "8", "--c", "2",
                              "--no-residual", "--json"])
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert d["criterion2"] and not d["criterion1"] and d["counterexample"] == [0, 0]
    res = runner.invoke(app, ["verify", "fixed", "--n", "1024", "--stride", "64", "--block",
                              "32", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["level"] == "block" and d["block"] == 32


def test_factorized_keeps_its_p():
    res = runner.invoke(app, ["verify", "factorized", "--n", "64", "--p", "3", "--json"])
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["p"] == 3


@pytest.mark.parametrize(
    "args",
    [["verify", "strided", "--n", "16", "--stride", "0"],
     ["verify", "strided", "--n", "16", "--mode", "sideways"],
     ["verify", "strided", "--n", "16", "--p", "3"],
     ["verify", "strided", "--n", "16", "--p", "0"],
     ["verify", "strided", "--n", "16", "--p", "x"],
     ["verify", "nope", "--n", "16"],
     ["verify", "strided"],
     ["analyze", "strided", "--n", "0,16"],
     ["analyze", "strided", "--n", "16", "--wat", "3"]],
)
def test_bad_input_exit_2(args):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "error:" in res.stderr and "Traceback" not in res.output


def test_analyze_prints_exponent():
    res = runner.invoke(app, ["analyze", "strided", "--n", "256,1024,4096", "--stride", "sqrt"])
    assert res.exit_code == 0, res.output
    assert "fitted exponent" in res.stdout and "0.5" in res.stdout
    res = runner.invoke(app, ["analyze", "strided", "--n", "256,1024,4096", "--stride", "sqrt",
                              "--json"])
    d = json.loads(res.stdout)
    assert abs(d["exponent"] - 0.5) < 0.03 and d["expected"] == 0.5


def test_verify_file(tmp_path):
    from sparse_patterns import make
    from sparse_patterns.export import save

    path = save(make("local", 64, window=4), tmp_path / "local.npz")
    res = runner.invoke(app, ["verify", "--file", str(path), "--mode", "merged", "--json"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["name"] == "local"
    res = runner.invoke(app, ["verify", "strided", "--n", "16", "--file", str(path)])
    assert res.exit_code == 2
