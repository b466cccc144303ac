"""The CPU kernel as a backend (``impl="numba"``): :data:`BACKEND` checks and converts the
inputs (:class:`~sparse_patterns.kernels.inputs.HostArrays`) and runs :mod:`..cpu`'s
kernels on them, one call at a time where numba's threading layer needs it."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from ...util.threads import jit_disabled, refuse_uncompiled
from ..backend import Backend
from ..inputs import HostArrays, check_scale
from . import amx_applies, backward, backward_bf16, bf16_applies, forward, forward_bf16

__all__ = ["BACKEND"]


_LOCK = threading.Lock()


def _one_at_a_time() -> Any:
    """The module lock where numba's threading layer is ``workqueue``, else a no-op context:
    that layer is not thread-safe (parallel kernels entered from two Python threads at once
    abort the process). Before any parallel kernel has run the configured layer decides, and
    ``default`` (workqueue where TBB and OpenMP do not load) takes the lock too."""
    import numba  # noqa: PLC0415

    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        layer = str(numba.config.THREADING_LAYER)
        layer = "workqueue" if layer == "default" else layer
    return _LOCK if layer == "workqueue" else contextlib.nullcontext()


class _Numba(Backend):
    """``impl="numba"``: the fused CPU kernels on NumPy arrays or CPU torch tensors."""

    name = "numba"
    description = "fused numba/LLVM kernels on the CPU (float32 sums; bf16 products where fast)"
    devices = ("cpu",)
    kinds = ("numpy", "torch")
    blocks = {"cpu": 32}

    def more_reasons(self, inputs: Any, plan: Any, pattern: Any) -> list[str]:
        value = jit_disabled()
        return [] if value is None else [f"NUMBA_DISABLE_JIT={value}: impl='numba' needs numba's "
                                         "JIT (unset NUMBA_DISABLE_JIT)"]

    def forward(self, q: Any, k: Any, v: Any, plan: Any, *, pattern: Any = None,
                scale: float | None = None, return_lse: bool = False) -> Any:
        refuse_uncompiled("impl='numba'")
        with _one_at_a_time():
            return self._forward(q, k, v, plan, scale=scale, return_lse=return_lse)

    def _forward(self, q: Any, k: Any, v: Any, plan: Any, *, scale: float | None,
                 return_lse: bool) -> Any:
        x = HostArrays({"q": q, "k": k, "v": v}, plan.n, widen_half=False)
        s = check_scale(scale, x.shape[3], x.compute.__name__)
        d = x.shape[3]
        if x.dtype_name == "bfloat16" and (amx_applies(plan, d) or bf16_applies(plan, d)):
            w = x.words  # the output comes back as bf16 words, rounded as blocks finish
            o, lse = forward_bf16(w["q"], w["k"], w["v"], plan, scale=s, words=True)
            return (x.out_words(o), x.out(lse, lse=True)) if return_lse else x.out_words(o)
        a = x.widen()
        o, lse = forward(a["q"], a["k"], a["v"], plan, scale=s)
        return (x.out(o), x.out(lse, lse=True)) if return_lse else x.out(o)

    def backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: Any, *,
                 pattern: Any = None, scale: float | None = None) -> tuple[Any, Any, Any]:
        refuse_uncompiled("impl='numba'")
        with _one_at_a_time():
            return self._backward(q, k, v, o, lse, do, plan, scale=scale)

    def _backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: Any, *,
                  scale: float | None) -> tuple[Any, Any, Any]:
        x = HostArrays({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}, plan.n,
                       widen_half=False)
        s = check_scale(scale, x.shape[3], x.compute.__name__)
        d = x.shape[3]
        if x.dtype_name == "bfloat16" and (amx_applies(plan, d) or bf16_applies(plan, d)):
            w = x.words  # the gradients come back as bf16 words, narrowed head by head
            return tuple(x.out_words(g) for g in backward_bf16(
                w["q"], w["k"], w["v"], w["o"], x.np["lse"], w["do"], plan, scale=s,
                words=True))
        a = x.widen()
        grads = backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], plan, scale=s)
        return tuple(x.out(g) for g in grads)


#: The CPU backend (:class:`~sparse_patterns.kernels.backend.Backend`).
BACKEND = _Numba()
