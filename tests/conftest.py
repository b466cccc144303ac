"""Shared pytest settings: hypothesis profiles sized for a 2-core CI machine, and tests
marked ``alone`` run while no other test does under pytest-xdist's workers."""

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
