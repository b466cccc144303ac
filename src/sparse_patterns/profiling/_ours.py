"""Our implementations as the profiler's runners: each gets its inputs where it runs.

``numba``, ``reference`` (and any other registered CPU implementation) take the
host arrays. ``flex`` (:mod:`sparse_patterns.kernels.flex`) takes torch tensors
on the profile's device and runs its own plan, with FlexAttention's tile size
(128): its computed FLOPs come from that plan. ``cuda`` takes the CUDA tensors
of a CUDA profile (read through ``__cuda_array_interface__``) or, on a host
profile, numba-cuda device arrays (the CUDA simulator, or a GPU torch does not
see), copied there once per cell; without either it is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..kernels import plan
from ..pattern import Pattern
from ._device import Host, NumbaDevice

__all__ = ["impl_runner"]

Runner = tuple[Callable[[], Any], Any, str, int | None]


def impl_runner(name: str, *, pattern: Pattern, mode: str, scale: float, block: int,
                host: list[Any], dev: Any, torch: Any, dtype: str,
                shape: tuple[int, int, int, int]) -> Runner:
    """``(fn, where it is timed, note, computed FLOPs or None)`` for implementation ``name``.

    Raises ``ValueError`` (the runner is then skipped, with the message as its
    note) when the implementation cannot run here.
    """
    from ..kernels import attention  # noqa: PLC0415

    if name == "flex":
        from ..kernels import flex  # noqa: PLC0415

        flex._api()
        pl = plan(pattern, block=flex.FLEX_BLOCK, mode=mode)
        if dev.name == "cuda":
            x = [torch.as_tensor(a).to(dev.device) for a in host]
        else:
            x = [torch.as_tensor(a) for a in host]
        mask = flex._mask_kind("auto", x[0].device, pattern, pl)
        compiled = flex._how(None, x[0].device, x[0].dtype, False, torch) == "compiled"
        flex.release_workspace()

        def fn() -> Any:
            with torch.no_grad():
                return flex.flex_attention_plan(*x, pl, scale=scale, pattern=pattern)

        note = (f"{'compiled' if compiled else 'eager'} FlexAttention on {pl.num_pieces} "
                f"piece(s), block {pl.block}, {mask} mask_mod, computed/useful {pl.ratio:.2f}")
        return fn, dev, note, pl.flops(*shape[:2], shape[3])[1]
    if name == "cuda":
        if dev.name == "cuda":
            where, x = dev, [torch.as_tensor(a).to(dev.device) for a in host]
        else:
            from ..kernels import cuda as kc  # noqa: PLC0415

            kc.require()  # CudaUnavailableError (a ValueError) says what is missing
            if dtype not in ("float32", "float64"):
                raise ValueError(f"dtype: {dtype} inputs need torch CUDA tensors for impl='cuda' "
                                 "(numba device arrays hold float32 or float64); use --device cuda")
            where = NumbaDevice()
            x = where.put(None, host)

        def fn() -> Any:
            return attention(*x, pattern, mode=mode, impl="cuda", scale=scale, block=block)

        return fn, where, f"numba-cuda on {where.name}", None
    x = list(host)

    def fn() -> Any:
        return attention(*x, pattern, mode=mode, impl=name, scale=scale, block=block)

    return fn, Host(), "", None
