"""Probes of the machine the profiler runs on: peak memory of one call (from
``/proc`` and libc, or ``getrusage``), the fp32 matmul rate that sets the
throughput reference, and the cores, CPU capability, versions and load average
reported beside every profile."""

from __future__ import annotations

import ctypes
import datetime as _dt
import gc
import os
import platform
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["measure", "available_bytes", "matmul_gflops", "fma_peak_gflops", "machine_info",
           "load_average"]

#: Modules whose recycled arrays are freed (``release_workspace``) before memory is measured.
_RECYCLING_MODULES = ("sparse_patterns.kernels.cpu", "sparse_patterns.kernels.flex")

_LIBC: Any = None


# ====================================================================== memory
def _malloc_trim() -> None:
    """Give freed heap pages back to the OS, so that reusing them shows in the RSS."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None)
        _LIBC.malloc_trim(0)
    except (OSError, AttributeError):
        _LIBC = False


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def available_bytes() -> int | None:
    """Memory this process can still take: ``MemAvailable`` of ``/proc/meminfo``, less
    where an address-space limit (``ulimit -v``) leaves less room; None where unknown.

    Examples
    --------
    >>> avail = available_bytes()
    >>> avail is None or avail >= 0
    True
    """
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    used = _status_kb("VmSize")
    if soft != resource.RLIM_INFINITY and used is not None:
        room = max(0, soft - used)
        avail = room if avail is None else min(avail, room)
    return avail


def _reset_hwm() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kb("VmHWM") is not None
    except OSError:
        return False


def _maxrss() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if platform.system() == "Darwin" else int(r) * 1024


def measure(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """Run ``fn`` once: ``(result, seconds, peak bytes above the memory held before)``.

    The peak is the larger of the resident set's high-water mark (Linux
    ``VmHWM``, reset through ``/proc/self/clear_refs`` after ``malloc_trim``;
    ``getrusage`` elsewhere) and the peak of ``tracemalloc``. The CPU kernel's
    recycled arrays are freed first, so that its output counts as new memory,
    as every other runner's does (and so are the FlexAttention path's intermediates).

    Examples
    --------
    >>> out, seconds, peak = measure(lambda: bytearray(1 << 20))
    >>> len(out), seconds >= 0, peak >= 0
    (1048576, True, True)
    """
    for name in _RECYCLING_MODULES:
        mod = sys.modules.get(name)
        if mod is not None:
            mod.release_workspace()
    gc.collect()
    _malloc_trim()
    exact = _reset_hwm()
    before = _status_kb("VmRSS") if exact else _maxrss()
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    after = _status_kb("VmHWM") if exact else _maxrss()
    rss = max(0, (after or 0) - (before or 0))
    return out, dt, max(rss, int(traced))


# ====================================================================== throughput and machine
def matmul_gflops(torch: Any, n: int) -> tuple[float, str]:
    """``(GFLOP/s, what was timed)`` of an ``n x n`` fp32 matmul: the median of 5 calls.

    ``torch.matmul`` when ``torch`` is given, numpy's ``@`` when it is None.

    Examples
    --------
    >>> rate, source = matmul_gflops(None, 64)
    >>> rate > 0, source
    (True, 'numpy matmul fp32 64x64 (torch missing)')
    """
    if torch is not None:
        a = torch.randn(n, n, dtype=torch.float32)
        b = torch.randn(n, n, dtype=torch.float32)
        fn, src = (lambda: torch.matmul(a, b)), f"torch.matmul fp32 {n}x{n}"
    else:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        fn, src = (lambda: a @ b), f"numpy matmul fp32 {n}x{n} (torch missing)"
    fn()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 2.0 * n**3 / float(np.median(ts)) / 1e9, src


def fma_peak_gflops(dtype: str) -> tuple[float | None, str]:
    """``(GFLOP/s, what was measured)``: the host's FMA peak for inputs of ``dtype``.

    :func:`sparse_patterns.kernels.cpu.fma_peak` on numba's threads: for bfloat16 its
    ``"bfloat16-amx"`` figure where this process runs the forward's bf16 products by
    AMX (:func:`~sparse_patterns.kernels.cpu.amx_products_here`), else its ``"bfloat16"``
    one where it runs them by ``vdpbf16ps``
    (:func:`~sparse_patterns.kernels.cpu.bf16_products_here`; both at 32-token tiles,
    ``n`` and ``d`` multiples of 32), ``"float32"`` for float32, float16 and bfloat16
    widened to float32 (an Intel Xeon's without AMX, whose ``vdpbf16ps`` is slower), and
    half the float32 figure for float64 (half the lanes of a vector FMA).

    Examples
    --------
    >>> rate, what = fma_peak_gflops("float64")
    >>> rate > 0, what.startswith("FMA peak float64")
    (True, True)
    """
    import numba  # noqa: PLC0415

    from ..kernels.cpu import amx_products_here, bf16_products_here, fma_peak  # noqa: PLC0415

    kind = "float32"
    if dtype == "bfloat16" and amx_products_here():
        kind = "bfloat16-amx"
    elif dtype == "bfloat16" and bf16_products_here():
        kind = "bfloat16"
    rate = fma_peak(kind) / 1e9
    where = f"register-only FMA loop on {numba.get_num_threads()} threads"
    if dtype == "float64":
        return rate / 2, f"FMA peak float64: half the float32 peak {rate:.0f} GFLOP/s ({where})"
    if dtype == "bfloat16" and kind == "float32":
        return rate, f"FMA peak float32: bfloat16 widened to float32 here ({where})"
    return rate, f"FMA peak {kind} ({where})"


def machine_info(torch: Any) -> dict[str, Any]:
    """Cores, CPU model and capability, thread counts, versions, date and load average.

    Examples
    --------
    >>> m = machine_info(None)
    >>> m["cores"] >= 1, m["cpu_capability"] is None, "load_before" in m
    (True, True, True)
    """
    import numba  # noqa: PLC0415

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {
        "cores": cores, "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if torch is not None else None,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "numba_threads": numba.get_num_threads(),
        "torch": torch.__version__ if torch is not None else None,
        "numba": numba.__version__, "numpy": np.__version__,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_before": load_average(),
    }


def load_average() -> str | None:
    """The 1, 5 and 15 minute load averages as one string (None where unavailable)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return None
