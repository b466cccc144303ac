"""The package in hostile environments (issue 54, item 8): a read-only install run by a
user without a writable home, numba settings that are wrong or cannot be honoured, a
threading layer that is not thread-safe. Each ends in one line on stderr, said once, and
the package running; or, from the command line, in one error line and exit status 2.

Each case runs in a fresh interpreter, since numba reads its settings when imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sparse_patterns

PACKAGE = os.path.dirname(sparse_patterns.__file__)

#: Makes the package directory and HOME read-only as far as this process can tell: the test
#: may run as root, for whom chmod does not stop a write. Both checks numba makes
#: (``_CacheLocator.ensure_cache_path``: make the directory, create a file in it) and the
#: one the package makes (``os.access``) say no there.
READ_ONLY = textwrap.dedent("""
    import os
    _ro = (os.path.realpath({package!r}), os.path.realpath(os.path.expanduser("~")))
    def _under(path):
        path = os.path.realpath(path)
        return any(path == r or path.startswith(r + os.sep) for r in _ro)
    _access = os.access
    os.access = lambda path, mode, **kw: (not (mode & os.W_OK and _under(path))
                                          and _access(path, mode, **kw))
    import numba.core.caching as _caching
    _ensure = _caching._CacheLocator.ensure_cache_path
    def _ensure_ro(self):
        if _under(self.get_cache_path()):
            raise PermissionError(13, "Read-only file system", self.get_cache_path())
        return _ensure(self)
    _caching._CacheLocator.ensure_cache_path = _ensure_ro
""")


def _python(code: str, env: dict[str, str | None], cwd: Path, timeout: float = 120):
    full = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=timeout)


def test_read_only_install_caches_in_a_private_directory(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    code = READ_ONLY.format(package=PACKAGE) + textwrap.dedent("""
        import os, numpy as np
        import sparse_patterns as sps
        import sparse_patterns.kernels  # decorates its kernels: each needs a cache locator
        from sparse_patterns.util.stream import _kernel
        sel = np.array([[False, True, True], [True, False, False]])
        counts, order = np.zeros(2, np.int64), np.zeros((2, 3), np.int64)
        _kernel()(sel, counts, order)  # a small @njit(cache=True) function, compiled and cached
        assert counts.tolist() == [2, 1] and order.tolist() == [[1, 2, 0], [0, 1, 2]]
        print(os.environ["NUMBA_CACHE_DIR"])
    """)
    env = {"HOME": str(home), "XDG_CACHE_HOME": None, "TMPDIR": str(tmp_path)}
    res = _python(code, env, tmp_path)
    assert res.returncode == 0, res.stderr
    private = str(tmp_path / f"sparse-patterns-numba-{os.getuid()}")
    assert res.stdout.strip() == private
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparse_patterns: the package directory and ")
    assert lines[0].endswith(f"numba caches compiled code in {private!r} (set NUMBA_CACHE_DIR "
                             "to choose)")
    assert any(Path(private).rglob("*.nbi"))  # numba cached there


def test_bad_thread_count_falls_back_once(tmp_path):
    code = ("import os, multiprocessing, sparse_patterns, numba\n"
            "print(numba.get_num_threads() == multiprocessing.cpu_count())")  # launches threads
    res = _python(code, {"NUMBA_NUM_THREADS": "-1"}, tmp_path)
    assert (res.returncode, res.stdout.strip()) == (0, "True"), res.stderr
    cpus = os.cpu_count()
    assert res.stderr == (f"sparse_patterns: NUMBA_NUM_THREADS='-1' is not an integer >= 1; "
                          f"numba uses its default, {cpus} threads\n")


def test_tbb_asked_where_it_cannot_load_falls_back_once(tmp_path):
    # no tbb wheel and no system libtbb, as far as this process can tell
    code = textwrap.dedent("""
        import ctypes, importlib.metadata as md
        _files, _cdll = md.files, ctypes.CDLL
        def files(name):
            if name == "tbb":
                raise md.PackageNotFoundError(name)
            return _files(name)
        class CDLL(_cdll):
            def __init__(self, name, *args, **kwargs):
                if name and "libtbb" in str(name):
                    raise OSError(f"{name}: cannot open shared object file")
                super().__init__(name, *args, **kwargs)
        md.files, ctypes.CDLL = files, CDLL
        import sparse_patterns, numba

        numba.get_num_threads()  # launches numba's threads on its layer (it raised here)
        print(numba.threading_layer() in ("omp", "workqueue"))
    """)
    res = _python(code, {"NUMBA_THREADING_LAYER": "tbb"}, tmp_path)
    assert (res.returncode, res.stdout.strip()) == (0, "True"), res.stderr
    assert res.stderr == ("sparse_patterns: NUMBA_THREADING_LAYER=tbb: TBB cannot be loaded "
                          "here (pip install tbb); numba uses its default layer\n")


def test_disable_jit_is_said_at_import_and_the_numba_kernels_refuse(tmp_path):
    code = textwrap.dedent("""
        import numpy as np, pytest
        import sparse_patterns as sps
        from typer.testing import CliRunner
        from sparse_patterns.cli import app
        x = np.zeros((1, 1, 16, 4), np.float32)
        for impl in ("auto", "numba"):
            with pytest.raises(ValueError) as info:
                sps.attention(x, x, x, sps.make("strided", 16, stride=4), impl=impl)
            print(info.value)
        with pytest.raises(ValueError) as info:
            sps.verify_schedule([sps.make("local", 16, window=2)] * 2)
        print(info.value)
        res = CliRunner().invoke(app, ["verify", "--schedule", "local:window=2,full", "--n", "16"])
        print(res.exit_code, res.stderr.strip())
    """)
    res = _python(code, {"NUMBA_DISABLE_JIT": "1"}, tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ("sparse_patterns: NUMBA_DISABLE_JIT=1: numba's JIT is off; the "
                          "package's numba kernels (attention with impl='numba', the exact "
                          "verification) refuse to run uncompiled (unset NUMBA_DISABLE_JIT)\n")
    auto, numba, verify, cli = res.stdout.strip().splitlines()
    assert auto == "NUMBA_DISABLE_JIT=1: impl='numba' needs numba's JIT (unset NUMBA_DISABLE_JIT)"
    assert numba == ("NUMBA_DISABLE_JIT=1: impl='numba' runs numba-compiled kernels, which do not "
                     "run uncompiled; unset NUMBA_DISABLE_JIT")
    assert verify.startswith("NUMBA_DISABLE_JIT=1: the exact verification runs numba-compiled")
    assert cli == f"2 error: {verify}"


@pytest.mark.parametrize("numba_first", [False, True])
def test_full_disk_under_numba_cache_runs_uncached_and_says_so_once(tmp_path, numba_first):
    cache = tmp_path / "cache"
    code = textwrap.dedent(f"""
        import errno
        if {numba_first}:
            import numba.core.caching
        import numpy as np
        import sparse_patterns as sps
        import numba.core.caching as caching
        def full(self, path):  # numba's cache writer, on a full disk
            raise OSError(errno.ENOSPC, "No space left on device", path)
        caching.IndexDataCacheFile._open_for_write = full
        from sparse_patterns.util.stream import _kernel
        sel = np.array([[False, True, True], [True, False, False]])
        counts, order = np.zeros(2, np.int64), np.zeros((2, 3), np.int64)
        _kernel()(sel, counts, order)  # compiled, then the cache write fails
        assert counts.tolist() == [2, 1] and order.tolist() == [[1, 2, 0], [0, 1, 2]]
        from sparse_patterns.analysis._numba import long_index  # another one: no second line
        ptr, run = np.array([0, 2], np.int64), np.array([0, 100], np.int64)
        print(long_index(ptr, run, np.array([3, 70], np.int64), 1)[0].tolist())
    """)
    res = _python(code, {"NUMBA_CACHE_DIR": str(cache)}, tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[0, 1]"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"sparse_patterns: numba's cache directory '{cache}")
    assert lines[0].endswith("cannot be written (No space left on device): compiled code is not "
                             "cached in this process (free space there, or set NUMBA_CACHE_DIR "
                             "to another directory)")
    assert not any(cache.rglob("*.nbc"))


def test_full_tmpdir_fails_the_flex_compile_with_one_line_naming_it(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    import errno

    import numpy as np

    from sparse_patterns.kernels import flex

    def compile_(fn, **kwargs):
        def run(*args, **kw):  # inductor writing its code: dynamo wraps the OSError
            try:
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.py"))
            except OSError as exc:
                raise RuntimeError("backend='inductor' raised: OSError") from exc
        return run

    monkeypatch.setattr(flex, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    x = np.zeros((1, 1, 64, 8), np.float32)
    with pytest.raises(OSError) as info:
        sparse_patterns.attention(x, x, x, sparse_patterns.make("strided", 64, stride=8),
                                  impl="flex")
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and "\n" not in msg
    assert msg == (f"[Errno 28] TMPDIR: torch.compile (inductor) cannot write its files under "
                   f"'{tmp_path / 'x.py'}' (No space left on device); free space there or set "
                   f"TMPDIR (or TORCHINDUCTOR_CACHE_DIR) to a writable directory with room "
                   f"(TMPDIR='{tmp_path}')")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda *a, **k: 1 / 0)
    monkeypatch.setattr(flex, "_COMPILED", {})
    with pytest.raises(ZeroDivisionError):  # anything else is not about room
        sparse_patterns.attention(x, x, x, sparse_patterns.make("strided", 64, stride=8),
                                  impl="flex")
