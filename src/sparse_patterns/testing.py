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
