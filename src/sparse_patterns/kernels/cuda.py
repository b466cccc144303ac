"""The CUDA kernel (``impl="cuda"``): the same ExecutionPlan, run by numba-cuda on a GPU.

Forward: for every piece of the plan one launch, with one thread block per
(batch, head, query tile) and one thread per query row. The block stages the
keys and values of each of its tiles (gathered through the piece's key
permutation) in shared memory, ``ks`` keys at a time; each thread keeps its
scaled query row, its accumulator and its running max and sum in registers
(an online softmax), tests a partial tile's token mask bit by bit and skips the
pairs outside it. At the end the thread merges its piece's normalized row into
the output exactly by log-sum-exp, as the CPU kernel does, so the pieces of one
softmax (a window in natural order, a stride in ``i mod l`` order) give one
softmax. Launches of one call run in order on one stream, and inside a launch a
token belongs to one query tile, so no two threads write the same row.

Backward (recomputation from the saved log-sum-exp, as in FlashAttention-2):
one launch computes ``delta_i = do_i . o_i`` and clears the gradients; per
piece, a row kernel (thread block per query tile) accumulates ``dq`` and a
column kernel (thread block per key tile, one thread per key, using the plan's
:meth:`~sparse_patterns.kernels.ExecutionPlan.column_index`) accumulates
``dk`` and ``dv``. No atomics: every row has one owner per launch.

numba-cuda is an optional dependency (``pip install 'sparse-patterns[cuda]'``),
imported on first use. Without a GPU the kernels run under numba's CUDA
simulator when ``NUMBA_ENABLE_CUDASIM=1`` is set before ``numba.cuda`` is first
imported (slow: one Python thread per CUDA thread; the tests use it). Inputs are
torch CUDA tensors (read through ``__cuda_array_interface__``, results returned
as torch tensors on the same device and stream) or numba device arrays.
float32 and float64 are computed in their own precision; torch float16 and
bfloat16 are computed in float32 and returned in their dtype.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = [
    "CudaUnavailableError",
    "backend",
    "forward",
    "backward",
    "attention",
    "ptx",
    "MAX_BLOCK",
    "MAX_HEAD_DIM",
]

#: Largest tile size: one thread per query row, and a CUDA block has at most 1024 threads.
MAX_BLOCK = 1024
#: Largest head dimension: each thread keeps a few rows of ``d`` values in registers / local memory.
MAX_HEAD_DIM = 1024
_SHARED_BYTES = 32 * 1024  # shared memory for the two staged (ks, d) tiles of a block

# ``numba.cuda``, bound on first use by :func:`_cuda`. The kernels below look it up as a
# module global on purpose: the CUDA simulator runs a kernel by swapping the globals that
# refer to ``numba.cuda`` for its fake module, which a closure variable would escape.
cuda: Any = None


class CudaUnavailableError(ValueError, RuntimeError):
    """``impl="cuda"`` cannot run here: numba-cuda or a GPU is missing.

    A ``ValueError`` (the value of ``impl`` is unusable here, so the CLI prints it
    on one line) and a ``RuntimeError`` (the environment lacks something).
    """


def _cuda():
    """Import ``numba.cuda`` once, or raise :class:`CudaUnavailableError` naming what is missing."""
    global cuda
    if cuda is None:
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


def _simulated() -> bool:
    """True when ``numba.cuda`` was imported as the simulator (decided once, at its import)."""
    return str(getattr(_cuda().jit, "__module__", "")).startswith("numba.cuda.simulator")


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
        c = _cuda()
    except CudaUnavailableError:
        return "none"
    if _simulated():
        return "simulator"
    try:
        return "gpu" if c.is_available() else "none"
    except Exception:  # a broken driver install: treat as no GPU
        return "none"


def _require_backend():
    c = _cuda()
    if _simulated():
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


def _driver_reason(c) -> str:
    try:
        err = c.cuda_error()
    except Exception as e:  # pragma: no cover
        err = e
    if err is None:
        return "numba.cuda.is_available() is False"
    return " ".join(str(err).split())[:200] or err.__class__.__name__


# --------------------------------------------------------------------- kernels
def _sub_tile(block: int, d: int, itemsize: int) -> int:
    """Keys staged at once: two ``(ks, d)`` tiles fit in ``_SHARED_BYTES``; a power of 2."""
    ks = 1
    while ks * 2 <= block and 2 * (ks * 2) * d * itemsize <= _SHARED_BYTES:
        ks *= 2
    return ks


@lru_cache(maxsize=32)
def _kernels(BLOCK: int, D: int, KS: int, fp64: bool) -> SimpleNamespace:  # noqa: C901
    """Compile (lazily, at first launch) the kernels for one tile size, head dim and precision.

    ``BLOCK``, ``D`` and ``KS`` are compile-time constants (shared and local array shapes).
    """
    c = _cuda()
    dt = np.float64 if fp64 else np.float32
    NEG = dt(-np.inf)
    ZERO = dt(0.0)
    ONE = dt(1.0)
    NAN = dt(np.nan)

    @c.jit
    def init_fwd(out, lse):  # pragma: no cover - device code
        """out = 0, lse = -inf; one thread per (b, h, i) row."""
        B, H, n, d = out.shape
        t = cuda.grid(1)
        if t < B * H * n:
            b = t // (H * n)
            h = (t // n) % H
            i = t % n
            lse[b, h, i] = NEG
            for x in range(D):
                out[b, h, i, x] = ZERO

    @c.jit
    def forward(q, k, v, out, lse, scale, p, g, G, Hg, nb, qperm, kperm, tile_ptr,
                tile_col, tile_mask, masks):  # pragma: no cover - device code
        """One block per (batch b, head h of group g, query tile I); thread r = query row."""
        B, H, n, d = q.shape
        I = cuda.blockIdx.x % nb  # a 1-D grid: (b, head of the group, tile) flattened
        bh = cuda.blockIdx.x // nb
        b = bh // Hg
        h = g + G * (bh % Hg)
        r = cuda.threadIdx.x
        ksh = cuda.shared.array((KS, D), dt)
        vsh = cuda.shared.array((KS, D), dt)
        qv = cuda.local.array(D, dt)
        acc = cuda.local.array(D, dt)
        sc = cuda.local.array(KS, dt)
        rows = min(BLOCK, n - I * BLOCK)
        active = r < rows
        i = 0
        if active:
            i = qperm[p, I * BLOCK + r]
            for x in range(D):
                qv[x] = q[b, h, i, x] * scale
                acc[x] = ZERO
        m = NEG
        lsum = ZERO
        bad = False  # a NaN score: the whole row is NaN, as in torch
        for t in range(tile_ptr[p * nb + I], tile_ptr[p * nb + I + 1]):
            J = tile_col[t]
            mi = tile_mask[t]
            cols = min(BLOCK, n - J * BLOCK)
            for x0 in range(0, cols, KS):
                nk = min(KS, cols - x0)
                cuda.syncthreads()  # the previous sub-tile is consumed
                e = r
                while e < nk * D:
                    kx = e // D
                    cx = e - kx * D
                    j = kperm[p, J * BLOCK + x0 + kx]
                    ksh[kx, cx] = k[b, h, j, cx]
                    vsh[kx, cx] = v[b, h, j, cx]
                    e += BLOCK
                cuda.syncthreads()
                if active:
                    cm = m
                    word = 0
                    for kx in range(nk):
                        cc = x0 + kx
                        keep = True
                        if mi >= 0:
                            if kx == 0 or (cc & 31) == 0:  # this row's next 32 mask bits
                                word = masks[mi, r, cc >> 5]
                            keep = ((word >> (cc & 31)) & 1) != 0
                        s = NEG
                        if keep:
                            s = ZERO
                            for x in range(D):
                                s += qv[x] * ksh[kx, x]
                            if s > cm:
                                cm = s
                            elif s != s:
                                bad = True
                        sc[kx] = s
                    if cm > NEG:  # at least one key so far
                        alpha = ZERO
                        if m > NEG:
                            alpha = math.exp(m - cm)
                        lsum *= alpha
                        for x in range(D):
                            acc[x] *= alpha
                        for kx in range(nk):
                            if sc[kx] > NEG:
                                pe = math.exp(sc[kx] - cm)
                                lsum += pe
                                for x in range(D):
                                    acc[x] += pe * vsh[kx, x]
                        m = cm
        if active:
            old = lse[b, h, i]
            if bad or lsum != lsum:
                for x in range(D):
                    out[b, h, i, x] = NAN
                lse[b, h, i] = NAN
            elif old != old:
                pass  # NaN from an earlier piece stays
            elif m > NEG and lsum > ZERO:
                lp = m + math.log(lsum)
                inv = ONE / lsum
                if old > NEG:
                    hi = max(old, lp)
                    new = hi + math.log(math.exp(old - hi) + math.exp(lp - hi))
                    a = math.exp(old - new)
                    w = math.exp(lp - new) * inv
                    for x in range(D):
                        out[b, h, i, x] = out[b, h, i, x] * a + acc[x] * w
                    lse[b, h, i] = new
                else:
                    for x in range(D):
                        out[b, h, i, x] = acc[x] * inv
                    lse[b, h, i] = lp

    @c.jit
    def init_bwd(o, do, delta, dq, dk, dv):  # pragma: no cover - device code
        """delta = rowsum(do * o); dq = dk = dv = 0; one thread per (b, h, i) row."""
        B, H, n, d = o.shape
        t = cuda.grid(1)
        if t < B * H * n:
            b = t // (H * n)
            h = (t // n) % H
            i = t % n
            s = ZERO
            for x in range(D):
                s += do[b, h, i, x] * o[b, h, i, x]
                dq[b, h, i, x] = ZERO
                dk[b, h, i, x] = ZERO
                dv[b, h, i, x] = ZERO
            delta[b, h, i] = s

    @c.jit
    def backward_dq(q, k, v, do, lse, delta, dq, scale, p, g, G, Hg, nb, qperm, kperm,
                    tile_ptr, tile_col, tile_mask, masks):  # pragma: no cover - device code
        """dq += scale * sum_j p_ij (dp_ij - delta_i) k_j over the piece; thread = query row."""
        B, H, n, d = q.shape
        I = cuda.blockIdx.x % nb  # a 1-D grid: (b, head of the group, tile) flattened
        bh = cuda.blockIdx.x // nb
        b = bh // Hg
        h = g + G * (bh % Hg)
        r = cuda.threadIdx.x
        ksh = cuda.shared.array((KS, D), dt)
        vsh = cuda.shared.array((KS, D), dt)
        qv = cuda.local.array(D, dt)
        dov = cuda.local.array(D, dt)
        acc = cuda.local.array(D, dt)
        rows = min(BLOCK, n - I * BLOCK)
        active = r < rows
        i = 0
        L = NEG
        dl = ZERO
        if active:
            i = qperm[p, I * BLOCK + r]
            L = lse[b, h, i]
            dl = delta[b, h, i]
            for x in range(D):
                qv[x] = q[b, h, i, x] * scale
                dov[x] = do[b, h, i, x]
                acc[x] = ZERO
        for t in range(tile_ptr[p * nb + I], tile_ptr[p * nb + I + 1]):
            J = tile_col[t]
            mi = tile_mask[t]
            cols = min(BLOCK, n - J * BLOCK)
            for x0 in range(0, cols, KS):
                nk = min(KS, cols - x0)
                cuda.syncthreads()
                e = r
                while e < nk * D:
                    kx = e // D
                    cx = e - kx * D
                    j = kperm[p, J * BLOCK + x0 + kx]
                    ksh[kx, cx] = k[b, h, j, cx]
                    vsh[kx, cx] = v[b, h, j, cx]
                    e += BLOCK
                cuda.syncthreads()
                if active and L > NEG:
                    word = 0
                    for kx in range(nk):
                        cc = x0 + kx
                        keep = True
                        if mi >= 0:
                            if kx == 0 or (cc & 31) == 0:
                                word = masks[mi, r, cc >> 5]
                            keep = ((word >> (cc & 31)) & 1) != 0
                        if keep:
                            s = ZERO
                            dp = ZERO
                            for x in range(D):
                                s += qv[x] * ksh[kx, x]
                                dp += dov[x] * vsh[kx, x]
                            ds = math.exp(s - L) * (dp - dl)
                            for x in range(D):
                                acc[x] += ds * ksh[kx, x]
        if active and L > NEG:
            for x in range(D):
                dq[b, h, i, x] += acc[x] * scale

    @c.jit
    def backward_dkdv(q, k, v, do, lse, delta, dk, dv, scale, p, g, G, Hg, nb, qperm,
                      kperm, tile_row, tile_mask, col_ptr, col_tile,
                      masks):  # pragma: no cover - device code
        """dk, dv of one key tile J over the query tiles of its column; thread = key."""
        B, H, n, d = q.shape
        J = cuda.blockIdx.x % nb  # a 1-D grid: (b, head of the group, tile) flattened
        bh = cuda.blockIdx.x // nb
        b = bh // Hg
        h = g + G * (bh % Hg)
        cl = cuda.threadIdx.x
        qsh = cuda.shared.array((KS, D), dt)
        dosh = cuda.shared.array((KS, D), dt)
        lsh = cuda.shared.array(KS, dt)
        dlsh = cuda.shared.array(KS, dt)
        kv = cuda.local.array(D, dt)
        vv = cuda.local.array(D, dt)
        dka = cuda.local.array(D, dt)
        dva = cuda.local.array(D, dt)
        cols = min(BLOCK, n - J * BLOCK)
        active = cl < cols
        j = 0
        if active:
            j = kperm[p, J * BLOCK + cl]
            for x in range(D):
                kv[x] = k[b, h, j, x]
                vv[x] = v[b, h, j, x]
                dka[x] = ZERO
                dva[x] = ZERO
        word = cl >> 5
        bit = cl & 31
        for u in range(col_ptr[p * nb + J], col_ptr[p * nb + J + 1]):
            t = col_tile[u]
            I = tile_row[t]
            mi = tile_mask[t]
            rows = min(BLOCK, n - I * BLOCK)
            for x0 in range(0, rows, KS):
                nr = min(KS, rows - x0)
                cuda.syncthreads()
                e = cl
                while e < nr * D:
                    rx = e // D
                    cx = e - rx * D
                    i = qperm[p, I * BLOCK + x0 + rx]
                    qsh[rx, cx] = q[b, h, i, cx] * scale
                    dosh[rx, cx] = do[b, h, i, cx]
                    e += BLOCK
                if cl < nr:
                    i = qperm[p, I * BLOCK + x0 + cl]
                    lsh[cl] = lse[b, h, i]
                    dlsh[cl] = delta[b, h, i]
                cuda.syncthreads()
                if active:
                    for rx in range(nr):
                        keep = lsh[rx] > NEG
                        if keep and mi >= 0:
                            keep = ((masks[mi, x0 + rx, word] >> bit) & 1) != 0
                        if keep:
                            s = ZERO
                            dp = ZERO
                            for x in range(D):
                                s += qsh[rx, x] * kv[x]
                                dp += dosh[rx, x] * vv[x]
                            pr = math.exp(s - lsh[rx])
                            ds = pr * (dp - dlsh[rx])
                            for x in range(D):
                                dva[x] += pr * dosh[rx, x]
                                dka[x] += ds * qsh[rx, x]
        if active:
            for x in range(D):
                dk[b, h, j, x] += dka[x]
                dv[b, h, j, x] += dva[x]

    return SimpleNamespace(init_fwd=init_fwd, forward=forward, init_bwd=init_bwd,
                           backward_dq=backward_dq, backward_dkdv=backward_dkdv)


def _raise_if_toolkit_missing(e: BaseException, where: str) -> None:
    """Turn "NVVM/NVRTC not found" (met at the first compile) into CudaUnavailableError."""
    text = f"{type(e).__name__}: {e}"
    if "Failure finding" in text or "NVVM" in type(e).__name__ or "libnvvm" in text.lower():
        raise CudaUnavailableError(
            f"{where}: numba-cuda cannot compile here, NVVM/NVRTC not found "
            f"({' '.join(text.split())[:160]}); install a CUDA toolkit, or "
            "pip install 'numba-cuda[cu13]' (or [cu12] for a CUDA 12 driver)"
        ) from e


# --------------------------------------------------------------------- plan on the device
_DEV_PLANS: OrderedDict[tuple, tuple[Any, SimpleNamespace]] = OrderedDict()
_DEV_PLANS_SIZE = 8


def _device_plan(plan, device_key) -> SimpleNamespace:
    """The plan's arrays on the device, copied once per (plan, device) and cached."""
    key = (id(plan), device_key)
    hit = _DEV_PLANS.get(key)
    if hit is not None and hit[0] is plan:
        _DEV_PLANS.move_to_end(key)
        return hit[1]
    c = _cuda()
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


# --------------------------------------------------------------------- arrays in and out
class _Args:
    """Inputs as numba device arrays in the compute dtype, and how to hand results back."""

    def __init__(self, arrays: dict[str, Any]):
        c = _require_backend()
        self.torch = None
        self.device = None
        kinds = {}
        for name, a in arrays.items():
            kinds[name] = _kind(name, a)
        if len(set(kinds.values())) > 1:
            desc = ", ".join(f"{k}: {v}" for k, v in kinds.items())
            raise ValueError(f"q, k, v: pass all torch CUDA tensors or all numba device arrays, got {desc}")
        first = next(iter(arrays.values()))
        if kinds[next(iter(kinds))] == "torch":
            import torch

            self.torch = torch
            devs = {str(a.device) for a in arrays.values()}
            if len(devs) > 1:
                desc = ", ".join(f"{k} on {a.device}" for k, a in arrays.items())
                raise ValueError(f"q, k, v: tensors on different devices ({desc})")
            self.device = first.device
            self.dtype = first.dtype
            fp64 = first.dtype == torch.float64
            cdt = torch.float64 if fp64 else torch.float32
            # launch on torch's current stream (0: the legacy default stream, numba's default
            # too), so the inputs are ready without a host synchronization (sync=False)
            ptr = torch.cuda.current_stream(first.device).cuda_stream
            self.stream = c.external_stream(ptr) if ptr else 0
            self.dev = {k: c.as_cuda_array(a.detach().to(cdt).contiguous(), sync=False)
                        for k, a in arrays.items()}
            self.device_key = ("torch", first.device.index)
        else:
            self.dtype = first.dtype
            fp64 = first.dtype == np.float64
            self.stream = 0
            self.dev = dict(arrays)
            self.device_key = ("numba", _current_device_id(c))
        self.fp64 = fp64
        self.np_dtype = np.dtype(np.float64 if fp64 else np.float32)

    def empty(self, shape):
        """A device array in the compute dtype (a torch tensor's view when inputs are torch)."""
        if self.torch is not None:
            t = self.torch.empty(shape, dtype=self.torch.float64 if self.fp64 else self.torch.float32,
                                 device=self.device)
            return t, _cuda().as_cuda_array(t, sync=False)
        a = _cuda().device_array(shape, dtype=self.np_dtype, stream=self.stream)
        return a, a

    def result(self, t):
        """Hand a result back in the inputs' dtype (torch) or as is (numba)."""
        if self.torch is not None and t.dtype != self.dtype:
            return t.to(self.dtype)
        return t

    def sync_device(self):
        if self.torch is not None:
            return _cuda().gpus[self.device.index]
        return _Null()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _current_device_id(c) -> int:
    try:
        return int(c.get_current_device().id)
    except Exception:  # pragma: no cover - simulator without a context
        return 0


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
def _torch_dtypes():
    import torch

    return (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_shapes(plan, arrays: dict[str, Any]) -> tuple[int, int, int, int]:
    """``(B, H, n, d)`` after checking every array against ``q`` and the plan."""
    q = tuple(arrays["q"].shape)
    if len(q) != 4:
        raise ValueError(f"q: must be shaped (B, H, n, d), got shape {q}")
    for name, a in arrays.items():
        want = q[:3] if name == "lse" else q
        if tuple(a.shape) != want:
            raise ValueError(f"{name}: shape {tuple(a.shape)} disagrees with q's {q} (want {want})")
        if name in ("k", "v", "o", "do") and a.dtype != arrays["q"].dtype:
            raise ValueError(f"{name}: dtype {a.dtype} disagrees with q's {arrays['q'].dtype}")
    B, H, n, d = q
    if n != plan.n:
        raise ValueError(f"q: sequence length {n} disagrees with the plan's n = {plan.n}")
    if plan.block > MAX_BLOCK:
        raise ValueError(
            f"block: must be an integer [1, {MAX_BLOCK}] for impl='cuda', got {plan.block}"
        )
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"q: head dimension d must be in [1, {MAX_HEAD_DIM}] for impl='cuda', got {d}"
        )
    return B, H, n, d


def _launches(plan, H: int):
    """(piece p, group g, heads of the group Hg) for every piece with heads to run."""
    G = plan.num_groups
    for p in range(plan.num_pieces):
        g = int(plan.piece_group[p])
        Hg = len(range(g, H, G))
        if Hg:
            yield p, g, Hg


def _scale_of(scale, d: int, fp64: bool):
    if scale is None:
        s = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(scale)):
        raise ValueError(f"scale: must be a finite number or None, got {scale!r}")
    else:
        s = float(scale)
    return np.float64(s) if fp64 else np.float32(s)


# --------------------------------------------------------------------- entry points
def forward(q: Any, k: Any, v: Any, plan, *, scale: float | None = None) -> tuple[Any, Any]:
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
    arrays = {"q": q, "k": k, "v": v}
    args = _Args(arrays)
    B, H, n, d = _check_shapes(plan, arrays)
    sc = _scale_of(scale, d, args.fp64)
    with args.sync_device():
        qd, kd, vd = args.dev["q"], args.dev["k"], args.dev["v"]
        out_t, out = args.empty((B, H, n, d))
        lse_t, lse = args.empty((B, H, n))
        try:
            _run_forward(qd, kd, vd, out, lse, plan, sc, args)
        except Exception as e:  # the first launch compiles: the toolkit is looked up then
            _raise_if_toolkit_missing(e, "impl='cuda'")
            raise
    return args.result(out_t), lse_t


def _run_forward(qd, kd, vd, out, lse, plan, scale, args) -> None:
    """Launch the forward kernels into ``out`` and ``lse`` (device arrays, compute dtype)."""
    B, H, n, d = qd.shape
    block = plan.block
    K = _kernels(block, d, _sub_tile(block, d, args.np_dtype.itemsize), args.fp64)
    dp = _device_plan(plan, args.device_key)
    st = args.stream
    rows = B * H * n
    K.init_fwd[(rows + 127) // 128, 128, st](out, lse)
    nb = plan.nb
    for p, g, Hg in _launches(plan, H):
        K.forward[nb * B * Hg, block, st](
            qd, kd, vd, out, lse, scale, p, g, plan.num_groups, Hg, nb, dp.qperm, dp.kperm,
            dp.tile_ptr, dp.tile_col, dp.tile_mask, dp.masks)


def backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan, *,
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
    arrays = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}
    args = _Args(arrays)
    B, H, n, d = _check_shapes(plan, arrays)
    sc = _scale_of(scale, d, args.fp64)
    with args.sync_device():
        a = args.dev
        grads = [args.empty((B, H, n, d)) for _ in range(3)]
        _delta_t, delta = args.empty((B, H, n))
        try:
            _run_backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], delta,
                          *(g[1] for g in grads), plan, sc, args)
        except Exception as e:
            _raise_if_toolkit_missing(e, "impl='cuda'")
            raise
    return tuple(args.result(g[0]) for g in grads)


def _run_backward(qd, kd, vd, od, lsed, dod, delta, dq, dk, dv, plan, scale, args) -> None:
    """Launch the backward kernels into ``dq``, ``dk``, ``dv`` (device arrays, compute dtype)."""
    B, H, n, d = qd.shape
    block = plan.block
    K = _kernels(block, d, _sub_tile(block, d, args.np_dtype.itemsize), args.fp64)
    dp = _device_plan(plan, args.device_key)
    st = args.stream
    rows = B * H * n
    K.init_bwd[(rows + 127) // 128, 128, st](od, dod, delta, dq, dk, dv)
    nb = plan.nb
    G = plan.num_groups
    for p, g, Hg in _launches(plan, H):
        K.backward_dq[nb * B * Hg, block, st](
            qd, kd, vd, dod, lsed, delta, dq, scale, p, g, G, Hg, nb, dp.qperm, dp.kperm,
            dp.tile_ptr, dp.tile_col, dp.tile_mask, dp.masks)
        K.backward_dkdv[nb * B * Hg, block, st](
            qd, kd, vd, dod, lsed, delta, dk, dv, scale, p, g, G, Hg, nb, dp.qperm, dp.kperm,
            dp.tile_row, dp.tile_mask, dp.col_ptr, dp.col_tile, dp.masks)


def attention(q: Any, k: Any, v: Any, pattern, *, mode: str = "multihead",
              scale: float | None = None, return_lse: bool = False,
              block: int = 64) -> Any:
    """Sparse attention of ``pattern`` on the GPU (forward only; see :func:`backward`).

    Plans the pattern (cached), then runs :func:`forward`.

    Parameters
    ----------
    q, k, v : torch CUDA tensors or numba device arrays ``(B, H, n, d)``
    pattern : Pattern or ExecutionPlan
        The token pattern (planned once and cached), or a plan (whose mode
        must be ``mode`` and whose block is then used).
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
    from .._validate import check_bool, check_choice, check_int
    from .planning import MODES, ExecutionPlan
    from .planning import plan as make_plan

    mode = check_choice("mode", mode, MODES)
    return_lse = check_bool("return_lse", return_lse)
    if isinstance(pattern, ExecutionPlan):
        if pattern.mode != mode:
            raise ValueError(f"mode: {mode!r} disagrees with the given plan's mode {pattern.mode!r}")
        pl = pattern
    else:
        pl = make_plan(pattern, block=check_int("block", block, 1, MAX_BLOCK), mode=mode)
    out, lse = forward(q, k, v, pl, scale=scale)
    return (out, lse) if return_lse else out



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
    from .._validate import check_choice, check_int

    block = check_int("block", block, 1, MAX_BLOCK)
    d = check_int("d", d, 1, MAX_HEAD_DIM)
    fp64 = check_choice("dtype", dtype, ("float32", "float64")) == "float64"
    c = _cuda()
    if _simulated():
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
    K = _kernels(block, d, _sub_tile(block, d, 8 if fp64 else 4), fp64)
    out = {}
    for name, sig in sigs.items():
        try:
            out[name], _ = c.compile_ptx(getattr(K, name).py_func, sig, cc=tuple(cc))
        except Exception as e:  # the toolkit libraries are looked up only now
            _raise_if_toolkit_missing(e, "ptx")
            raise
    return out
