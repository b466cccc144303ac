"""The command line against a hostile user: every argument vector ends in exit
status 0 or 2 (1 only for a pattern that fails verification), never a traceback,
one line on stderr for an error, no temporary file left and an existing output
file untouched when a command fails; sizes that do not fit end in one line,
with bounded peak memory; repeated options are errors; Ctrl-C exits 130 and
SIGTERM/SIGHUP during a write remove the temporary file and exit 143/129.

The fuzzer (hypothesis) runs a short budget in CI. Its vocabulary holds the hostile
input of issue 54 too: ``--schedule`` layers that give n, name or documents, 257-300
layers, empty and malformed items (verify and render, without a pattern name so the
schedule is read), ``--documents`` that conflict with ``--n``, and ``--n`` lists of up to
5,000 lengths. For a longer run::

    SPARSE_PATTERNS_FUZZ_EXAMPLES=5000 .venv/bin/pytest -q -p no:cacheprovider \\
        tests/cli/test_cli_hostile.py -k fuzz

(about 0.1 s an example; render and export examples are the slow ones). The search's
cache rows and ``--grid`` values have their fuzzers in ``tests/search/test_search_fuzz.py``
(``SP_FUZZ_EXAMPLES``), hostile pattern files in ``tests/export/test_hostile_files.py``.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sparse_patterns import config
from sparse_patterns.catalog import CATALOG
from sparse_patterns.cli import _args as _cliargs
from sparse_patterns.cli import app
from sparse_patterns.util import files as _atomic

runner = CliRunner()
EXAMPLES = int(os.environ.get("SPARSE_PATTERNS_FUZZ_EXAMPLES", "100"))
MAX_N = 2**31 - 1

# ---------------------------------------------------------------- the strategy

#: Values an integer option can be given: valid, out of range, huge, not an integer.
VALID_INTS = st.integers(1, 64).map(str)
BAD_INTS = st.sampled_from(["0", "-1", "-4611686018427387904", str(2**31), str(2**63),
                            "1" + "0" * 30, "9" * 5000])
NOT_INTS = st.sampled_from(["abc", "1.5", "", " ", "1e3", "0x10", "1_000", "٣", "１", "nan",
                            "inf", "--n", "sqrt", "-", "True", "1\n2", "\x1b[31m1"])
INT_VALUES = st.one_of(VALID_INTS, BAD_INTS, NOT_INTS)
STR_VALUES = st.sampled_from(["paper", "reference", "sqrt", "cbrt", "x", "", "64", "1e400"])
GOOD_STR_VALUES = st.sampled_from(["paper", "reference"])
NAMES = st.sampled_from([*sorted(CATALOG), "nope", "--stride", "", "strided\nfixed"])
COMMANDS = st.sampled_from(["show", "verify", "analyze", "render", "export"])
#: ``--schedule`` texts (verify, render): valid ones, layers that give what the command sets
#: (n, name, documents), too many layers, empty and malformed items, unknown names.
SCHEDULES = st.one_of(
    st.sampled_from(["local:window=2,full", "local:window=4", "full,full", "strided:stride=4",
                     "local:n=5", "local:name=x", "local:documents=4", "local:N=5",
                     "local:window=2:window=3", "local:window", "local:=3", ":window=2", ",",
                     "", " ", "local,,full", "none", "nope", "local:window=-1",
                     "local:window=" + "9" * 5000, "local:window=\x1b[31m", "x.json",
                     ",".join(["full"] * 300), ",".join(["local:window=2"] * 257),
                     ",".join(["full"] * 256)]),
    st.lists(st.sampled_from(["full", "local:window=2", "local:n=8", "", "local:causal=false",
                              "strided:stride=4:window=paper", "local:documents=1,2"]),
             min_size=1, max_size=6).map(",".join),
)
#: ``--documents`` values: lengths, offsets, conflicts with --n, hostile text.
DOCUMENTS = st.sampled_from(["4,4", "0,4,8", "8", "16", "3,5", "0", "0,0", "4,-4", "8,4",
                             "1," * 200 + "1", "9" * 40, "", ",", "x", "4.0", "٣", "0,16,8",
                             "2147483647", "4,4,4,4,4,4,4,4,4,4"])
#: ``--n`` for analyze: a list of sequence lengths, long ones included.
N_LISTS = st.sampled_from(["16,32", "8", "0,8", "x", "", "16,1e3", "64," + "9" * 40,
                           ",".join(["16"] * 64), ",".join(["16"] * 65),
                           ",".join(str(k) for k in range(1, 2000)), "16," * 5000 + "16",
                           ",,,16,,,", "16;32", "١٦", "+16,-16"])
#: The command's own options and the values they take.
OWN = {
    "verify": {"--mode": st.sampled_from(["interleaved", "merged", "multihead", "x"]),
               "--steps": INT_VALUES, "--p": INT_VALUES, "--block": INT_VALUES,
               "--residual": None, "--no-residual": None, "--depth": None, "--json": None,
               "--schedule": SCHEDULES, "--documents": DOCUMENTS},
    "render": {"--view": st.sampled_from(["matrix", "image", "hops", "x"]), "--tile": INT_VALUES,
               "--dpi": st.sampled_from(["20", "5", "100000", "x"]), "--position": INT_VALUES,
               "--heads": st.sampled_from(["A1", "0", "-1", "99", "A1,A2", "x"]),
               "--schedule": SCHEDULES, "--documents": DOCUMENTS},
    "export": {"--format": st.sampled_from(["json", "npz", "safetensors", "deepspeed", "x"]),
               "--block": INT_VALUES, "--num-heads": INT_VALUES,
               "--mode": st.sampled_from(["multihead", "merged", "x"])},
    "show": {"--json": None},
    "analyze": {"--json": None},
}


@st.composite
def argvs(draw: st.DrawFn) -> tuple[str, list[str]]:
    """``(command, argv)``: a command, a pattern name, --n and options, some of them hostile.

    About a third of the vectors draw only valid-looking values (most of those
    succeed, so writing and replacing files is exercised too).
    """
    cmd = draw(COMMANDS)
    hostile = draw(st.integers(0, 2)) > 0
    if cmd in ("verify", "render") and draw(st.integers(0, 3)) == 0:
        return cmd, draw(schedule_argvs(cmd, hostile))
    name = draw(NAMES if hostile else st.sampled_from(sorted(CATALOG)))
    argv = [cmd, name] if name else [cmd]
    if not hostile or draw(st.integers(0, 9)):  # --n, usually
        if cmd == "analyze":
            argv += ["--n", draw(N_LISTS if hostile else st.just("16,32"))]
        else:
            argv += ["--n", draw(INT_VALUES if hostile else VALID_INTS)]
    params = CATALOG[name].params if name in CATALOG else []
    options: list[list[str]] = []
    for p in draw(st.lists(st.sampled_from(params), max_size=3, unique=True)) if params else []:
        flag = "--" + p.name.replace("_", "-")
        if p.type is bool:
            options.append([draw(st.sampled_from([flag, "--no-" + flag[2:]]))])
        elif p.type is int:
            options.append([flag, draw(INT_VALUES if hostile else VALID_INTS)])
        else:
            options.append([flag, draw(STR_VALUES if hostile else GOOD_STR_VALUES)])
    own = OWN[cmd]
    for flag in draw(st.lists(st.sampled_from(sorted(own)), max_size=2, unique=True)):
        options.append([flag] if own[flag] is None else [flag, draw(own[flag])])
    if hostile and options and draw(st.integers(0, 3)) == 0:  # repeat one option
        options.append(draw(st.sampled_from(options)))
    if hostile and draw(st.integers(0, 9)) == 0:  # an option the pattern does not take
        options.append(["--bogus", "1"])
    for opt in draw(st.permutations(options)):
        argv += opt
    return cmd, argv


@st.composite
def schedule_argvs(draw: st.DrawFn, cmd: str, hostile: bool) -> list[str]:
    """``verify``/``render`` with ``--schedule`` (no pattern name, else the schedule is never
    read), ``--n`` small, ``--documents`` sometimes, now and then a name or an option that
    a schedule does not take."""
    argv = [cmd, "--n", draw(st.sampled_from(["8", "16", "32"]) if not hostile else
                            st.one_of(st.sampled_from(["8", "16", "32"]), INT_VALUES))]
    argv += ["--schedule", draw(SCHEDULES if hostile else st.sampled_from(
        ["local:window=2,full", "local:window=4,local:window=4", "full"]))]
    if draw(st.integers(0, 2)) == 0:
        argv += ["--documents", draw(DOCUMENTS if hostile else st.sampled_from(["8,8", "0,4,16"]))]
    extra = {"verify": [("--json",), ("--p", "2"), ("--steps", "3"), ("--block", "4"),
                        ("--mode", "merged"), ("--depth",)],
             "render": [("--view", "hops"), ("--view", "matrix"), ("--no-residual",),
                        ("--tile", "4")]}[cmd]
    for opt in draw(st.lists(st.sampled_from(extra), max_size=2 if hostile else 1, unique=True)):
        argv += opt
    if hostile and draw(st.integers(0, 5)) == 0:
        argv += draw(st.sampled_from([["local"], ["--stride", "4"], ["--file", "x.npz"]]))
    return argv


# ---------------------------------------------------------------- the checks

def _no_temp_files(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]


def check_result(res, cmd: str) -> None:
    """The contract of every command, whatever its arguments."""
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-2000:]
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "internal error" not in res.stderr, res.stderr
    failed_verification = cmd == "verify" and res.exit_code == 1 and (
        "NOT VERIFIED" in res.stdout or '"ok": false' in res.stdout)
    assert res.exit_code in (0, 2) or failed_verification, (res.exit_code, out[-2000:])
    if res.exit_code == 2:
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: "), err


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=argvs())
def test_fuzz_argv_exit_0_or_2_one_line_no_traceback(tmp_path, case):
    cmd, argv = case
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    target = out_dir / ("fig.png" if cmd == "render" else "pat.npz")
    target.write_bytes(b"precious")
    if cmd in ("render", "export"):
        argv = [*argv, "-o", str(target)]
        if "--format" in argv:  # the format must match the suffix; keep it to .json/.npz/...
            fmt = argv[argv.index("--format") + 1]
            suffix = {"json": ".json", "safetensors": ".safetensors", "deepspeed": ".pt"}.get(fmt)
            if suffix:
                target = target.with_suffix(suffix)
                target.write_bytes(b"precious")
                argv[-1] = str(target)
    with config.memory_limit(512 * 2**20):  # a lower ceiling than the machine's, for the fuzzer
        res = runner.invoke(app, argv)
    check_result(res, cmd)
    assert _no_temp_files(out_dir) == []
    if res.exit_code != 0:
        assert target.read_bytes() == b"precious"


# ---------------------------------------------------------------- the repros, one by one

@pytest.mark.parametrize(("args", "line"), [
    (["show", "strided", "--n", "abc"], "error: n: must be an integer [1, 2147483647], got 'abc'"),
    (["show", "strided", "--n", "1.5"], "error: n: must be an integer [1, 2147483647], got '1.5'"),
    (["show", "strided", "--n", "0"], "error: n: must be an integer [1, 2147483647], got 0"),
    (["show", "strided", "--n", str(2**31)],
     "error: n: must be an integer [1, 2147483647], got 2147483648"),
    (["show", "strided", "--n", "9" * 5000],
     "error: n: must be an integer [1, 2147483647], got '99999999999999999999999999999999999999"
     "... (5000 characters)"),
    (["render", "strided", "--n", "16", "--dpi", "x", "-o", "f.png"],
     "error: dpi: must be an integer [10, 1200], got 'x'"),
    (["profile", "strided", "--n", "64", "--head-dim", "-3"],
     "error: head_dim: must be an integer [1, 16384], got -3"),
    (["show", "strided", "--n", "64", "--n", "16"], "error: n: --n given twice; give it once"),
    (["show", "strided", "--n", "16", "--json", "--json", "--json"],
     "error: json: --json given 3 times; give it once"),
    (["verify", "strided", "--n", "16", "--residual", "--no-residual"],
     "error: residual: --residual/--no-residual given twice; give it once"),
    (["export", "strided", "--n", "16", "-o", "a.npz", "--output", "b.npz"],
     "error: output: -o/--output given twice; give it once"),
    (["analyze", "strided", "--n", "16", "--n", "32"], "error: n: --n given twice; give it once"),
    (["show", "strided", "--n", "16", "--causal", "--no-causal"],
     "error: causal: --causal/--no-causal given twice; give it once"),
    (["show", "strided", "--n", "16", "--stride", "4", "--stride=8"],
     "error: stride: --stride given twice; give it once"),
    (["verify", "strided", "--n", "16", "--p", "2", "--p", "3"], "error: p: --p given twice; give it once"),
    (["analyze", "strided", "--n", "16,x"],
     "error: n: expected comma-separated integers [1, 2147483647], got '16,x'"),
    (["show", "--stride", "4", "strided", "--n", "16"],
     "error: name: expected a pattern name first, got the option '--stride'; give the name "
     "before its options (strided --n 64 --stride 8)"),
    (["--debug", "--debug", "list"], "error: debug: --debug given twice; give it once"),
])
def test_bad_options_are_one_line_with_the_range(args, line):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == line
    assert res.stdout == ""


def test_cli_and_library_agree_on_the_largest_n():
    from sparse_patterns.util.checks import MAX_N as lib_max

    assert _cliargs.MAX_N == lib_max == MAX_N


def test_help_states_the_ranges():
    res = runner.invoke(app, ["profile", "--help"])
    assert res.exit_code == 0
    assert "1 to 16384" in res.stdout and "1 to 1000" in res.stdout
    res = runner.invoke(app, ["--help"])
    assert "--debug" in res.stdout


def test_deeply_nested_recipe_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"pattern": ' * 50_000 + '"strided"' + "}" * 50_000)
    res = runner.invoke(app, ["show", "--file", str(deep)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")


@pytest.mark.parametrize(("exc", "code", "line"), [
    (OverflowError("Python int too large to convert to C long"), 2,
     "error: a value is too large: Python int too large to convert to C long"),
    (RecursionError("maximum recursion depth exceeded"), 2,
     "error: input nested too deeply: maximum recursion depth exceeded"),
    (MemoryError("Unable to allocate 8.00 EiB"), 2,
     "error: out of memory: Unable to allocate 8.00 EiB; from the command line: show a registered "
     "pattern by name (its |A_i| come from its rule; the picture needs n <= 64)"),
    (MemoryError(), 2, "error: out of memory: MemoryError; from the command line: show a registered "
                       "pattern by name (its |A_i| come from its rule; the picture needs n <= 64)"),
    (TypeError("unsupported operand\nsecond line"), 1,
     "error: internal error: TypeError: unsupported operand (a bug; run again with --debug or "
     "SPARSE_PATTERNS_DEBUG=1 for the traceback)"),
])
def test_escaping_exceptions_become_one_line(monkeypatch, exc, code, line):
    from sparse_patterns.patterns import registry

    def boom(*args, **kwargs):
        raise exc

    monkeypatch.delenv("SPARSE_PATTERNS_DEBUG", raising=False)
    monkeypatch.setattr(registry, "make", boom)
    res = runner.invoke(app, ["show", "strided", "--n", "16"])
    assert (res.exit_code, res.stderr.strip()) == (code, line)
    assert "Traceback" not in res.output


@pytest.mark.parametrize("how", ["option", "env"])
def test_debug_shows_the_traceback(monkeypatch, how):
    from sparse_patterns.patterns import registry

    def boom(*args, **kwargs):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(registry, "make", boom)
    if how == "env":
        monkeypatch.setenv("SPARSE_PATTERNS_DEBUG", "1")
    res = runner.invoke(app, [*(["--debug"] if how == "option" else []), "show", "strided", "--n", "16"])
    assert res.exit_code == 1
    assert "Traceback (most recent call last)" in res.stderr and "in boom" in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "error: internal error: TypeError: unsupported operand (a bug; the traceback is above)")
    monkeypatch.setenv("SPARSE_PATTERNS_DEBUG", "0")  # and it does not stick
    res = runner.invoke(app, ["show", "strided", "--n", "16"])
    assert res.exit_code == 1 and "Traceback" not in res.stderr


def test_failed_verification_exits_1_without_an_error_line():
    res = runner.invoke(app, ["verify", "local", "--n", "64", "--window", "4", "--mode", "merged",
                              "--p", "2"])
    assert res.exit_code == 1 and "NOT VERIFIED" in res.stdout and res.stderr == ""


def test_keyboard_interrupt_in_a_command_exits_130(monkeypatch):
    from sparse_patterns.patterns import registry

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "make", interrupted)
    res = runner.invoke(app, ["show", "strided", "--n", "16"])
    assert res.exit_code == 130 and "Traceback" not in res.output


# ---------------------------------------------------------------- subprocesses

def _run_cli(args: list[str], cwd: Path, script: str = "") -> tuple[int, str, str, int]:
    """Run ``patterns ARGS`` in a fresh interpreter; return (status, stdout, stderr, peak RSS bytes).

    The child gets an 8 GB address-space ceiling, so a runaway allocation fails
    instead of swapping the machine. The peak is the child's own ``VmHWM`` at exit
    (written to a file outside ``cwd``): ``wait4``'s ``ru_maxrss`` would start from the
    test process's resident size at the fork, which Linux carries across ``exec``.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = 8 * 2**30 if hard == resource.RLIM_INFINITY else min(hard, 8 * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    peak_file = cwd.parent / f"{cwd.name}.peak"
    code = (f"{script}\nimport atexit\n"
            f"def _peak():\n"
            f"    hwm = [x for x in open('/proc/self/status') if x.startswith('VmHWM')]\n"
            f"    open({str(peak_file)!r}, 'w').write(hwm[0].split()[1])\n"
            f"atexit.register(_peak)\n"
            f"from sparse_patterns.cli import main\nmain()\n")
    with open(cwd / "stdout", "w+b") as so, open(cwd / "stderr", "w+b") as se:
        p = subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, stdout=so, stderr=se,
                             preexec_fn=limit)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        peak = int(peak_file.read_text()) * 1024 if peak_file.exists() else usage.ru_maxrss * 1024
        return p.returncode, so.read().decode(), se.read().decode(), peak


@pytest.mark.parametrize("args", [
    ["show", "strided", "--n", "2147483647"],
    ["show", "full", "--n", "200000"],
    ["show", "bigbird", "--n", "65536", "--block", "1", "--random-blocks", "65536"],
    ["show", "bigbird", "--n", "1024", "--block", "1000000000"],
    ["show", "strided", "--n", "64", "--stride", "1" + "0" * 30],
    ["export", "strided", "--n", "2147483647", "-o", "x.npz"],
])
def test_huge_sizes_have_bounded_peak_memory(tmp_path, args):
    status, out, err, peak = _run_cli(args, tmp_path)
    assert status in (0, 2), err[-2000:]
    assert "Traceback" not in out + err
    if status == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert peak < 600 * 2**20, f"{args}: peak RSS {peak / 2**20:.0f} MB"
    assert not (tmp_path / "x.npz").exists() and _no_temp_files(tmp_path) == []


def test_ctrl_c_while_the_command_starts_exits_130(tmp_path):
    # the console script is named `patterns`; SIGINT arrives while cli.py imports rich
    script = tmp_path / "patterns"
    script.write_text(textwrap.dedent("""
        import builtins, os, signal, sys
        real = builtins.__import__
        def interrupting(name, *args, **kwargs):
            if name == "rich.console":
                builtins.__import__ = real
                os.kill(os.getpid(), signal.SIGINT)
            return real(name, *args, **kwargs)
        builtins.__import__ = interrupting
        from sparse_patterns.cli import main
        sys.exit(main())
    """))
    res = subprocess.run([sys.executable, str(script), "list"], capture_output=True, text=True,
                         preexec_fn=_default_signals)
    assert (res.returncode, res.stdout, res.stderr) == (130, "", "")


# ---------------------------------------------------------------- signals during a write

SLOW_WRITE = """
import os, signal, sys, time
from sparse_patterns.util.files import atomic_write
def slow(f):
    f.write(b"partial")
    f.flush()
    sys.stderr.write("ready\\n")
    sys.stderr.flush()
    time.sleep(60)
atomic_write(sys.argv[1], slow)
"""

SLOW_RENDER = """
import sys, time
import matplotlib
from matplotlib.figure import Figure
def slow(self, fh, **kwargs):
    fh.write(b"partial")
    fh.flush()
    sys.stderr.write("ready\\n")
    sys.stderr.flush()
    time.sleep(60)
Figure.savefig = slow
from sparse_patterns.cli import main
main()
"""


def _default_signals() -> None:
    """In the child: SIGINT, SIGTERM and SIGHUP back to their defaults. A test run started
    by `nohup` or as a background job inherits them ignored (and so would its children),
    which is the user's choice for a real command, not what these tests send signals to."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _kill_while_writing(code: str, args: list[str], sig: int) -> tuple[int, str]:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    try:
        assert p.stderr.readline() == "ready\n"
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    return p.returncode, err


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_during_a_write_removes_the_temp_file(tmp_path, sig, status):
    target = tmp_path / "pattern.npz"
    target.write_bytes(b"precious")
    code, err = _kill_while_writing(SLOW_WRITE, [str(target)], sig)
    assert (code, err) == (status, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pattern.npz"]
    assert target.read_bytes() == b"precious"


def test_sigterm_during_render_exits_143_and_leaves_nothing(tmp_path):
    target = tmp_path / "fig.png"
    code, err = _kill_while_writing(
        SLOW_RENDER, ["render", "strided", "--n", "16", "--stride", "4", "-o", str(target)],
        signal.SIGTERM)
    assert (code, err) == (143, "")
    assert list(tmp_path.iterdir()) == []


def test_write_handlers_are_restored_and_others_left_alone(tmp_path):
    seen = []
    atomic_write = _atomic.atomic_write
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        atomic_write(tmp_path / "a", lambda f: seen.append(signal.getsignal(signal.SIGTERM)))
        assert seen[-1] is _atomic._exit and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        def mine(signum, frame):
            pass

        signal.signal(signal.SIGTERM, mine)  # someone else's handler: not replaced
        atomic_write(tmp_path / "b", lambda f: seen.append(signal.getsignal(signal.SIGTERM)))
        assert seen[-1] is mine and signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # in another thread nothing is installed (and nothing fails)
        t = threading.Thread(target=atomic_write, args=(
            tmp_path / "c", lambda f: seen.append(signal.getsignal(signal.SIGTERM))))
        t.start()
        t.join()
        assert seen[-1] is signal.SIG_DFL and (tmp_path / "c").exists()
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------- file modes

@pytest.mark.parametrize(("umask", "existing", "expected"), [
    (0o027, None, 0o640),  # a new file: 0o666 & ~umask
    (0o077, None, 0o600),
    (0o022, 0o640, 0o640),  # an overwritten file keeps its mode, not the umask's 0o644
    (0o022, 0o600, 0o600),
    (0o077, 0o664, 0o664),
])
def test_written_files_get_the_umask_or_keep_their_mode(tmp_path, umask, existing, expected):
    target = tmp_path / "p.json"
    if existing is not None:
        target.write_text("{}")
        os.chmod(target, existing)
    old = os.umask(umask)
    try:
        assert _atomic.file_mode() == 0o666 & ~umask
        res = runner.invoke(app, ["export", "strided", "--n", "16", "--stride", "4", "-o", str(target)])
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    assert json.loads(target.read_text())["pattern"] == "strided"
    assert stat.S_IMODE(os.stat(target).st_mode) == expected
