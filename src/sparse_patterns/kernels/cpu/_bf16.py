"""When bf16 inputs run on bf16 products rather than widened to float32, forward and
backward: by AMX (:func:`amx_applies`) or by ``vdpbf16ps`` (:func:`bf16_applies`), from
the CPU, the plan and the head size, and the environment variable
``SPARSE_PATTERNS_BF16`` that overrides the measured choice.
"""

from __future__ import annotations

import functools
import os

from ._amx import amx_here
from ._llvm import _AVX512_BF16
from ._peak import fma_peak

__all__ = ["BF16_MODES", "amx_applies", "amx_products_here", "bf16_applies", "bf16_products_here",
           "_check_products"]


#: bf16 products for bf16 inputs: "auto" (forward and backward by AMX where
#: :func:`amx_applies`, else ``vdpbf16ps`` where :func:`bf16_applies`), "products"
#: (``vdpbf16ps`` wherever it can run, never AMX) or "widen" (never: widened to
#: float32); the environment variable ``SPARSE_PATTERNS_BF16`` sets it for a process
BF16_MODES = ("auto", "products", "widen")


def _bf16_mode() -> str:
    mode = os.environ.get("SPARSE_PATTERNS_BF16", "auto")
    if mode not in BF16_MODES:
        raise ValueError(
            f"SPARSE_PATTERNS_BF16 must be one of {', '.join(BF16_MODES)}, got {mode!r}"
        )
    return mode


@functools.lru_cache(maxsize=1)
def _bf16_faster() -> bool:
    """Whether one core's ``vdpbf16ps`` peak is at least 1.3x its float32 FMA peak,
    measured once per process (not again when :func:`fma_peak` measures anew)."""
    return fma_peak("bfloat16", 1) >= 1.3 * fma_peak("float32", 1)


def _tiles_fit(plan, d: int) -> bool:
    """Whether bf16 products can run over ``plan`` at head size ``d``: 32-token tiles,
    ``n`` and ``d`` multiples of 32 (a bad ``SPARSE_PATTERNS_BF16`` is an error whatever
    the plan)."""
    _bf16_mode()
    return plan.block == 32 and plan.n % 32 == 0 and d % 32 == 0


def bf16_products_here() -> bool:
    """Whether this process runs bf16 inputs on bf16 products where the plan and head
    size allow (:func:`bf16_applies`): AVX512_BF16, and ``SPARSE_PATTERNS_BF16=products``
    or (``auto``) a measured ``vdpbf16ps`` peak at least 1.3x the float32 FMA peak.

    Examples
    --------
    >>> isinstance(bf16_products_here(), bool)
    True
    """
    mode = _bf16_mode()
    if mode == "widen" or not _AVX512_BF16:
        return False
    return mode == "products" or _bf16_faster()


def bf16_applies(plan, d: int) -> bool:
    """Whether :func:`forward_bf16` runs bf16 inputs of head size ``d`` over ``plan``
    on bf16 products (else they are widened to float32 and :func:`forward` runs).

    It needs a CPU with AVX512_BF16, 32-token tiles (``plan.block == 32``), ``n`` and
    ``d`` multiples of 32, and, unless ``SPARSE_PATTERNS_BF16=products``, a
    ``vdpbf16ps`` peak at least 1.3x the float32 FMA peak, measured once per process
    on one core (:func:`._peak.fma_peak`, about 0.4 s); below it, widening is faster.
    ``vdpbf16ps`` and the conversions to bf16 flush subnormal inputs and results to zero
    (whatever the MXCSR says): products below float32's normal range (about 1e-38) come
    out 0.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> bf16_applies(sps.plan(sps.make("strided", 64, stride=8), block=16), 64)
    False
    """
    return _tiles_fit(plan, d) and bf16_products_here()


def _check_products(plan, n: int, d: int, amx: bool | None = False) -> bool:
    """A one-line ``ValueError`` where bf16 products cannot run (see :func:`bf16_applies`),
    or (``amx``) AMX cannot; else whether they are AMX's (``amx`` None: where
    :func:`amx_applies`)."""
    if not _AVX512_BF16 or plan.block != 32 or n % 32 or d % 32:
        raise ValueError(f"q: bf16 products need AVX512_BF16, block 32, n and d multiples of 32; "
                         f"got block {plan.block}, n={n}, d={d}")
    if amx and not amx_here():
        raise ValueError("amx: AMX products need a CPU with AMX-TILE and AMX-BF16 that Linux "
                         "lets this process use; got amx=True on a CPU without them")
    return amx_applies(plan, d) if amx is None else amx


def amx_products_here() -> bool:
    """Whether this process runs the bf16 products of the forward and the backward by
    AMX where the plan and head size allow (:func:`amx_applies`):
    ``SPARSE_PATTERNS_BF16=auto``, AVX512_BF16, and AMX that Linux lets the process use
    (:func:`._amx.amx_here`).

    Examples
    --------
    >>> isinstance(amx_products_here(), bool)
    True
    """
    return _bf16_mode() == "auto" and _AVX512_BF16 and amx_here()


def amx_applies(plan, d: int) -> bool:
    """Whether :func:`._forward.forward_bf16` runs the products of bf16 inputs of head
    size ``d`` over ``plan`` by AMX (``tdpbf16ps``, :mod:`._amx`): ``SPARSE_PATTERNS_BF16``
    is ``auto``, the CPU has AMX-TILE, AMX-BF16 and AVX512_BF16 and Linux lets this
    process use the tiles (:func:`._amx.amx_here`), ``plan.block == 32`` and ``n`` and
    ``d`` are multiples of 32. The backward's products (:func:`._backward.backward_bf16`)
    are then AMX's too; elsewhere they are ``vdpbf16ps``'s where :func:`bf16_applies`.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> amx_applies(sps.plan(sps.make("strided", 64, stride=8), block=16), 64)
    False
    """
    return _tiles_fit(plan, d) and amx_products_here()
