"""scaling, bottleneck and budgets (the analysis helpers around verify)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparse_patterns import make
from sparse_patterns.analysis import (
    block_budgets,
    bottleneck,
    budgets,
    scaling,
)


def test_scaling_strided_sqrt_follows_half():
    t = scaling("strided", [256, 1024, 4096, 16384], stride="sqrt")
    assert t.p == 2 and t.expected == 0.5
    assert [r["stride"] for r in t.resolved] == [16, 32, 64, 128]
    # union row of strided(l): l + 1 window positions plus about i / l strided ones
    assert t.max_row == [2 * l - 1 for l in (16, 32, 64, 128)]
    assert abs(t.exponent - 0.5) < 0.02
    for k, n in enumerate(t.ns):
        pat = make("strided", n, stride="sqrt")
        counts = pat.row_counts()
        assert t.nnz[k] == int(counts[-1].sum()) == pat.nnz
        assert t.head_max_row[k] == [int(c.max()) for c in counts[:-1]]
        assert math.isclose(t.mean_row[k], counts[-1].mean())
    d = t.to_dict()
    assert d["params"] == {"stride": "sqrt"} and d["ns"] == t.ns


def test_scaling_fixed_stride_grows_linearly():
    t = scaling("strided", [256, 1024, 4096], stride=16)
    assert t.exponent > 0.75  # a fixed stride makes |A_i| ~ l + n / l: towards linear


def test_scaling_one_n_and_bad_input():
    t = scaling("local", [64], window=4)
    assert math.isnan(t.exponent) and t.to_dict()["exponent"] is None
    with pytest.raises(ValueError, match="ns"):
        scaling("local", [], window=4)
    with pytest.raises(ValueError, match="ns"):
        scaling("local", [0], window=4)
    with pytest.raises(ValueError, match="name"):
        scaling("nope", [16])


@pytest.mark.parametrize("c", [1, 2, 4, 8])
def test_fixed_bottleneck_is_c(c):
    """The paper's point: fixed routes a block through its c summary positions."""
    l = 16
    pat = make("fixed", 4 * l, stride=l, c=c)
    b = bottleneck(pat, l, 4 * l - 1)  # the first block -> the last position
    assert b.size == c
    # the cut: the first block's summary positions after step 1
    assert set(b.cut) == {(1, a) for a in range(l - c, l)}


def test_bottleneck_strided_and_unreachable():
    pat = make("strided", 64, stride=8)
    assert bottleneck(pat, 8, 63).size >= 1
    assert bottleneck(make("local", 64, window=2), 4, 63, p=1).size == 0
    with pytest.raises(ValueError, match="target"):
        bottleneck(pat, 8, 64)
    with pytest.raises(ValueError, match="sources"):
        bottleneck(pat, [], 10)
    d = bottleneck(pat, [0, 1], 40).to_dict()
    assert d["sources"] == [0, 1]


def test_budgets_with_counts_equal_plain():
    pat = make("fixed", 256, stride=16, c=2)
    plain = budgets(pat)
    given = budgets(pat, counts=pat.row_counts())
    assert plain == given
    with pytest.raises(ValueError, match="counts"):
        budgets(pat, counts=np.zeros((2, 256), np.int64))


def test_block_budgets_bound_token_budgets():
    pat = make("strided", 256, stride=16)
    tok = budgets(pat)
    blk = block_budgets(pat.to_blocks(16))
    for t, b in zip(tok, blk, strict=True):
        assert b.max_row >= t.max_row and b.nnz >= t.nnz
