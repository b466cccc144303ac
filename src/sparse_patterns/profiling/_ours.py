"""Our backends as the profiler's runners, through the one backend interface.

A backend runs where its devices allow: on a CUDA profile a backend that runs on
CUDA (``torch``, ``flex``, ``cuda``) gets the CUDA tensors, one that does not
(``numba``, ``reference``) the host arrays. On a host profile a CUDA-only backend
that takes numba device arrays (``cuda``) gets them (the CUDA simulator, or a GPU
torch does not see), copied there once per cell. The plan is the backend's, at
the profile's ``block`` or the backend's default tile size on that device, and its
computed FLOPs are reported; a backend whose reasons
(:meth:`~sparse_patterns.kernels.backend.Backend.reasons`) are not empty is skipped
with them as its note.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..kernels import get_backend, plan
from ..kernels.backend import Inputs
from ..pattern import Pattern
from ._device import Host, NumbaDevice

__all__ = ["impl_runner"]

Runner = tuple[Callable[[], Any], Any, str, int | None]


def impl_runner(name: str, *, pattern: Pattern, mode: str, scale: float, block: int | None,
                host: list[Any], dev: Any, torch: Any, dtype: str,
                shape: tuple[int, int, int, int]) -> Runner:
    """``(fn, where it is timed, note, computed FLOPs)`` for backend ``name``.

    Raises ``ValueError`` (the runner is then skipped, with the message as its
    note) when the backend cannot run here.
    """
    be = get_backend(name)
    if dev.name == "cuda" and "cuda" in be.devices:
        where, x = dev, [torch.as_tensor(a).to(dev.device) for a in host]
    elif "cpu" not in be.devices and "numba" in be.kinds:
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype: {dtype} inputs need torch CUDA tensors for impl={name!r} "
                             "(numba device arrays hold float32 or float64); use --device cuda")
        where = NumbaDevice()
        if be.more_reasons(Inputs("numba", "cuda", dtype, shape), None, pattern):
            from ..kernels import cuda as kc  # noqa: PLC0415

            kc.require()  # CudaUnavailableError (a ValueError) says what is missing
        x = where.put(None, host)
    else:
        where, x = Host(), list(host)
    numba_arrays = isinstance(where, NumbaDevice)
    inputs = Inputs("numba" if numba_arrays else Inputs.of({"q": x[0]}).kind,
                    "cuda" if numba_arrays or where is dev and dev.name == "cuda" else "cpu",
                    dtype, tuple(shape))
    device = inputs.device
    pl = plan(pattern, block=be.default_block(device) if block is None else block, mode=mode)
    why = be.reasons(inputs, pl, pattern)
    if why:
        raise ValueError("; ".join(why))
    grad_off = torch.no_grad if torch is not None else None

    def fn() -> Any:
        if grad_off is None:
            return be.forward(*x, pl, pattern=pattern, scale=scale)
        with grad_off():
            return be.forward(*x, pl, pattern=pattern, scale=scale)

    note = be.note(pl, inputs)
    if where is not dev and not isinstance(where, NumbaDevice) and dev.name == "cuda":
        note = f"{note} (host arrays)"
    return fn, where, note, pl.flops(*shape[:2], shape[3])[1]
