"""The one input check of :func:`~sparse_patterns.kernels.attention` and its backward.

Every implementation is reached through the same checks, each made once per
call: :func:`resolve` turns ``pattern``, ``mode`` and ``block`` into the
(cached) :class:`ExecutionPlan` (``mode`` is checked here, not again by the
planner), :func:`check_scale` gives the score scale, and one of two array
checks validates ``q, k, v`` (and ``o, lse, do``) for where the implementation
runs: :class:`HostArrays` (NumPy arrays or CPU torch tensors, converted to
C-contiguous NumPy arrays in the compute dtype, for ``"numba"`` and
``"reference"``) or :class:`DeviceArrays` (torch CUDA tensors or numba device
arrays on one device, checked but left where they are, for ``"cuda"``). The
backends then take validated arrays and a plan and make no decisions.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from ..pattern import Pattern
from ..util.checks import check_int
from .cpu import HALF_KINDS, narrow, pooled_array, widen
from .planning import ExecutionPlan, cached_plan, check_mode

__all__ = ["MAX_BLOCK", "resolve", "check_scale", "HostArrays", "DeviceArrays"]

#: Largest tile size a plan may have (an implementation may allow less).
MAX_BLOCK = 4096

_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


# ----------------------------------------------------------------------- pattern, mode, block
def resolve(pattern: Any, mode: Any, block: Any, *, max_block: int = MAX_BLOCK,
            needs_pattern: str | None = None) -> tuple[Pattern | None, ExecutionPlan]:
    """The pattern (None when a plan was given) and its (cached) plan.

    ``block`` must be in ``[1, max_block]``; a given plan must have ``mode``.
    ``needs_pattern`` names an implementation that cannot run from a plan alone.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pat, pl = resolve(sps.make("full", 8), "merged", 4)
    >>> pl.mode, pl.block, resolve(pl, "merged", 4)[0] is None
    ('merged', 4, True)
    """
    mode = check_mode(mode)
    block = check_int("block", block, 1, max_block)
    if isinstance(pattern, ExecutionPlan):
        if mode != pattern.mode:
            raise ValueError(f"mode: {mode!r} disagrees with the given plan's mode {pattern.mode!r}")
        if needs_pattern is not None:
            raise ValueError(
                f"pattern: impl={needs_pattern!r} needs the Pattern, not an ExecutionPlan"
            )
        return None, pattern
    if not isinstance(pattern, Pattern):
        raise ValueError(
            f"pattern: expected a Pattern or an ExecutionPlan, got {type(pattern).__name__}"
        )
    return pattern, cached_plan(pattern, block, mode)


def check_scale(scale: Any, d: int, compute: str = "float64") -> float:
    """``scale`` as a float, ``1 / sqrt(d)`` when None; ``ValueError`` unless finite and
    finite in the ``compute`` dtype (``"float32"`` for float32 and half inputs).

    Examples
    --------
    >>> check_scale(None, 16), check_scale(2, 16)
    (0.25, 2.0)
    >>> check_scale(1e39, 16, "float32")
    Traceback (most recent call last):
    ...
    ValueError: scale: 1e+39 overflows float32, the compute dtype of these inputs; use |scale| <= 3.4e+38
    """
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise ValueError(f"scale: must be a finite number or None, got {scale!r}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale: must be a finite number or None, got {scale!r}")
    top = float(np.finfo(np.float64 if compute == "float64" else np.float32).max)
    if abs(float(scale)) > top:
        raise ValueError(f"scale: {float(scale):.3g} overflows {compute}, the compute dtype of "
                         f"these inputs; use |scale| <= {top:.2g}")
    return float(scale)


def _dtype_name(a: Any) -> str:
    return str(a.dtype).removeprefix("torch.")


# ----------------------------------------------------------------------- host arrays
def check_shapes(arrays: dict[str, Any]) -> tuple[int, int, int, int]:
    """q's shape ``(B, H, n, d)``; every other array shaped like it (``lse`` like ``(B, H, n)``)."""
    shape = tuple(arrays["q"].shape)
    if len(shape) != 4:
        raise ValueError(f"q: must be shaped (B, H, n, d), got shape {shape}")
    for name, a in arrays.items():
        want = shape[:3] if name == "lse" else shape
        if tuple(a.shape) != want:
            raise ValueError(
                f"{name}: shape {tuple(a.shape)} disagrees with q's {shape} (want {want})"
            )
    return shape  # type: ignore[return-value]


class HostArrays:
    """Validated CPU inputs as C-contiguous NumPy arrays in the compute dtype.

    ``arrays`` maps ``q, k, v`` (and ``o, lse, do`` for a backward) to NumPy
    arrays or CPU torch tensors of one kind and one float dtype, shaped
    ``(B, H, n, d)`` (``lse``: ``(B, H, n)``) with ``n`` the plan's. float16 and
    bfloat16 are computed in float32 (``widen_half=False``: their words are kept, in
    ``words`` and ``np``, until :meth:`widen`).

    Examples
    --------
    >>> import numpy as np
    >>> x = HostArrays({"q": np.ones((1, 1, 4, 2), np.float16)}, 4)
    >>> x.np["q"].dtype, x.shape, x.out(x.np["q"]).dtype
    (dtype('float32'), (1, 1, 4, 2), dtype('float16'))
    """

    def __init__(self, arrays: dict[str, Any], n: int | None, *, widen_half: bool = True):
        self.torch = None
        kinds = {name: _host_kind(a) for name, a in arrays.items()}
        if len(set(kinds.values())) > 1:
            desc = ", ".join(f"{k} is a {v}" for k, v in kinds.items())
            raise ValueError(f"q, k, v: mix NumPy arrays and torch tensors ({desc})")
        q = arrays["q"]
        shape = check_shapes(arrays)
        nn = shape[2]
        if min(shape) < 1:
            raise ValueError(f"q: every dimension of (B, H, n, d) must be >= 1, got {shape}")
        if n is not None and nn != n:
            raise ValueError(f"q: sequence length n={nn} disagrees with the pattern's n={n}")
        self.dtype_name = _dtype_name(q)
        if self.dtype_name not in _FLOAT_NAMES:
            raise ValueError(
                f"q: dtype {self.dtype_name} is not supported; use one of {', '.join(_FLOAT_NAMES)}"
            )
        for name, a in arrays.items():
            if name != "lse" and _dtype_name(a) != self.dtype_name:
                raise ValueError(
                    f"{name}: dtype {_dtype_name(a)} disagrees with q's {self.dtype_name}"
                )
        self.compute = np.float64 if self.dtype_name == "float64" else np.float32
        if kinds["q"] == "torch tensor":
            import torch

            self.torch = torch
            for name, a in arrays.items():
                if a.device.type != "cpu":
                    raise ValueError(
                        f"{name}: tensor is on {a.device}; this implementation runs on the CPU"
                    )
            self.torch_dtype = q.dtype
            cdt = torch.float64 if self.compute is np.float64 else torch.float32
            self.np = {name: (a.detach().contiguous().view(torch.int16).numpy()
                              if self.dtype_name in HALF_KINDS and name != "lse"
                              else np.ascontiguousarray(a.detach().to(cdt).numpy()))
                       for name, a in arrays.items()}
        else:
            self.np = {
                name: (np.ascontiguousarray(a) if self.dtype_name in HALF_KINDS and name != "lse"
                       else np.ascontiguousarray(np.asarray(a), dtype=self.compute))
                for name, a in arrays.items()
            }
        self.shape = shape
        # a half dtype's 16-bit words (int16 or float16 arrays), ``self.np`` until widened
        self.words = None
        self._widened = self.dtype_name not in HALF_KINDS
        if not self._widened:
            self.words = {name: a for name, a in self.np.items() if name != "lse"}
            if widen_half:
                self.widen()

    def widen(self) -> dict[str, np.ndarray]:
        """``self.np``, a half dtype's words widened to float32 first (one vector pass,
        :func:`widen`) where ``widen_half=False`` left them as they came."""
        if not self._widened:
            self.np = {name: widen(self.words[name], self.dtype_name) if name in self.words
                       else a for name, a in self.np.items()}
            self._widened = True
        return self.np

    def out(self, a: np.ndarray, *, lse: bool = False) -> Any:
        """Back to the caller's kind; outputs in the input dtype, ``lse`` in the compute dtype."""
        half = not lse and self.dtype_name in HALF_KINDS
        if half:
            # narrowed into a recycled array: a new 16 MiB tensor's first touch cost 2-35 ms
            # of page faults (bf16 strided forward, n = 16,384: 51-85 ms -> see the commit)
            return self.out_words(narrow(a, self.dtype_name, out=pooled_array(a.shape, np.uint16)))
        if self.torch is None:
            return a if lse else a.astype(self.dtype_name, copy=False)
        t = self.torch.from_numpy(a)
        return t if lse else t.to(self.torch_dtype)

    def out_words(self, words: np.ndarray) -> Any:
        """16-bit words of the input dtype (``uint16``) as the caller's kind, not copied."""
        if self.torch is None:
            return words.view(np.float16)
        return self.torch.from_numpy(words.view(np.int16)).view(self.torch_dtype)


def _host_kind(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return "NumPy array"
    if type(a).__module__.startswith("torch") and hasattr(a, "detach"):
        return "torch tensor"
    raise ValueError(
        f"q, k, v: expected NumPy arrays or torch tensors, got {type(a).__module__}.{type(a).__name__}"
    )


# ----------------------------------------------------------------------- device arrays
class DeviceArrays:
    """Validated GPU inputs: all torch CUDA tensors or all numba device arrays, on one device.

    The arrays stay where they are (``self.arrays``); the backend reads them in
    place. Shapes, dtypes and ``n`` are checked against ``q`` and the plan, and
    the plan's ``block`` and the head dimension against the backend's limits.
    ``kind`` is ``"torch"`` or ``"numba"``; ``fp64`` whether the compute dtype
    is float64 (float16 and bfloat16 tensors are computed in float32).

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> try:
    ...     DeviceArrays({"q": np.ones((1, 1, 8, 2))}, sps.plan(sps.make("full", 8)),
    ...                  max_block=1024, max_d=1024)
    ... except ValueError as e:
    ...     print(str(e)[:36])
    q: impl='cuda' needs GPU arrays (tor
    """

    def __init__(self, arrays: dict[str, Any], plan: ExecutionPlan, *,
                 max_block: int, max_d: int):
        kinds = {name: _kind(name, a) for name, a in arrays.items()}
        if len(set(kinds.values())) > 1:
            desc = ", ".join(f"{k}: {v}" for k, v in kinds.items())
            raise ValueError(
                f"q, k, v: pass all torch CUDA tensors or all numba device arrays, got {desc}"
            )
        self.kind = kinds["q"]
        if self.kind == "torch":
            devs = {str(a.device) for a in arrays.values()}
            if len(devs) > 1:
                desc = ", ".join(f"{k} on {a.device}" for k, a in arrays.items())
                raise ValueError(f"q, k, v: tensors on different devices ({desc})")
        q = arrays["q"]
        shape = check_shapes(arrays)
        for name, a in arrays.items():
            if name in ("k", "v", "o", "do") and a.dtype != q.dtype:
                raise ValueError(f"{name}: dtype {a.dtype} disagrees with q's {q.dtype}")
        n, d = shape[2], shape[3]
        if n != plan.n:
            raise ValueError(f"q: sequence length {n} disagrees with the plan's n = {plan.n}")
        if plan.block > max_block:
            raise ValueError(
                f"block: must be an integer [1, {max_block}] for impl='cuda', got {plan.block}"
            )
        if not 1 <= d <= max_d:
            raise ValueError(
                f"q: head dimension d must be in [1, {max_d}] for impl='cuda', got {d}"
            )
        self.arrays = arrays
        self.shape = shape
        self.dtype = q.dtype
        self.fp64 = _dtype_name(q) == "float64"


def _kind(name: str, a: Any) -> str:
    """``"torch"`` (CUDA tensor), ``"numba"`` (device array), else ``ValueError`` saying why."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        if not a.is_cuda:
            raise ValueError(
                f"{name}: impl='cuda' needs tensors on a CUDA device, got a tensor on {a.device} "
                "(move it with .cuda(), or use impl='numba' on the CPU)"
            )
        if a.dtype not in _torch_dtypes():
            raise ValueError(
                f"{name}: dtype {a.dtype} is not supported by impl='cuda' "
                "(float16, bfloat16, float32, float64)"
            )
        return "torch"
    if isinstance(a, np.ndarray):
        raise ValueError(
            f"{name}: impl='cuda' needs GPU arrays (torch CUDA tensors or numba device arrays), "
            "got a NumPy array on the CPU (move it with numba.cuda.to_device, or use impl='numba')"
        )
    if getattr(a, "__cuda_ndarray__", False):  # a numba device array (or the simulator's)
        if a.dtype not in (np.float32, np.float64):
            raise ValueError(
                f"{name}: dtype {a.dtype} is not supported for numba device arrays by "
                "impl='cuda' (float32, float64; torch tensors may also be float16 or bfloat16)"
            )
        return "numba"
    raise ValueError(
        f"{name}: impl='cuda' needs a torch CUDA tensor or a numba device array, "
        f"got {type(a).__name__}"
    )


@lru_cache(maxsize=1)
def _torch_dtypes() -> tuple[Any, ...]:
    import torch

    return (torch.float16, torch.bfloat16, torch.float32, torch.float64)
