"""The dense reference implementation (``impl="reference"``): masked softmax attention.

It builds the ``(n, n)`` token mask of every softmax group and runs plain
float64 NumPy, forward and backward, so it is exact and slow; use it for small
``n`` (it refuses beyond ``pattern.DENSE_LIMIT`` mask cells). It follows the same
conventions as the fast kernels: a row with no keys gives zeros and a
log-sum-exp of ``-inf``.
"""

from __future__ import annotations

import numpy as np

from ..pattern import Pattern
from .planning import ExecutionPlan

__all__ = ["group_masks", "reference_forward", "reference_backward"]


def group_masks(pattern: Pattern, mode: str) -> np.ndarray:
    """``bool (G, n, n)``: the token mask of every softmax group.

    ``multihead``: one per pattern head; ``merged``: the union.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> group_masks(sps.make("strided", 8, stride=2), "merged").shape
    (1, 8, 8)
    """
    if mode == "merged":
        return pattern.union().toarray()[None]
    return pattern.to_dense()


def _scores(q, k, masks, scale):
    B, H, n, _ = q.shape
    G = masks.shape[0]
    m = masks[np.arange(H) % G]  # (H, n, n)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    s = np.where(m[None], s, -np.inf)
    return s, m


def reference_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, pattern: Pattern, plan: ExecutionPlan,
    *, scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Dense masked softmax: ``(out, lse)`` with ``out`` in ``q``'s dtype.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 8, stride=2)
    >>> q = np.ones((1, 1, 8, 4))
    >>> o, lse = reference_forward(q, q, q, pat, sps.plan(pat), scale=0.5)
    >>> o.shape, lse.shape
    ((1, 1, 8, 4), (1, 1, 8))
    """
    masks = group_masks(pattern, plan.mode)
    q64, k64, v64 = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s, m = _scores(q64, k64, masks, scale)
    with np.errstate(invalid="ignore", over="ignore"):
        mx = s.max(axis=-1, keepdims=True)
        mx = np.where(np.isneginf(mx), 0.0, mx)
        e = np.where(m[None], np.exp(s - mx), 0.0)
        tot = e.sum(axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            lse = (np.log(tot) + mx)[..., 0]
        p = np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)
        out = np.einsum("bhij,bhjd->bhid", p, v64)
    return out.astype(q.dtype), lse.astype(q.dtype)


def reference_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
    do: np.ndarray, pattern: Pattern, plan: ExecutionPlan, *, scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense gradients ``(dq, dk, dv)`` recomputed from ``lse``.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("full", 4)
    >>> x = np.ones((1, 1, 4, 2))
    >>> pl = sps.plan(pat)
    >>> o, lse = reference_forward(x, x, x, pat, pl, scale=1.0)
    >>> [g.shape for g in reference_backward(x, x, x, o, lse, x, pat, pl, scale=1.0)]
    [(1, 1, 4, 2), (1, 1, 4, 2), (1, 1, 4, 2)]
    """
    masks = group_masks(pattern, plan.mode)
    q64, k64, v64, o64, do64 = (np.asarray(a, dtype=np.float64) for a in (q, k, v, o, do))
    s, m = _scores(q64, k64, masks, scale)
    lse64 = np.asarray(lse, dtype=np.float64)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(m[None] & np.isfinite(lse64), np.exp(s - lse64), 0.0)
        dv = np.einsum("bhij,bhid->bhjd", p, do64)
        dp = np.einsum("bhid,bhjd->bhij", do64, v64)
        delta = (do64 * o64).sum(-1, keepdims=True)
        ds = np.where(m[None], p * (dp - delta), 0.0)
        dq = np.einsum("bhij,bhjd->bhid", ds, k64) * scale
        dk = np.einsum("bhij,bhid->bhjd", ds, q64) * scale
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)
