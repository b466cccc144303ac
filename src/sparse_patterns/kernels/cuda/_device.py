"""Arrays on the GPU for ``impl="cuda"``: the inputs read in place, outputs, and the plan.

:class:`Launch` takes inputs already checked by
:class:`sparse_patterns.kernels.inputs.DeviceArrays` and gives numba device
arrays in the compute dtype: torch CUDA tensors are read through
``__cuda_array_interface__`` (results come back as torch tensors on the same
device, launched on torch's current stream), numba device arrays are used as
they are. :func:`device_plan` copies a plan's arrays to the device once per
(plan, device) and caches them.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import numpy as np

from ._detect import load

__all__ = ["Launch", "device_plan"]


class Launch:
    """Inputs as numba device arrays in the compute dtype, and how to hand results back."""

    def __init__(self, x: Any):
        c = load()
        self.torch = None
        self.device = None
        self.dtype = x.dtype
        self.shape = x.shape
        self.fp64 = x.fp64
        self.np_dtype = np.dtype(np.float64 if x.fp64 else np.float32)
        first = x.arrays["q"]
        if x.kind == "torch":
            import torch

            self.torch = torch
            self.device = first.device
            cdt = torch.float64 if x.fp64 else torch.float32
            # launch on torch's current stream (0: the legacy default stream, numba's default
            # too), so the inputs are ready without a host synchronization (sync=False)
            ptr = torch.cuda.current_stream(first.device).cuda_stream
            self.stream = c.external_stream(ptr) if ptr else 0
            self.dev = {k: c.as_cuda_array(a.detach().to(cdt).contiguous(), sync=False)
                        for k, a in x.arrays.items()}
            self.device_key = ("torch", first.device.index)
        else:
            self.stream = 0
            self.dev = dict(x.arrays)
            self.device_key = ("numba", _current_device_id(c))

    def empty(self, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """``(result, device array)`` in the compute dtype (a torch tensor and its view for torch)."""
        if self.torch is not None:
            t = self.torch.empty(shape, device=self.device,
                                 dtype=self.torch.float64 if self.fp64 else self.torch.float32)
            return t, load().as_cuda_array(t, sync=False)
        a = load().device_array(shape, dtype=self.np_dtype, stream=self.stream)
        return a, a

    def result(self, t: Any) -> Any:
        """Hand a result back in the inputs' dtype (torch) or as is (numba)."""
        if self.torch is not None and t.dtype != self.dtype:
            return t.to(self.dtype)
        return t

    def sync_device(self) -> Any:
        """A context that makes the inputs' GPU current (torch), or does nothing."""
        if self.torch is not None:
            return load().gpus[self.device.index]
        return nullcontext()


def _current_device_id(c: Any) -> int:
    try:
        return int(c.get_current_device().id)
    except Exception:  # pragma: no cover - simulator without a context
        return 0


_DEV_PLANS: OrderedDict[tuple, tuple[Any, SimpleNamespace]] = OrderedDict()
_DEV_PLANS_SIZE = 8


def device_plan(plan: Any, device_key: tuple) -> SimpleNamespace:
    """The plan's arrays on the device, copied once per (plan, device) and cached."""
    key = (id(plan), device_key)
    hit = _DEV_PLANS.get(key)
    if hit is not None and hit[0] is plan:
        _DEV_PLANS.move_to_end(key)
        return hit[1]
    c = load()
    nb = plan.nb
    masks = plan.masks.view(np.uint32)  # (M, block, 2W): bit c % 32 of word c // 32
    if masks.shape[0] == 0:
        masks = np.zeros((1,) + masks.shape[1:], np.uint32)  # never read; no empty device arrays
    tile_row = np.repeat(np.arange(plan.num_pieces * nb, dtype=np.int64) % nb,
                         np.diff(plan.tile_ptr)).astype(np.int32)
    col_ptr, col_tile = plan.column_index()

    def put(a):
        a = np.ascontiguousarray(a)
        return c.to_device(a if a.size else np.zeros(1, a.dtype))

    dp = SimpleNamespace(
        qperm=put(plan.qperm), kperm=put(plan.kperm), tile_ptr=put(plan.tile_ptr),
        tile_col=put(plan.tile_col), tile_mask=put(plan.tile_mask), masks=put(masks),
        tile_row=put(tile_row), col_ptr=put(col_ptr), col_tile=put(col_tile.astype(np.int32)),
    )
    _DEV_PLANS[key] = (plan, dp)
    while len(_DEV_PLANS) > _DEV_PLANS_SIZE:
        _DEV_PLANS.popitem(last=False)
    return dp
