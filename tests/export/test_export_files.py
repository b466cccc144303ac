"""Files: .npz, .safetensors, .json recipes and the .pt exports round-trip;
malformed and hostile files are rejected with a one-line message before any
large allocation."""

from __future__ import annotations

import io
import json
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparse_patterns import REGISTRY, Pattern, make
from sparse_patterns.export import from_recipe, load, save, to_recipe

FAMILY_CASES = [
    ("full", {}), ("strided", {"stride": 5, "window": "reference"}),
    ("fixed", {"stride": 8, "c": 2, "summary_heads": 2, "causal": False}),
    ("local", {"window": 3}), ("dilated", {"window": 2, "dilation": 3}),
    ("local2d", {"query_block": 2, "memory": 1}), ("axial2d", {"causal": False}),
    ("factorized", {"p": 3}), ("longformer", {"window": 2, "global_tokens": 2}),
    ("bigbird", {"block": 4, "random_blocks": 1, "seed": 7}), ("global_tokens", {"tokens": 3}),
]


def test_cases_cover_registry():
    assert {name for name, _ in FAMILY_CASES} == set(REGISTRY)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".json"])
@pytest.mark.parametrize(("name", "params"), FAMILY_CASES)
def test_round_trip_every_family(tmp_path, name, params, suffix):
    pat = make(name, 36, **params)
    back = load(save(pat, tmp_path / f"p{suffix}"))
    assert back == pat
    assert back.name == pat.name and dict(back.params) == dict(pat.params)
    assert back.head_names == pat.head_names


@pytest.mark.parametrize(("name", "params"), FAMILY_CASES)
def test_recipe_regenerates_exactly(name, params):
    pat = make(name, 49, **params)
    r = to_recipe(pat)
    assert set(r) == {"pattern", "params", "n", "version"}
    assert set(r["params"]) == {p.name for p in REGISTRY[name].params}
    again = make(r["pattern"], r["n"], **json.loads(json.dumps(r["params"])))
    assert again == pat and from_recipe(r) == pat


@given(
    n=st.integers(1, 24),
    p=st.integers(1, 3),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
    causal=st.booleans(),
)
def test_custom_patterns_round_trip(tmp_path_factory, n, p, density, seed, causal):
    rng = np.random.default_rng(seed)
    a = rng.random((p, n, n)) < density
    if causal:
        a &= np.tril(np.ones((n, n), dtype=bool))
    pat = Pattern.from_dense(a, causal=causal, head_names=[f"h{k}" for k in range(p)])
    d = tmp_path_factory.mktemp("rt")
    for suffix in (".npz", ".safetensors"):
        back = load(save(pat, d / f"c{suffix}"))
        assert back == pat and back.head_names == pat.head_names


def test_custom_pattern_has_no_recipe(tmp_path):
    pat = Pattern.from_dense(np.eye(4, dtype=bool))
    with pytest.raises(ValueError, match="pattern: a 'custom' pattern has no recipe"):
        save(pat, tmp_path / "c.json")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"path: unknown suffix '.txt'"):
        save(make("local", 8, window=1), tmp_path / "x.txt")
    with pytest.raises(ValueError, match="path: no such file"):
        load(tmp_path / "missing.npz")


@pytest.mark.parametrize("fmt", ["flex", "deepspeed", "xformers", "triton", "bsa"])
def test_torch_exports_load_back(tmp_path, fmt):
    torch = pytest.importorskip("torch")
    from sparse_patterns.export import from_block_layout, save_torch_export

    pat = make("fixed", 64, stride=16, c=8)  # block-aligned for 8-token blocks
    f = save_torch_export(pat, tmp_path / "x.pt", fmt, block=8 if fmt != "bsa" else None)
    obj = torch.load(f, weights_only=True)
    assert obj["format"] == fmt
    back = load(f)
    if fmt == "flex":
        assert back == pat
        assert obj["kv_indices"].shape == (1, 2, 8, 8)
    elif fmt == "bsa":
        assert obj["base_blockmask"].shape == (1, 2, 1, 1)
        assert obj["head_mask_type"].tolist() == [1, 2]
        assert back == from_block_layout(obj["base_blockmask"][0], 128, 64)
    else:
        assert obj["layout"].dtype == torch.int64 and obj["layout"].shape == (2, 8, 8)
        assert back == pat


# ------------------------------------------------------------------ hostile files
def _meta(**over):
    m = {"format": "sparse-patterns", "version": 1, "n": 4, "num_heads": 1, "name": "custom",
         "params": {}, "causal": False, "head_names": ["A1"]}
    m.update(over)
    return np.frombuffer(json.dumps(m).encode(), dtype=np.uint8)


def _npz(path, **arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())
    return path


GOOD = {"indptr_0": np.array([0, 1, 2, 3, 4], np.int32), "indices_0": np.arange(4, dtype=np.int32)}


def test_good_handmade_npz(tmp_path):
    pat = load(_npz(tmp_path / "ok.npz", meta=_meta(), **GOOD))
    assert pat.nnz == 4 and not pat.causal


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"meta": _meta(n=10**12)}, r"n must be an integer in \[1, 2147483647\], got 1000000000000"),
        ({"meta": _meta(n=5)}, r"indptr_0 has 5 entries, expected n \+ 1 = 6"),  # inconsistent n
        ({"meta": _meta(num_heads=2, head_names=["a", "b"])}, "missing array 'indptr_1'"),
        ({"meta": _meta(version=9)}, r"version must be an integer in \[1, 1\]"),
        ({"meta": _meta(format="other")}, "not a sparse-patterns file"),
        ({"meta": np.frombuffer(b"{not json", np.uint8)}, "'meta' is not valid JSON"),
        ({"meta": _meta(), "indices_0": np.arange(4.0)}, "indices_0 has dtype float64, expected int32 or int64"),
        ({"meta": _meta(), "indices_0": np.array([0, 1, 2, 9], np.int32)}, r"column 9 out of range \[0, 4\)"),
        ({"meta": _meta(), "indices_0": np.array([0, -1, 2, 3], np.int32)}, r"column -1 out of range"),
        ({"meta": _meta(), "indptr_0": np.array([0, 2, 2, 3, 4], np.int32),
          "indices_0": np.array([1, 0, 2, 3], np.int32)}, "sorted and unique within each row"),
        ({"meta": _meta(), "indptr_0": np.array([0, 2, 2, 3, 4], np.int32),
          "indices_0": np.array([1, 1, 2, 3], np.int32)}, "sorted and unique within each row"),
        ({"meta": _meta(), "indptr_0": np.array([0, 3, 2, 3, 4], np.int32)}, "indptr_0 must be non-decreasing"),
        ({"meta": _meta(), "indptr_0": np.array([1, 1, 2, 3, 4], np.int32)}, r"indptr_0\[0\] must be 0"),
        ({"meta": _meta(), "indptr_0": np.array([0, 1, 2, 3, 5], np.int32)},
         r"indptr_0\[-1\] = 5 but indices_0 has 4 entries"),
        ({"meta": _meta(), "indptr_0": np.zeros((5, 1), np.int32)}, r"indptr_0 must be 1-D"),
        ({"meta": _meta(causal=True), "indices_0": np.array([1, 1, 2, 3], np.int32),
          "indptr_0": np.array([0, 1, 2, 3, 4], np.int32)}, r"causal pattern has entry \(i=0, j=1\)"),
        ({"meta": _meta(), "extra": np.zeros(2)}, r"unexpected arrays \['extra'\]"),
        ({"meta": _meta(), "indices_0": np.array(["a", "b"], dtype=object)}, "needs pickle"),
        ({"indptr_0": GOOD["indptr_0"]}, "no 'meta' array"),
    ],
)
def test_malformed_npz_rejected(tmp_path, arrays, message):
    full = dict(GOOD)
    full.update(arrays)
    if "meta" not in arrays:
        full.pop("meta", None)
    f = _npz(tmp_path / "bad.npz", **full)
    with pytest.raises(ValueError, match=message) as exc:
        load(f)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(str(f))


def test_npz_header_claiming_huge_array_is_refused_before_allocating(tmp_path):
    """An .npy header claiming 10**12 int64 entries over a few bytes of data."""
    f = tmp_path / "huge.npz"
    with zipfile.ZipFile(f, "w") as zf:
        for name, a in (("meta", _meta()), ("indptr_0", GOOD["indptr_0"])):
            b = io.BytesIO()
            np.save(b, a)
            zf.writestr(name + ".npy", b.getvalue())
        b = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            b, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)}
        )
        zf.writestr("indices_0.npy", b.getvalue() + b"\0" * 32)
    with pytest.raises(ValueError, match=r"indices_0. declares 8,000,000,000,000 bytes but the member holds \d+: truncated"):
        load(f)


def test_npz_truncated_member_is_refused(tmp_path):
    f = tmp_path / "short.npz"
    with zipfile.ZipFile(f, "w") as zf:
        for name, a in (("meta", _meta()), ("indptr_0", GOOD["indptr_0"])):
            b = io.BytesIO()
            np.save(b, a)
            zf.writestr(name + ".npy", b.getvalue())
        b = io.BytesIO()
        np.save(b, GOOD["indices_0"])
        zf.writestr("indices_0.npy", b.getvalue()[:-6])
    with pytest.raises(ValueError, match="declares 16 bytes but the member holds .*: truncated"):
        load(f)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_truncated_files_rejected(tmp_path, cut):
    pat = make("strided", 200, stride=14)
    for suffix in (".npz", ".safetensors", ".json"):
        f = save(pat, tmp_path / f"t{suffix}")
        data = f.read_bytes()
        f.write_bytes(data[: int(len(data) * cut)])
        with pytest.raises(ValueError) as exc:
            load(f)
        assert "\n" not in str(exc.value) and str(f) in str(exc.value)


def _safetensors(path, header: dict, data: bytes = b""):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


ST_META = {"sparse_patterns": json.dumps(json.loads(_meta().tobytes()))}


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"__metadata__": ST_META,
          "indptr_0": {"dtype": "I32", "shape": [5], "data_offsets": [0, 20]},
          "indices_0": {"dtype": "I64", "shape": [10**12], "data_offsets": [20, 8 * 10**12 + 20]}},
         b"\0" * 52, r"indices_0 declares 8,000,000,000,000 bytes .* truncated or corrupt"),
        ({"__metadata__": ST_META,
          "indptr_0": {"dtype": "F32", "shape": [5], "data_offsets": [0, 20]},
          "indices_0": {"dtype": "I32", "shape": [4], "data_offsets": [20, 36]}},
         b"\0" * 36, r"indptr_0 has dtype 'F32', expected int32 or int64"),
        ({"weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4,
         "no 'sparse_patterns' metadata"),
        ({"__metadata__": {"sparse_patterns": json.dumps(
            dict(json.loads(_meta().tobytes()), n=10**12))}}, b"",
         r"n must be an integer in \[1, 2147483647\]"),
    ],
)
def test_malformed_safetensors_rejected(tmp_path, header, data, message):
    f = _safetensors(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(ValueError, match=message):
        load(f)


def test_safetensors_header_length_lie(tmp_path):
    f = tmp_path / "lie.safetensors"
    f.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(ValueError, match="header claims 1,000,000,000,000 bytes"):
        load(f)


def test_safetensors_out_of_range_indices(tmp_path):
    data = np.array([0, 1, 2, 3, 4], "<i4").tobytes() + np.array([0, 1, 2, 7], "<i4").tobytes()
    f = _safetensors(tmp_path / "oor.safetensors", {
        "__metadata__": ST_META,
        "indptr_0": {"dtype": "I32", "shape": [5], "data_offsets": [0, 20]},
        "indices_0": {"dtype": "I32", "shape": [4], "data_offsets": [20, 36]},
    }, data)
    with pytest.raises(ValueError, match=r"column 7 out of range \[0, 4\)"):
        load(f)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"pattern": "strided", "n": 1000000000000, "params": {}, "version": 1}',
         r"n must be an integer in \[1, 2147483647\], got 1000000000000"),
        ('{"pattern": "nope", "n": 16, "params": {}, "version": 1}', "unknown pattern 'nope'"),
        ('{"pattern": "strided", "n": 16, "params": {"stride": -1}, "version": 1}',
         "stride: must be an integer >= 1, got -1"),
        ('{"pattern": "strided", "n": 16, "params": {"bogus": 1}, "version": 1}',
         "takes no parameter 'bogus'"),
        ('{"pattern": "strided", "n": 16, "params": {}}', "version must be an integer"),
        ('{"pattern": "strided", "n": 16, "params": {}, "version": 1, "x": 0}',
         r"unknown keys \['x'\]"),
        ("[1, 2]", "a recipe must be a JSON object"),
        ('{"pattern": ', "not valid JSON"),
    ],
)
def test_malformed_recipe_rejected(tmp_path, text, message):
    f = tmp_path / "r.json"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        load(f)


def test_malformed_pt_rejected(tmp_path):
    torch = pytest.importorskip("torch")
    f = tmp_path / "x.pt"
    f.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(ValueError, match="not a readable torch file"):
        load(f)
    torch.save({"format": "deepspeed", "n": 64, "causal": True, "block": 8,
                "layout": torch.ones(2, 4, 4, dtype=torch.int64)}, f)
    with pytest.raises(ValueError, match=r"layout must have shape \(H, 8, 8\) for n=64, block=8"):
        load(f)
    torch.save({"format": "deepspeed", "n": 2**31 - 1, "causal": True, "block": 2**30,
                "layout": torch.ones(1, 2, 2, dtype=torch.int64)}, f)
    with pytest.raises(ValueError, match=r"the layout \(1, 2, 2\) with block=1073741824 expands to [\d,]+ token pairs"):
        load(f)
    torch.save({"weights": torch.zeros(3)}, f)
    with pytest.raises(ValueError, match="not a file written by 'patterns export'"):
        load(f)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_every_written_file_gets_the_umask_mode(tmp_path, umask):
    # pattern files and figures share one atomic writer: a new file gets 0o666 & ~umask
    # (mkstemp alone would leave 0o600), as open(path, "w") would
    import importlib.util
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparse_patterns.export import save_torch_export
    from sparse_patterns.render import save_figure

    pat = make("strided", 16, stride=4)
    old = os.umask(umask)
    try:
        paths = [save(pat, tmp_path / f"p{suffix}") for suffix in (".npz", ".safetensors", ".json")]
        fig = plt.figure()
        paths.append(save_figure(fig, tmp_path / "f.png"))
        plt.close(fig)
        if importlib.util.find_spec("torch") is not None:
            paths.append(save_torch_export(pat, tmp_path / "p.pt", "deepspeed", block=4))
    finally:
        os.umask(old)
    for path in paths:
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask, path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
