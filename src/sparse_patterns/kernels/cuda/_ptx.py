"""PTX of the ``impl="cuda"`` kernels, compiled without a GPU (for checks and for reading).

Needs the real numba-cuda (not the simulator) and NVIDIA's NVVM and NVRTC
libraries; :func:`ptx` gives every kernel's PTX text for one tile size, head
dimension and dtype.
"""

from __future__ import annotations

from ...util.checks import check_choice, check_int
from ._detect import CudaUnavailableError, load, raise_if_toolkit_missing, simulated
from ._kernels import MAX_BLOCK, MAX_HEAD_DIM, _sub_tile, kernels

__all__ = ["ptx"]


def ptx(block: int = 64, d: int = 64, dtype: str = "float32",
        cc: tuple[int, int] = (8, 0)) -> dict[str, str]:
    """Compile every kernel to PTX for one tile size, head dim and dtype; no GPU needed.

    Needs the real numba-cuda (not the simulator) and NVIDIA's NVVM and NVRTC
    libraries (a CUDA toolkit, or the ``nvidia-nvvm`` and ``nvidia-cuda-nvrtc``
    wheels). Useful to check that the kernels type and lower for a GPU on a
    machine without one, and to read what they compile to.

    Parameters
    ----------
    block : int
        Tile size (threads per block), in ``[1, 1024]``.
    d : int
        Head dimension, ``>= 1``.
    dtype : {"float32", "float64"}
        Compute dtype.
    cc : tuple of int
        Target compute capability.

    Returns
    -------
    dict
        Kernel name -> PTX text.

    Raises
    ------
    CudaUnavailableError
        Without numba-cuda, under the simulator, or when NVVM/NVRTC are missing.
    ValueError
        A bad ``block``, ``d`` or ``dtype``.

    Examples
    --------
    >>> from sparse_patterns.kernels import cuda
    >>> try:
    ...     kernels = cuda.ptx(block=32, d=8)
    ... except cuda.CudaUnavailableError:  # no numba-cuda, the simulator, or no NVVM here
    ...     kernels = None
    >>> kernels is None or ".entry" in kernels["forward"]
    True
    """
    block = check_int("block", block, 1, MAX_BLOCK)
    d = check_int("d", d, 1, MAX_HEAD_DIM)
    fp64 = check_choice("dtype", dtype, ("float32", "float64")) == "float64"
    c = load()
    if simulated():
        raise CudaUnavailableError("ptx: the CUDA simulator compiles nothing; unset NUMBA_ENABLE_CUDASIM")
    from numba import types as T

    f = T.float64 if fp64 else T.float32
    i64, i32 = T.int64, T.int32

    def arr(t, nd):
        return T.Array(t, nd, "C")

    a4, a3, ix1, ix2, m3 = arr(f, 4), arr(f, 3), arr(i32, 1), arr(i32, 2), arr(T.uint32, 3)
    ints = (i64,) * 5  # p, g, G, Hg, nb
    sigs = {
        "init_fwd": (a4, a3),
        "forward": (a4, a4, a4, a4, a3, f, *ints, ix2, ix2, arr(i64, 1), ix1, ix1, m3),
        "init_bwd": (a4, a4, a3, a4, a4, a4),
        "backward_dq": (a4, a4, a4, a4, a3, a3, a4, f, *ints, ix2, ix2, arr(i64, 1), ix1, ix1, m3),
        "backward_dkdv": (a4, a4, a4, a4, a3, a3, a4, a4, f, *ints, ix2, ix2, ix1, ix1,
                          arr(i64, 1), ix1, m3),
    }
    K = kernels(block, d, _sub_tile(block, d, 8 if fp64 else 4), fp64)
    out = {}
    for name, sig in sigs.items():
        try:
            out[name], _ = c.compile_ptx(getattr(K, name).py_func, sig, cc=tuple(cc))
        except Exception as e:  # the toolkit libraries are looked up only now
            raise_if_toolkit_missing(e, "ptx")
            raise
    return out
