"""Bad input a hostile user found, each one line on stderr with the right exit status:
parameters a schedule's layer may not set, paths that are not regular files, lists
past their cap, a closed stdout, and Ctrl-C wherever it lands (issue 54, 6-8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparse_patterns.cli import app
from sparse_patterns.cli._args import MAX_NS
from sparse_patterns.cli._schedule import MAX_LAYERS

runner = CliRunner()
#: The ``patterns`` console script of this interpreter, or the same entry point through -c.
_SCRIPT = Path(sys.executable).with_name("patterns")
PATTERNS = [str(_SCRIPT)] if _SCRIPT.exists() else [
    sys.executable, "-c", "from sparse_patterns.cli import main; main()"]


def one_line(res, code: int) -> str:
    """The single error line of a CliRunner result that exited with ``code``."""
    assert res.exit_code == code, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


# --------------------------------------------------------- A: a layer's n, name, documents
@pytest.mark.parametrize(("schedule", "extra", "line"), [
    ("local:n=5", [], "error: schedule: layer 1 ('local') gives n='5'; every layer is made at --n"),
    ("full,local:name=x", [], "error: schedule: layer 2 ('local') gives name='x'; a layer's "
                              "pattern is the NAME before its parameters"),
    ("local:documents=4", ["--documents", "8,8"],
     "error: schedule: layer 1 ('local') gives documents='4'; every layer is made inside the "
     "--documents of the command"),
    ("local:documents=4", [], "error: schedule: layer 1 ('local') gives documents='4'; every "
                              "layer is made inside the --documents of the command"),
])
def test_schedule_layer_cannot_set_what_the_command_sets(schedule, extra, line):
    res = runner.invoke(app, ["verify", "--schedule", schedule, "--n", "16", *extra])
    assert one_line(res, 2) == line


def test_schedule_file_cannot_set_n(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps([{"pattern": "local", "params": {"window": 2}},
                             {"pattern": "full", "params": {"n": 4}}]))
    res = runner.invoke(app, ["verify", "--schedule", str(f), "--n", "16"])
    assert one_line(res, 2) == ("error: schedule: layer 2 ('full') gives n=4; every layer is "
                                "made at --n")
    res = runner.invoke(app, ["render", "--schedule", "local:n=4", "--n", "16", "-o",
                              str(tmp_path / "s.png")])
    assert "gives n='4'" in one_line(res, 2) and not list(tmp_path.glob("*.png"))


def test_schedule_of_too_many_layers_is_one_line():
    res = runner.invoke(app, ["verify", "--schedule", ",".join(["local:window=1"] * 500),
                              "--n", "16"])
    assert one_line(res, 2).startswith(f"error: schedule: 500 layers; at most {MAX_LAYERS} ")


# ---------------------------------------------------------------- B: not a regular file
def _fifo(tmp_path: Path, name: str) -> str:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = str(tmp_path / name)
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("cmd", [["verify", "--n", "16", "--schedule"], ["show", "--file"],
                                 ["verify", "--file"], ["export", "-o", "x.npz", "--file"]])
def test_fifo_is_refused_before_opening(tmp_path, cmd):
    what = "schedule" if "--schedule" in cmd else "file"
    _fifo(tmp_path, "s.json")
    path = "s.json"
    # a FIFO opened for reading blocks until a writer comes: a hang here is the bug
    proc = subprocess.run([*PATTERNS, *cmd, path],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: {what}: {path!r} is a FIFO, not a regular file"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_device_and_directory_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("z.json").symlink_to("/dev/zero")
    res = runner.invoke(app, ["verify", "--schedule", "z.json", "--n", "16"])
    assert one_line(res, 2) == "error: schedule: 'z.json' is a character device, not a regular file"
    res = runner.invoke(app, ["show", "--file", "/dev/zero"])
    assert one_line(res, 2) == "error: file: '/dev/zero' is a character device, not a regular file"
    Path("d.json").mkdir()
    res = runner.invoke(app, ["show", "--file", "d.json"])
    assert one_line(res, 2) == "error: file: 'd.json' is a directory, not a regular file"


# ------------------------------------------------------------------- E: lists are capped
@pytest.mark.parametrize("argv", [
    ["profile", "strided", "--n"], ["analyze", "strided", "--n"],
    ["render", "strided", "--view", "scaling", "-o", "x.png", "--ns"],
])
def test_list_of_sequence_lengths_is_capped(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*argv, ",".join(str(k) for k in range(1, 2001))])
    assert one_line(res, 2) == (f"error: n: 2,000 sequence lengths; at most {MAX_NS} (each one "
                                "is a full run of the command)")
    assert not list(tmp_path.iterdir())


def test_pattern_named_twice_is_refused():
    res = runner.invoke(app, ["profile", "strided", "fixed", "strided", "--n", "16"])
    assert one_line(res, 2) == "error: patterns: 'strided' named twice; name each pattern once"


# ---------------------------------------------------------------- G: a closed stdout
@pytest.mark.parametrize("argv", [["verify", "strided", "--n", "64", "--stride", "8"],
                                  ["show", "strided", "--n", "64", "--stride", "8"],
                                  ["list"], ["analyze", "strided", "--n", "64,128"]])
def test_closed_stdout_is_one_line_and_exit_2(argv, tmp_path):
    # fd 1 closed in the child, as `patterns ... >&-` does: Python starts with sys.stdout None
    proc = subprocess.run([*PATTERNS, *argv], stderr=subprocess.PIPE, text=True, timeout=120,
                          cwd=tmp_path, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2
    assert proc.stderr == ("error: stdout: standard output is closed; send it somewhere "
                           "(> FILE, > /dev/null or | less)\n")


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"],
                                  ["verify", "strided", "--n", "64", "--stride", "8"]])
def test_reader_gone_stays_quiet(argv, tmp_path):
    # as `patterns ... | head` when head has gone: the pipe's reader is closed before the
    # command writes; no line on stderr (the exit status is typer's 1)
    proc = subprocess.Popen([*PATTERNS, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == b""


# ------------------------------------------------------------------- H: Ctrl-C anywhere
def _swallowed_then(error: BaseException):
    """A library call that Ctrl-C interrupts inside a ctypes callback (where Python prints the
    KeyboardInterrupt as "Exception ignored" and drops it, as during llvmlite's compile), and
    that then fails with ``error``."""
    import ctypes

    def callback() -> None:
        raise KeyboardInterrupt

    def call(*args, **kwargs):
        ctypes.CFUNCTYPE(None)(callback)()
        raise error

    return call


@pytest.mark.parametrize("error", [RuntimeError("no compiled object yet"), ValueError("x")])
def test_interrupt_dropped_in_a_callback_exits_130(monkeypatch, error):
    import signal

    from sparse_patterns.patterns import registry

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("the test runner has its own SIGINT handler")
    monkeypatch.setattr(registry, "make", _swallowed_then(error))
    res = runner.invoke(app, ["show", "strided", "--n", "16"])
    assert res.exit_code == 130 and res.stderr == "interrupted\n", res.output
    assert sys.unraisablehook is not sys.__unraisablehook__  # the collector stays quiet
    sys.unraisablehook = sys.__unraisablehook__


def test_interrupt_chained_in_an_error_exits_130(monkeypatch):
    from sparse_patterns.patterns import registry

    def make(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("no compiled object yet") from exc

    monkeypatch.setattr(registry, "make", make)
    res = runner.invoke(app, ["show", "strided", "--n", "16"])
    assert res.exit_code == 130 and res.stderr == "interrupted\n", res.output


@pytest.mark.parametrize("compiled", [1, 3])
def test_ctrl_c_during_the_first_compilation_exits_130(tmp_path, compiled):
    # an empty numba cache: verify compiles five kernels first (about 2 s here), writing each
    # to the cache as it is done. The interrupt follows the `compiled`-th of them, so that it
    # lands mid-compilation on any machine; after a fixed delay it could land while a fast
    # machine's interpreter was already shutting down, which a SIGINT ends as the signal
    import signal
    import time

    cache = tmp_path / "cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    proc = subprocess.Popen([*PATTERNS, "verify", "strided", "--n", "1024", "--stride", "32"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                           signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while len(list(cache.rglob("*.nbi"))) < compiled:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.skip(f"verify compiled fewer than {compiled} kernels (exit {proc.wait()})")
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert (proc.returncode, err) == (130, "interrupted\n")


# ------------------------------------------------- F: save writes only what load reads
def test_recipe_save_and_load_agree_on_the_size(tmp_path):
    from sparse_patterns import make
    from sparse_patterns.export import load, save
    from sparse_patterns.export._codec import MAX_META

    fits = make("local", 400_000, window=1, documents=[2] * 200_000)
    f = save(fits, tmp_path / "fits.json")  # indented it would be 1.8 MB: written compact
    assert f.stat().st_size <= MAX_META and load(f) == fits
    big = make("local", 1_200_000, window=1, documents=[2] * 600_000)
    with pytest.raises(ValueError, match=r"^pattern: its recipe is 1,200,093 bytes of JSON, over "
                                         r"the 1,048,576 a recipe may hold \(reading refuses"):
        save(big, tmp_path / "big.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fits.json"]


# -------------------------------------- D: expressions bounded by their expanded size
def test_repeated_subexpression_is_bounded_by_its_expanded_size():
    from sparse_patterns import make
    from sparse_patterns.algebra import MAX_NODES

    x = make("local", 16, window=2)
    sizes = []
    with pytest.raises(ValueError, match=rf"^patterns: the expression would hold 511 nodes, a "
                                         rf"repeated subexpression counted each time; at most "
                                         rf"{MAX_NODES} "):
        for _ in range(22):  # 2**22 nodes and a 38-million-character name, unbounded
            x = x - x
            sizes.append(x.rule.nodes)
    assert sizes == [2 ** (k + 2) - 1 for k in range(7)] and len(x.name) < 2000
    # what is admitted computes what the tree says: x - x is empty
    assert x.rows(0, 16).nnz == 0


def test_expression_name_is_bounded():
    import scipy.sparse as sp

    from sparse_patterns.algebra import MAX_NAME
    from sparse_patterns.pattern import Pattern

    a = Pattern([sp.eye(4, format="csr", dtype=bool)], name="a" * 40_000)
    with pytest.raises(ValueError, match=rf"name would be 80,003 characters; at most {MAX_NAME:,}"):
        a | a
