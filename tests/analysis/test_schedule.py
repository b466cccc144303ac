"""Layer schedules (issue 21, item 3): verify_schedule against dense boolean matrix products."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import sparse_patterns as sps
from sparse_patterns import Pattern, make
from sparse_patterns.analysis import ScheduleReport, document_offsets, verify, verify_schedule
from sparse_patterns.cli import app

runner = CliRunner()


# ------------------------------------------------------------------- reference
def dense_reference(layers: list[np.ndarray], causal: bool, offs=None, residual: bool = True):
    """Everything verify_schedule reports, from products of the dense (n, n) layer unions.

    ``R_1 = M_1``, ``R_k = M_k @ R_{k-1}`` with ``M_k = A_k ∩ block diagonal (+ I)``.
    """
    n = layers[0].shape[0]
    offs = [0, n] if offs is None else list(offs)
    doc = np.zeros((n, n), bool)
    for s, e in zip(offs[:-1], offs[1:], strict=True):
        doc[s:e, s:e] = True
    target = doc & (np.tril(np.ones((n, n), bool)) if causal else True)
    hop = np.zeros((n, n), np.int64)
    reach, R = [], None
    for k, a in enumerate(layers, 1):
        m = a & doc
        if residual:
            m = m | np.eye(n, dtype=bool)
        R = m if R is None else (m.astype(np.int64) @ R.astype(np.int64)) > 0
        hop[R & target & (hop == 0)] = k
        reach.append(int((R & target).sum()))
    P = len(layers)
    fail2 = np.argwhere(target & (hop == 0))
    fail1 = np.argwhere(target & ~R)
    first = next((i for i, x in enumerate(reach) if x == int(target.sum())), None)
    leaks = [a & ~doc for a in layers]
    k = next((k for k, x in enumerate(leaks) if x.any()), None)
    return {
        "targets": int(target.sum()),
        "reachable": tuple(reach),
        "hops": {k: int((hop == k).sum()) for k in range(1, P + 1)},
        "unreachable": len(fail2),
        "not_in_last": len(fail1),
        "counterexample2": tuple(int(x) for x in fail2[0]) if len(fail2) else None,
        "counterexample1": tuple(int(x) for x in fail1[0]) if len(fail1) else None,
        "layers_to_connect": None if first is None else first + 1,
        "leak_entries": tuple(int(x.sum()) for x in leaks),
        "leak_example": None if k is None else (k, *(int(x) for x in np.argwhere(leaks[k])[0])),
    }


def dense(layer: Pattern) -> np.ndarray:
    return layer.to_dense().any(axis=0)


def check(layers: list[Pattern], documents=None, residual: bool = True) -> ScheduleReport:
    """verify_schedule(layers) equals the dense reference field by field; returns the report."""
    r = verify_schedule(layers, documents=documents, residual=residual)
    causal = all(x.causal for x in layers)
    offs = None if documents is None else document_offsets(documents, layers[0].n).tolist()
    ref = dense_reference([dense(x) for x in layers], causal, offs, residual)
    for key in ("targets", "reachable", "hops", "unreachable", "not_in_last", "counterexample1",
                "counterexample2", "layers_to_connect"):
        assert getattr(r, key) == ref[key], key
    assert r.criterion1 == (ref["not_in_last"] == 0) and r.criterion2 == (ref["unreachable"] == 0)
    assert r.counterexample == (ref["counterexample2"] or ref["counterexample1"])
    assert r.causal == causal and r.p == len(layers) and r.n == layers[0].n
    assert r.layer_nnz == tuple(int(dense(x).sum()) for x in layers)
    if documents is None:
        assert r.leak is None and r.leak_example is None and r.leak_entries is None
    else:
        assert r.leak_entries == ref["leak_entries"] and r.leak_example == ref["leak_example"]
        assert r.leak == (ref["leak_example"] is not None)
        assert r.documents == tuple(offs)
    assert r.ok == (r.criterion1 and r.criterion2 and not r.leak)
    return r


# ----------------------------------------------------------------------- cases
def test_local_local_full_reachability_per_layer():
    n = 48
    loc, full = make("local", n, window=3), make("full", n)
    r = check([loc, loc])
    assert not r.ok and r.layers_to_connect is None and r.counterexample == (7, 0)
    r = check([loc, loc, full])
    assert r.ok and r.layers_to_connect == 3 and r.reachable[-1] == n * (n + 1) // 2
    assert r.hops[1] == 4 * n - 6  # local(window=3): |A_i| = min(i + 1, 4)


def test_strided_heads_as_two_layers_and_the_same_as_verify():
    pat = make("strided", 64, stride=8)
    a1, a2 = (Pattern([h], causal=True) for h in pat.heads)
    r = check([a1, a2])
    v = verify(pat, method="generic")
    assert r.ok and v.ok and r.hops == v.hops and r.targets == v.targets
    r = check([a2, a1], residual=False)  # the other order, no residual
    assert r.hops == verify(Pattern([a2.heads[0], a1.heads[0]]), residual=False).hops
    union = [make("local", 64, window=4), make("local", 64, window=4), make("local", 64, window=4)]
    v = verify(Pattern([x.heads[0] for x in union]), method="generic")
    r = check(union)
    assert (r.hops, r.unreachable, r.counterexample) == (v.hops, v.unreachable, v.counterexample)


def test_no_residual_reachability_is_not_nested():
    # layer 2 forgets what layer 1 brought: R_2 misses pairs R_1 had
    n = 16
    nxt = np.eye(n, k=-1, dtype=bool)  # i reads i - 1
    layers = [Pattern.from_dense(nxt | np.eye(n, dtype=bool)), Pattern.from_dense(nxt)]
    r = check(layers, residual=False)
    assert r.reachable[1] < r.reachable[0] + r.hops[2]
    assert not r.criterion1 and not r.criterion2
    r = check(layers, documents=[5, 11], residual=False)
    assert r.leak and r.leak_example == (0, 5, 4)


def test_documents_lengths_and_offsets_agree_with_dense_block_diagonal():
    n = 40
    layers = [make("strided", n, stride=4), make("local", n, window=2),
              make("fixed", n, stride=8, c=2)]
    a = check(layers, documents=[7, 1, 20, 12])
    b = check(layers, documents=np.array([0, 7, 8, 28, 40]))
    assert a == replace(b, seconds=a.seconds)
    assert a.leak and a.leak_entries[0] > 0


def test_leak_full_over_packed_documents():
    n = 32
    r = check([make("full", n)], documents=[10, 22])
    assert r.criterion1 and r.criterion2 and r.leak and not r.ok
    k, i, j = r.leak_example
    assert (k, i, j) == (0, 10, 0)  # the first entry between documents, row by row
    assert r.leak_entries == (10 * 22,)
    r = check([make("full", n, causal=False), make("local", n, window=1)], documents=[0, 10, 32])
    assert r.leak_example == (0, 0, 10) and r.leak_entries == (2 * 10 * 22, 1)


def test_block_diagonal_pattern_has_no_leak():
    lengths = [5, 1, 9, 3]
    blocks = [np.tril(np.ones((m, m), bool)) for m in lengths]
    full_docs = Pattern.from_dense(sp.block_diag(blocks).toarray())
    local_docs = Pattern([sp.block_diag([sp.csr_matrix(np.tril(np.triu(np.ones((m, m), bool), -1)))
                                         for m in lengths], format="csr")])
    r = check([local_docs, full_docs], documents=lengths)
    assert r.ok and r.leak is False and r.leak_entries == (0, 0) and r.layers_to_connect == 2
    r = check([local_docs, local_docs], documents=lengths)
    assert not r.ok and r.leak is False and r.counterexample == (3, 0)  # 3 steps back in [0, 5)
    assert "no leak" not in r.summary() and "criterion 1 fails" in r.summary()


def test_empty_layer_and_length_one_documents():
    n = 6
    empty = Pattern([sp.csr_matrix((n, n), dtype=bool)])
    check([empty, make("full", n)], documents=[1] * n)
    r = check([empty], residual=False)
    assert r.reachable == (0,) and r.unreachable == n * (n + 1) // 2
    r = check([empty, empty], documents=[1] * n)
    assert r.ok and r.layers_to_connect == 1  # targets (i, i) only, held by the residual


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 12))
    P = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layers = []
    for _ in range(P):
        causal = draw(st.booleans())
        heads = []
        for _ in range(draw(st.integers(1, 2))):
            m = rng.random((n, n)) < draw(st.sampled_from([0.05, 0.2, 0.5]))
            heads.append(sp.csr_matrix(np.tril(m) if causal else m))
        layers.append(Pattern(heads, causal=causal))
    docs = None
    if draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=4))) if n > 1 else []
        docs = [0, *cuts, n]
        if draw(st.booleans()):
            docs = np.diff(docs).tolist()
    return layers, docs, draw(st.booleans())


@given(schedules())
def test_random_schedules_match_dense_products(case):
    layers, docs, residual = case
    check(layers, documents=docs, residual=residual)


@pytest.mark.parametrize("residual", [True, False])
def test_column_chunks_row_blocks_and_the_parallel_form_match_dense_products(monkeypatch, residual):
    # the smallest chunk (64 source columns), short row blocks and the parallel kernel at small n
    from sparse_patterns.analysis import _numba, schedule

    monkeypatch.setattr(schedule, "CHUNK_BYTES", 1)
    monkeypatch.setattr(schedule, "REACH_BLOCK", 7)
    monkeypatch.setattr(_numba, "SERIAL_BELOW", 0)
    n = 203
    rng = np.random.default_rng(5)
    rand = Pattern.from_dense(rng.random((n, n)) < 0.01, causal=False)
    layers = [make("local", n, window=5), make("strided", n, stride=16), make("full", n),
              make("local", n, window=2)]
    check(layers, residual=residual)  # full: each row starts from the one before
    check([make("local", n, window=3)] * 5, residual=residual)
    check([make("local", n, window=2), rand, make("fixed", n, stride=32, c=4)], residual=residual)
    check(layers[:2], documents=[70, 1, 132], residual=residual)
    holes = np.tril(np.ones((150, 150), bool))
    holes[100, 80] = holes[120, 10] = False  # the first failing pair is in the second chunk
    r = check([Pattern.from_dense(holes)], residual=residual)
    assert r.counterexample == (100, 80)


def test_many_layers_against_the_closed_form_of_a_window_of_one():
    # local(window=1) with the residual: R_k(i) = [i - k, i], so i needs i - j layers for j < i
    n, P = 300, 256
    r = verify_schedule([make("local", n, window=1)] * P)
    assert r.reachable == tuple(sum(min(i + 1, k + 1) for i in range(n)) for k in range(1, P + 1))
    assert r.hops == {1: 2 * n - 1, **{k: n - k for k in range(2, P + 1)}}
    assert r.counterexample == (P + 1, 0) and r.unreachable == sum(range(1, n - P))
    back = Pattern.from_dense(np.eye(n, k=-1, dtype=bool))  # i reads i - 1: R_k(i) = {i - k}
    r = verify_schedule([back] * P, residual=False)
    assert r.reachable == tuple(n - k for k in range(1, P + 1))
    assert r.hops == {k: n - k for k in range(1, P + 1)} and r.counterexample == (0, 0)
    assert r.unreachable == n * (n + 1) // 2 - sum(n - k for k in range(1, P + 1))


def test_explain_failure_gives_the_counterexample_in_sequence_positions():
    n = 24
    loc = make("local", n, window=2)
    r = verify_schedule([loc, loc], documents=[10, 14], explain_failure=True)
    assert r.counterexample == (5, 0) and r.explanation is not None
    assert r.explanation.path is None and "document [0, 10)" in r.explanation.reason
    r = verify_schedule([loc, loc], documents=[4, 20], explain_failure=True, residual=False)
    i, j = r.counterexample
    e = r.explanation
    assert (e.i, e.j) == (i, j) and 4 <= j <= i
    if e.path is not None:  # a path of the layers, in sequence positions, ending at i
        assert e.path[0] == j and e.path[-1] == i and set(e.steps) <= {"L1", "L2"}
    d = r.to_dict()
    assert json.loads(json.dumps(d))["explanation"]["reason"] == e.reason


def test_verify_dispatches_a_list_of_patterns():
    layers = [make("local", 32, window=3), make("full", 32)]
    r = sps.verify(layers)
    assert isinstance(r, ScheduleReport) and r.ok and r.hops == verify_schedule(layers).hops
    assert sps.verify_schedule is verify_schedule
    seen = []
    assert sps.verify(tuple(layers), p=2, progress=lambda d, t: seen.append((d, t))).ok
    assert seen == [(1, 1)]
    with pytest.raises(ValueError, match=r"^p: a schedule of 2 layers"):
        sps.verify(layers, p=3)
    with pytest.raises(ValueError, match=r"^mode: a schedule runs its layers in order"):
        sps.verify(layers, mode="merged")
    with pytest.raises(ValueError, match=r"^depth:"):
        sps.verify(layers, depth=True)
    with pytest.raises(ValueError, match=r"^method:"):
        sps.verify(layers, method="structured")
    with pytest.raises(ValueError, match=r"^layers: layers\[1\] must be a Pattern, got ndarray"):
        sps.verify([layers[0], np.eye(32, dtype=bool)])


def test_report_prints_and_serializes():
    r = verify_schedule([make("local", 16, window=3), make("full", 16)], documents=[8, 8])
    d = json.loads(json.dumps(r.to_dict()))
    assert d["leak"] is True and d["leak_example"] == [0, 8, 5] and d["documents"] == [0, 8, 16]
    assert d["reachable"] == list(r.reachable) and d["hops"] == {"1": r.hops[1], "2": r.hops[2]}
    assert "explanation" not in d
    text = r.text(120)
    assert "NOT VERIFIED" in text and "(8, 5)" in text and "local(window=3" in text
    assert verify_schedule([make("full", 8)]).text(200).splitlines()[-1].startswith("VERIFIED")


# ------------------------------------------------------------------- bad input
@pytest.mark.parametrize("layers, documents, match", [
    ([], None, r"^layers: a schedule needs at least one layer"),
    (None, None, r"^layers: expected a list of Patterns"),
    ("full", None, r"^layers: expected a list of Patterns"),
    ("PATTERN", None, r"^layers: expected a list of Patterns .* got one Pattern"),
    (["full8", "full16"], None, r"^layers: layers\[1\] has n=16 but layers\[0\] has n=8"),
    (["full8", 3], None, r"^layers: layers\[1\] must be a Pattern, got int"),
    (["full8"], [3, 4], r"^documents: lengths sum to 7, not n=8$"),
    (["full8"], [3, 0, 5], r"^documents: lengths must be integers \[1, 8\], got lengths\[1\]=0"),
    (["full8"], [-2, 10], r"^documents: lengths must be .* got lengths\[0\]=-2"),
    (["full8"], [0, 5, 3, 8], r"^documents: starts with 0, .* strictly increasing"),
    (["full8"], [0, 4, 4, 8], r"^documents: starts with 0, .* strictly increasing"),
    (["full8"], [0, 3, 7], r"^documents: cu_seqlens offsets must end at n=8, got \[0, 3, 7\]"),
    (["full8"], [0, 9], r"^documents: offsets must be integers \[0, 8\], got offsets\[1\]=9"),
    (["full8"], [0], r"^documents: cu_seqlens offsets must end at n=8, got \[0\]"),
    (["full8"], [1, 3, 8], r"^documents: lengths sum to 12, not n=8; cu_seqlens offsets must start at 0"),
    (["full8"], [], r"^documents: needs at least one document"),
    (["full8"], [2.5, 5.5], r"^documents: expected integers"),
    (["full8"], [True, 7], r"^documents: expected integers"),
    (["full8"], [[4, 4]], r"^documents: expected a 1-D sequence"),
    (["full8"], 8, r"^documents: expected a 1-D sequence"),
])
def test_bad_input_one_line(layers, documents, match):
    pats = {"full8": make("full", 8), "full16": make("full", 16)}
    if isinstance(layers, list):
        layers = [pats.get(x, x) if isinstance(x, str) else x for x in layers]
    elif layers == "PATTERN":
        layers = pats["full8"]
    with pytest.raises(ValueError, match=match) as info:
        verify_schedule(layers, documents=documents)
    assert "\n" not in str(info.value)


def test_bad_flags():
    with pytest.raises(ValueError, match=r"^residual: must be True or False"):
        verify_schedule([make("full", 8)], residual="yes")
    with pytest.raises(ValueError, match=r"^explain_failure:"):
        verify_schedule([make("full", 8)], explain_failure=1)


# ------------------------------------------------------------------------- CLI
def test_cli_schedule_passes_and_fails():
    res = runner.invoke(app, ["verify", "--schedule", "local:window=4,local:window=4,full",
                              "--n", "64", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["ok"] and d["p"] == 3 and d["layers_to_connect"] == 3 and d["leak"] is None
    assert d["layer_names"][0] == "local(window=4, causal=True)"
    res = runner.invoke(app, ["verify", "--schedule", "local:window=4,local:window=4", "--n", "64",
                              "--json"])
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert d["counterexample"] == [9, 0] and d["explanation"]["path"] is None
    res = runner.invoke(app, ["verify", "--schedule", "local:window=4:causal=false,full:causal=false",
                              "--n", "32", "--no-residual"])
    assert res.exit_code == 0, res.output
    assert "VERIFIED" in res.stdout and "residual=off" in res.stdout


def test_cli_schedule_documents_make_every_layer_inside_them(tmp_path):
    res = runner.invoke(app, ["verify", "--schedule", "full", "--n", "64", "--documents", "16,48",
                              "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["criterion1"] and d["leak"] is False and d["layers_to_connect"] == 1
    # local(4) inside documents of 16 + 48 needs more than two layers: exit 1, no leak
    res = runner.invoke(app, ["verify", "--schedule", "local:window=4,local:window=4", "--n", "64",
                              "--documents", "0,16,64", "--json"])
    d = json.loads(res.stdout)
    assert res.exit_code == 1 and d["leak"] is False and d["layers_to_connect"] is None
    path = tmp_path / "sched.json"
    path.write_text(json.dumps([{"pattern": "local", "params": {"window": 2}},
                                {"pattern": "strided", "params": {"stride": 4}}, {"pattern": "full"}]))
    res = runner.invoke(app, ["verify", "--schedule", str(path), "--n", "32", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["p"] == 3 and d["layer_names"][1].startswith("strided(stride=4")


@pytest.mark.parametrize("args, msg", [
    (["--schedule", "", "--n", "8"], "schedule: layer 1 has no pattern name"),
    (["--schedule", "local:window", "--n", "8"], "schedule: layer 1 'local:window' must be NAME"),
    (["--schedule", "local:window=2:window=3", "--n", "8"], "gives window twice"),
    (["--schedule", "nope", "--n", "8"], "schedule: layer 1 (nope): name: unknown pattern"),
    (["--schedule", "full,local:stride=2", "--n", "8"], "schedule: layer 2 (local): stride:"),
    (["--schedule", "full", "--n", "8", "--documents", "3,4"], "documents: lengths sum to 7"),
    (["--schedule", "full", "--n", "8", "--documents", "3,x"], "documents: expected comma-separated"),
    (["--schedule", "full", "--n", "8", "--documents", "0,4,4,8"], "strictly increasing"),
    (["--documents", "3,5", "--n", "8"], "documents: --documents applies to a schedule"),
    (["--schedule", "full"], "n: --n is required with --schedule"),
    (["--schedule", "full", "--n", "8", "--stride", "4"], "takes no pattern name or pattern options"),
    (["strided", "--schedule", "full", "--n", "8"], "takes no pattern name or pattern options"),
    (["--schedule", "full", "--n", "8", "--p", "2"], "p: a schedule of 1 layer(s)"),
    (["--schedule", "full", "--n", "8", "--block", "4"], "takes no --block"),
    (["--schedule", "full", "--n", "8", "--mode", "merged"], "takes no --mode merged"),
    (["--schedule", "missing.json", "--n", "8"], "schedule: cannot read 'missing.json'"),
])
def test_cli_schedule_bad_input_exit_2(args, msg):
    res = runner.invoke(app, ["verify", *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], res.stderr


@pytest.mark.parametrize("content, msg", [
    ("{", "is not valid JSON"),
    ('{"pattern": "full"}', "must hold a JSON list"),
    ('[{"name": "full"}]', "layer 1 of"),
    ('[{"pattern": "full", "params": [1]}]', "layer 1 of"),
    ("[]", "needs at least one layer"),
])
def test_cli_schedule_bad_file_exit_2(tmp_path, content, msg):
    path = tmp_path / "s.json"
    path.write_text(content)
    res = runner.invoke(app, ["verify", "--schedule", str(path), "--n", "8"])
    assert res.exit_code == 2 and msg in res.stderr, res.output
