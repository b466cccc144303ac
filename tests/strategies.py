"""Hypothesis strategies shared by the kernel and plan tests."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from hypothesis import strategies as st

from sparse_patterns import Pattern

__all__ = ["random_patterns"]


@st.composite
def random_patterns(draw, *, max_n: int, densities: tuple[float, ...], single_key: float):
    """Random CSR patterns: 1-3 heads of very different densities, some rows with a single key."""
    n = draw(st.integers(1, max_n))
    p = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    causal = draw(st.booleans())
    heads = []
    for _ in range(p):
        density = draw(st.sampled_from(densities))
        m = rng.random((n, n)) < density
        if draw(st.booleans()):  # rows with a single key
            rows = rng.random(n) < single_key
            m[rows] = False
            m[rows, rng.integers(0, n, rows.sum())] = True
        if causal:
            m = np.tril(m)
        heads.append(sp.csr_matrix(m))
    return Pattern(heads, causal=causal)
