"""Exact recomputation of chosen rows of attention and of its gradients.

A fused kernel computes whole tiles: in a partial tile the masked pairs are
multiplied too, and ``0 * NaN`` is NaN, so one NaN or inf in ``k`` or ``v`` can
reach rows that never attend it. :func:`repair_forward` and
:func:`repair_backward` (called by :func:`~sparse_patterns.kernels.attention`
and :func:`~sparse_patterns.kernels.attention_backward` after every backend)
find the non-finite rows with one reduction that allocates ``(B, H, n)``, and
only when there is one recompute exactly those rows from the pattern's pairs:
the keys a query row attends (:func:`row_keys`) or the queries that attend a
key row (:func:`key_queries`), decoded from the plan's tiles, gathered a
bounded chunk at a time, in the compute dtype with IEEE arithmetic on the
attended pairs only, as the dense reference does. A row that attends a
non-finite value stays non-finite; a row that does not gets its finite value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .planning import ExecutionPlan

__all__ = ["nonfinite_rows", "row_keys", "key_queries", "exact_rows", "exact_grad_rows",
           "repair_forward", "repair_backward"]

#: Elements (pairs times ``d``) gathered at once; a single row larger than this is
#: still taken whole (its keys times ``d`` is at most the size of ``k``).
_CHUNK = 1 << 21


# ----------------------------------------------------------------------- arrays of either kind
def _is_torch(a: Any) -> bool:
    return type(a).__module__.startswith("torch")


def _compute(a: Any) -> type:
    """The compute dtype (NumPy) of an array or tensor: float64 for float64, else float32."""
    return np.float64 if str(a.dtype).removeprefix("torch.") == "float64" else np.float32


def _host(a: Any) -> Any:
    """A CPU tensor NumPy can read as a NumPy view (its reductions are the faster here);
    anything else as it is."""
    if _is_torch(a) and a.device.type == "cpu" and str(a.dtype) != "torch.bfloat16":
        return a.detach().numpy()
    return a


def _numba_device(a: Any) -> bool:
    """A numba-cuda device array (``impl="cuda"``): its rows stay as the kernel wrote them;
    reading it here would copy the whole array to the host on every call."""
    return hasattr(a, "copy_to_host") and not _is_torch(a)


def _total(a: Any) -> float:
    """The sum of every element in the compute dtype: finite unless an element is NaN or
    inf (or the sum overflows)."""
    a = _host(a)
    if _is_torch(a):
        import torch  # noqa: PLC0415

        return float(a.sum(dtype=torch.float64 if a.dtype == torch.float64 else torch.float32))
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.add.reduce(a, axis=None, dtype=_compute(a)))


def nonfinite_rows(*arrays: Any, lse: Any = None) -> np.ndarray:
    """``int64 (R, 3)``: the ``(b, h, i)`` where a row of any of ``arrays`` is not finite.

    First one sum of each array (nothing allocated): when every sum is finite, so is
    every row, and that is all it costs. Otherwise one reduction per array over its
    last axis, in the compute dtype (``(B, H, n)``); a finite row whose sum overflows
    is reported too (its exact recomputation then costs a little and changes
    nothing). With ``lse``, a row whose log-sum-exp is NaN or ``+inf`` is reported as
    well (``-inf`` is a row without keys).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.ones((1, 2, 4, 3), np.float32)
    >>> x[0, 1, 2, 0] = np.nan
    >>> nonfinite_rows(x).tolist()
    [[0, 1, 2]]
    """
    tot = [_total(a) for a in arrays]
    lse_tot = _total(lse) if lse is not None else 0.0
    if all(np.isfinite(tot)) and not (np.isnan(lse_tot) or lse_tot == np.inf):
        return np.empty((0, 3), np.int64)
    bad = None
    for a in arrays:
        a = _host(a)
        if _is_torch(a):
            import torch  # noqa: PLC0415

            ct = torch.float64 if a.dtype == torch.float64 else torch.float32
            b = ~torch.isfinite(a.sum(-1, dtype=ct))
            b = b.cpu().numpy()
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                b = ~np.isfinite(a.sum(axis=-1, dtype=_compute(a)))
        bad = b if bad is None else bad | b
    if lse is not None:
        ls = _host(lse)
        ls = ls.float().cpu().numpy() if _is_torch(ls) else ls
        b = np.isnan(ls) | (ls == np.inf)
        bad = b if bad is None else bad | b
    return np.argwhere(bad).astype(np.int64)


# ----------------------------------------------------------------------- the pairs of a row
def _inverse(plan: ExecutionPlan, side: str, p: int) -> np.ndarray:
    """Token -> position in piece ``p``'s query (``side="q"``) or key order."""
    def build() -> np.ndarray:
        perm = (plan.qperm if side == "q" else plan.kperm)[p]
        inv = np.empty(plan.n, np.int64)
        inv[perm] = np.arange(plan.n)
        return inv

    return plan.memo(("exact_rows.inverse", side, int(p)), build)


def _tile_rows(plan: ExecutionPlan) -> np.ndarray:
    return plan.memo("exact_rows.tile_rows", plan.tile_rows)


def _decode(plan: ExecutionPlan, group: int, tokens: np.ndarray,
            by_key: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(ptr, tokens)`` of the pairs of ``tokens`` in ``group``: the keys each query
    token attends, or (``by_key``) the queries that attend each key token."""
    blk, nb, n = plan.block, plan.nb, plan.n
    tokens = np.asarray(tokens, np.int64)
    segs, toks = [], []
    ar = np.arange(blk)
    for p in np.flatnonzero(plan.piece_group == group):
        inv = _inverse(plan, "k" if by_key else "q", p)
        x = inv[tokens]
        own, at = x // blk, x % blk  # this token's block and place in it
        if by_key:
            ptr, which = plan.column_index()
        else:
            ptr, which = plan.tile_ptr, None
        lo, hi = ptr[p * nb + own], ptr[p * nb + own + 1]
        cnt = hi - lo
        row = np.repeat(np.arange(tokens.size), cnt)
        t = lo[row] + np.arange(row.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        if by_key:
            t = which[t]
            other, perm = _tile_rows(plan)[t], plan.qperm[p]
        else:
            other, perm = plan.tile_col[t].astype(np.int64), plan.kperm[p]
        sel = ar[None, :] < np.minimum(blk, n - other * blk)[:, None]  # (E, blk) in range
        m = plan.tile_mask[t]
        part = np.flatnonzero(m >= 0)
        if part.size:
            mp, ap = m[part], at[row[part]]
            if by_key:  # bit ``ap`` of every row of the tile's mask
                w = plan.masks[mp[:, None], ar[None, :], (ap // 64)[:, None]]
                bits = ((w >> (ap % 64).astype(np.uint64)[:, None]) & np.uint64(1)).astype(bool)
            else:  # row ``ap`` of the tile's mask
                w = np.ascontiguousarray(plan.masks[mp, ap])  # (Ep, W) uint64
                bits = np.unpackbits(w.view(np.uint8), axis=1, bitorder="little")[:, :blk]
                bits = bits.astype(bool)
            sel[part] &= bits
        e, c = np.nonzero(sel)
        segs.append(row[e])
        toks.append(perm[other[e] * blk + c].astype(np.int64))
    seg = np.concatenate(segs) if segs else np.empty(0, np.int64)
    tok = np.concatenate(toks) if toks else np.empty(0, np.int64)
    order = np.argsort(seg, kind="stable")
    ptr = np.zeros(tokens.size + 1, np.int64)
    np.cumsum(np.bincount(seg, minlength=tokens.size), out=ptr[1:])
    return ptr, tok[order]


def row_keys(plan: ExecutionPlan, group: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(ptr, keys)``: the keys each query token of ``rows`` attends in softmax ``group``.

    Decoded from the plan's tiles (a plan covers its pattern exactly), so it needs
    no Pattern; memory in proportion to the tiles of ``rows``.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pl = sps.plan(sps.make("strided", 16, stride=4), block=4, mode="merged")
    >>> ptr, keys = row_keys(pl, 0, np.array([9]))
    >>> sorted(keys.tolist())
    [1, 5, 6, 7, 8, 9]
    """
    return _decode(plan, group, rows, by_key=False)


def key_queries(plan: ExecutionPlan, group: int,
                keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(ptr, queries)``: the query tokens that attend each key token of ``keys``.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pl = sps.plan(sps.make("strided", 16, stride=4), block=4, mode="merged")
    >>> ptr, qs = key_queries(pl, 0, np.array([14]))
    >>> sorted(qs.tolist())
    [14, 15]
    """
    return _decode(plan, group, keys, by_key=True)


def _row_bound(plan: ExecutionPlan, group: int, by_key: bool) -> int:
    """An upper bound on the pairs of one row of ``group`` (tiles per block times ``block``)."""
    def build() -> int:
        nb, tot = plan.nb, 0
        ptr = plan.column_index()[0] if by_key else plan.tile_ptr
        for p in np.flatnonzero(plan.piece_group == group):
            c = np.diff(ptr[p * nb:(p + 1) * nb + 1])
            tot += int(c.max()) if c.size else 0
        return max(1, tot * plan.block)

    return plan.memo(("exact_rows.bound", int(group), by_key), build)


def _chunks(plan: ExecutionPlan, rows: np.ndarray, d: int, by_key: bool):
    """Yield ``(sel, group)``: indices into ``rows`` of one softmax group, a bounded chunk."""
    G = plan.num_groups
    g_of = rows[:, 1] % G
    for g in np.unique(g_of):
        idx = np.flatnonzero(g_of == g)
        step = max(1, _CHUNK // (_row_bound(plan, int(g), by_key) * max(d, 1)))
        for s in range(0, idx.size, step):
            yield idx[s:s + step], int(g)


class _Gather:
    """Rows of ``(B, H, n, ...)`` arrays or tensors, as NumPy arrays in the compute dtype."""

    def __init__(self, like: Any, ct: type):
        self.torch = _is_torch(like)
        self.ct = ct
        if self.torch:
            import torch  # noqa: PLC0415

            self.t = torch
            self.device = like.device
            self.tct = torch.float64 if ct is np.float64 else torch.float32

    def __call__(self, x: Any, b: np.ndarray, h: np.ndarray, i: np.ndarray) -> np.ndarray:
        if self.torch:
            ix = [self.t.from_numpy(a).to(self.device) for a in (b, h, i)]
            return x[ix[0], ix[1], ix[2]].to(self.tct).cpu().numpy()
        return np.asarray(x[b, h, i], dtype=self.ct)

    def put(self, x: Any, rows: np.ndarray, vals: np.ndarray) -> None:
        b, h, i = rows.T
        if self.torch:
            ix = [self.t.from_numpy(np.ascontiguousarray(a)).to(x.device) for a in (b, h, i)]
            with self.t.no_grad():
                x[ix[0], ix[1], ix[2]] = self.t.from_numpy(vals).to(x.device, x.dtype)
        else:
            x[b, h, i] = vals.astype(x.dtype, copy=False)


def _segments(ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cnt = np.diff(ptr)
    nz = cnt > 0
    return np.repeat(np.arange(cnt.size), cnt), nz, ptr[:-1][nz]


# ----------------------------------------------------------------------- forward
def exact_rows(q: Any, k: Any, v: Any, plan: ExecutionPlan, rows: np.ndarray,
               scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``(out, lse)`` of the ``(b, h, i)`` in ``rows``, recomputed from their attended pairs.

    ``out`` is ``(R, d)`` and ``lse`` ``(R,)``, in the compute dtype (float64 for
    float64 inputs, else float32). As the dense reference: the scores, their
    maximum (0 when every score is ``-inf``), the softmax and ``P V`` over the
    attended keys only, in IEEE arithmetic, so a NaN or inf key or value reaches
    exactly the rows that attend it.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 16, stride=4)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 8))
    >>> ref, lse = sps.attention(x, x, x, pat, impl="reference", return_lse=True)
    >>> o, l = exact_rows(x, x, x, sps.plan(pat), np.array([[0, 1, 9]]), 8 ** -0.5)
    >>> bool(np.allclose(o[0], ref[0, 1, 9])), bool(np.isclose(l[0], lse[0, 1, 9]))
    (True, True)
    """
    rows = np.asarray(rows, np.int64).reshape(-1, 3)
    ct = _compute(q)
    get = _Gather(q, ct)
    d = int(q.shape[-1])
    out = np.zeros((rows.shape[0], d), ct)
    lse = np.full(rows.shape[0], -np.inf, ct)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for sel, g in _chunks(plan, rows, d, by_key=False):
            b, h, i = rows[sel].T
            ptr, keys = row_keys(plan, g, i)
            seg, nz, starts = _segments(ptr)
            Q = get(q, b, h, i)  # (R, d)
            K = get(k, b[seg], h[seg], keys)  # (E, d)
            V = get(v, b[seg], h[seg], keys)
            s = np.einsum("ed,ed->e", Q[seg], K) * ct(scale)
            mx = np.full(sel.size, -np.inf, ct)
            tot = np.zeros(sel.size, ct)
            o = np.zeros((sel.size, d), ct)
            if starts.size:
                mx[nz] = np.maximum.reduceat(s, starts)  # NaN where an attended score is NaN
                mx[np.isneginf(mx)] = 0.0  # no keys, or every score -inf
                e = np.exp(s - mx[seg])
                tot[nz] = np.add.reduceat(e, starts)
                p = e / np.where(tot == 0, ct(1), tot)[seg]
                o[nz] = np.add.reduceat(p[:, None] * V, starts, axis=0)
            else:
                mx[:] = 0.0
            out[sel] = o
            lse[sel] = np.log(tot) + mx
    return out, lse


def repair_forward(q: Any, k: Any, v: Any, plan: ExecutionPlan, scale: float, out: Any,
                   lse: Any = None) -> None:
    """Recompute, in place, the rows of ``out`` (and ``lse``) that are not finite.

    The check is one reduction of ``out`` (and a look at ``lse``); nothing more
    runs when every row is finite.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("local", 8, window=2)
    >>> x = np.ones((1, 1, 8, 2))
    >>> out = np.full_like(x, np.nan)  # a wrong result: every row NaN
    >>> repair_forward(x, x, x, sps.plan(pat), 1.0, out)
    >>> bool(np.allclose(out, 1.0))
    True
    """
    if _numba_device(out):
        return
    rows = nonfinite_rows(out, lse=lse)
    if not rows.shape[0]:
        return
    o, ls = exact_rows(q, k, v, plan, rows, scale)
    put = _Gather(out, o.dtype.type)
    put.put(out, rows, o)
    if lse is not None:
        put.put(lse, rows, ls)


# ----------------------------------------------------------------------- backward
def exact_grad_rows(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan,
                    rows: np.ndarray, scale: float, *,
                    of: str) -> tuple[np.ndarray, ...]:
    """Gradient rows recomputed from their pairs and the forward's ``lse``.

    ``of="q"``: ``dq`` of the query rows ``(b, h, i)``, over the keys ``i`` attends.
    ``of="kv"``: ``(dk, dv)`` of the key rows ``(b, h, j)``, over the queries that
    attend ``j``. With ``P = exp(scale q.k - lse)`` (0 for a row whose ``lse`` is
    ``-inf``), ``D_i = rowsum(do_i * o_i)`` and ``dS = P (do_i . v_j - D_i)``:
    ``dq_i = scale sum_j dS k_j``, ``dk_j = scale sum_i dS q_i``,
    ``dv_j = sum_i P do_i``; IEEE arithmetic on the attended pairs only, as the
    dense reference. Arrays ``(R, d)`` in the compute dtype.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 16, stride=4)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 8))
    >>> o, lse = sps.attention(x, x, x, pat, impl="reference", return_lse=True)
    >>> dq, dk, dv = sps.kernels.attention_backward(x, x, x, o, lse, x, pat, impl="reference")
    >>> r = np.array([[0, 0, 5]])
    >>> g, = exact_grad_rows(x, x, x, o, lse, x, sps.plan(pat), r, 8 ** -0.5, of="q")
    >>> gk, gv = exact_grad_rows(x, x, x, o, lse, x, sps.plan(pat), r, 8 ** -0.5, of="kv")
    >>> [bool(np.allclose(a, b[0, 0, 5])) for a, b in ((g[0], dq), (gk[0], dk), (gv[0], dv))]
    [True, True, True]
    """
    rows = np.asarray(rows, np.int64).reshape(-1, 3)
    ct = _compute(q)
    get = _Gather(q, ct)
    d = int(q.shape[-1])
    by_key = of == "kv"
    g1 = np.zeros((rows.shape[0], d), ct)
    g2 = np.zeros((rows.shape[0], d), ct) if by_key else None
    sc = ct(scale)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for sel, g in _chunks(plan, rows, d, by_key=by_key):
            b, h, i = rows[sel].T
            ptr, other = (key_queries if by_key else row_keys)(plan, g, i)
            seg, nz, starts = _segments(ptr)
            if not starts.size:
                continue
            bs, hs = b[seg], h[seg]
            if by_key:  # this row is a key; the pairs' other ends are queries
                K, V = get(k, b, h, i)[seg], get(v, b, h, i)[seg]
                Q, DO, O = (get(a, bs, hs, other) for a in (q, do, o))
                L = get(lse[..., None], bs, hs, other)[:, 0]
                D = np.einsum("ed,ed->e", DO, O)
            else:
                Q, DO, O = (get(a, b, h, i) for a in (q, do, o))
                L = get(lse[..., None], b, h, i)[:, 0][seg]
                D = np.einsum("ed,ed->e", DO, O)[seg]
                Q, DO = Q[seg], DO[seg]
                K, V = get(k, bs, hs, other), get(v, bs, hs, other)
            s = np.einsum("ed,ed->e", Q, K) * sc
            P = np.where(np.isneginf(L), ct(0), np.exp(s - L))
            dS = P * (np.einsum("ed,ed->e", DO, V) - D)
            if by_key:
                g1[sel[nz]] = np.add.reduceat(dS[:, None] * Q, starts, axis=0) * sc
                g2[sel[nz]] = np.add.reduceat(P[:, None] * DO, starts, axis=0)
            else:
                g1[sel[nz]] = np.add.reduceat(dS[:, None] * K, starts, axis=0) * sc
    return (g1, g2) if by_key else (g1,)


def repair_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan,
                    scale: float, dq: Any, dk: Any, dv: Any) -> None:
    """Recompute, in place, the rows of ``dq``, ``dk`` and ``dv`` that are not finite.

    One reduction per gradient finds them; ``dq`` rows from the keys they attend,
    ``dk`` and ``dv`` rows (recomputed together) from the queries attending them.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("local", 8, window=2)
    >>> x = np.ones((1, 1, 8, 2))
    >>> o, lse = sps.attention(x, x, x, pat, return_lse=True)
    >>> dq, dk, dv = (np.full_like(x, np.inf) for _ in range(3))
    >>> repair_backward(x, x, x, o, lse, x, sps.plan(pat), 1.0, dq, dk, dv)
    >>> bool(np.allclose(dq, 0)), bool(np.isfinite(dv).all())
    (True, True)
    """
    if _numba_device(dq):
        return
    rows = nonfinite_rows(dq)
    if rows.shape[0]:
        (g,) = exact_grad_rows(q, k, v, o, lse, do, plan, rows, scale, of="q")
        _Gather(dq, g.dtype.type).put(dq, rows, g)
    rows = nonfinite_rows(dk, dv)
    if rows.shape[0]:
        gk, gv = exact_grad_rows(q, k, v, o, lse, do, plan, rows, scale, of="kv")
        put = _Gather(dk, gk.dtype.type)
        put.put(dk, rows, gk)
        put.put(dv, rows, gv)
