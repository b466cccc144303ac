"""Shared pytest settings: hypothesis profiles sized for a 2-core CI machine, the numba
kernels compiled once before pytest-xdist's workers start, and tests marked ``alone`` run
while no other test does under those workers."""

import fcntl
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: runs while no other test of the run does (under pytest-xdist: "
        "dask's scheduling order, which the search tests assert, shifts when another "
        "worker takes the cores)")


#: What the warm-up runs, one process per dtype: the CPU kernel's forward and backward and
#: the exact verification on small patterns, in the modes and tile sizes the tests use most.
_WARM_UP = """
import numpy as np, sparse_patterns as sps
from sparse_patterns.kernels import attention, attention_backward
dtype = np.{dtype}
x = np.random.default_rng(0).standard_normal((1, 2, 128, 32)).astype(dtype)
for name, params in (("strided", {{"stride": 8}}), ("fixed", {{"stride": 16, "c": 2}}),
                     ("local", {{"window": 8}})):
    pat = sps.make(name, 128, **params)
    if dtype is np.float64:
        sps.verify(pat)
    for mode in ("merged", "multihead"):
        for block in (32, 16):
            o, lse = attention(x, x, x, pat, mode=mode, block=block, return_lse=True)
            attention_backward(x, x, x, o, lse, x, pat, mode=mode, block=block)
"""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, compile the kernels the tests share once, in two processes at
    a time, before the workers start: numba caches them on disk, and each worker would
    otherwise compile the same functions at the same moment (its first kernel test).
    The outcome is not checked here: a kernel that fails to compile fails its tests."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    procs = [subprocess.Popen([sys.executable, "-c", _WARM_UP.format(dtype=dtype)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for dtype in ("float32", "float64")]
    for proc in procs:
        proc.wait()


@pytest.fixture(autouse=True)
def _alone_or_together(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory):
    """Under pytest-xdist, every test holds a shared lock of the run while it runs, and a
    test marked ``alone`` an exclusive one; a gate lock, taken first, makes a waiting
    ``alone`` test go before the other worker's next tests. The locks are files in the
    run's temporary directory, which the workers' directories share."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: nothing runs beside a test
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    base = tmp_path_factory.getbasetemp().parent / "tests-alone"
    with open(f"{base}.gate", "a") as gate, open(f"{base}.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
