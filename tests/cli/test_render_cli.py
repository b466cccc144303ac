"""`patterns render` through typer's CliRunner: the three formats and the bad-input cases."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sparse_patterns.cli import app

runner = CliRunner()

MAGIC = {".png": b"\x89PNG\r\n\x1a\n", ".pdf": b"%PDF-", ".svg": b"<?xml"}


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_writes_each_format(tmp_path, suffix):
    out = tmp_path / f"strided{suffix}"
    res = runner.invoke(app, ["render", "strided", "--n", "16", "--stride", "4", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(MAGIC[suffix])
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    if suffix == ".svg":  # the title states the pattern and its parameters
        assert "strided(stride=4, window='paper', causal=True), n=16" in out.read_text()


@pytest.mark.parametrize(
    "args",
    [
        ["fixed", "--n", "36", "--stride", "6", "--view", "image"],
        ["strided", "--n", "24", "--stride", "4", "--view", "image", "--height", "4",
         "--width", "6", "--position", "23", "--heads", "A2"],
        ["local2d", "--n", "64", "--height", "8", "--width", "8", "--view", "image"],
        ["axial2d", "--n", "64", "--height", "8", "--width", "8", "--view", "matrix"],
        ["strided", "--n", "4096", "--stride", "64", "--view", "matrix"],
        ["bigbird", "--n", "64", "--block", "8", "--view", "matrix", "--tile", "8"],
        ["fixed", "--n", "64", "--stride", "8", "--summary-heads", "2", "--heads", "0,A2.1"],
    ],
)
def test_views_and_options(tmp_path, args):
    out = tmp_path / "fig.png"
    res = runner.invoke(app, ["render", *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 1000
    assert "wrote" in res.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["strided", "--n", "16", "--view", "picture"], "view: unknown view 'picture'"),
        (["strided", "--n", "16", "--view", "image", "--height", "3", "--width", "4"],
         "height, width: the raster must hold n=16 positions, got 3 x 4 = 12"),
        (["strided", "--n", "20", "--view", "image"], "n=20 is not a square"),
        (["strided", "--n", "16", "--view", "image", "--position", "16"], "position: must be"),
        (["strided", "--n", "16", "--view", "image", "--position", "-1"], "position: must be"),
        (["strided", "--n", "16", "--heads", "B"], "heads: unknown head 'B'"),
        (["strided", "--n", "16", "--stride", "0"], "stride"),
        (["nosuch", "--n", "16"], "name: unknown pattern 'nosuch'"),
        (["strided", "--n", "16", "--tile", "0"], "tile: must be an integer >= 1"),
    ],
)
def test_bad_input_one_line_exit_2_no_file(tmp_path, args, message):
    out = tmp_path / "fig.png"
    res = runner.invoke(app, ["render", *args, "-o", str(out)])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, message",
    [
        ("fig.gif", "output: unknown file suffix '.gif'"),
        ("fig", "output: unknown file suffix '(none)'"),
        ("missing/fig.png", "does not exist"),
        ("adir.png", "it is a directory"),
        ("afile/fig.png", "does not exist"),
    ],
)
def test_bad_output_paths(tmp_path, name, message):
    (tmp_path / "adir.png").mkdir()
    (tmp_path / "afile").write_text("x")
    res = runner.invoke(app, ["render", "strided", "--n", "16", "-o", str(tmp_path / name)])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir.png", "afile"]


def test_unwritable_directory(tmp_path, monkeypatch):
    # root may write anywhere, so the permission check and the failing create are simulated
    from sparse_patterns.render import _save

    monkeypatch.setattr(_save.os, "access", lambda path, mode: False)
    res = runner.invoke(app, ["render", "strided", "--n", "16", "-o", str(tmp_path / "f.png")])
    assert res.exit_code == 2 and "is not writable" in res.stderr
    monkeypatch.undo()

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_save.tempfile, "mkstemp", denied)
    res = runner.invoke(app, ["render", "strided", "--n", "16", "-o", str(tmp_path / "f.png")])
    assert res.exit_code == 2
    assert res.stderr.strip().endswith("cannot write '%s': Permission denied" % (tmp_path / "f.png"))
    assert list(tmp_path.iterdir()) == []


def test_failed_render_keeps_existing_file(tmp_path):
    out = tmp_path / "fig.png"
    out.write_bytes(b"previous figure")
    res = runner.invoke(app, ["render", "strided", "--n", "16", "--view", "image",
                              "--position", "99", "-o", str(out)])
    assert res.exit_code == 2
    assert out.read_bytes() == b"previous figure"


def test_output_required_and_gallery_exclusive(tmp_path):
    res = runner.invoke(app, ["render", "strided", "--n", "16"])
    assert res.exit_code == 2 and "output: --output/-o FILE is required" in res.stderr
    res = runner.invoke(app, ["render", "strided", "--gallery", str(tmp_path)])
    assert res.exit_code == 2 and "gallery:" in res.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["strided", "--n", "36", "--stride", "6", "--view", "hops"],
        ["local", "--n", "36", "--window", "4", "--view", "hops", "--mode", "merged"],
        ["strided", "--n", "1024", "--view", "hops"],  # above the per-pair limit: a histogram
        ["strided", "--view", "scaling", "--ns", "64,256,1024", "--stride", "sqrt"],
        ["factorized", "--view", "scaling", "--ns", "64,512", "--p", "3"],
    ],
)
def test_hops_and_scaling_views(tmp_path, args):
    out = tmp_path / "fig.svg"
    res = runner.invoke(app, ["render", *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(MAGIC[".svg"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["local", "--n", "36", "--view", "hops", "--mode", "sideways"], "mode"),
        (["strided", "--n", "36", "--view", "hops", "--mode", "merged", "--ns", "x"], None),
        (["strided", "--view", "scaling", "--ns", "64,x"], "n: expected comma-separated"),
        (["--view", "scaling", "--file", "x.npz"], "file: the scaling view"),
    ],
)
def test_hops_and_scaling_bad_input(tmp_path, args, message):
    out = tmp_path / "fig.png"
    res = runner.invoke(app, ["render", *args, "-o", str(out)])
    if message is None:  # --ns is ignored outside the scaling view
        assert res.exit_code == 0, res.output
        return
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_gallery_plan_covers_every_pattern():
    from sparse_patterns.patterns import REGISTRY
    from sparse_patterns.render import gallery

    names = [f for f, _ in gallery._plan()]
    assert {f"matrix_{k}.png" for k in REGISTRY} <= set(names)
    assert {"paper_figure3.png", "patterns.png", "hops_strided.png", "hops_local.png",
            "scaling.png"} <= set(names)


def test_committed_gallery_is_small():
    from pathlib import Path

    d = Path(__file__).resolve().parents[2] / "figures"
    pngs = sorted(d.glob("*.png"))
    assert len(pngs) >= 15
    for p in pngs:
        assert p.stat().st_size < 500_000, p
    assert sum(p.stat().st_size for p in pngs) < 2_000_000


def test_gallery(tmp_path, monkeypatch):
    # the command end to end on three of the figures (the whole gallery takes ~15 s)
    from sparse_patterns.render import gallery

    full = gallery._plan()
    keep = {"paper_figure3.png", "hops_local.png", "matrix_bigbird.png"}
    monkeypatch.setattr(gallery, "_plan", lambda: [(f, d) for f, d in full if f in keep])
    d = tmp_path / "figures"
    res = runner.invoke(app, ["render", "--gallery", str(d)])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in d.iterdir())
    assert set(names) == keep
    assert res.stdout.count("wrote") == 3
    for p in d.iterdir():
        assert p.read_bytes().startswith(MAGIC[".png"])
        assert p.stat().st_size < 500_000, p
    assert not [k for k in names if k.endswith(".tmp")]


def test_render_from_file(tmp_path):
    import sparse_patterns as sps

    src = tmp_path / "fixed.npz"
    sps.save(sps.make("fixed", 36, stride=6, c=1), src)
    out = tmp_path / "fixed.svg"
    res = runner.invoke(app, ["render", "--file", str(src), "--view", "image", "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "fixed(stride=6, c=1, summary_heads=1, causal=True)," in text  # the title, wrapped
    assert "n=36" in text and "output i = 28 on a 6 x 6 raster" in text
    res = runner.invoke(app, ["render", "--file", str(tmp_path / "none.npz"), "-o",
                              str(tmp_path / "x.png")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()
