"""Hostile files: loading either returns exactly the pattern a file holds or
refuses with a one-line ``ValueError`` that names the file, and it stays within
the load limit (issue 20).

Hypothesis builds hostile files in every format (``.npz``, ``.safetensors``,
``.json`` recipes, ``flex`` ``.pt`` with a recipe or a CSR, ``deepspeed`` and
``bsa`` ``.pt`` layouts):

* valid files truncated, with bytes overwritten or garbage appended;
* hand-made files with lying headers (``n``, heads, shapes, dtypes, offsets,
  header lengths; sizes up to ``2**31 - 1`` and beyond) and random index
  arrays: the loader must accept exactly the canonical CSRs, checked against
  a loop-by-loop reference, and keep a name and params only when the
  generator regenerates the stored heads;
* stride-0 and overlapping tensors in ``.pt`` files;
* nested and non-scalar metadata, JSON nested 100,000 deep.

In-process examples run under a 64 MB load limit, so a loader that allocated
what a file declares would fail fast instead of exhausting the machine. The
cases of the issue (a 2 kB flex ``.pt`` declaring n = 2**26, a 1.6 kB
DeepSpeed layout, a 1.2 MB ``.npz`` of deflated zeros, a bigbird recipe with
block 10**9, ``local`` at n = 2**27, a recipe nested 100,000 deep, ...) are
loaded in forked children of one subprocess with the default limits but a
256 MB load limit, each child's peak RSS growth (``ru_maxrss``) bounded, and
no file may be left behind.

The CI run is short (``SP_FUZZ_EXAMPLES``, default 15 examples a strategy,
a few seconds). Run longer with::

    SP_FUZZ_EXAMPLES=2000 .venv/bin/pytest -q -p no:cacheprovider tests/export/test_hostile_files.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sparse_patterns import REGISTRY, Pattern, config, make
from sparse_patterns.export import export_pattern, load, save

torch = pytest.importorskip("torch")

EXAMPLES = int(os.environ.get("SP_FUZZ_EXAMPLES", "15"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: the load limit of the in-process examples
LIMIT = 64 << 20
MAX_N = 2**31 - 1
INDEX = (np.dtype("<i4"), np.dtype("<i8"))

FAMILIES = [
    ("full", {}), ("strided", {"stride": 3}), ("fixed", {"stride": 4, "c": 1}),
    ("local", {"window": 2, "causal": False}), ("bigbird", {"block": 2, "random_blocks": 1}),
    ("longformer", {"window": 1, "global_tokens": 1}), ("factorized", {"p": 2}),
]


class Reject(Exception):
    """The reference says the file must be refused."""


class Unknown(Exception):
    """Too large for the reference to decide: either outcome is accepted."""


# ----------------------------------------------------------------- the reference
def _ref_meta(meta: object) -> dict:
    """The metadata rules, written out: raise Reject where the loader must refuse."""
    def nat(v, lo, hi):
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    ok = (isinstance(meta, dict) and meta.get("format") == "sparse-patterns"
          and nat(meta.get("version"), 1, 1) and nat(meta.get("n"), 1, MAX_N)
          and nat(meta.get("num_heads"), 1, 4096) and isinstance(meta.get("name"), str)
          and isinstance(meta.get("params"), dict)
          and all(v is None or isinstance(v, (bool, int, float, str)) for v in meta["params"].values())
          and isinstance(meta.get("causal"), bool) and isinstance(meta.get("head_names"), list)
          and len(meta["head_names"]) == meta["num_heads"]
          and all(isinstance(s, str) for s in meta["head_names"]))
    if not ok:
        raise Reject("metadata")
    return meta


def _ref_dense(meta: dict, arrays: dict) -> np.ndarray:
    """Dense ``(p, n, n)`` of canonical CSR arrays, checked entry by entry; else Reject."""
    n, p, causal = meta["n"], meta["num_heads"], meta["causal"]
    if set(arrays) != {f"{a}_{k}" for k in range(p) for a in ("indptr", "indices")}:
        raise Reject("array names")
    for k in range(p):
        ip, ix = arrays[f"indptr_{k}"], arrays[f"indices_{k}"]
        if ip.dtype not in INDEX or ix.dtype not in INDEX or ip.ndim != 1 or ix.ndim != 1:
            raise Reject("dtype or shape")
        if ip.size != n + 1:
            raise Reject("indptr length")
    if n > 64:
        raise Unknown
    dense = np.zeros((p, n, n), dtype=bool)
    for k in range(p):
        ip, ix = arrays[f"indptr_{k}"].tolist(), arrays[f"indices_{k}"].tolist()
        if len(ip) != n + 1 or ip[0] != 0 or ip[-1] != len(ix):
            raise Reject("indptr")
        for i in range(n):
            row = ix[ip[i] : ip[i + 1]]
            if ip[i + 1] < ip[i] or any(not 0 <= j < n for j in row):
                raise Reject("indptr or column")
            if any(a >= b for a, b in zip(row, row[1:], strict=False)) or (causal and row and row[-1] > i):
                raise Reject("order or causality")
            dense[k, i, row] = True
    return dense


def _ref_label(meta: dict, dense: np.ndarray) -> tuple[str, dict]:
    """The name and params a loaded pattern must carry: the file's, if they regenerate it."""
    if meta["name"] not in REGISTRY:
        return meta["name"], meta["params"]
    try:
        gen = make(meta["name"], meta["n"], **meta["params"])
        same = gen.causal == meta["causal"] and gen.num_heads == dense.shape[0] and np.array_equal(
            gen.to_dense(), dense)
    except Exception:  # noqa: BLE001 - whatever the generator refuses
        same = False
    return (meta["name"], dict(gen.params)) if same else ("custom", {})


def _expected(meta: object, arrays: dict) -> tuple[np.ndarray, str, dict]:
    meta = _ref_meta(meta)
    dense = _ref_dense(meta, arrays)
    return (dense, *_ref_label(meta, dense))


def _decode_npz(path: Path):
    with zipfile.ZipFile(path) as zf:
        for zi in zf.infolist():
            if not zi.filename.endswith(".npy") or zi.compress_type not in (0, 8):
                raise Reject("member")
            # sizes a zip of that length cannot hold (deflate inflates at most ~1032x)
            if zi.compress_size > path.stat().st_size or zi.file_size > 1100 * zi.compress_size + 4096:
                raise Reject("member sizes")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = arrays.pop("meta", None)
    if meta is None or meta.dtype != np.uint8 or meta.ndim != 1:
        raise Reject("meta")
    return _expected(json.loads(meta.tobytes()), arrays)


def _decode_safetensors(path: Path):
    data = path.read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + hlen])
    body = data[8 + hlen :]
    md = header.pop("__metadata__")
    arrays = {}
    for name, info in header.items():
        dt = {"I32": "<i4", "I64": "<i8"}.get(info["dtype"], "<f8")
        a, b = info["data_offsets"]
        size = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(dt).itemsize
        if not 0 <= a <= b <= len(body) or b - a != size or any(s < 0 for s in info["shape"]):
            raise Reject("offsets")
        arrays[name] = np.frombuffer(body[a:b], dtype=dt).reshape(info["shape"])
    return _expected(json.loads(md["sparse_patterns"]), arrays)


def _plain(t) -> np.ndarray:
    """A tensor's values, or Reject when elements share storage (stride 0, overlap)."""
    if t.numel() > t.untyped_storage().nbytes() // max(1, t.element_size()):
        raise Reject("more elements than stored")
    offsets = np.zeros(1, dtype=np.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = (offsets[:, None] + np.arange(size) * stride).ravel()
    if np.unique(offsets).size != t.numel():
        raise Reject("overlapping")
    return t.numpy()


def _ref_recipe(r: object) -> tuple[np.ndarray, str, dict]:
    ok = (isinstance(r, dict) and set(r) <= {"pattern", "params", "n", "version", "generator"}
          and r.get("version") == 1 and type(r.get("version")) is int
          and type(r.get("n")) is int and 1 <= r["n"] <= MAX_N
          and isinstance(r.get("params", {}), dict)
          and all(v is None or isinstance(v, (bool, int, float, str)) for v in r.get("params", {}).values()))
    if not ok:
        raise Reject("recipe")
    pat = make(r["pattern"], r["n"], **r.get("params", {}))  # what it refuses raises
    if pat.n > 64:
        raise Unknown
    return pat.to_dense(), pat.name, dict(pat.params)


def _decode_pt(path: Path):
    obj = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj) or obj.get("format") not in (
            "flex", "deepspeed", "xformers", "triton", "bsa"):
        raise Reject("format")
    n, causal = obj.get("n"), obj.get("causal")
    if type(n) is not int or not 1 <= n <= MAX_N or not isinstance(causal, bool):
        raise Reject("n or causal")
    if obj["format"] == "flex":
        meta = _ref_meta(json.loads(obj["meta"]))
        names = [k for k in obj if k.startswith(("indptr_", "indices_"))]
        if meta["n"] != n or ("recipe" in obj and names):
            raise Reject("n, or a recipe and a CSR")
        if "recipe" in obj:
            dense, name, params = _ref_recipe(json.loads(obj["recipe"]))
            if (dense.shape[1], dense.shape[0], name) != (meta["n"], meta["num_heads"], meta["name"]):
                raise Reject("the recipe is not the metadata's pattern")
            return dense, name, params
        return _expected(meta, {k: _plain(obj[k]) for k in names})
    block, key = obj.get("block"), "base_blockmask" if obj["format"] == "bsa" else "layout"
    if type(block) is not int or not 1 <= block <= MAX_N:
        raise Reject("block")
    lay = _plain(obj[key])
    if key == "base_blockmask":
        lay = lay[0]  # an empty batch raises: refused
    nb = -(-n // block)
    if (lay.ndim != 3 or lay.shape[1:] != (nb, nb) or not 1 <= lay.shape[0] <= 4096
            or lay.dtype not in (np.bool_, np.int32, np.int64, np.uint8, np.int8)
            or not np.isin(lay, (0, 1)).all()):
        raise Reject("layout")
    if n > 64:
        raise Unknown
    dense = np.kron(lay.astype(bool), np.ones((1, block, block), dtype=bool))[:, :n, :n]
    return (dense & np.tril(np.ones((n, n), dtype=bool)) if causal else dense), "blocks", {"block": block}


def _decode_json(path: Path):
    return _ref_recipe(json.loads(path.read_bytes()))


DECODERS = {".npz": _decode_npz, ".safetensors": _decode_safetensors, ".pt": _decode_pt,
            ".json": _decode_json}


def check_load(path: Path) -> Pattern | None:
    """Load ``path`` under a 64 MB load limit: a one-line ValueError naming the file
    exactly when the reference refuses it, else the reference's pattern and label."""
    try:
        want = DECODERS[path.suffix](path)
    except Unknown:
        want = Unknown
    except Exception:  # noqa: BLE001 - the reference cannot read it (or says Reject)
        want = None
    try:
        with config.load_limit(LIMIT):
            got = load(path)
    except ValueError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith(f"{path}: ") and len(msg) < 600, msg
        assert want is None, f"refused a file the reference reads: {msg}"
        event(f"{path.suffix}: refused")
        return None
    assert want is not None, f"loaded a file the reference refuses: {got!r}"
    event(f"{path.suffix}: loaded")
    if want is Unknown:
        return got
    dense, name, params = want
    assert got.n == dense.shape[1] and got.num_heads == dense.shape[0]
    assert np.array_equal(got.to_dense(), dense)
    assert (got.name, dict(got.params)) == (name, params)
    return got


# ----------------------------------------------------------------- strategies
@st.composite
def patterns(draw) -> Pattern:
    """A small generated pattern, or a random user layout of 1-3 heads."""
    if draw(st.booleans()):
        name, params = draw(st.sampled_from(FAMILIES))
        return make(name, draw(st.integers(1, 12)), **params)
    n, p, causal = draw(st.integers(1, 10)), draw(st.integers(1, 3)), draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = rng.random((p, n, n)) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    if causal:
        a &= np.tril(np.ones((n, n), dtype=bool))
    return Pattern.from_dense(a, causal=causal)


KINDS = ["npz", "safetensors", "json", "flex", "deepspeed", "bsa"]


def _write(pat: Pattern, kind: str, d: Path) -> Path:
    if kind == "json":
        if pat.rule is None:
            pat = make("strided", pat.n, stride=2)
        return save(pat, d / "p.json")
    f = d / ("p" + {"npz": ".npz", "safetensors": ".safetensors"}.get(kind, ".pt"))
    export_pattern(pat, f, kind, block=None if kind in ("npz", "safetensors") else 4)
    return f


@st.composite
def mutations(draw):
    kind = draw(st.sampled_from(["truncate", "overwrite", "append", "flip"]))
    return kind, draw(st.floats(0, 1)), draw(st.binary(min_size=1, max_size=24))


def _mutate(data: bytes, mutation) -> bytes:
    kind, where, junk = mutation
    at = int(where * len(data))
    if kind == "truncate":
        return data[:at]
    if kind == "append":
        return data + junk
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ (1 << (junk[0] % 8))]) + data[at + 1 :] if at < len(data) else data
    return data[:at] + junk + data[at + len(junk) :]


@FUZZ
@given(pat=patterns(), kind=st.sampled_from(KINDS), mutation=mutations())
def test_mutated_files_load_exactly_or_are_refused(pat, kind, mutation):
    with tempfile.TemporaryDirectory() as tmp:
        f = _write(pat, kind, Path(tmp))
        check_load(f)  # the file as written
        f.write_bytes(_mutate(f.read_bytes(), mutation))
        check_load(f)


def _meta(n: int, p: int, **over) -> dict:
    m = {"format": "sparse-patterns", "version": 1, "n": n, "num_heads": p, "name": "custom",
         "params": {}, "causal": False, "head_names": [f"A{k}" for k in range(p)]}
    m.update(over)
    return m


@st.composite
def csr_files(draw):
    """(meta, arrays): a real pattern's CSR or random index arrays, and metadata that may lie."""
    if draw(st.booleans()):
        pat = draw(patterns())
        arrays = {}
        for k, h in enumerate(pat.heads):
            dt = draw(st.sampled_from(INDEX))
            arrays[f"indptr_{k}"], arrays[f"indices_{k}"] = h.indptr.astype(dt), h.indices.astype(dt)
        meta = _meta(pat.n, pat.num_heads, name=pat.name, params=dict(pat.params), causal=pat.causal)
    else:  # random index arrays: unsorted, out of range, negative, wrong lengths, other dtypes
        n, p = draw(st.integers(1, 6)), draw(st.integers(1, 2))
        ints = st.integers(-2, 8)
        dt = draw(st.sampled_from([*INDEX, np.dtype("<i2"), np.dtype("<f8"), np.dtype(">i4")]))
        arrays = {}
        for k in range(p):
            ip = sorted(draw(st.lists(ints, min_size=n + 1, max_size=n + 1)))
            ip = draw(st.sampled_from([ip, [0] + ip[1:], draw(st.lists(ints, max_size=n + 2))]))
            nnz = max(0, ip[-1]) if ip else 0
            ix = draw(st.lists(ints, min_size=nnz, max_size=nnz + draw(st.integers(0, 1))))
            arrays[f"indptr_{k}"], arrays[f"indices_{k}"] = np.array(ip, dt), np.array(ix, dt)
        meta = _meta(n, p, causal=draw(st.booleans()))
    lie = draw(st.sampled_from(["none", "n", "heads", "name", "params", "nested", "causal", "names"]))
    if lie == "n":
        meta["n"] = draw(st.sampled_from([0, meta["n"] + 1, MAX_N, MAX_N + 1, 10**30, -1, 2.0, True]))
    elif lie == "heads":
        meta["num_heads"] = draw(st.sampled_from([0, meta["num_heads"] + 1, 4097, 10**9]))
    elif lie == "name":
        meta["name"], meta["params"] = draw(st.sampled_from(FAMILIES))
    elif lie == "params":
        meta["params"] = draw(st.sampled_from([{"stride": 2}, {"stride": -1}, {"stride": 10**30},
                                               {"bogus": 1}, {"window": "paper"}]))
        meta["name"] = draw(st.sampled_from(["strided", "local", "blocks"]))
    elif lie == "nested":
        key = draw(st.sampled_from(["params", "name", "head_names", "causal", "n"]))
        meta[key] = draw(st.sampled_from([{"a": [1, {"b": []}]}, [[[]]], {"stride": [4]},
                                          {"stride": {"x": 1}}, None]))
    elif lie == "causal":
        meta["causal"] = not meta["causal"]
    elif lie == "names":
        meta["head_names"] = meta["head_names"][:-1] or [1]
    return meta, arrays


def _write_csr(meta: dict, arrays: dict, fmt: str, d: Path) -> Path:
    text = json.dumps(meta)
    if fmt == "npz":
        f = d / "c.npz"
        np.savez(f, meta=np.frombuffer(text.encode(), np.uint8), **arrays)
    elif fmt == "safetensors":
        f = d / "c.safetensors"
        header, body = {"__metadata__": {"sparse_patterns": text}}, b""
        for name, a in arrays.items():
            code = {"<i4": "I32", "<i8": "I64", "<i2": "I16", "<f8": "F64", ">i4": "I32"}[a.dtype.str]
            raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
            header[name] = {"dtype": code, "shape": list(a.shape),
                            "data_offsets": [len(body), len(body) + len(raw)]}
            body += raw
        h = json.dumps(header).encode()
        f.write_bytes(struct.pack("<Q", len(h)) + h + body)
    else:
        f = d / "c.pt"
        obj = {"format": "flex", "n": meta.get("n"), "causal": meta.get("causal"), "meta": text}
        obj.update({k: torch.from_numpy(a.astype(a.dtype.newbyteorder("="))) for k, a in arrays.items()})
        torch.save(obj, f)
    return f


@FUZZ
@given(case=csr_files(), fmt=st.sampled_from(["npz", "safetensors", "pt"]))
def test_handmade_csr_files_load_exactly_or_are_refused(case, fmt):
    meta, arrays = case
    with tempfile.TemporaryDirectory() as tmp:
        check_load(_write_csr(meta, arrays, fmt, Path(tmp)))


# ----------------------------------------------------------------- lying headers
@st.composite
def npy_lies(draw):
    descr = draw(st.sampled_from(["<i4", "<i8", ">i8", "|u1", "<f8", "|O"]))
    shape = draw(st.sampled_from([(5,), (10**12,), (2**40, 2**40), (-1,), (5, 1), (), (0,), (3,)]))
    data = draw(st.binary(max_size=48))
    return descr, shape, data


@FUZZ
@given(lie=npy_lies(), which=st.sampled_from(["meta", "indptr_0", "indices_0"]))
def test_lying_npy_headers(lie, which):
    descr, shape, data = lie
    good = {"meta": np.frombuffer(json.dumps(_meta(4, 1)).encode(), np.uint8),
            "indptr_0": np.arange(5, dtype="<i4"), "indices_0": np.arange(4, dtype="<i4")}
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "lie.npz"
        with zipfile.ZipFile(f, "w") as zf:
            for name, a in good.items():
                b = io.BytesIO()
                if name == which:
                    np.lib.format.write_array_header_1_0(
                        b, {"descr": descr, "fortran_order": False, "shape": shape})
                    b.write(data)
                else:
                    np.save(b, a)
                zf.writestr(f"{name}.npy", b.getvalue())
        check_load(f)


@st.composite
def safetensors_lies(draw):
    shape = draw(st.sampled_from([[5], [4], [10**12], [-4], [2, 2], [], "x", [True]]))
    offs = draw(st.sampled_from([None, [0, 16], [16, 0], [0, 8 * 10**12], [-8, 8], [0], "x"]))
    dtype = draw(st.sampled_from(["I32", "I64", "F32", 7, None]))
    hlen = draw(st.sampled_from([None, 0, 7, 10**12, 2**64 - 1]))
    return shape, offs, dtype, hlen


@FUZZ
@given(lie=safetensors_lies(), which=st.sampled_from(["indptr_0", "indices_0"]))
def test_lying_safetensors_headers(lie, which):
    shape, offs, dtype, hlen = lie
    header = {"__metadata__": {"sparse_patterns": json.dumps(_meta(4, 1))},
              "indptr_0": {"dtype": "I32", "shape": [5], "data_offsets": [0, 20]},
              "indices_0": {"dtype": "I32", "shape": [4], "data_offsets": [20, 36]}}
    entry = header[which]
    entry["shape"] = shape
    entry["dtype"] = dtype
    if offs is not None:
        entry["data_offsets"] = offs
    body = np.arange(5, dtype="<i4").tobytes() + np.arange(4, dtype="<i4").tobytes()
    h = json.dumps(header).encode()
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "lie.safetensors"
        f.write_bytes(struct.pack("<Q", len(h) if hlen is None else hlen) + h + body)
        check_load(f)


# ----------------------------------------------------------------- stride-0 tensors
@st.composite
def repeating_views(draw):
    """(role, stored elements, shape, strides) of a tensor whose elements share storage."""
    role = draw(st.sampled_from(["indptr_0", "indices_0", "layout", "base_blockmask"]))
    ndim = {"layout": 3, "base_blockmask": 4}.get(role, 1)
    stored = draw(st.integers(1, 8))
    shape = [draw(st.integers(2, 2 ** (60 // ndim))) for _ in range(ndim)]  # numel < 2**63
    strides = [0] * ndim  # an expansion: every axis repeats
    how = draw(st.sampled_from(["expand", "walk", "overlap"])) if ndim > 1 else "expand"
    if how == "walk":  # one axis walks the storage, the others repeat it
        ax = draw(st.integers(0, ndim - 1))
        strides[ax], shape[ax] = 1, draw(st.integers(2, 8))
        stored = max(stored, shape[ax])
    elif how == "overlap":  # no zero stride, but neighbouring rows share elements
        shape = [draw(st.integers(2, 3)) for _ in range(ndim)]
        strides = [1] * ndim
        stored = max(stored, sum(x - 1 for x in shape) + 1)
    return role, stored, tuple(shape), tuple(strides)


@FUZZ
@given(view=repeating_views())
def test_stride_zero_and_overlapping_tensors_are_refused(view):
    role, stored, shape, strides = view
    if role.startswith("ind"):
        obj = {"format": "flex", "n": 4, "causal": False, "meta": json.dumps(_meta(4, 1)),
               "indptr_0": torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32),
               "indices_0": torch.tensor([0, 1, 2, 3], dtype=torch.int32)}
        obj[role] = torch.zeros(stored, dtype=torch.int32).as_strided(shape, strides)
    else:
        obj = {"format": "deepspeed" if role == "layout" else "bsa", "n": shape[-1] * 4,
               "causal": True, "block": 4,
               role: torch.zeros(stored, dtype=torch.int64).as_strided(shape, strides)}
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "s.pt"
        torch.save(obj, f)
        assert f.stat().st_size < 10_000
        with config.load_limit(LIMIT), pytest.raises(ValueError) as err:
            load(f)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{f}: {role} of shape {shape} has strides"), msg
    assert "stride-0 or overlapping view" in msg


# ----------------------------------------------------------------- nested metadata
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("fmt", ["json", "npz", "safetensors", "flex-meta", "flex-recipe"])
def test_json_nested_deeply_is_one_line(tmp_path, fmt):
    if fmt == "json":
        f = tmp_path / "r.json"
        f.write_text(DEEP)
    elif fmt == "npz":
        f = tmp_path / "r.npz"
        np.savez(f, meta=np.frombuffer(DEEP.encode(), np.uint8))
    elif fmt == "safetensors":
        f = tmp_path / "r.safetensors"
        h = json.dumps({"__metadata__": {"sparse_patterns": DEEP}}).encode()
        f.write_bytes(struct.pack("<Q", len(h)) + h)
    else:
        f = tmp_path / "r.pt"
        meta = json.dumps(_meta(4, 1, name="strided"))
        obj = {"format": "flex", "n": 4, "causal": False, "meta": meta, "recipe": DEEP}
        if fmt == "flex-meta":
            obj = {"format": "flex", "n": 4, "causal": False, "meta": DEEP}
        torch.save(obj, f)
    with pytest.raises(ValueError, match=r"is not valid JSON: nested too deeply$") as err:
        load(f)
    assert str(err.value).startswith(str(f)) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "recipe",
    [{"pattern": "strided", "n": 16, "version": 1, "params": {"stride": [4]}},
     {"pattern": "strided", "n": 16, "version": 1, "params": {"stride": {"a": {"b": 4}}}},
     {"pattern": ["strided"], "n": 16, "version": 1},
     {"pattern": "strided", "n": [16], "version": 1},
     {"pattern": "strided", "n": 16, "version": 1, "params": {"stride": 10**30}},
     {"pattern": "strided", "n": 16, "version": 1, "params": {"stride": 1e300}},
     {"pattern": "bigbird", "n": 1024, "version": 1, "params": {"block": -5}}],
)
def test_bad_recipe_values_are_one_line(tmp_path, recipe):
    f = tmp_path / "r.json"
    f.write_text(json.dumps(recipe))
    with pytest.raises(ValueError) as err:
        load(f)
    assert str(err.value).startswith(f"{f}: ") and "\n" not in str(err.value)


def test_a_recipe_with_an_integer_of_ten_thousand_digits(tmp_path):
    f = tmp_path / "r.json"
    f.write_text('{"pattern": "strided", "n": 16, "version": 1, "params": {"stride": ' + "9" * 10_000 + "}}")
    with pytest.raises(ValueError, match="the recipe is not valid JSON: .*digits"):
        load(f)


# ----------------------------------------------------------------- huge declared sizes
def _huge_cases(d: Path) -> dict[str, Path]:
    """Small files that declare far more than the load limit; built without allocating it."""
    files = {}
    meta = _meta(2**26, 1)
    files["flex-stride0-indptr"] = d / "a.pt"
    torch.save({"format": "flex", "n": 2**26, "causal": False, "meta": json.dumps(meta),
                "indptr_0": torch.zeros(1, dtype=torch.int64).expand(2**26 + 1),
                "indices_0": torch.zeros(0, dtype=torch.int64)}, files["flex-stride0-indptr"])
    files["deepspeed-stride0"] = d / "b.pt"
    torch.save({"format": "deepspeed", "n": 2**17, "causal": True, "block": 16,
                "layout": torch.ones(1, dtype=torch.int64).expand(1, 8192, 8192)}, files["deepspeed-stride0"])
    files["deepspeed-contiguous"] = d / "c.pt"  # 1 MB of bools: 2**35 token pairs
    torch.save({"format": "deepspeed", "n": 2**18, "causal": True, "block": 256,
                "layout": torch.ones(1, 1024, 1024, dtype=torch.bool)}, files["deepspeed-contiguous"])
    files["bsa-huge-block"] = d / "d.pt"
    torch.save({"format": "bsa", "n": MAX_N, "causal": False, "block": 2**30,
                "base_blockmask": torch.ones(1, 1, 2, 2, dtype=torch.bool)}, files["bsa-huge-block"])
    files["safetensors-empty"] = d / "e.safetensors"  # a true empty pattern at n = 2**20: loads
    n = 2**20
    h = json.dumps({"__metadata__": {"sparse_patterns": json.dumps(_meta(n, 1))},
                    "indptr_0": {"dtype": "I32", "shape": [n + 1], "data_offsets": [0, 4 * n + 4]},
                    "indices_0": {"dtype": "I32", "shape": [0], "data_offsets": [4 * n + 4, 4 * n + 4]},
                    }).encode()
    files["safetensors-empty"].write_bytes(struct.pack("<Q", len(h)) + h + bytes(4 * n + 4))
    files["npz-claims-local"] = d / "f.npz"  # empty heads that say "local" at n = 2**24
    with zipfile.ZipFile(files["npz-claims-local"], "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        m = json.dumps(_meta(2**24, 1, name="local", params={"window": 8}, causal=True))
        b = io.BytesIO()
        np.save(b, np.frombuffer(m.encode(), np.uint8))
        zf.writestr("meta.npy", b.getvalue())
        for name, count in (("indptr_0", 2**24 + 1), ("indices_0", 0)):
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fp:
                np.lib.format.write_array_header_1_0(
                    fp, {"descr": "<i4", "fortran_order": False, "shape": (count,)})
                for start in range(0, 4 * count, 1 << 22):
                    fp.write(bytes(min(1 << 22, 4 * count - start)))
    return files


@pytest.mark.parametrize("limit", [LIMIT, None])
def test_huge_declared_sizes_are_refused_before_allocating(tmp_path, limit):
    files = _huge_cases(tmp_path)
    expect = {
        "flex-stride0-indptr": r"indptr_0 of shape \(67108865,\) has strides \(0,\), a stride-0",
        "deepspeed-stride0": r"layout of shape \(1, 8192, 8192\) has strides \(0, 0, 0\)",
        "deepspeed-contiguous": r"the layout \(1, 1024, 1024\) with block=256 expands to "
                                r"34,359,869,440 token pairs .*: loading needs .* above the load limit",
        "bsa-huge-block": r"expands to 4,611,686,014,132,420,609 token pairs",
        "safetensors-empty": None,  # fits: loads
        # 201 MB to read, and 1.3 GB more to regenerate "local" and compare
        "npz-claims-local": r"(indices_0 declares 0 entries|checking that name 'local' and its "
                            r"params regenerate the heads) \(n=16,777,216, 1 head\): loading needs",
    }
    with config.load_limit(limit) if limit else contextlib.nullcontext():
        for case, f in files.items():
            if expect[case] is None:
                assert load(f).nnz == 0
                continue
            with pytest.raises(ValueError, match=expect[case]) as err:
                load(f)
            assert str(err.value).startswith(f"{f}: ") and "\n" not in str(err.value)


def test_max_nnz_bounds_every_format(tmp_path):
    pat = Pattern(make("strided", 32, stride=4).heads)
    for suffix in (".npz", ".safetensors"):
        f = save(pat, tmp_path / f"p{suffix}")
        assert load(f, max_nnz=pat.nnz * 2) == pat
        with pytest.raises(ValueError, match=f"the heads hold {sum(pat.head_nnz)} entries; max_nnz is 10"):
            load(f, max_nnz=10)
    f = export_pattern(make("fixed", 32, stride=8, c=8), tmp_path / "d.pt", "deepspeed", block=8).file
    pairs = sum(load(f).head_nnz)  # the expansion, counted on the pattern built
    assert load(f, max_nnz=pairs).nnz > 0
    with pytest.raises(ValueError, match=f"the layout expands to {pairs} token pairs; max_nnz is {pairs - 1}"):
        load(f, max_nnz=pairs - 1)
    with pytest.raises(ValueError, match="max_nnz: must be an integer >= 0"):
        load(f, max_nnz=-1)


# ----------------------------------------------------------------- metadata lies
@pytest.mark.parametrize("fmt", ["npz", "safetensors", "pt"])
def test_metadata_that_does_not_regenerate_the_heads_is_dropped(tmp_path, fmt):
    from typer.testing import CliRunner

    from sparse_patterns.cli import app

    full = make("full", 16)
    strided = make("strided", 16, stride=4)
    lie = _meta(16, 1, name="strided", params=dict(strided.params), causal=True)
    arrays = {"indptr_0": full.heads[0].indptr.astype("<i4"), "indices_0": full.heads[0].indices.astype("<i4")}
    f = _write_csr(lie, arrays, fmt, tmp_path)
    back = load(f)
    assert back == full and back.name == "custom" and dict(back.params) == {}
    with pytest.raises(ValueError, match="pattern: a 'custom' pattern has no recipe .* loaded file "
                                         "whose name and params do not regenerate its heads"):
        export_pattern(back, tmp_path / "r.json")
    res = CliRunner().invoke(app, ["export", "--file", str(f), "-o", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "has no recipe" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r.json").exists()
    # the same heads under their true name keep it; other params do not
    truth = {f"{a}_{k}": getattr(h, a).astype("<i4") for k, h in enumerate(strided.heads)
             for a in ("indptr", "indices")}
    meta = _meta(16, 2, name="strided", params=dict(strided.params), causal=True)
    assert load(_write_csr(meta, truth, fmt, tmp_path)).name == "strided"
    assert load(_write_csr(dict(meta, params={"stride": 5}), truth, fmt, tmp_path)).name == "custom"
    assert load(_write_csr(dict(meta, params={"stride": -5}), truth, fmt, tmp_path)).name == "custom"
    kept = load(_write_csr(dict(meta, name="my-layout", params={"a": 1}), truth, fmt, tmp_path))
    assert kept.name == "my-layout" and dict(kept.params) == {"a": 1}  # a label claims nothing


# ----------------------------------------------------------------- peak memory
CHILD = r"""
import json, os, resource, sys
import numpy as np, scipy.sparse, torch
from sparse_patterns import config, make
from sparse_patterns.export import load, save
import sparse_patterns.export.npz, sparse_patterns.export.pt, sparse_patterns.export.safetensors
import sparse_patterns.export.recipe, sparse_patterns.export.blocks, sparse_patterns.patterns
config.set_load_limit(256 << 20)
warm = sys.argv[1]
for suffix in (".npz", ".safetensors", ".json"):  # imports and compiled code of a normal load
    load(save(make("strided", 64, stride=8), os.path.join(warm, "w" + suffix)))
for path in sys.argv[2:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            pat = load(path)
            out = {"ok": repr(pat)}
        except BaseException as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        out["grew"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    print(json.dumps(dict(json.loads(data), path=path)), flush=True)
"""


def test_issue_cases_stay_within_memory_and_leave_nothing(tmp_path):
    d = tmp_path / "files"
    d.mkdir()
    files = _huge_cases(d)
    (d / "bigbird.json").write_text(
        json.dumps({"pattern": "bigbird", "params": {"block": 1000000000}, "n": 1024, "version": 1}))
    (d / "local.json").write_text(json.dumps({"pattern": "local", "n": 2**27, "version": 1}))
    (d / "deep.json").write_text(DEEP)
    files.update({k: d / f"{k}.json" for k in ("bigbird", "local", "deep")})
    files["npz-zeros"] = d / "z.npz"  # 1.2 MB declaring 67,000,000 indices
    with zipfile.ZipFile(files["npz-zeros"], "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        m = json.dumps(_meta(2**14, 1))
        b = io.BytesIO()
        np.save(b, np.frombuffer(m.encode(), np.uint8))
        zf.writestr("meta.npy", b.getvalue())
        ip = np.zeros(2**14 + 1, "<i4")
        ip[-1] = 67_000_000
        b = io.BytesIO()
        np.save(b, ip)
        zf.writestr("indptr_0.npy", b.getvalue())
        with zf.open("indices_0.npy", "w", force_zip64=True) as fp:
            np.lib.format.write_array_header_1_0(fp, {"descr": "<i4", "fortran_order": False,
                                                      "shape": (67_000_000,)})
            for start in range(0, 4 * 67_000_000, 1 << 22):
                fp.write(bytes(min(1 << 22, 4 * 67_000_000 - start)))
    before = sorted(os.listdir(d))
    warm = tmp_path / "warm"
    warm.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2] / "src"))
    res = subprocess.run([sys.executable, "-c", CHILD, str(warm), *map(str, files.values())],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    results = {Path(r["path"]).name: r for r in map(json.loads, res.stdout.splitlines())}
    assert len(results) == len(files)
    for name, r in results.items():
        assert r["grew"] < 400 << 20, (name, r)
        if "error" in r:
            assert r["error"] in ("ValueError", "MemoryLimitError"), (name, r)
            assert "\n" not in r["message"] and r["message"].startswith(str(d)), (name, r)
    loaded = {k for k, r in results.items() if "ok" in r}
    assert loaded == {"bigbird.json", "local.json", "e.safetensors"}, results
    assert "local(window=11586" in results["local.json"]["ok"]
    assert sorted(os.listdir(d)) == before  # nothing written, no temporary file left
