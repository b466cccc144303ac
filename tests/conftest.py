"""Shared pytest settings: hypothesis profiles sized for a 2-core CI machine, tests
marked ``alone`` run while no other test does under pytest-xdist's workers, and the
workers compile the CPU kernels once between them."""

import fcntl
import os

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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under two or more pytest-xdist workers, with the CPU kernel's tests collected: worker
    0 compiles its float32 kernels (forward and backward: two pieces per head, a pair, one
    piece) and worker 1 its float64 ones, before their first test. A kernel is compiled once
    per dtype, a few minutes of a cold run; without this each worker compiles both dtypes
    as its tests first reach them, while with it each loads the other's from numba's cache.
    Worker 1 first compiles the verifiers' kernels (structured, generic, schedule: about
    half a minute), in which time worker 0 compiles the planner's (dtype-free) and worker 1
    then loads them, instead of both compiling them at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2 or worker not in ("gw0", "gw1"):
        return
    if not any(item.nodeid.startswith("tests/kernels/cpu/") for item in session.items):
        return
    import torch

    import sparse_patterns as sps
    from sparse_patterns.torch import sparse_attention
    from sparse_patterns.util.threads import jit_disabled

    if jit_disabled() is not None:
        return
    dtype = torch.float32 if worker == "gw0" else torch.float64
    if worker == "gw1":
        strided = sps.make("strided", 64, stride=8)
        sps.verify(strided)
        sps.verify(strided, method="generic")
        sps.verify(sps.make("fixed", 64, stride=8, c=2))
        sps.verify_schedule([sps.make("local", 64, window=3)] * 2 + [sps.make("full", 64)])
    for name, n, params, mode in (("strided", 1024, {"stride": 32}, "merged"),
                                  ("fixed", 1500, {"stride": 64, "c": 16}, "merged"),
                                  ("strided", 1024, {"stride": 32}, "multihead")):
        q, k, v = (torch.randn(1, 2, n, 32, dtype=dtype, requires_grad=True) for _ in range(3))
        sparse_attention(q, k, v, sps.make(name, n, **params), mode=mode,
                         impl="numba").sum().backward()
