"""The two criteria at block granularity: verifying a :class:`BlockLayout`.

A set block connects its block pairs; the criteria of the Sparse Transformer
(Child et al. 2019, arXiv:1904.10509, section 4.1) are checked on block pairs
with word-level bitsets (the numba kernels of :mod:`._numba`). The check runs
twice, once through every set block and once through full blocks alone: when
the second also passes, every token pair is proven connected
(``certified``), and ``partial_pairs`` counts the block pairs that rely on a
partial block. :func:`sparse_patterns.analysis.verify` hands a BlockLayout here.
"""

from __future__ import annotations

import time

import numpy as np

from ..pattern import BlockLayout
from . import _numba as K
from ._common import check_common
from .budget import block_budgets
from .report import VerifyReport

__all__ = ["MAX_BLOCKS", "verify_blocks"]

#: Largest number of blocks per side for block-level verification.
MAX_BLOCKS = 32768


def _block_csr(lay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return K.pick("bool_csr", lay.shape[0])(np.ascontiguousarray(lay))


def _block_reach(mats, p, residual, causal, singles):
    """Hop counts over block pairs; returns (hops, have_last, E, first misses)."""
    nb = mats[0][0].size - 1
    W = (nb + 63) >> 6
    prev = np.zeros((nb, W), np.uint64)
    cur = np.zeros((nb, W), np.uint64)
    E = np.zeros((nb, W), np.uint64)
    hops = np.zeros(p + 1, np.int64)
    have = miss = None
    for k in range(1, p + 1):
        bptr, bidx = mats[k - 1]
        K.pick("block_step", nb)(nb, bptr, bidx, prev, k == 1 or residual, residual, cur)
        if k == 1 and residual and singles.size:
            cur[singles, singles >> 6] |= np.left_shift(np.uint64(1), (singles & 63).astype(np.uint64))
        new, have, miss = K.pick("block_count", nb)(nb, cur, E, causal, True)
        hops[k] = new.sum()
        prev, cur = cur, prev
    return hops, have, miss, E


def verify_blocks(
    bl: BlockLayout, *, p: int | None = None, mode: str = "interleaved", residual: bool = True
) -> VerifyReport:
    """Check the two criteria on the block pairs of a block layout.

    Parameters
    ----------
    bl : BlockLayout
    p, mode, residual
        As in :func:`sparse_patterns.analysis.verify`.

    Returns
    -------
    VerifyReport
        ``level="block"``; pairs, hops and counter-examples are block pairs.

    Raises
    ------
    ValueError
        More than ``MAX_BLOCKS`` blocks per side, an empty layout, or as
        :func:`sparse_patterns.analysis.verify`.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> r = verify_blocks(make("strided", 16, stride=4).to_blocks(4))
    >>> r.ok, r.level, r.targets
    (True, 'block', 10)
    """
    t0 = time.perf_counter()
    p, mode, residual = check_common(p, mode, residual, bl.num_heads)
    nb = bl.nb
    if nb > MAX_BLOCKS:
        raise ValueError(f"block: the layout has nb={nb} blocks per side; block-level "
                         f"verification handles nb <= {MAX_BLOCKS} (use a larger block)")
    if not bl.layout.any():
        raise ValueError("pattern: every head of the block layout is empty; nothing to verify")
    any_set = bl.layout.any(axis=0)
    rows = np.flatnonzero(any_set.any(axis=1))
    # causal when no block lies above the diagonal: the last set block of every row is <= the row
    last = any_set.shape[1] - 1 - np.argmax(any_set[rows, ::-1], axis=1)
    causal = bool((last <= rows).all())
    if mode == "interleaved":
        sets = [bl.layout[h] for h in range(p)]
        fulls = [bl.full[h] for h in range(p)]
    else:
        sets = [any_set] * p
        fulls = [bl.full.any(axis=0)] * p
    sizes = np.full(nb, bl.block, np.int64)
    sizes[-1] = bl.n - bl.block * (nb - 1)
    singles = np.flatnonzero(sizes == 1).astype(np.int64)
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def csr(k, a):
        if k not in cache:
            cache[k] = _block_csr(a)
        return cache[k]

    if mode == "interleaved":
        set_mats = [csr(("set", h), sets[h]) for h in range(p)]
        full_mats = [csr(("full", h), fulls[h]) for h in range(p)]
    else:
        set_mats = [csr("set", sets[0])] * p
        full_mats = [csr("full", fulls[0])] * p
    hops, have, miss, E = _block_reach(set_mats, p, residual, causal, singles)
    fh, fhave, _, fE = _block_reach(full_mats, p, residual, causal, singles)
    T = np.arange(1, nb + 1, dtype=np.int64) if causal else np.full(nb, nb, np.int64)
    targets = int(T.sum())
    miss1 = int((T - have).sum())
    miss2 = targets - int(hops.sum())
    bad1 = bad2 = None
    rows = np.flatnonzero(have < T)
    if rows.size:
        bad1 = (int(rows[0]), int(miss[rows[0]]))
    if miss2:
        _, ehave, emiss = K.pick("block_count", nb)(nb, E, np.zeros_like(E), causal, False)
        rows = np.flatnonzero(ehave < T)
        bad2 = (int(rows[0]), int(emiss[rows[0]]))
    fmiss1 = int((T - fhave).sum())
    fmiss2 = targets - int(fh.sum())
    certified = miss1 == 0 and miss2 == 0 and fmiss1 == 0 and fmiss2 == 0
    return VerifyReport.from_counts(
        hops, miss1, miss2, bad1, bad2, p=p, n=bl.n, causal=causal, started=t0,
        targets=targets,  # block pairs
        mode=mode,
        residual=residual,
        budgets=tuple(block_budgets(bl, p)),
        name="blocks",
        params={"block": bl.block, "nb": nb},
        level="block",
        block=bl.block,
        certified=certified,
        partial_pairs=fmiss2 - miss2,
    )
