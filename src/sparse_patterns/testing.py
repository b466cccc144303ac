"""Brute-force references, written independently of the fast paths.

Every fast path in the package is compared with these in the tests: dense NumPy
oracles for the generators (straight from the definitions in DESIGN.md, one
``(i, j)`` pair at a time), and, in later sections, a BFS oracle for verification
and a dense masked-softmax oracle for attention. They are slow on purpose: use
them for n up to a few hundred.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["dense_oracle", "ORACLES"]


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return np.broadcast_to(i, (n, n)), np.broadcast_to(j, (n, n))


def _causal(mask: np.ndarray, causal: bool) -> np.ndarray:
    i, j = _grid(mask.shape[0])
    return mask & (j <= i) if causal else mask


def oracle_full(n, causal=True):
    return [_causal(np.ones((n, n), bool), causal)]


def oracle_strided(n, stride, window="paper", causal=True):
    i, j = _grid(n)
    w = stride if window == "paper" else stride - 1
    a1 = np.abs(i - j) <= w
    a2 = (i - j) % stride == 0
    return [_causal(a1, causal), _causal(a2, causal)]


def oracle_fixed(n, stride, c=None, summary_heads=1, causal=True):
    c = max(1, stride // 8) if c is None else c
    i, j = _grid(n)
    heads = [_causal(i // stride == j // stride, causal)]
    for h in range(summary_heads):
        lo, hi = stride - (h + 1) * c, stride - h * c
        heads.append(_causal((j % stride >= lo) & (j % stride < hi), causal))
    return heads


def oracle_dilated(n, window, dilation, causal=True):
    i, j = _grid(n)
    d = i - j
    m = (d % dilation == 0) & (np.abs(d) <= window * dilation)
    return [_causal(m, causal)]


def oracle_local(n, window, causal=True):
    return oracle_dilated(n, window, 1, causal)


def oracle_axial2d(n, height, width, causal=True):
    i, j = _grid(n)
    return [_causal(i // width == j // width, causal), _causal(i % width == j % width, causal)]


def oracle_local2d(n, height, width, query_block, memory, causal=True):
    m = np.zeros((n, n), bool)
    for i in range(n):
        ri, ci = divmod(i, width)
        r0, c0 = ri // query_block * query_block, ci // query_block * query_block
        for j in range(n):
            rj, cj = divmod(j, width)
            below = r0 + query_block - 1 + (0 if causal else memory)
            if r0 - memory <= rj <= below and c0 - memory <= cj <= c0 + query_block - 1 + memory:
                m[i, j] = True
    return [_causal(m, causal)]


def oracle_factorized(n, p, causal=True):
    l = 1
    while l**p < n:
        l += 1
    i, j = _grid(n)
    d = np.abs(i - j)
    return [_causal((d % l ** (m - 1) == 0) & (d < l**m), causal) for m in range(1, p + 1)]


def oracle_longformer(n, window, global_tokens, dilation=1, causal=True):
    i, j = _grid(n)
    glob = (i < global_tokens) | (j < global_tokens)
    return [oracle_dilated(n, window, dilation, causal)[0], _causal(glob, causal)]


ORACLES = {
    "full": oracle_full,
    "strided": oracle_strided,
    "fixed": oracle_fixed,
    "local": oracle_local,
    "dilated": oracle_dilated,
    "axial2d": oracle_axial2d,
    "local2d": oracle_local2d,
    "factorized": oracle_factorized,
    "longformer": oracle_longformer,
}


def dense_oracle(name: str, n: int, **params) -> np.ndarray:
    """Dense ``bool (p, n, n)`` heads of a registered family, from its definition.

    BigBird is random at block level, so it has no independent oracle here; its
    tests check the block structure instead.

    Examples
    --------
    >>> dense_oracle("strided", 5, stride=2)[1].astype(int)
    array([[1, 0, 0, 0, 0],
           [0, 1, 0, 0, 0],
           [1, 0, 1, 0, 0],
           [0, 1, 0, 1, 0],
           [1, 0, 1, 0, 1]])
    """
    if name not in ORACLES:
        raise ValueError(f"name: no dense oracle for {name!r}; have {', '.join(ORACLES)}")
    assert math.isfinite(n)
    return np.stack(ORACLES[name](n, **params))


def document_oracle(name: str, lengths, **params) -> np.ndarray:
    """Dense ``bool (p, n, n)``: the family on each document alone, on the block diagonal.

    Examples
    --------
    >>> document_oracle("full", [2, 1])[0].astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [0, 0, 1]])
    """
    parts = [dense_oracle(name, int(length), **params) for length in lengths]
    n = sum(int(length) for length in lengths)
    out = np.zeros((parts[0].shape[0], n, n), dtype=bool)
    o = 0
    for part in parts:
        length = part.shape[1]
        out[:, o:o + length, o:o + length] = part
        o += length
    return out


__all__ += ["document_oracle"]


# ---------------------------------------------------------------------------
# BFS oracle for verification (issue 3): the paper's criteria from the
# definitions, one output row and one step count at a time, with Python sets.
# ---------------------------------------------------------------------------

__all__ += ["bfs_hops", "bfs_verify", "bfs_depth"]


def _bfs_steps(heads, p, mode):
    """Dense bool (n, n) matrix of every step 1..p."""
    hs = np.asarray(heads, dtype=bool)
    if hs.ndim == 2:
        hs = hs[None]
    p = hs.shape[0] if p is None else int(p)
    if mode == "interleaved":
        return [hs[m % hs.shape[0]] for m in range(p)], hs.shape[0]
    u = hs.any(axis=0)
    return [u] * p, 1


def bfs_hops(heads, p=None, mode="interleaved", residual=True, causal=True):
    """Hop distances by brute force: ``(hops, in_last)`` for dense heads ``(H, n, n)``.

    For every output i and every k <= p, the set ``R_k(i)`` is built by a plain
    layered BFS backwards from i: layer 0 is ``{i}``, layer t is the union of
    the step ``k - t + 1`` rows of layer t - 1 (plus the layer itself when
    ``residual``). ``hops[i, j]`` is 0 for non-target pairs (``j > i`` when
    causal), the least k with ``j in R_k(i)``, or -1; ``in_last[i, j]`` says
    whether ``j in R_p(i)``. Slow on purpose (n up to a few hundred).

    Examples
    --------
    >>> import numpy as np
    >>> a1 = np.tril(np.ones((3, 3), bool)) & ~np.tril(np.ones((3, 3), bool), -2)
    >>> bfs_hops([a1, a1])[0]
    array([[1, 0, 0],
           [1, 1, 0],
           [2, 1, 1]])
    """
    steps, _ = _bfs_steps(heads, p, mode)
    p = len(steps)
    n = steps[0].shape[0]
    rows = [[set(np.flatnonzero(m[a]).tolist()) for a in range(n)] for m in steps]
    hops = np.zeros((n, n), dtype=np.int64)
    in_last = np.zeros((n, n), dtype=bool)
    for i in range(n):
        targets = range(i + 1) if causal else range(n)
        for j in targets:
            hops[i, j] = -1
        for k in range(1, p + 1):
            layer = {i}
            for t in range(1, k + 1):
                step = k - t  # 0-based index of step k - t + 1
                nxt = set()
                for a in layer:
                    nxt |= rows[step][a]
                    if residual:
                        nxt.add(a)
                layer = nxt
            for j in layer:
                if (not causal or j <= i) and hops[i, j] == -1:
                    hops[i, j] = k
                if k == p:
                    in_last[i, j] = True
    return hops, in_last


def bfs_verify(heads, p=None, mode="interleaved", residual=True, causal=True):
    """The criteria and the hop histogram from :func:`bfs_hops`, as a dict."""
    hops, in_last = bfs_hops(heads, p, mode, residual, causal)
    n = hops.shape[0]
    target = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
    p = len(_bfs_steps(heads, p, mode)[0])
    c1 = bool(in_last[target].all())
    c2 = bool((hops[target] > 0).all())
    return {
        "criterion1": c1,
        "criterion2": c2,
        "hops": {k: int((hops == k).sum()) for k in range(1, p + 1)},
        "unreachable": int((hops == -1).sum()),
        "not_in_last": int((target & ~in_last).sum()),
        "hop_matrix": hops,
        "in_last": in_last,
    }


def bfs_depth(heads, p=None, mode="interleaved", residual=True, causal=True):
    """Least K such that every target pair is in some ``R_k``, k <= K, or None.

    Steps repeat with period p (interleaved) or use the union (merged). Each
    input j is pushed forward one step at a time, ``F_K = {b : M_K(b) meets
    F_{K-1}}``, until every target output was reached or the state
    ``(F_K, K mod period)`` repeats.
    """
    hs = np.asarray(heads, dtype=bool)
    if hs.ndim == 2:
        hs = hs[None]
    p = hs.shape[0] if p is None else int(p)
    n = hs.shape[1]
    if mode == "interleaved":
        mats = [hs[m] for m in range(p)]
    else:
        mats = [hs.any(axis=0)]
    if residual:
        mats = [m | np.eye(n, dtype=bool) for m in mats]
    period = len(mats)
    worst = 0
    for j in range(n):
        want = np.zeros(n, bool)
        want[j:] = True
        if not causal:
            want[:] = True
        got = np.zeros(n, bool)
        f = np.zeros(n, bool)
        f[j] = True
        seen = set()
        K = 0
        while not got[want].all():
            state = (f.tobytes(), K % period)
            if state in seen:
                return None
            seen.add(state)
            f = mats[K % period][:, f].any(axis=1)
            K += 1
            newly = f & ~got
            if (newly & want).any():
                worst = max(worst, K)
            got |= f
    return worst


# --------------------------------------------------------------------------------------
# Attention oracle (kernels): dense masked softmax, float64, one row at a time.

__all__ += ["attention_masks", "attention_oracle"]


def attention_masks(pattern, mode: str, num_heads: int) -> np.ndarray:
    """Dense ``bool (num_heads, n, n)``: the keys each attention head's rows attend.

    ``multihead``: head ``h`` uses pattern head ``h % p``; ``merged``: every head
    uses the union of the pattern's heads. Built from the CSR rows directly.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> attention_masks(sps.make("strided", 4, stride=2), "merged", 1)[0].astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 0],
           [0, 1, 1, 1]])
    """
    n, p = pattern.n, pattern.num_heads
    dense = np.zeros((p, n, n), dtype=bool)
    for m, head in enumerate(pattern.heads):
        for i in range(n):
            dense[m, i, head.indices[head.indptr[i]:head.indptr[i + 1]]] = True
    if mode == "merged":
        return np.broadcast_to(dense.any(axis=0), (num_heads, n, n))
    if mode == "multihead":
        return dense[np.arange(num_heads) % p]
    raise ValueError(f"mode: must be 'multihead' or 'merged', got {mode!r}")


def attention_oracle(q, k, v, masks, scale=None):
    """Masked softmax attention in float64, row by row: ``(out, lse)``.

    ``q, k, v``: ``(B, H, n, d)``; ``masks``: ``bool (H, n, n)``. A row with no
    keys gives a zero output and ``lse = -inf``. Slow on purpose (n up to a few
    hundred).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.arange(8.0).reshape(1, 1, 4, 2) / 8
    >>> out, lse = attention_oracle(x, x, x, np.tril(np.ones((1, 4, 4), bool)))
    >>> out[0, 0, 0].tolist(), bool(np.isfinite(lse).all())
    ([0.0, 0.125], True)
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, H, n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = np.zeros((B, H, n, d))
    lse = np.full((B, H, n), -np.inf)
    for b in range(B):
        for h in range(H):
            for i in range(n):
                keys = np.flatnonzero(masks[h, i])
                if keys.size == 0:
                    continue
                s = np.array([scale * float(np.dot(q[b, h, i], k[b, h, j])) for j in keys])
                top = s.max()
                w = np.exp(s - top)
                tot = w.sum()
                lse[b, h, i] = top + math.log(tot)
                out[b, h, i] = (w / tot) @ v[b, h, keys]
    return out, lse
