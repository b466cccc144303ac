"""The dense reference implementation (``impl="reference"``): masked softmax attention.

It builds the ``(n, n)`` token mask of each softmax group and runs plain float64
NumPy on one ``(n, n)`` score matrix at a time (one batch entry of one head),
forward and backward, so it is exact and slow; use it for small ``n``. Before
allocating anything it estimates its bytes (:func:`reference_bytes`) and refuses
above :func:`sparse_patterns.config.get_memory_limit` with a
:class:`~sparse_patterns.config.MemoryLimitError`.

It follows the conventions of the fast kernels: a row with no keys gives zeros
and a log-sum-exp of ``-inf``. NaN and inf propagate as in the row-by-row
definition (and in torch's scaled dot-product attention): a row whose attended
scores hold NaN gets NaN (output and log-sum-exp), and an attended value that is
NaN or inf reaches exactly the rows that attend it. Keys and values a row does
not attend never reach it (a dense product would spread them as ``0 * inf``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import config
from ..pattern import Pattern
from .backend import Backend
from .planning import ExecutionPlan

__all__ = ["BACKEND", "group_masks", "reference_bytes", "reference_forward", "reference_backward"]

#: Bytes per score cell ``(i, j)`` of one ``(n, n)`` slice: the float64 scores (backward:
#: the probabilities, then the score gradients), the mask and its complement, and at most
#: 26 more while :func:`_masked_matmul` counts non-finite values (a float64 copy of the
#: columns that meet them, boolean selections, float32 counts). The tests check it
#: against the traced peak with every value non-finite.
_CELL_BYTES = {"forward": 8 + 2 + 26, "backward": 8 + 2 + 26}
#: float64 ``(B, H, n, d)`` arrays alive at once: forward q, k, v, out (and its cast);
#: backward q, k, v, o, do, dq, dk, dv (and their casts).
_ARRAYS = {"forward": 5, "backward": 11}


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


def _group_mask(pattern: Pattern, mode: str, g: int) -> np.ndarray:
    """``bool (n, n)``: the token mask of softmax group ``g`` (one at a time)."""
    if mode == "merged":
        return pattern.union().toarray()
    return pattern.heads[g].toarray()


def reference_bytes(shape: tuple[int, int, int, int], *, backward: bool = False) -> int:
    """Bytes the reference allocates at most for ``(B, H, n, d)`` inputs.

    One ``(n, n)`` slice of scores at a time (:data:`_CELL_BYTES` per cell), plus
    the float64 copies of the ``(B, H, n, d)`` arrays and the log-sum-exp.

    Examples
    --------
    >>> reference_bytes((1, 8, 8192, 64)) > 1 << 30
    True
    """
    B, H, n, d = (int(x) for x in shape)
    key = "backward" if backward else "forward"
    return n * n * _CELL_BYTES[key] + 8 * B * H * n * (d * _ARRAYS[key] + 2)


def _check_fits(shape: tuple[int, ...], backward: bool) -> None:
    need = reference_bytes(tuple(shape), backward=backward)  # type: ignore[arg-type]
    limit = config.get_memory_limit()
    if need > limit:
        B, H, n, d = shape
        raise config.MemoryLimitError(
            f"impl: 'reference' computes dense (n, n) scores in float64; at (B, H, n, d) = "
            f"({B}, {H}, {n}, {d}) its {'backward' if backward else 'forward'} needs "
            f"{config.format_bytes(need)}, above the memory limit of "
            f"{config.format_bytes(limit)} (sparse_patterns.config.set_memory_limit); "
            "use impl='numba'"
        )


def _masked_matmul(p: np.ndarray, x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``out[r] = sum of p[r, c] * x[c]`` over the ``c`` with ``m[r, c]``, in IEEE arithmetic.

    ``p`` is 0 where ``m`` is False; a plain ``p @ x`` would turn a NaN or inf in
    a row ``x[c]`` that ``r`` does not attend into NaN (``0 * inf``). The finite
    part is one product; the non-finite entries of ``x`` (rows ``J``) are added
    from hit counts: NaN where an attended one is NaN, or is inf with ``p == 0``,
    or where both signs of inf meet; else ``+-inf`` with the sign of ``p * x``.
    """
    finite = np.isfinite(x)
    if finite.all():
        return p @ x
    out = p @ np.where(finite, x, 0.0)
    J = np.flatnonzero(~finite.all(axis=1))  # rows of x holding NaN or inf
    xj = x[J]
    pos = (xj == np.inf).astype(np.float32)
    neg = (xj == -np.inf).astype(np.float32)
    mj, pj = m[:, J], p[:, J]

    def hits(sel: np.ndarray, flags: np.ndarray) -> np.ndarray:
        return (sel.astype(np.float32) @ flags) > 0

    nan = hits(mj, np.isnan(xj).astype(np.float32))
    nan |= hits(mj & ~((pj > 0) | (pj < 0)), pos + neg)  # 0 * inf (or NaN p)
    up = pj > 0
    plus = hits(mj & up, pos)
    minus = hits(mj & up, neg)
    down = pj < 0
    plus |= hits(mj & down, neg)
    minus |= hits(mj & down, pos)
    out[plus] += np.inf
    out[minus] -= np.inf
    out[nan | (plus & minus)] = np.nan
    return out


def _slices(pattern: Pattern, mode: str, B: int, H: int):
    """Yield ``(b, h, mask, not_mask)`` for every batch entry and head, one group mask at a time."""
    G = 1 if mode == "merged" else pattern.num_heads
    for g in range(min(G, H)):
        m = _group_mask(pattern, mode, g)  # (n, n)
        notm = ~m
        for h in range(g, H, G):
            for b in range(B):
                yield b, h, m, notm
        del m, notm


def reference_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, pattern: Pattern, plan: ExecutionPlan,
    *, scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Dense masked softmax: ``(out, lse)`` with ``out`` in ``q``'s dtype.

    Raises
    ------
    MemoryLimitError
        (a ``ValueError``) when :func:`reference_bytes` passes the memory limit.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 8, stride=2)
    >>> q = np.ones((1, 1, 8, 4))
    >>> o, lse = reference_forward(q, q, q, pat, sps.plan(pat), scale=0.5)
    >>> o.shape, lse.shape
    ((1, 1, 8, 4), (1, 1, 8))
    >>> k = q.copy()
    >>> k[0, 0, 3, 0] = np.nan  # a NaN key: exactly the rows that attend key 3 are NaN
    >>> o, lse = reference_forward(q, k, q, pat, sps.plan(pat), scale=0.5)
    >>> np.isnan(lse[0, 0]).astype(int).tolist(), pat.heads[0][:, 3].T.toarray().astype(int).tolist()
    ([0, 0, 0, 1, 1, 1, 0, 0], [[0, 0, 0, 1, 1, 1, 0, 0]])
    """
    _check_fits(q.shape, backward=False)
    B, H, n, d = q.shape
    q64, k64, v64 = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    out = np.zeros((B, H, n, d))
    lse = np.full((B, H, n), -np.inf)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for b, h, m, notm in _slices(pattern, plan.mode, B, H):
            s = q64[b, h] @ k64[b, h].T  # (n, n)
            s *= scale
            np.putmask(s, notm, -np.inf)
            mx = s.max(axis=1)  # NaN where an attended score is NaN
            mx[np.isneginf(mx)] = 0.0  # rows with no keys
            s -= mx[:, None]
            np.exp(s, out=s)
            tot = s.sum(axis=1)
            lse[b, h] = np.log(tot) + mx
            s /= np.where(tot == 0, 1.0, tot)[:, None]  # a NaN total stays NaN
            out[b, h] = _masked_matmul(s, v64[b, h], m)
            del s
    return out.astype(q.dtype), lse.astype(q.dtype)


def reference_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
    do: np.ndarray, pattern: Pattern, plan: ExecutionPlan, *, scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense gradients ``(dq, dk, dv)`` recomputed from ``lse``.

    Rows without keys (``lse = -inf``) get zero gradients; NaN propagates as in
    the forward.

    Raises
    ------
    MemoryLimitError
        (a ``ValueError``) when :func:`reference_bytes` passes the memory limit.

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
    _check_fits(q.shape, backward=True)
    B, H, n, d = q.shape
    q64, k64, v64, o64, do64 = (np.asarray(a, dtype=np.float64) for a in (q, k, v, o, do))
    lse64 = np.asarray(lse, dtype=np.float64)
    dq, dk, dv = (np.zeros((B, H, n, d)) for _ in range(3))
    with np.errstate(invalid="ignore", over="ignore"):
        for b, h, m, notm in _slices(pattern, plan.mode, B, H):
            L = lse64[b, h]
            p = q64[b, h] @ k64[b, h].T  # (n, n): the probabilities, recomputed
            p *= scale
            p -= L[:, None]
            np.exp(p, out=p)
            np.putmask(p, notm, 0.0)
            p[np.isneginf(L)] = 0.0  # rows with no keys
            dv[b, h] = _masked_matmul(p.T, do64[b, h], m.T)
            ds = do64[b, h] @ v64[b, h].T  # dp, then ds = p * (dp - delta)
            ds -= (do64[b, h] * o64[b, h]).sum(axis=1)[:, None]
            ds *= p
            del p
            np.putmask(ds, notm, 0.0)
            dq[b, h] = _masked_matmul(ds, k64[b, h], m)
            dk[b, h] = _masked_matmul(ds.T, q64[b, h], m.T)
            del ds
    dq *= scale
    dk *= scale
    return dq.astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)


class _Reference(Backend):
    """``impl="reference"``: the dense float64 oracle on the CPU (small ``n``)."""

    name = "reference"
    description = "dense masked softmax in float64 on the CPU (an oracle for small n)"
    devices = ("cpu",)
    kinds = ("numpy", "torch")
    blocks = {"cpu": 32}
    needs_pattern = True

    def forward(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                pattern: Pattern | None = None, scale: float | None = None,
                return_lse: bool = False) -> Any:
        from .inputs import HostArrays, check_scale  # noqa: PLC0415 - numba, on first call

        x = HostArrays({"q": q, "k": k, "v": v}, plan.n)
        a = x.np
        o, lse = reference_forward(a["q"], a["k"], a["v"], pattern, plan,
                                   scale=check_scale(scale, x.shape[3], x.compute.__name__))
        return (x.out(o), x.out(lse, lse=True)) if return_lse else x.out(o)

    def backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan,
                 *, pattern: Pattern | None = None,
                 scale: float | None = None) -> tuple[Any, Any, Any]:
        from .inputs import HostArrays, check_scale  # noqa: PLC0415 - numba, on first call

        x = HostArrays({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}, plan.n)
        a = x.np
        grads = reference_backward(a["q"], a["k"], a["v"], a["o"], a["lse"], a["do"], pattern,
                                   plan, scale=check_scale(scale, x.shape[3], x.compute.__name__))
        return tuple(x.out(g) for g in grads)


#: The oracle backend (:class:`~sparse_patterns.kernels.backend.Backend`).
BACKEND = _Reference()
