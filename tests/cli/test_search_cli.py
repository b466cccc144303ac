"""Tests of ``patterns search``: --json parses and agrees with the API, the table shows the
Pareto front, --plot writes a figure, --cache resumes, bad input exits 2 with one line
(an unreachable scheduler within its timeout). Runs against one small LocalCluster
through --scheduler; one test lets the command start its own (--workers 1)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("distributed")
pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from typer.testing import CliRunner  # noqa: E402

from sparse_patterns.cli import app  # noqa: E402
from sparse_patterns.search import _connect as connect  # noqa: E402
from sparse_patterns.search import search  # noqa: E402


@pytest.fixture(scope="module")
def address():
    client, owned = connect(None, 2, 30.0)
    yield owned[0].scheduler_address
    client.close()
    for thing in owned:  # the cluster, then os.environ as it was
        thing.close()


def run(*args: str):
    return CliRunner().invoke(app, ["search", *args])


def test_local_cluster_from_the_command(tmp_path):
    before = dict(os.environ)
    r = run("strided", "--n", "64", "--grid", "stride=4,8", "--workers", "1", "--json")
    assert r.exit_code == 0, r.output
    assert [x["ok"] for x in json.loads(r.stdout)["rows"]] == [True, True]
    # the nannies' variables (OMP_NUM_THREADS, PYTHONHASHSEED...) are gone with the cluster
    assert dict(os.environ) == before


def test_json_parses_and_equals_the_api(address):
    r = run("fixed", "strided", "--n", "256,512", "--grid", "stride=8,16", "--grid", "c=2,4",
            "--block", "16", "--scheduler", address, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["counts"]["candidates"] == 2 * (4 + 2) == len(d["rows"])
    assert d["settings"]["grid"] == {"stride": ["8", "16"], "c": ["2", "4"]}
    api = search(["fixed", "strided"], {"stride": [8, 16], "c": [2, 4]}, [256, 512], block=16,
                 client=address)
    mine = {(r["family"], r["params"]["stride"], r["params"].get("c"), r["n"]):
            (r["ok"], r["max_hops"], r["computed_flops"]) for r in d["rows"]}
    theirs = {(r["family"], json.loads(r["params"])["stride"], json.loads(r["params"]).get("c"),
               r["n"]): (r["ok"], r["max_hops"], r["computed_flops"]) for r in api.rows}
    assert mine == theirs
    front = {r["key"] for r in api.pareto().rows}
    assert set(d["pareto"]) == front


def test_table_plot_markdown_and_cache(address, tmp_path):
    png, cache = tmp_path / "pareto.png", tmp_path / "r.jsonl"
    args = ["fixed", "--n", "256", "--grid", "stride=8,16,32", "--grid", "c=2,64",
            "--scheduler", address, "--cache", str(cache)]
    r = run(*args, "--plot", str(png))
    assert r.exit_code == 1, r.output  # every row printed; some candidates errored
    assert "Pareto front: cheapest verified per n" in r.stdout and "fixed stride=32 c=2" in r.stdout
    assert "6 candidates: 3 verified, 0 failing a criterion, 3 errors; 6 computed" in r.stdout
    assert "failed: fixed stride=8 c=64 n=256: ValueError: c: " in r.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and cache.exists()
    r = run(*args, "--markdown", "--all")
    assert r.exit_code == 1 and r.stdout.startswith("| candidate | n | ok |")
    assert len(r.stdout.strip().splitlines()) == 2 + 6
    r = run(*args)
    assert "0 computed, 6 from the cache" in r.stdout
    r = run("fixed", "--n", "256", "--grid", "stride=8", "--no-causal", "--scheduler", address,
            "--json", "--all")
    d = json.loads(r.stdout)
    assert d["rows"][0]["params"]["causal"] is False
    # exit 1 unless every candidate verified
    assert r.exit_code == (0 if d["counts"]["verified"] == d["counts"]["candidates"] else 1)


def test_a_file_that_is_not_a_cache_is_refused_and_kept(address, tmp_path):
    bad = tmp_path / "r.parquet"
    bad.write_bytes(b"garbage")
    r = run("strided", "--n", "64", "--grid", "stride=4", "--scheduler", address, "--cache",
            str(bad))
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and "is not a search cache (not a readable Parquet" in r.stderr
    assert bad.read_bytes() == b"garbage"
    assert len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (["--n", "64"], "patterns: name at least one pattern"),
        (["stridd", "--n", "64"], "name: unknown pattern 'stridd'"),
        (["fixed"], "n: --n is required"),
        (["fixed", "--n", "64", "--grid", "window=4"], "grid: 'window' is a parameter of none"),
        (["fixed", "--n", "64", "--grid", "stride=abc"], "grid: stride: must be an integer"),
        (["fixed", "--n", "64", "--grid", "stride"], "grid: expected NAME=V1,V2"),
        (["fixed", "--n", "64", "--grid", "stride=4", "--grid", "stride=8"], "stride given twice"),
        (["fixed", "--n", "64", "--grid", "stride=4", "--stride", "8"], "stride: given both"),
        (["fixed", "--n", "64", "--workers", "0"], "workers: must be an integer [1, 256]"),
        (["fixed", "--n", "64", "--measure", "speed"], "measure: unknown measure 'speed'"),
        (["fixed", "--n", "64", "--mode", "x"], "mode: must be one of"),
        (["fixed", "--n", "64", "--block", "0"], "block: must be an integer [1, 4096]"),
        (["fixed", "--n", "64", "--json", "--markdown"], "give --json or --markdown"),
        (["fixed", "--n", "64", "--cache", "r.csv"], "cache: unknown format '.csv'"),
        (["fixed", "--n", "64", "--plot", "p.gif"], "output"),
        (["fixed", "--n", "64", "--plot-x", "depth"], "plot_x: must be one of"),
        (["fixed", "--n", "64", "--scheduler", "tcp://127.0.0.1:9", "--workers", "2"],
         "workers: --workers sizes the local cluster"),
        (["fixed", "--n", "64", "--scheduler", "not an address"], "client: not a scheduler"),
        (["fixed", "--n", "64", "--scheduler", "tcp://127.0.0.1:9", "--timeout", "1"],
         "scheduler: cannot reach 'tcp://127.0.0.1:9' within 1 s"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message):
    r = run(*args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert r.stdout == ""


def test_cache_in_use_exits_2_with_one_line(address, tmp_path):
    from sparse_patterns import __version__  # noqa: PLC0415
    from sparse_patterns.search._cache import open_cache  # noqa: PLC0415

    held = open_cache(tmp_path / "r.jsonl", __version__)
    try:
        r = run("strided", "--n", "64", "--grid", "stride=4", "--scheduler", address,
                "--cache", str(tmp_path / "r.jsonl"))
    finally:
        held.close()
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and "is in use by another search" in r.output
