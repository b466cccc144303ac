"""The CUDA kernel (``impl="cuda"``): the same ExecutionPlan, run by numba-cuda on a GPU.

:func:`forward` and :func:`backward` have the signature of
:mod:`sparse_patterns.kernels.cpu`'s: arrays shaped ``(B, H, n, d)``, a plan,
and the score scale. The inputs are torch CUDA tensors (read through
``__cuda_array_interface__``, results returned as torch tensors on the same
device and stream) or numba device arrays; both functions check them with the
kernels' one input check (``kernels.inputs.DeviceArrays``), which
:func:`sparse_patterns.kernels.attention` with ``impl="cuda"`` reaches through
them. float32 and float64 are computed in their own precision; torch float16
and bfloat16 are computed in float32 and returned in their dtype.

numba-cuda is an optional dependency (``pip install 'sparse-patterns[cuda]'``),
imported on first use. Without a GPU the kernels run under numba's CUDA
simulator when ``NUMBA_ENABLE_CUDASIM=1`` is set before ``numba.cuda`` is first
imported (slow: one Python thread per CUDA thread; the tests use it). The
private modules: ``_detect`` (numba-cuda, GPU or simulator: :func:`backend`),
``_kernels`` (the kernels and how they work), ``_device`` (arrays and the plan
on the GPU), ``_ptx`` (:func:`ptx`, compilation without a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..backend import Backend, Inputs
from ..inputs import DeviceArrays, check_scale
from ..planning import ExecutionPlan
from ._detect import CudaUnavailableError, backend, raise_if_toolkit_missing, require
from ._device import Launch, device_plan
from ._kernels import MAX_BLOCK, MAX_HEAD_DIM, _sub_tile, kernels
from ._ptx import ptx

__all__ = [
    "BACKEND",
    "CudaUnavailableError",
    "backend",
    "available",
    "forward",
    "backward",
    "attention",
    "ptx",
    "MAX_BLOCK",
    "MAX_HEAD_DIM",
]


def available() -> bool:
    """Whether ``impl="cuda"`` can run here (on a GPU or the simulator); never raises.

    Examples
    --------
    >>> from sparse_patterns.kernels import cuda
    >>> cuda.available() == (cuda.backend() != "none")
    True
    """
    return backend() != "none"


def _checked(arrays: dict[str, Any], plan: ExecutionPlan, scale: Any) -> tuple[Launch, Any]:
    """The inputs on the device, and the scale in the compute dtype, after the one check."""
    require()
    x = DeviceArrays(arrays, plan, max_block=MAX_BLOCK, max_d=MAX_HEAD_DIM)
    sc = check_scale(scale, x.shape[3], "float64" if x.fp64 else "float32")
    return Launch(x), (np.float64(sc) if x.fp64 else np.float32(sc))


def _prepare(plan: ExecutionPlan, args: Launch) -> tuple[Any, Any, Any, int]:
    """The kernels compiled for the inputs, the plan on their device, the stream, and the
    number of 128-thread blocks of the row-wise init kernels."""
    B, H, n, d = args.shape
    block = plan.block
    K = kernels(block, d, _sub_tile(block, d, args.np_dtype.itemsize), args.fp64)
    return K, device_plan(plan, args.device_key), args.stream, (B * H * n + 127) // 128


def _launches(plan: ExecutionPlan, shape: tuple[int, ...]):
    """``(grid, (p, g, G, Hg, nb))`` for every piece p with heads to run: the number of thread
    blocks and the piece arguments every per-piece kernel takes (group g of G, Hg heads)."""
    B, H = shape[0], shape[1]
    G, nb = plan.num_groups, plan.nb
    for p in range(plan.num_pieces):
        g = int(plan.piece_group[p])
        Hg = len(range(g, H, G))
        if Hg:
            yield nb * B * Hg, (p, g, G, Hg, nb)


@contextmanager
def _first_compile() -> Iterator[None]:
    """Turn a missing toolkit (found when the first launch compiles) into CudaUnavailableError."""
    try:
        yield
    except Exception as e:
        raise_if_toolkit_missing(e, "impl='cuda'")
        raise


# --------------------------------------------------------------------- entry points
def forward(q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
            scale: float | None = None) -> tuple[Any, Any]:
    """Run the forward kernel on GPU arrays shaped ``(B, H, n, d)``.

    Parameters
    ----------
    q, k, v : torch CUDA tensors or numba device arrays
        Queries, keys, values, on one device. Torch tensors may be float16,
        bfloat16, float32 or float64; numba device arrays float32 or float64.
    plan : ExecutionPlan
        From :func:`sparse_patterns.kernels.plan`; its ``block`` (at most 1024)
        is the tile size and the number of threads per CUDA block.
    scale : float, optional
        Score scale; ``1 / sqrt(d)`` when omitted.

    Returns
    -------
    out, lse
        ``out`` like ``q`` (same kind, device and dtype); ``lse`` ``(B, H, n)``
        natural-log log-sum-exp in the compute dtype (float32, or float64 for
        float64 inputs), ``-inf`` for a row with no keys, whose output is 0.

    Raises
    ------
    CudaUnavailableError
        Without numba-cuda, or without a usable GPU outside the simulator.
    ValueError
        CPU or NumPy inputs, inputs on different devices or of different kinds,
        an unsupported dtype, or shapes that disagree with each other or the plan.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> from sparse_patterns.kernels import cuda
    >>> x = np.ones((1, 1, 16, 4), np.float32)
    >>> pl = sps.plan(sps.make("strided", 16, stride=4), block=8)
    >>> try:
    ...     cuda.forward(x, x, x, pl)
    ... except ValueError as e:
    ...     print("ValueError")
    ValueError
    """
    args, sc = _checked({"q": q, "k": k, "v": v}, plan, scale)
    B, H, n, d = args.shape
    with args.sync_device():
        a = args.dev
        out_t, out = args.empty((B, H, n, d))
        lse_t, lse = args.empty((B, H, n))
        with _first_compile():
            _run_forward(a["q"], a["k"], a["v"], out, lse, plan, sc, args)
    return args.result(out_t), lse_t


def _run_forward(qd, kd, vd, out, lse, plan, scale, args) -> None:
    """Launch the forward kernels into ``out`` and ``lse`` (device arrays, compute dtype)."""
    K, dp, st, inits = _prepare(plan, args)
    K.init_fwd[inits, 128, st](out, lse)
    for grid, piece in _launches(plan, args.shape):
        K.forward[grid, plan.block, st](qd, kd, vd, out, lse, scale, *piece, dp.qperm, dp.kperm,
                                        dp.tile_ptr, dp.tile_col, dp.tile_mask, dp.masks)


def backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan, *,
             scale: float | None = None) -> tuple[Any, Any, Any]:
    """Gradients ``(dq, dk, dv)`` by recomputation from the forward's ``lse``.

    Parameters
    ----------
    q, k, v, o, do : torch CUDA tensors or numba device arrays ``(B, H, n, d)``
        Inputs, the forward output and the output gradient, on one device.
    lse : ``(B, H, n)``
        The log-sum-exp returned by :func:`forward`.
    plan : ExecutionPlan
        The plan the forward ran.
    scale : float, optional
        The forward's scale; ``1 / sqrt(d)`` when omitted.

    Returns
    -------
    dq, dk, dv
        Like ``q``. Rows with no keys get zero gradients.

    Raises
    ------
    CudaUnavailableError, ValueError
        As :func:`forward`.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> from sparse_patterns.kernels import cuda
    >>> x = np.ones((1, 1, 8, 2), np.float32)
    >>> try:
    ...     cuda.backward(x, x, x, x, x[..., 0], x, sps.plan(sps.make("full", 8), block=4))
    ... except ValueError:
    ...     print("ValueError")
    ValueError
    """
    args, sc = _checked({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}, plan, scale)
    B, H, n, d = args.shape
    with args.sync_device():
        a = args.dev
        grads = [args.empty((B, H, n, d)) for _ in range(3)]
        _delta_t, delta = args.empty((B, H, n))
        with _first_compile():
            _run_backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], delta,
                          *(g[1] for g in grads), plan, sc, args)
    return tuple(args.result(g[0]) for g in grads)


def _run_backward(qd, kd, vd, od, lsed, dod, delta, dq, dk, dv, plan, scale, args) -> None:
    """Launch the backward kernels into ``dq``, ``dk``, ``dv`` (device arrays, compute dtype)."""
    K, dp, st, inits = _prepare(plan, args)
    K.init_bwd[inits, 128, st](od, dod, delta, dq, dk, dv)
    for grid, piece in _launches(plan, args.shape):
        K.backward_dq[grid, plan.block, st](
            qd, kd, vd, dod, lsed, delta, dq, scale, *piece, dp.qperm, dp.kperm,
            dp.tile_ptr, dp.tile_col, dp.tile_mask, dp.masks)
        K.backward_dkdv[grid, plan.block, st](
            qd, kd, vd, dod, lsed, delta, dk, dv, scale, *piece, dp.qperm, dp.kperm,
            dp.tile_row, dp.tile_mask, dp.col_ptr, dp.col_tile, dp.masks)


def attention(q: Any, k: Any, v: Any, pattern: Any, *, mode: str = "multihead",
              scale: float | None = None, return_lse: bool = False,
              block: int = 64) -> Any:
    """Sparse attention of ``pattern`` on the GPU: ``kernels.attention(..., impl="cuda")``.

    Plans the pattern (cached), then runs :func:`forward`; the only difference
    from :func:`sparse_patterns.kernels.attention` is the default ``block``, 64.

    Parameters
    ----------
    q, k, v : torch CUDA tensors or numba device arrays ``(B, H, n, d)``
    pattern : Pattern or ExecutionPlan
        The token pattern (planned once and cached), or a plan (whose mode
        must be ``mode``).
    mode : {"multihead", "merged"}
        ``multihead``: attention head ``h`` uses pattern head ``h % p``;
        ``merged``: every head uses the union.
    scale : float, optional
        ``1 / sqrt(d)`` when omitted.
    return_lse : bool
        Also return the log-sum-exp ``(B, H, n)``.
    block : int
        Tile size and threads per CUDA block, in ``[1, 1024]``.

    Returns
    -------
    out, or (out, lse) when ``return_lse``

    Raises
    ------
    CudaUnavailableError, ValueError
        As :func:`forward`, and for a bad ``mode`` or ``block``.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> from sparse_patterns.kernels import cuda
    >>> x = np.zeros((1, 1, 8, 2), np.float32)
    >>> try:
    ...     cuda.attention(x, x, x, sps.make("full", 8), block=4)
    ... except ValueError:
    ...     print("ValueError")
    ValueError
    """
    from .. import attention as kernels_attention

    return kernels_attention(q, k, v, pattern, mode=mode, impl="cuda", scale=scale,
                             return_lse=return_lse, block=block)


class _Cuda(Backend):
    """``impl="cuda"``: the numba-cuda kernels (a GPU, or the simulator)."""

    name = "cuda"
    description = ("numba-cuda kernels on the plan's tiles: the portable reference GPU "
                   "kernel (impl='torch' is the fast GPU path)")
    devices = ("cuda",)
    kinds = ("torch", "numba")
    blocks = {"cuda": 64}
    max_block = MAX_BLOCK
    max_head_dim = MAX_HEAD_DIM

    def more_reasons(self, inputs: Inputs, plan: ExecutionPlan | None,
                     pattern: Any) -> list[str]:
        if not available():
            return ["numba-cuda with a GPU (or its simulator) is not available here"]
        return []

    def forward(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *, pattern: Any = None,
                scale: float | None = None, return_lse: bool = False) -> Any:
        out, lse = forward(q, k, v, plan, scale=scale)
        return (out, lse) if return_lse else out

    def backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan,
                 *, pattern: Any = None, scale: float | None = None) -> tuple[Any, Any, Any]:
        return backward(q, k, v, o, lse, do, plan, scale=scale)


#: The numba-cuda backend (:class:`~sparse_patterns.kernels.backend.Backend`).
BACKEND = _Cuda()
