"""`patterns list` and `patterns show` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sparse_patterns.cli import app

runner = CliRunner()


def test_list_names_every_family():
    res = runner.invoke(app, ["list", "--json"])
    assert res.exit_code == 0
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert {"full", "strided", "fixed", "local", "local2d", "axial2d", "factorized",
            "dilated", "longformer", "bigbird"} <= set(rows)
    assert rows["strided"]["params"] == {"stride": "sqrt", "window": "paper", "causal": True}
    assert "1904.10509" in rows["fixed"]["reference"]
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0 and "strided" in res.stdout


def test_show_strided_exact_sets():
    res = runner.invoke(app, ["show", "strided", "--n", "16", "--stride", "4"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    pic = lines[1:17]
    assert pic[0] == "#..............."
    assert pic[9] == ".2...#111#......"  # A1 = 5..9, A2 = 1, 5, 9
    assert pic[15] == "...2...2...#111#"


def test_show_json_figures():
    res = runner.invoke(app, ["show", "fixed", "--n", "16", "--stride", "4", "--c", "2",
                              "--summary-heads", "2", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["params"] == {"stride": 4, "c": 2, "summary_heads": 2, "causal": True}
    heads = {h["head"]: h for h in data["heads"]}
    assert set(heads) == {"A1", "A2.0", "A2.1", "union"}
    assert heads["A1"]["nnz"] == 40 and heads["A1"]["max_row"] == 4


def test_show_options_forms():
    a = runner.invoke(app, ["show", "strided", "--n", "16", "--stride=4", "--window", "reference",
                            "--no-causal", "--json"])
    assert a.exit_code == 0, a.output
    assert json.loads(a.stdout)["causal"] is False
    b = runner.invoke(app, ["show", "strided", "--n", "100", "--stride", "sqrt", "--json"])
    assert json.loads(b.stdout)["params"]["stride"] == 10


@pytest.mark.parametrize(("args", "message"), [
    (["show", "strided", "--n", "16", "--c", "2"],
     "--c: pattern 'strided' takes no such option; it takes --stride, --window, --causal"),
    (["show", "strided", "--n", "0"], "n: must be an integer"),
    (["show", "strided", "--n", "16", "--stride", "-1"], "stride: must be an integer >= 1, got -1"),
    (["show", "strided", "--n", "16", "--stride", "x"], "stride: must be an integer or 'sqrt'"),
    (["show", "fixed", "--n", "16", "--stride", "4", "--c", "9"], "c: must be an integer [1, 4], got 9"),
    (["show", "nope", "--n", "16"], "name: unknown pattern 'nope'"),
    (["show", "strided"], "n: --n is required"),
    (["show", "axial2d", "--n", "16", "--height", "3"], "height: height * width must equal n=16"),
    (["show", "strided", "--n", "16", "--stride"], "--stride: needs a value"),
])
def test_bad_input_one_line_exit_2(args, message):
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.startswith("error: ") and message in err
    assert len(err.splitlines()) == 1
    assert "Traceback" not in res.output
