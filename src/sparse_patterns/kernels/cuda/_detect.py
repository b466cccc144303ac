"""Where ``impl="cuda"`` can run: numba-cuda imported on first use, a GPU or the simulator.

:func:`load` imports ``numba.cuda`` once (or raises :class:`CudaUnavailableError`
naming what is missing), :func:`backend` says ``"gpu"``, ``"simulator"`` or
``"none"`` without raising, :func:`require` raises when nothing can run a
kernel, and :func:`raise_if_toolkit_missing` turns the "NVVM/NVRTC not found"
met at the first compile into the same one-line error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "CudaUnavailableError",
    "backend",
    "load",
    "simulated",
    "require",
    "raise_if_toolkit_missing",
]

# ``numba.cuda``, bound on first use by :func:`load` (None until then).
cuda: Any = None


class CudaUnavailableError(ValueError, RuntimeError):
    """``impl="cuda"`` cannot run here: numba-cuda or a GPU is missing.

    A ``ValueError`` (the value of ``impl`` is unusable here, so the CLI prints it
    on one line) and a ``RuntimeError`` (the environment lacks something).
    """


def _numpy_row_stack() -> None:
    """Give NumPy back ``row_stack`` (an alias of ``vstack``) where it lacks it; else nothing."""
    # numba-cuda <= 0.30.4 registers np.row_stack at its first compile; numpy 2.5 removed the alias.
    if "row_stack" not in vars(np):  # vars(np): never reads (nor warns about) np.row_stack
        vars(np)["row_stack"] = np.vstack


def load() -> Any:
    """Import ``numba.cuda`` once, or raise :class:`CudaUnavailableError` naming what is missing."""
    global cuda
    if cuda is None:
        _numpy_row_stack()
        try:
            from numba import cuda as _c
        except ImportError as e:  # numba-cuda absent (or broken)
            raise CudaUnavailableError(
                "impl='cuda' needs numba-cuda, which is not importable "
                f"({e.__class__.__name__}: {e}); install it with "
                "pip install 'sparse-patterns[cuda]'"
            ) from e
        cuda = _c
    return cuda


def simulated() -> bool:
    """True when ``numba.cuda`` was imported as the simulator (decided once, at its import)."""
    return str(getattr(load().jit, "__module__", "")).startswith("numba.cuda.simulator")


def backend() -> str:
    """Where ``impl="cuda"`` would run: ``"gpu"``, ``"simulator"`` or ``"none"``.

    ``"none"`` when numba-cuda is not installed or no CUDA GPU (with a working
    driver) is visible; ``"simulator"`` when ``NUMBA_ENABLE_CUDASIM=1`` was set
    before ``numba.cuda`` was first imported. Never raises.

    Returns
    -------
    str

    Examples
    --------
    >>> from sparse_patterns.kernels import cuda
    >>> cuda.backend() in ("gpu", "simulator", "none")
    True
    """
    try:
        c = load()
    except CudaUnavailableError:
        return "none"
    if simulated():
        return "simulator"
    try:
        return "gpu" if c.is_available() else "none"
    except Exception:  # a broken driver install: treat as no GPU
        return "none"


def require() -> Any:
    """``numba.cuda`` when a GPU or the simulator can run kernels, else :class:`CudaUnavailableError`."""
    c = load()
    if simulated():
        return c
    try:
        ok = c.is_available()
    except Exception as e:  # pragma: no cover - depends on the driver install
        ok, why = False, f"{e.__class__.__name__}: {e}"
    else:
        why = "" if ok else _driver_reason(c)
    if not ok:
        raise CudaUnavailableError(
            f"impl='cuda' needs a CUDA GPU, and none is usable here ({why}); "
            "use impl='numba' on the CPU, or set NUMBA_ENABLE_CUDASIM=1 before "
            "numba.cuda is imported to run the (slow) simulator"
        )
    return c


def _driver_reason(c: Any) -> str:
    try:
        err = c.cuda_error()
    except Exception as e:  # pragma: no cover
        err = e
    if err is None:
        return "numba.cuda.is_available() is False"
    return " ".join(str(err).split())[:200] or err.__class__.__name__


def raise_if_toolkit_missing(e: BaseException, where: str) -> None:
    """Turn "NVVM/NVRTC not found" (met at the first compile) into CudaUnavailableError."""
    text = f"{type(e).__name__}: {e}"
    if "Failure finding" in text or "NVVM" in type(e).__name__ or "libnvvm" in text.lower():
        raise CudaUnavailableError(
            f"{where}: numba-cuda cannot compile here, NVVM/NVRTC not found "
            f"({' '.join(text.split())[:160]}); install a CUDA toolkit, or "
            "pip install 'numba-cuda[cu13]' (or [cu12] for a CUDA 12 driver)"
        ) from e
