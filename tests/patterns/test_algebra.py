"""Pattern algebra (``|``, ``&``, ``-``, ``+``), its recipes, and the global_tokens family,
against dense boolean algebra of the operands and definitions written out here."""

from __future__ import annotations

import json
import operator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sparse_patterns as sps
from sparse_patterns import BlockLayout, Pattern, make
from sparse_patterns.algebra import (
    MAX_DEPTH,
    MAX_NODES,
    ExpressionRule,
    combine,
    expression_flex,
    expression_recipe,
    from_expression,
)
from sparse_patterns.documents import within
from sparse_patterns.testing import attention_masks, attention_oracle, bfs_verify

# ------------------------------------------------------------------ operands
#: families by head count, with a strategy for their params at n
FAMILIES = {
    1: {
        "full": lambda n: st.just({}),
        "local": lambda n: st.fixed_dictionaries({"window": st.integers(0, 4)}),
        "dilated": lambda n: st.fixed_dictionaries(
            {"window": st.integers(0, 3), "dilation": st.integers(1, 3)}),
        "global_tokens": lambda n: st.fixed_dictionaries({"tokens": st.integers(0, n)}),
    },
    2: {
        "strided": lambda n: st.fixed_dictionaries(
            {"stride": st.integers(1, 5), "window": st.sampled_from(["paper", "reference"])}),
        "fixed": lambda n: st.fixed_dictionaries({"stride": st.integers(1, 5), "c": st.just(1)}),
        "longformer": lambda n: st.fixed_dictionaries(
            {"window": st.integers(0, 3), "global_tokens": st.integers(0, n)}),
    },
    3: {
        "bigbird": lambda n: st.fixed_dictionaries(
            {"block": st.integers(2, 4), "random_blocks": st.integers(0, 1),
             "seed": st.integers(0, 9)}),
    },
}


def dense(pat: Pattern) -> np.ndarray:
    """``bool (p, n, n)`` from the CSR of every head, entry by entry."""
    out = np.zeros((pat.num_heads, pat.n, pat.n), dtype=bool)
    for m, h in enumerate(pat.heads):
        for i in range(pat.n):
            out[m, i, h.indices[h.indptr[i]:h.indptr[i + 1]]] = True
    return out


@st.composite
def leaves(draw, n, heads, registered=False):
    """``(pattern, dense heads)``: a family with ``heads`` heads, or a random user layout."""
    causal = draw(st.booleans())
    names = sorted(FAMILIES.get(heads, {}))
    if names and (registered or draw(st.integers(0, 3)) > 0):
        name = draw(st.sampled_from(names))
        params = draw(FAMILIES[heads][name](n))
        # the dense heads from a copy, so that the operand itself stays unbuilt
        return make(name, n, causal=causal, **params), dense(make(name, n, causal=causal, **params))
    if registered:  # no family has that many heads: concatenate
        k = draw(st.integers(1, heads - 1))
        (a, da), (b, db) = draw(leaves(n, k, True)), draw(leaves(n, heads - k, True))
        return a + b, np.concatenate([da, db])
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    d = rng.random((heads, n, n)) < draw(st.sampled_from([0.1, 0.4, 0.8]))
    if causal:
        d = np.tril(d)
    return Pattern.from_dense(d, causal=causal), d


@st.composite
def expressions(draw, n, heads, depth, registered=False):
    """``(pattern, dense heads, causal flag it must carry)`` of a random expression tree."""
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        pat, d = draw(leaves(n, heads, registered))
        return pat, d, pat.causal
    op = draw(st.sampled_from(["|", "&", "-", "+"] if heads > 1 else ["|", "&", "-"]))
    k = draw(st.integers(1, heads - 1)) if op == "+" else heads
    a, da, ca = draw(expressions(n, k, depth - 1, registered))
    b, db, cb = draw(expressions(n, heads - k if op == "+" else heads, depth - 1, registered))
    if op == "|":
        return a | b, da | db, ca and cb
    if op == "&":
        return a & b, da & db, ca or cb
    if op == "-":
        return a - b, da & ~db, ca
    return a + b, np.concatenate([da, db]), ca and cb


def cases(registered=False):
    return st.integers(1, 18).flatmap(lambda n: st.integers(1, 4).flatmap(
        lambda h: expressions(n, h, 3, registered)))


# ------------------------------------------------------------------ algebra vs dense
@given(case=cases(), data=st.data())
def test_expressions_equal_dense_boolean_algebra(case, data):
    pat, d, causal = case
    n, p = pat.n, pat.num_heads
    assert p == d.shape[0] and pat.causal == causal
    assert not causal or not np.triu(d, 1).any()
    # row ranges and arbitrary rows, read before (and without) building anything
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    for h in range(p):
        assert (pat.rows(a, b, head=h).toarray() == d[h, a:b]).all()
    assert (pat.rows(a, b).toarray() == d.any(axis=0)[a:b]).all()
    tokens = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n)), dtype=np.int64)
    for h, m in enumerate(pat.rows_of(tokens)):
        assert m.shape == (tokens.size, n) and m.has_canonical_format
        assert (m.toarray() == d[h, tokens]).all()
    for start, stop, mats in pat.iter_rows(chunk=data.draw(st.integers(1, n))):
        assert all((m.toarray() == d[h, start:stop]).all() for h, m in enumerate(mats))
    assert not isinstance(pat.rule, ExpressionRule) or not pat.materialized
    counts = d.sum(axis=2)
    assert (pat.row_counts() == np.vstack([counts, d.any(axis=0).sum(axis=1)])).all()
    assert pat.head_nnz == tuple(int(c) for c in counts.sum(axis=1))
    assert pat.nnz == int(d.any(axis=0).sum())
    block = data.draw(st.integers(1, 5))
    got = pat.to_blocks(block)
    want = BlockLayout.from_pattern(Pattern.from_dense(d, causal=False), block)
    assert (got.layout == want.layout).all() and (got.full == want.full).all()
    assert (dense(pat) == d).all() and (pat.to_dense() == d).all()


def test_golden_strided_plus_global_tokens():
    pat = make("strided", 8, stride=3) + sps.global_tokens(8, tokens=2)
    assert pat.name == "strided + global_tokens" and pat.causal
    assert pat.head_names == ("strided.A1", "strided.A2", "global_tokens.G")
    assert dict(pat.params) == {"op": "+", "args": (
        {"pattern": "strided", "params": {"stride": 3, "window": "paper", "causal": True}},
        {"pattern": "global_tokens", "params": {"tokens": 2, "causal": True}})}
    assert [m.indices.tolist() for m in pat.rows_of([7])] == [[4, 5, 6, 7], [1, 4, 7], [0, 1]]
    assert [m.indices.tolist() for m in pat.rows_of([1])] == [[0, 1], [1], [0, 1]]
    assert pat.rows(7, 8).indices.tolist() == [0, 1, 4, 5, 6, 7]


def test_names_follow_python_precedence_and_flatten():
    loc, full, g = make("local", 8, window=1), make("full", 8), make("global_tokens", 8)
    assert (loc | full | g).name == "local | full | global_tokens"
    assert ((loc | full) & g).name == "(local | full) & global_tokens"
    assert (loc - (full - g)).name == "local - (full - global_tokens)"
    assert (loc - full - g).name == "local - full - global_tokens"
    assert ((loc | g) + loc).head_names == ("(local | global_tokens).A|G", "local.A")
    three = loc + g + loc  # one node of three operands; the repeated heads are told apart
    assert three.rule.depth == 1 and len(three.rule.operands) == 3
    assert three.head_names == ("local.A", "global_tokens.G", "local.A#2")
    assert (make("strided", 8, stride=2) | make("fixed", 8, stride=2, c=1)).head_names == (
        "A1", "A2")
    assert (loc | make("global_tokens", 8)).head_names == ("A|G",)


def test_many_heads_and_depth_limit():
    g = make("global_tokens", 16, tokens=1)
    pat = make("local", 16, window=2)
    for _ in range(40):  # flattened: depth 1
        pat = pat + g
    assert pat.num_heads == 41 and pat.rule.depth == 1
    assert (pat.to_dense()[1:] == g.to_dense()[0]).all()
    pat = make("full", 16)
    for _ in range(MAX_DEPTH):
        pat = pat - g
    assert pat.rule.depth == MAX_DEPTH
    with pytest.raises(ValueError, match=f"nest {MAX_DEPTH + 1} operators deep; at most {MAX_DEPTH}"):
        pat - g


def test_operands_stay_unbuilt_and_build_streams():
    a, b = make("strided", 40, stride=6), make("local", 40, window=3)
    u = a | (b + b)
    u.rows(10, 20)
    u.rows_of(np.array([39, 0, 5]))
    assert not (a.materialized or b.materialized or u.materialized)
    assert u.heads[0].nnz == u.head_nnz[0]  # built from row chunks
    assert not (a.materialized or b.materialized)
    assert (u.to_dense() == (a.to_dense() | np.concatenate([b.to_dense()] * 2))).all()


def test_bad_operands():
    a, b = make("strided", 16, stride=4), make("strided", 32, stride=4)
    for op in ("|", "&", "-", "+"):
        with pytest.raises(ValueError) as err:
            combine(op, a, b)
        msg = str(err.value)
        assert len(msg.splitlines()) == 1 and msg.startswith("b: strided has n=32, but a ")
    one = make("local", 16, window=2)
    for expr in (lambda: a | one, lambda: a & one, lambda: a - one):
        with pytest.raises(ValueError, match=r"^b: local has 1 heads, but a \(strided\) has 2"):
            expr()
    assert (a + one).num_heads == 3
    for bad in (3, "x", None, a.heads[0], np.ones((16, 16), bool)):
        for f in (operator.or_, operator.and_, operator.sub, operator.add):
            with pytest.raises(TypeError):
                f(a, bad)
            with pytest.raises(TypeError):
                f(bad, a)
    with pytest.raises(TypeError, match="^b: expected a Pattern, got int"):
        combine("|", a, 3)
    with pytest.raises(ValueError, match="^op: must be one of"):
        combine("*", a, a)
    with pytest.raises(ValueError, match="'-' takes exactly 2 patterns, got 3"):
        combine("-", a, a, a)
    with pytest.raises(ValueError, match="'|' takes at least 2 patterns, got 1"):
        combine("|", a)
    with pytest.raises(ValueError, match=r"^patterns\[2\]: local has 1 heads"):
        combine("|", a, a, one)


# ------------------------------------------------------------------ global_tokens
def global_oracle(n, tokens, causal):
    i, j = np.indices((n, n))
    m = (i < tokens) | (j < tokens)
    return m & (j <= i) if causal else m


def test_global_tokens_golden():
    got = sps.global_tokens(6, tokens=2).to_dense()[0].astype(int)
    assert got.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
    ]
    got = sps.global_tokens(5, tokens=2, causal=False).to_dense()[0].astype(int)
    assert got.tolist() == [
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
    ]
    pat = sps.global_tokens(5)
    assert (pat.head_names, pat.params["tokens"], pat.causal) == (("G",), 1, True)
    assert make("global_tokens", 9, tokens=3) == sps.global_tokens(9, 3)


@given(n=st.integers(1, 40), data=st.data())
def test_global_tokens_against_its_definition(n, data):
    g = data.draw(st.integers(0, n))
    causal = data.draw(st.booleans())
    pat = sps.global_tokens(n, tokens=g, causal=causal)
    want = global_oracle(n, g, causal)
    assert (dense(pat)[0] == want).all()
    assert (pat.row_counts()[0] == want.sum(axis=1)).all()
    tokens = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=n)), dtype=np.int64)
    assert (pat.rows_of(tokens)[0].toarray() == want[tokens]).all()
    block = data.draw(st.integers(1, 9))
    got = pat.to_blocks(block)  # closed form
    ref = BlockLayout.from_pattern(Pattern.from_dense(want, causal=causal), block)
    assert (got.layout == ref.layout).all() and (got.full == ref.full).all()
    # the global head of longformer, alone
    assert (make("longformer", n, global_tokens=g, causal=causal).to_dense()[1] == want).all()


def test_global_tokens_bad_input():
    with pytest.raises(ValueError, match=r"^tokens: must be an integer \[0, 8\], got 9$"):
        sps.global_tokens(8, tokens=9)
    with pytest.raises(ValueError, match=r"^tokens: must be an integer \[0, 8\], got -1$"):
        make("global_tokens", 8, tokens=-1)
    with pytest.raises(ValueError, match="^causal: "):
        sps.global_tokens(8, causal="yes")


def test_global_tokens_per_document():
    pat = make("global_tokens", 7, tokens=1, documents=[3, 4])
    want = np.zeros((7, 7), bool)
    want[:3, :3] = global_oracle(3, 1, True)
    want[3:, 3:] = global_oracle(4, 1, True)
    assert (pat.to_dense()[0] == want).all()


# ------------------------------------------------------------------ flex formulas
@given(case=cases(registered=True))
def test_flex_rules_equal_the_rows(case):
    torch = pytest.importorskip("torch")
    pat, d, _ = case
    rules = expression_flex(pat)
    assert rules is not None and len(rules) == pat.num_heads
    q, kv = torch.arange(pat.n)[:, None], torch.arange(pat.n)[None, :]
    for h, rule in enumerate(rules):
        got = torch.broadcast_to(rule(q, kv), (pat.n, pat.n)).numpy()
        assert (got == d[h]).all(), h


def test_flex_needs_every_operand():
    custom = Pattern.from_dense(np.eye(6, dtype=bool))
    assert expression_flex(make("full", 6) | custom) is None
    seen = []
    rules = expression_flex(make("full", 6) | custom, leaf=lambda p: seen.append(p.name) or [
        lambda q, kv: q == kv])
    assert seen == ["full", "custom"] and len(rules) == 1


# ------------------------------------------------------------------ recipes
@given(case=cases(registered=True))
def test_recipe_round_trip(case):
    pat = case[0]
    r = expression_recipe(pat)
    assert r is not None and r["n"] == pat.n
    again = from_expression(json.loads(json.dumps(r)), where="r.json")
    assert again == pat
    assert (again.name, again.head_names, again.causal) == (pat.name, pat.head_names, pat.causal)
    assert expression_recipe(again) == r


def test_recipe_of_packed_documents_and_refusals():
    n = 12
    pat = make("strided", n, stride=3, documents=[5, 7]) + make("global_tokens", n, documents=[5, 7])
    r = expression_recipe(pat)
    assert r["args"][0]["params"]["documents"] == [5, 7]
    assert from_expression(json.loads(json.dumps(r))) == pat
    custom = Pattern.from_dense(np.tril(np.ones((n, n), bool)), name="full", params={"causal": True})
    assert expression_recipe(custom + pat) is None  # a user layout, whatever its name
    cut = within(make("fixed", n, stride=4, c=1), [5, 7])  # not what documents= generates
    assert cut != make("fixed", n, stride=4, c=1, documents=[5, 7])
    assert dict(cut.params) == dict(make("fixed", n, stride=4, c=1, documents=[5, 7]).params)
    assert expression_recipe(cut + make("full", n)) is None
    assert expression_recipe(make("local", n, window=2)) == {
        "pattern": "local", "params": {"window": 2, "causal": True}, "n": n}
    with pytest.raises(TypeError):
        expression_recipe("strided")


def _leaf(name="local", **params):
    return {"pattern": name, "params": params if params or name != "local" else {"window": 1}}


def _nested(depth):
    node = _leaf()
    for _ in range(depth):
        node = {"op": "-", "args": [node, _leaf()]}
    return node


def _shared(levels):
    node = _leaf()
    for _ in range(levels):
        node = {"op": "+", "args": [node, node]}  # one object: 2^levels leaves if walked
    return node


@pytest.mark.parametrize(("recipe", "message"), [
    ([1], "an expression recipe must be a JSON object, got [1]"),
    ({"op": "+", "args": [_leaf(), _leaf()]}, "n must be an integer in [1, 2147483647], got None"),
    ({"op": "+", "args": [_leaf(), _leaf()], "n": True}, "n must be an integer"),
    ({"op": "+", "args": [_leaf(), _leaf()], "n": 0}, "n must be an integer"),
    ({"op": "^", "args": [_leaf(), _leaf()], "n": 8}, "expression: op must be one of"),
    ({"op": "+", "args": [_leaf()], "n": 8}, "expression: '+' takes a list 'args' of at least 2"),
    ({"op": "-", "args": [_leaf()] * 3, "n": 8}, "'-' takes a list 'args' of exactly 2 nodes, got 3"),
    ({"op": "|", "args": {"a": 1}, "n": 8}, "'|' takes a list 'args'"),
    ({"op": "|", "args": [_leaf(), 3], "n": 8}, "expression.args[1]: expected a JSON object, got 3"),
    ({"op": "|", "args": [_leaf(), {"x": 1}], "n": 8}, "expression.args[1]: a node needs 'op'"),
    ({**_nested(MAX_DEPTH + 1), "n": 8}, f"operators nest deeper than {MAX_DEPTH}"),
    ({**_shared(12), "n": 8}, f"a recipe holds at most {MAX_NODES} nodes"),
    ({"op": "|", "args": [_leaf(), {**_leaf(), "n": 9}], "n": 8},
     "expression.args[1]: n=9 differs from the recipe's n=8"),
    ({"op": "|", "args": [_leaf(), _leaf("strided", stride=2)], "n": 8},
     "expression: b: strided has 2 heads, but a (local) has 1"),
    ({"op": "+", "args": [_leaf(), _leaf("nope")], "n": 8}, "unknown pattern 'nope'"),
    ({"op": "+", "args": [_leaf(), _leaf(window=-1)], "n": 8},
     "expression.args[1]: window: must be an integer >= 0, got -1"),
    ({"op": "+", "args": [_leaf(), _leaf(window=[1])], "n": 8}, "param 'window' must be"),
    ({"op": "+", "args": [_leaf(), _leaf(n=3)], "n": 8}, "expression.args[1]: "),
    ({"op": "+", "args": [_leaf(), {**_leaf(), "extra": 1}], "n": 8}, "unknown keys ['extra']"),
    ({"op": "+", "args": [_leaf(), {**_leaf(), "version": 1}], "n": 8}, "unknown keys ['version']"),
    ({"op": "+", "args": [_leaf(), _leaf("global_tokens", tokens=2, documents=[3, 4])], "n": 8},
     "documents: lengths sum to 7, not n=8"),
])
def test_bad_recipes(recipe, message):
    with pytest.raises(ValueError) as err:
        from_expression(recipe, where="r.json")
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("r.json: ") and message in msg, msg


def test_recipe_top_level_keys_of_the_file_format_are_ignored():
    r = {"op": "+", "args": [_leaf(), _leaf("global_tokens")], "n": 8, "version": 1,
         "generator": "sparse-patterns"}
    assert from_expression(r).head_names == ("local.A", "global_tokens.G")
    assert from_expression({**_nested(MAX_DEPTH), "n": 8}).rule.depth == MAX_DEPTH


# ------------------------------------------------------------------ consumers
@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize("n", [1, 23, 40])
def test_kernel_runs_combined_patterns(mode, n):
    rng = np.random.default_rng(n)
    pats = [
        sps.strided(n, stride=5) + sps.global_tokens(n, tokens=min(2, n)),
        # a head with empty rows: global tokens minus the diagonal
        (sps.local(n, window=3, causal=False) & sps.full(n)) + (
            sps.global_tokens(n, min(2, n)) - sps.local(n, window=0)),
        make("strided", n, stride=4, causal=False) | make("fixed", n, stride=4, c=1, causal=False),
    ]
    for pat in pats:
        H = 2 * pat.num_heads if mode == "multihead" else 2
        q, k, v = (rng.standard_normal((1, H, n, 8)) for _ in range(3))
        out, lse = sps.kernels.attention(q, k, v, pat, mode=mode, return_lse=True, block=8)
        ref, ref_lse = attention_oracle(q, k, v, attention_masks(pat, mode, H))
        np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-10, atol=1e-12)


def test_verify_runs_on_a_combined_pattern():
    n = 30
    pat = make("local", n, window=3) + make("global_tokens", n, tokens=2)
    for mode in ("interleaved", "merged"):
        r = sps.verify(pat, mode=mode, depth=True)
        o = bfs_verify(pat.to_dense(), 2, mode, True, True)
        assert (r.criterion1, r.criterion2, r.hops, r.unreachable) == (
            o["criterion1"], o["criterion2"], o["hops"], o["unreachable"])
    both = make("local", n, window=3, causal=False) + make("global_tokens", n, causal=False)
    assert sps.verify(both, mode="merged").ok  # any j, then token 0, then any i
    assert not sps.verify(make("local", n, window=3) + make("local", n, window=3)).ok
