"""`patterns export` through typer's CliRunner: every format is written and
read back (by `show --file`, `load` or torch.load); bad input is one line and
exit status 2, with nothing written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sparse_patterns import make
from sparse_patterns.cli import app
from sparse_patterns.export import load

runner = CliRunner()
SUFFIX = {"flex": "pt", "deepspeed": "pt", "xformers": "pt", "triton": "pt", "bsa": "pt",
          "npz": "npz", "safetensors": "safetensors", "json": "json"}


@pytest.mark.parametrize("fmt", list(SUFFIX))
def test_export_every_format_and_show_it(tmp_path, fmt):
    if SUFFIX[fmt] == "pt":
        pytest.importorskip("torch")
    out = tmp_path / f"p.{SUFFIX[fmt]}"
    args = ["export", "fixed", "--n", "64", "--stride", "16", "--c", "8", "--format", fmt,
            "-o", str(out), "--json"]
    if SUFFIX[fmt] == "pt" and fmt != "bsa":
        args += ["--block", "8"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["format"] == fmt and info["bytes"] == out.stat().st_size
    pat = make("fixed", 64, stride=16, c=8)
    back = load(out)
    if fmt == "bsa":  # one 128-token block: the whole causal triangle
        full = make("full", 64).heads[0]
        assert back.num_heads == 2 and all((h != full).nnz == 0 for h in back.heads)
    else:
        assert back == pat  # block-aligned for 8-token blocks, exact
    shown = runner.invoke(app, ["show", "--file", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["n"] == 64 and len(data["heads"]) == pat.num_heads + 1


def test_export_from_file_and_suffix_inference(tmp_path):
    src = tmp_path / "a.npz"
    res = runner.invoke(app, ["export", "strided", "--n", "32", "--stride", "4", "-o", str(src)])
    assert res.exit_code == 0, res.output and "wrote" in res.stdout
    dst = tmp_path / "b.json"
    res = runner.invoke(app, ["export", "--file", str(src), "-o", str(dst)])
    assert res.exit_code == 0, res.output
    assert load(dst) == make("strided", 32, stride=4)
    res = runner.invoke(app, ["show", "--file", str(dst)])
    assert res.exit_code == 0 and "strided" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "flex", "-o", "{d}/x.npz"], "output: --format flex writes a .pt file"),
        (["-o", "{d}/x.txt"], "format: give --format"),
        (["--format", "onnx", "-o", "{d}/x.pt"], "format: must be one of"),
        (["--format", "npz", "--block", "4", "-o", "{d}/x.npz"], "block: --block, --mode"),
        (["--format", "deepspeed", "--mode", "sum", "-o", "{d}/x.pt"], "mode: must be one of"),
    ],
)
def test_export_bad_input_one_line(tmp_path, args, message):
    args = [a.replace("{d}", str(tmp_path)) for a in args]
    res = runner.invoke(app, ["export", "strided", "--n", "32", *args])
    assert res.exit_code == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_custom_has_no_recipe_and_show_rejects_bad_file(tmp_path):
    blocks = tmp_path / "l.pt"
    pytest.importorskip("torch")
    res = runner.invoke(app, ["export", "local", "--n", "32", "--window", "3", "--format",
                              "deepspeed", "--block", "8", "-o", str(blocks)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["export", "--file", str(blocks), "-o", str(tmp_path / "l.json")])
    assert res.exit_code == 2 and "has no recipe" in res.stderr
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    res = runner.invoke(app, ["show", "--file", str(bad)])
    assert res.exit_code == 2 and "not a valid .npz" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("fmt", "block", "message"), [
    ("deepspeed", "16", "block: the block layout of strided at n=1,048,576"),
    ("flex", "16", "block_size: the BlockMask of strided at n=1,048,576"),
])
def test_export_too_big_for_memory_exits_2_before_allocating(tmp_path, fmt, block, message):
    # (H, nb, nb) tensors of 65,536 blocks a side: refused by the memory limit, nothing written
    pytest.importorskip("torch")
    from sparse_patterns import config

    with config.memory_limit(1 << 30):
        res = runner.invoke(app, ["export", "strided", "--n", "1048576", "--format", fmt,
                                  "--block", block, "-o", str(tmp_path / "x.pt")])
    assert res.exit_code == 2
    assert message in res.stderr and "memory limit" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())
