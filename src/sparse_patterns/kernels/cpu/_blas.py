"""BLAS and thread control of the CPU kernel: :func:`_gemm` calls BLAS ``?gemm``
on flat arrays from inside ``@njit`` code, :func:`single_threaded_blas` holds every
loaded OpenBLAS to one thread while the kernel's own threads call it, and
:func:`_threads_for` sizes numba's thread pool to the problem.

What decides the speed of the matrix products: they call BLAS ``?gemm`` directly
(numba's own entry point, the one ``np.dot`` uses) with leading dimensions, scale and
``beta``, in the ``NN``/``NT`` forms that OpenBLAS's small-matrix kernels run fastest,
on rows that lie close together (rows 32 KB apart, as a stride-128 head's keys are in
natural order, are slow: hence the copies of :mod:`._forward` and :mod:`._backward`),
with the BLAS library held to one thread while the kernel runs, since every kernel
thread calls it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["single_threaded_blas", "blas_thread_counts", "_gemm", "_N", "_T", "_threads_for"]


# --------------------------------------------------------------------- BLAS
@intrinsic
def _gemm(typingctx, ta, tb, m, n, k, alpha, a, aoff, lda, b, boff, ldb, beta, c, coff,
          ldc):  # pragma: no cover - compiled
    """Column-major ``C = alpha op(A) op(B) + beta C`` (BLAS ``?gemm``) on flat arrays.

    ``a``, ``b``, ``c``: 1-D arrays of one float dtype; the matrices start at
    element offsets ``aoff``, ``boff``, ``coff`` with leading dimensions ``lda``,
    ``ldb``, ``ldc`` (in elements), so strided row sets are used in place.
    ``ta``, ``tb``: ``ord("N")`` or ``ord("T")``. Calls numba's own BLAS entry
    (``numba_xxgemm``, scipy's BLAS), the one ``np.dot`` uses.
    """
    if not (isinstance(a, types.Array) and a.ndim == 1 and a.dtype in (types.float32, types.float64)):
        return None
    dt = a.dtype
    sig = types.int32(ta, tb, m, n, k, alpha, a, aoff, lda, b, boff, ldb, beta, c, coff, ldc)

    def codegen(context, builder, signature, args):
        (ta_, tb_, m_, n_, k_, al_, a_, ao_, lda_, b_, bo_, ldb_, be_, c_, co_, ldc_) = args
        ty = signature.args
        ll_char = ir.IntType(8)
        intp = context.get_value_type(types.intp)
        vp = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [ll_char, ll_char, ll_char, intp, intp, intp,
                                                vp, vp, intp, vp, intp, vp, vp, intp])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "numba_xxgemm")

        def num(v, t, to=types.intp):
            return context.cast(builder, v, t, to)

        def ptr(v, t, off, offt):
            ary = context.make_array(t)(context, builder, v)
            return builder.bitcast(builder.gep(ary.data, [num(off, offt)]), vp)

        def slot(v, t):
            return builder.bitcast(cgutils.alloca_once_value(builder, num(v, t, dt)), vp)

        kind = ir.Constant(ll_char, ord("s" if dt == types.float32 else "d"))
        return builder.call(fn, (
            kind, builder.trunc(num(ta_, ty[0]), ll_char), builder.trunc(num(tb_, ty[1]), ll_char),
            num(m_, ty[2]), num(n_, ty[3]), num(k_, ty[4]), slot(al_, ty[5]),
            ptr(a_, ty[6], ao_, ty[7]), num(lda_, ty[8]), ptr(b_, ty[9], bo_, ty[10]),
            num(ldb_, ty[11]), slot(be_, ty[12]), ptr(c_, ty[13], co_, ty[14]), num(ldc_, ty[15])))

    return sig, codegen


_N, _T = ord("N"), ord("T")


# --------------------------------------------------------------------- BLAS threads
def _openblas_controls() -> list[tuple]:
    """``(set, get)`` thread-count functions of every OpenBLAS loaded in this process."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return found
    for path in sorted(paths):
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("", "64_"):
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                    found.append((setter, getter))
                    break
            else:
                continue
            break
    return found


_CONTROLS: list[tuple] | None = None
#: Calls inside :func:`single_threaded_blas` now, and the thread counts saved by the first.
_HOLD: dict = {"depth": 0, "saved": []}
_HOLD_LOCK = threading.Lock()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Hold every loaded OpenBLAS to one thread while any kernel call runs, then restore it.

    The kernels call BLAS from each of their own threads; a multi-threaded BLAS
    inside would oversubscribe the cores (and OpenBLAS warns about OpenMP loops).
    OpenBLAS has one thread count per process, so the holds of concurrent calls
    (several Python threads running kernels at once, or a nested call) are
    counted under a lock: the first to enter saves the thread counts and sets 1,
    the last to leave restores what the first saved. Between two calls, and
    after them, the process's setting is its own again.

    Examples
    --------
    >>> with single_threaded_blas():
    ...     pass
    """
    global _CONTROLS
    import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls this BLAS)

    with _HOLD_LOCK:
        if _CONTROLS is None:
            _CONTROLS = _openblas_controls()
        if _HOLD["depth"] == 0:
            _HOLD["saved"] = [(setter, getter()) for setter, getter in _CONTROLS]
            for setter, _ in _HOLD["saved"]:
                setter(1)
        _HOLD["depth"] += 1
    try:
        yield
    finally:
        with _HOLD_LOCK:
            _HOLD["depth"] -= 1
            if _HOLD["depth"] == 0:
                for setter, old in _HOLD["saved"]:
                    setter(old)
                _HOLD["saved"] = []


def blas_thread_counts() -> list[int]:
    """The thread count of every loaded OpenBLAS, read through the controls
    :func:`single_threaded_blas` sets (empty where none is found).

    Examples
    --------
    >>> all(c >= 1 for c in blas_thread_counts())
    True
    """
    global _CONTROLS
    import scipy.linalg.cython_blas  # noqa: F401

    with _HOLD_LOCK:
        if _CONTROLS is None:
            _CONTROLS = _openblas_controls()
        return [getter() for _, getter in _CONTROLS]


_SMALL_FLOPS = 5e7  # below this (about a millisecond), one thread beats waking up more


@contextlib.contextmanager
def _threads_for(flops: float) -> Iterator[None]:
    """Run small problems on one thread (a parallel region costs more than they do);
    larger ones hand out loop iterations in small chunks, so that a thread slowed down
    (by uneven rows, or by a busy machine) does not hold the others up."""
    before = numba.get_num_threads()
    chunk = numba.get_parallel_chunksize()
    if flops < _SMALL_FLOPS:
        numba.set_num_threads(1)
    else:
        numba.set_parallel_chunksize(2)
    try:
        yield
    finally:
        numba.set_num_threads(before)
        numba.set_parallel_chunksize(chunk)
