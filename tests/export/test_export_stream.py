"""Exports streamed in row chunks: a tiny forced chunk gives the same files and
tensors as one chunk (npz, safetensors, block layouts, FlexAttention), the files
equal what numpy / safetensors write for the whole CSR, a generated pattern is
never materialized (a tiny memory limit would refuse it), and what cannot be
streamed is refused with the memory limit's error before anything is written."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

from sparse_patterns import Pattern, config, make
from sparse_patterns.export import load, save, to_block_layout, to_bsa_mask
from sparse_patterns.export._codec import meta_of
from sparse_patterns.pattern import PatternRule

CASES = [
    ("strided", 37, {"stride": 5}),
    ("fixed", 50, {"stride": 8, "c": 2, "summary_heads": 2, "causal": False}),
    ("factorized", 40, {"p": 3}),
    ("bigbird", 45, {"block": 4, "random_blocks": 1, "seed": 3}),
    ("local2d", 36, {"query_block": 2, "memory": 1}),
]


def _force_chunk(monkeypatch, rows):
    """Every streaming consumer reads ``rows`` rows at a time (Pattern.chunk_rows)."""
    monkeypatch.setattr(Pattern, "chunk_rows", lambda self, entries=None: rows)


def _rows_only(pat: Pattern) -> Pattern:
    """The same heads behind a rule that only answers row ranges (no counts, no blocks)."""
    heads = [h.copy() for h in pat.heads]
    rule = PatternRule(len(heads), lambda: heads,
                       rows=lambda a, b: [h[a:b] for h in heads])
    return Pattern.from_rule(rule, pat.n, name="custom", causal=pat.causal,
                             head_names=pat.head_names)


def _csr_arrays(pat: Pattern) -> dict[str, np.ndarray]:
    """The reference arrays, from the whole CSR (small n only)."""
    out = {}
    for k, h in enumerate(pat.heads):
        dt = np.int32 if max(pat.n, h.nnz) < 2**31 - 1 else np.int64
        out[f"indptr_{k}"] = h.indptr.astype(dt)
        out[f"indices_{k}"] = h.indices.astype(dt)
    return out


def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {zi.filename: zf.read(zi) for zi in zf.infolist()}


def _patterns(name, n, params):
    gen = make(name, n, **params)
    return {"generated": gen, "custom": Pattern(make(name, n, **params).heads, causal=gen.causal,
                                                head_names=gen.head_names),
            "rows-only": _rows_only(make(name, n, **params))}


@pytest.mark.parametrize("chunk", [1, 3, 7])
@pytest.mark.parametrize(("name", "n", "params"), CASES)
def test_npz_and_safetensors_chunked_equal_whole(tmp_path, monkeypatch, name, n, params, chunk):
    from safetensors.numpy import save as st_save

    for kind, pat in _patterns(name, n, params).items():
        ref = _patterns(name, n, params)[kind]
        arrays = _csr_arrays(ref)
        meta = json.dumps(meta_of(pat))
        # the reference files: numpy and safetensors writing the whole CSR at once
        buf = io.BytesIO()
        np.savez_compressed(buf, meta=np.frombuffer(meta.encode(), np.uint8), **arrays)
        want_npz = _members(buf)
        want_st = st_save(arrays, metadata={"sparse_patterns": meta})
        with monkeypatch.context() as m:
            _force_chunk(m, chunk)
            f_npz = save(pat, tmp_path / f"{kind}.npz")
            f_st = save(pat, tmp_path / f"{kind}.safetensors")
        assert _members(f_npz) == want_npz, kind
        assert list(_members(f_npz)) == list(want_npz)  # same member order
        assert f_st.read_bytes() == want_st, kind  # byte for byte
        for f in (f_npz, f_st):
            back = load(f)
            assert back == ref and back.head_names == ref.head_names
        if kind == "generated":
            assert not pat.materialized  # streamed from the rule, never the whole CSR


def test_generated_pattern_is_written_under_a_tiny_memory_limit(tmp_path):
    # the whole CSR (about 1.7 kB) would be refused; chunks of rows are not
    pat = make("strided", 120, stride=11)
    want = make("strided", 120, stride=11).heads
    with config.memory_limit(1000):
        with pytest.raises(config.MemoryLimitError):
            _ = make("strided", 120, stride=11).heads
        f_npz = save(pat, tmp_path / "s.npz")
        f_st = save(pat, tmp_path / "s.safetensors")
    assert not pat.materialized
    for f in (f_npz, f_st):
        back = load(f)
        assert all((a != b).nnz == 0 for a, b in zip(back.heads, want, strict=True))


def test_rows_that_disagree_with_the_counts_leave_nothing(tmp_path):
    # a rule whose rows hold fewer entries than its counts: refused, no file left behind
    heads = [sp.identity(6, dtype=bool, format="csr")]
    rule = PatternRule(1, lambda: heads, rows=lambda a, b: [heads[0][a:b]],
                       counts=lambda: np.full((1, 6), 2, dtype=np.int64))
    pat = Pattern.from_rule(rule, 6, name="custom")
    for suffix in (".npz", ".safetensors"):
        with pytest.raises(ValueError, match="indices_0: the pattern's rows hold"):
            save(pat, tmp_path / f"x{suffix}")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("name", "n", "params"), CASES)
def test_block_layouts_chunked_equal_whole(monkeypatch, name, n, params):
    pytest.importorskip("torch")
    pats = _patterns(name, n, params)
    want = {kind: (to_block_layout(p, 4, mode="merged"), to_bsa_mask(p, block=8, mode="merged"))
            for kind, p in pats.items()}
    dense = pats["custom"].to_dense()  # (p, n, n): the max-pooling oracle
    nb = -(-n // 4)
    pad = np.zeros((dense.shape[0], nb * 4, nb * 4), dtype=bool)
    pad[:, :n, :n] = dense
    oracle = pad.reshape(-1, nb, 4, nb, 4).any(axis=(2, 4))  # (p, nb, nb)
    for chunk in (1, 3):
        with monkeypatch.context() as m:
            _force_chunk(m, chunk)
            for kind, p in _patterns(name, n, params).items():
                lay = to_block_layout(p, 4)
                assert np.array_equal(lay.numpy(), oracle.astype(np.int64)), (kind, chunk)
                assert np.array_equal(to_block_layout(p, 4, mode="merged").numpy(),
                                      want[kind][0].numpy())
                assert np.array_equal(to_bsa_mask(p, block=8, mode="merged").numpy(),
                                      want[kind][1].numpy())


# ------------------------------------------------------------------ FlexAttention
def _dense_ordered(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What BlockMask derives from a dense block mask: a stable sort, set tiles first."""
    return sel.sum(-1).astype(np.int32), np.argsort(~sel, axis=-1, kind="stable").astype(np.int32)


@pytest.mark.parametrize(("mode", "num_heads"), [("multihead", None), ("multihead", 5), ("merged", None)])
@pytest.mark.parametrize(("name", "n", "params"), CASES)
def test_flex_block_tensors_chunked_equal_whole_and_oracle(monkeypatch, name, n, params, mode,
                                                           num_heads):
    from sparse_patterns.export.flex import flex_block_tensors

    B = 8
    pats = _patterns(name, n, params)
    dense = pats["custom"].to_dense()  # (p, n, n)
    p = dense.shape[0]
    nb = -(-n // B)
    pad = np.zeros((p, nb * B, nb * B), dtype=np.int64)
    pad[:, :n, :n] = dense
    cnt = pad.reshape(p, nb, B, nb, B).sum(axis=(2, 4))  # (p, nb, nb) set pairs a tile
    size = np.minimum(B, n - np.arange(nb) * B)
    area = np.multiply.outer(size, size)
    lay, full = cnt > 0, cnt == area
    plan = [h % p for h in range(num_heads or p)] if mode == "multihead" else [-1]
    want = {}
    for prefix, is_full, transpose in (("kv", False, False), ("full_kv", True, False),
                                       ("q", False, True), ("full_q", True, True)):
        sels = []
        for k in plan:
            if k < 0:
                sel = full.any(0) if is_full else lay.any(0) & ~full.any(0)
            else:
                sel = full[k] if is_full else lay[k] & ~full[k]
            sels.append(sel.T if transpose else sel)
        num, idx = _dense_ordered(np.stack(sels))
        want[f"{prefix}_num_blocks"], want[f"{prefix}_indices"] = num[None], idx[None]
    for chunk in (None, 1, 3):
        with monkeypatch.context() as m:
            if chunk is not None:
                _force_chunk(m, chunk)
            for kind, pat in _patterns(name, n, params).items():
                got = flex_block_tensors(pat, mode=mode, num_heads=num_heads, block_size=B)
                assert set(got) == set(want)
                for key, v in want.items():
                    assert got[key].dtype == np.int32
                    assert np.array_equal(got[key], v), (kind, chunk, key)


@pytest.mark.parametrize("mode", ["multihead", "merged"])
@pytest.mark.parametrize(("name", "n", "params"), CASES)
def test_flex_block_mask_chunked_equal_whole(monkeypatch, name, n, params, mode):
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from sparse_patterns.export import to_flex_block_mask

    def dense_of(bm):
        return bm.to_dense(), [bm.mask_mod(torch.tensor(0), torch.tensor(h), q, kv)
                               for h in range(bm.kv_num_blocks.shape[1])]

    q, kv = torch.arange(n)[:, None], torch.arange(n)[None, :]
    whole = {kind: to_flex_block_mask(p, mode=mode, block_size=8, impl="csr")
             for kind, p in _patterns(name, n, params).items()}
    for kind, bm in whole.items():  # q_* equal what BlockMask derives from the kv_* tensors
        ref = flex.BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices,
                                            bm.full_kv_num_blocks, bm.full_kv_indices,
                                            BLOCK_SIZE=8, seq_lengths=(n, n))
        for a in ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
            assert torch.equal(getattr(bm, a), getattr(ref, a)), (kind, a)
    with monkeypatch.context() as m:
        _force_chunk(m, 3)
        for kind, p in _patterns(name, n, params).items():
            bm = to_flex_block_mask(p, mode=mode, block_size=8, impl="csr")
            ref = whole[kind]
            for a in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                      "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
                assert torch.equal(getattr(bm, a), getattr(ref, a)), (kind, a)
            d1, m1 = dense_of(bm)
            d2, m2 = dense_of(ref)
            assert torch.equal(d1, d2)
            assert all(torch.equal(x, y) for x, y in zip(m1, m2, strict=True))


def test_flex_pt_of_a_generated_pattern_holds_its_recipe(tmp_path):
    torch = pytest.importorskip("torch")
    from sparse_patterns.export import export_pattern

    pat = make("strided", 96, stride=10)
    with config.memory_limit(1000):  # the CSR would be refused: the file never needs it
        export_pattern(pat, tmp_path / "s.pt", "flex", block=16)
    assert not pat.materialized
    obj = torch.load(tmp_path / "s.pt", weights_only=True)
    assert not any(k.startswith(("indptr_", "indices_")) for k in obj)
    assert json.loads(obj["recipe"]) == {"pattern": "strided", "n": 96, "version": 1,
                                         "params": {"stride": 10, "window": "paper", "causal": True}}
    assert obj["kv_indices"].shape == (1, 2, 6, 6)
    assert load(tmp_path / "s.pt") == make("strided", 96, stride=10)
    # a user layout has no recipe: its CSR goes in
    custom = Pattern(make("strided", 96, stride=10).heads)
    export_pattern(custom, tmp_path / "c.pt", "flex", block=16)
    obj = torch.load(tmp_path / "c.pt", weights_only=True)
    assert "recipe" not in obj and "indptr_1" in obj
    assert load(tmp_path / "c.pt") == custom


def test_flex_pt_recipe_is_checked(tmp_path):
    torch = pytest.importorskip("torch")
    from sparse_patterns.export import export_pattern

    f = export_pattern(make("local", 32, window=3), tmp_path / "l.pt", "flex", block=8).file
    obj = torch.load(f, weights_only=True)
    bad = dict(obj, recipe=json.dumps({"pattern": "local", "n": 32, "version": 1,
                                       "params": {"window": 3, "causal": False}}))
    torch.save(bad, tmp_path / "b.pt")
    with pytest.raises(ValueError, match="the recipe does not regenerate the pattern the metadata"):
        load(tmp_path / "b.pt")
    torch.save(dict(obj, recipe="{not json"), tmp_path / "b.pt")
    with pytest.raises(ValueError, match="'recipe' is not valid JSON"):
        load(tmp_path / "b.pt")
    torch.save(dict(obj, indptr_0=torch.zeros(33, dtype=torch.int32)), tmp_path / "b.pt")
    with pytest.raises(ValueError, match="holds both a recipe and CSR tensors"):
        load(tmp_path / "b.pt")
    torch.save(dict(obj, recipe=json.dumps({"pattern": "nope", "n": 32, "version": 1})),
               tmp_path / "b.pt")
    with pytest.raises(ValueError, match="b.pt: "):
        load(tmp_path / "b.pt")


def test_what_cannot_be_streamed_is_refused_before_writing(tmp_path):
    pytest.importorskip("torch")
    from sparse_patterns.export import export_pattern
    from sparse_patterns.export.flex import flex_block_tensors

    pat = _rows_only(make("strided", 300, stride=17))
    # the BlockMask tensors are (H, nb, nb): refused with the limit's error, naming block_size
    with config.memory_limit(10_000):
        with pytest.raises(config.MemoryLimitError, match="block_size: the BlockMask of strided"):
            flex_block_tensors(make("strided", 4096, stride=64), block_size=16)
        with pytest.raises(config.MemoryLimitError, match="block: the block layout of strided"):
            export_pattern(make("strided", 4096, stride=64), tmp_path / "d.pt", "deepspeed", block=16)
        with pytest.raises(config.MemoryLimitError, match="block: the block layout of strided"):
            to_bsa_mask(make("strided", 4096, stride=64), block=32)
        # a .pt is written whole by torch.save: a custom pattern's CSR must fit the limit
        with pytest.raises(config.MemoryLimitError, match="heads: the token-level CSR"):
            export_pattern(pat, tmp_path / "c.pt", "flex", block=64)
    assert not list(tmp_path.iterdir())


def test_ordered_into_matches_a_stable_sort():
    from sparse_patterns.util.stream import ordered_into

    rng = np.random.default_rng(0)
    for shape in ((1, 1), (3, 7), (16, 16), (5, 40)):
        for density in (0.0, 0.3, 1.0):
            sel = rng.random(shape) < density
            counts = np.empty(shape[0], np.int32)
            order = np.empty(shape, np.int32)
            ordered_into(sel, counts, order)
            want_c, want_o = _dense_ordered(sel)
            assert np.array_equal(counts, want_c) and np.array_equal(order, want_o)


@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (31, 33), (64, 64), (130, 65), (1, 200)])
def test_ordering_of_a_transposed_view_equals_a_contiguous_copy(shape):
    from sparse_patterns.util.stream import ordered_into

    a = np.random.default_rng(shape[0] * 1000 + shape[1]).random(shape) < 0.3
    got = np.empty(shape[1], np.int32), np.empty(shape[::-1], np.int32)
    want = np.empty(shape[1], np.int32), np.empty(shape[::-1], np.int32)
    ordered_into(a.T, *got)  # the tiled transpose
    dense = a.T.copy()
    ordered_into(dense, *want)
    assert (got[0] == dense.sum(1)).all() and (got[0] == want[0]).all() and (got[1] == want[1]).all()
    for r in range(shape[1]):  # set columns ascending, then the rest ascending
        assert got[1][r].tolist() == [*np.flatnonzero(dense[r]), *np.flatnonzero(~dense[r])]
