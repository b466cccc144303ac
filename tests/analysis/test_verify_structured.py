"""``verify`` routes generated strided, local, dilated and fixed patterns to the structured check.

The report it gives (``method="auto"``, and ``method="structured"`` where auto
prefers the generic check) equals the generic one field by field, except the
``method`` it names and the wall time: every covered family, every mode, with
and without the residual, causal and bidirectional, n below, at and above the
period, multiples or not.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from rich.console import Console

from sparse_patterns import Pattern, make
from sparse_patterns.analysis import verify

MODE_CASES = [("interleaved", None), ("merged", None), ("multihead", None), ("interleaved", 1),
              ("merged", 3)]


def plain(report):
    d = report.to_dict()
    del d["method"], d["seconds"]
    return d


def check_same(pat):
    for (mode, p), residual in itertools.product(MODE_CASES, (True, False)):
        kw = {"p": p, "mode": mode, "residual": residual}
        want = verify(pat, method="generic", **kw)
        assert want.method == "generic"
        got = verify(pat, **kw)
        if got.method == "generic":  # auto kept the generic check: force the structured one
            assert not pat.causal and pat.name in ("strided", "local", "dilated")
            got = verify(pat, method="structured", **kw)
        expected = "structured-periodic" if pat.name == "fixed" else "structured-offsets"
        assert got.method == expected
        assert plain(got) == plain(want), (pat.name, dict(pat.params), pat.n, kw)


CASES = [
    ("strided", {"stride": 5}, (3, 5, 17, 64, 301)),
    ("strided", {"stride": 7, "window": "reference"}, (4, 50, 333)),
    ("strided", {"stride": 31}, (1000,)),
    ("local", {"window": 3}, (2, 3, 40, 257)),
    ("local", {"window": 20}, (999,)),
    ("dilated", {"window": 3, "dilation": 4}, (5, 19, 300)),
    ("fixed", {"stride": 8, "c": 2}, (5, 8, 61, 256)),
    ("fixed", {"stride": 6, "c": 1, "summary_heads": 3}, (4, 37, 200)),
    ("fixed", {"stride": 32, "c": 4}, (1000,)),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("name", "params", "ns"), CASES)
def test_auto_equals_generic(name, params, ns, causal):
    for n in ns:
        check_same(make(name, n, causal=causal, **params))


def test_auto_routes():
    assert verify(make("strided", 64, stride=8)).method == "structured-offsets"
    assert verify(make("local", 64, window=3, causal=False)).method == "structured-offsets"
    # bidirectional strided: the stride head reaches across the sequence, so auto goes generic
    assert verify(make("strided", 64, stride=8, causal=False)).method == "generic"
    assert verify(make("fixed", 64, stride=8, causal=False)).method == "structured-periodic"
    assert verify(make("bigbird", 64)).method == "generic"
    pat = make("strided", 64, stride=8)
    user = Pattern(list(pat.heads), causal=True)  # a user layout: no rule
    assert user.rule is None and verify(user).method == "generic"
    assert verify(pat.to_blocks(8)).method == "generic"


def test_structured_not_covered_raises():
    with pytest.raises(ValueError, match="^method: "):
        verify(make("bigbird", 64), method="structured")
    user = Pattern(list(make("local", 16, window=2).heads), causal=True)
    with pytest.raises(ValueError, match="^method: "):
        verify(user, method="structured")
    with pytest.raises(ValueError, match="^method: "):
        verify(make("local", 16, window=2), method="fast")


def test_structured_builds_no_csr():
    pat = make("fixed", 4096, stride=64, c=4)
    r = verify(pat)
    assert r.method == "structured-periodic" and r.ok
    assert not pat.materialized or pat.rule.rows is None


def test_explain_failure_small_and_large(monkeypatch):
    pat = make("local", 40, window=3)
    r = verify(pat, p=2, mode="merged", explain_failure=True)
    assert r.method == "structured-offsets" and r.explanation is not None
    assert r.explanation == verify(pat, p=2, mode="merged", explain_failure=True,
                                   method="generic").explanation
    monkeypatch.setattr("sparse_patterns.analysis.criteria.EXPLAIN_LIMIT", 16)
    fresh = make("local", 40, window=3)
    r = verify(fresh, p=2, mode="merged", explain_failure=True)
    assert r.counterexample is not None and r.explanation is None


def test_table_and_dict_name_the_method():
    r = verify(make("strided", 16, stride=4))
    assert r.to_dict()["method"] == "structured-offsets"
    out = Console(width=120, color_system=None)
    with out.capture() as cap:
        out.print(r.table())
    lines = cap.get().splitlines()
    assert any(line.startswith("decided by: structured-offsets") for line in lines)
    assert lines[-1].startswith("VERIFIED")
    g = verify(make("strided", 16, stride=4), method="generic")
    assert np.array_equal(list(g.hops.values()), list(r.hops.values()))
