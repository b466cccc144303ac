"""Where the profiler's inputs live and how a runner is timed there.

* :class:`Host`: NumPy arrays or CPU tensors; ``time.perf_counter`` and the
  resident-set peak (:func:`._machine.measure`).
* :class:`Cuda`: torch tensors created on the GPU once per cell; CUDA events
  recorded around the call on torch's current stream (after a synchronize), and
  ``torch.cuda.max_memory_allocated`` above what was allocated before.
* :class:`NumbaDevice`: numba-cuda device arrays, for ``impl="cuda"`` when the
  profile runs on the host (numba's CUDA simulator, or a GPU torch cannot see):
  ``perf_counter`` around the call and ``numba.cuda.synchronize``.

A runner is timed where its inputs are: on a CUDA profile the CPU
implementations (``numba``, ``reference``) still get host arrays and the host clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._machine import matmul_gflops, measure

__all__ = ["DEVICES", "Host", "Cuda", "NumbaDevice", "device_for", "to_numpy"]

#: Where :func:`~sparse_patterns.profiling.profile` can put its inputs.
DEVICES = ("cpu", "cuda")


class Host:
    """The host: arrays as given, the wall clock, the resident-set peak."""

    name = "cpu"

    def put(self, torch: Any, arrays: list[np.ndarray]) -> list[Any]:
        """torch views of ``arrays`` (no copy); None without torch."""
        return [torch.from_numpy(a) for a in arrays] if torch is not None else None

    def clock(self, fn: Callable[[], Any]) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, float, int]:
        return measure(fn)

    def matmul(self, torch: Any, n: int) -> tuple[float, str]:
        return matmul_gflops(torch, n)


class Cuda:
    """A CUDA device through torch: inputs on it, CUDA events, ``max_memory_allocated``."""

    name = "cuda"

    def __init__(self, torch: Any) -> None:
        if torch is None:
            raise ValueError("device: 'cuda' needs torch with CUDA, and torch is not installed")
        if not torch.cuda.is_available():
            raise ValueError(
                f"device: 'cuda' needs a CUDA GPU visible to torch {torch.__version__} "
                "(torch.cuda.is_available() is False); use device 'cpu'"
            )
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())

    def put(self, torch: Any, arrays: list[np.ndarray]) -> list[Any]:
        return [torch.from_numpy(a).to(self.device) for a in arrays]

    def clock(self, fn: Callable[[], Any]) -> float:
        cuda = self.torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cuda.synchronize(self.device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, float, int]:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        cuda.reset_peak_memory_stats(self.device)
        before = cuda.memory_allocated(self.device)
        out: list[Any] = []
        seconds = self.clock(lambda: out.append(fn()))
        return out[0], seconds, max(0, cuda.max_memory_allocated(self.device) - before)

    def matmul(self, torch: Any, n: int) -> tuple[float, str]:
        """fp32 ``torch.matmul`` of ``n x n`` on the device: the median of 5 timed calls."""
        a = torch.randn(n, n, device=self.device)
        b = torch.randn(n, n, device=self.device)
        self.clock(lambda: torch.matmul(a, b))
        ts = sorted(self.clock(lambda: torch.matmul(a, b)) for _ in range(5))
        name = torch.cuda.get_device_name(self.device)
        return 2.0 * n**3 / ts[2] / 1e9, f"torch.matmul fp32 {n}x{n} on {name}"


class NumbaDevice(Host):
    """numba-cuda device arrays (the simulator, or a GPU): host clock after a synchronize."""

    name = "numba-cuda"

    def __init__(self) -> None:
        from numba import cuda  # noqa: PLC0415

        self.cuda = cuda

    def put(self, torch: Any, arrays: list[np.ndarray]) -> list[Any]:
        return [self.cuda.to_device(np.ascontiguousarray(a)) for a in arrays]

    def clock(self, fn: Callable[[], Any]) -> float:
        t = time.perf_counter()
        fn()
        self.cuda.synchronize()
        return time.perf_counter() - t


def device_for(device: str, torch: Any) -> Host | Cuda:
    """The :class:`Host` or the :class:`Cuda` device a profile runs on (``ValueError`` when
    ``"cuda"`` has no GPU).

    Examples
    --------
    >>> device_for("cpu", None).name
    'cpu'
    """
    return Cuda(torch) if device == "cuda" else Host()


def to_numpy(x: Any) -> np.ndarray:
    """A runner's output (NumPy, torch on any device, numba device array) as a NumPy array.

    Examples
    --------
    >>> to_numpy((np.ones(2), None)).tolist()
    [1.0, 1.0]
    """
    if isinstance(x, tuple):
        x = x[0]
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if hasattr(x, "detach"):
        x = x.detach()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        return x.cpu().numpy()
    return np.asarray(x)
