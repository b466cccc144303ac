"""Fuzzers for the search's hostile input (issue 54), beside the hostile-file and CLI
fuzzers (``tests/export/test_hostile_files.py``, ``tests/cli/test_cli_hostile.py``).

* **The cache** (JSON lines): a valid header, then rows mutated by hypothesis (fields
  removed, wrong types, another candidate's recipe or key, megabytes of text and
  terminal escapes, lists for objects, lines that are not JSON or not finished, huge
  numbers). Opening the cache either works, serving only rows valid for their key
  (checked against the row each key was made from, not through the cache's own
  checks), or is a one-line ``ValueError``; opening it again serves the same rows and
  says nothing more.
* **The grid**: ``--grid`` values, as arbitrary text and as near-valid text (Unicode
  digits, huge numbers, odd separators), through ``parse_grid``, the search's grid
  check and its recipes, and through ``patterns search`` itself (its cluster replaced by
  a sentinel: no Dask cluster starts): a parsed grid or one line under 300 characters.

The CI run is short (``SP_FUZZ_EXAMPLES``, default 30 examples a fuzzer, a few
seconds). Run longer with::

    SP_FUZZ_EXAMPLES=2000 .venv/bin/pytest -q -p no:cacheprovider -n 0 \\
        tests/search/test_search_fuzz.py
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pandas")

from typer.testing import CliRunner  # noqa: E402

import sparse_patterns as sps  # noqa: E402
from sparse_patterns.cli import app  # noqa: E402
from sparse_patterns.cli.search import parse_grid  # noqa: E402
from sparse_patterns.patterns import registry  # noqa: E402
from sparse_patterns.search._cache import FORMAT, MAX_LINE, SCHEMA, open_cache  # noqa: E402
from sparse_patterns.search._grid import _grid, _recipes  # noqa: E402
from sparse_patterns.search._tasks import FIELDS, MEASURES, TEXT_LIMIT, _blank  # noqa: E402

EXAMPLES = int(os.environ.get("SP_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
V = sps.__version__
KINDS = dict(FIELDS)
HEADER = json.dumps({"format": FORMAT, "schema": SCHEMA, "version": V})


def _one_line(exc: BaseException, limit: int | None = None) -> str:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, repr(text[:500])
    assert "Traceback" not in text, text[:500]
    if limit is not None:
        assert len(text) < limit, (len(text), text[:500])
    return text


# ------------------------------------------------------------------------------ the cache
def _rec(family: str, params: dict, n: int, **over) -> dict:
    params = registry.resolve(family, n, params)  # as a search stores them: every parameter
    return {"family": family, "params": params, "n": n, "mode": "interleaved", "block": 4,
            "batch": 1, "heads": 2, "head_dim": 8, "depth": None, **over}


def _base_rows() -> list[dict]:
    """Valid rows of four candidates (made as a task makes them, without computing)."""
    out = []
    for rec, measured, status in [
        (_rec("strided", {"stride": 4, "window": "paper", "causal": True}, 16), ("verify",), "ok"),
        (_rec("strided", {"stride": 4, "window": "paper", "causal": True}, 32),
         ("verify", "flops"), "ok"),
        (_rec("fixed", {"stride": 4, "c": 1, "causal": True}, 16, mode="merged"), ("verify",),
         "error"),
        (_rec("strided", {"stride": 8, "window": "paper", "causal": True}, 64, block=8),
         ("verify", "flops", "time"), "ok"),
    ]:
        row = {**_blank(rec, V, measured), "status": status}
        if status == "error":
            row["error"] = "ValueError: no"
        else:
            row.update(ok=False, criterion1=True, criterion2=False, p=2, depth=2, nnz=40,
                       mean_row=2.5, worker="w:1", finished="2026-01-01T00:00:00+00:00")
            if "flops" in measured:
                row.update(useful_flops=100.0, computed_flops=120.0, flop_ratio=1.2)
            if "time" in measured:
                row.update(time_s=0.001, time_first_s=0.01, repeats=3)
        out.append(row)
    return out


BASE = _base_rows()
BY_KEY = {r["key"]: r for r in BASE}
assert len(BY_KEY) == len(BASE)
#: Fields a served row must share with the row its key was made from.
RECIPE = ("version", "family", "n", "mode", "kernel_mode", "block", "batch", "heads",
          "head_dim", "depth_search")

#: Values a field is set to: every JSON type, edges, text that must be cleaned.
VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, 1, -1, 16, 2**31, 2**63, 10**30, -(10**30),
                     0.0, 1.5, -2.5, 1e308, "", "x", "ok", "error", "verify", "verify,time",
                     "flops,verify", "none", "interleaved", "merged", "multihead", "strided",
                     "fixed", V, "0.0.0", "0" * 24, "\x1b[31mred\x1b[0m\x00\x07", "a\nb\rc",
                     "é" * 400, "x" * 100_000, '{"stride": 4}', "{}", "[]", [], {}, [1, 2],
                     {"stride": 4}, [[[]]], {"a": {"b": None}}]),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=50),
    st.sampled_from([r[f] for r in BASE for f in ("key", "params", "n", "block", "mode")]),
)
#: Raw JSON that json.loads takes but no finite float holds (a row carrying one is invalid).
FLOAT_TOKENS: list[str] = ["NaN", "Infinity", "-Infinity", "9" * 400]
RAW_LINES = st.one_of(
    st.sampled_from(["", "   ", "x", "{", '{"key": "', "[" * 5000, "null", "0", "true",
                     '"row"', "[]", "{}", json.dumps([BASE[0]]), json.dumps(list(BASE[0])),
                     json.dumps({"format": FORMAT}), HEADER, "\x00\x01\x02", "\ufeff{}"]),
    st.text(max_size=200).map(lambda t: t.replace("\n", " ").replace("\r", " ")),
)
FIELD_NAMES = st.sampled_from([name for name, _ in FIELDS])


@st.composite
def row_lines(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """One line (bytes, no newline) and the key of the base row it is exactly, if any."""
    how = draw(st.sampled_from(["valid", "valid", "drop", "set", "set", "swap", "respell",
                                "unknown", "raw", "long", "bytes", "token"]))
    base = draw(st.sampled_from(BASE))
    row = dict(base)
    if how == "valid":
        return json.dumps(row).encode(), row["key"]
    if how == "drop":
        for name in draw(st.lists(FIELD_NAMES, min_size=1, max_size=6, unique=True)):
            row.pop(name, None)
    elif how == "set":
        for name in draw(st.lists(FIELD_NAMES, min_size=1, max_size=3, unique=True)):
            row[name] = draw(VALUES)
    elif how == "swap":  # another candidate's key, or its recipe under this key
        other = draw(st.sampled_from([r for r in BASE if r is not base]))
        names = draw(st.lists(st.sampled_from(["key", *RECIPE, "params", "measured", "status",
                                                "ok", "error"]), min_size=1, max_size=4,
                              unique=True))
        for name in names:
            row[name] = other[name]
    elif how == "respell":  # the same params, spelled otherwise: still this candidate
        params = json.loads(row["params"])
        items = draw(st.permutations(list(params.items())))
        row["params"] = json.dumps(dict(items), indent=draw(st.sampled_from([None, 1])),
                                   separators=draw(st.sampled_from([None, (",", ":")])))
    elif how == "unknown":
        row[draw(st.sampled_from(["extra", "", "KEY", "\x1b", "x" * 1000]))] = draw(VALUES)
    elif how == "raw":
        return draw(RAW_LINES).encode("utf-8", "surrogatepass"), None
    elif how == "long":
        return json.dumps({**row, "worker": "w" * (MAX_LINE + draw(st.integers(-200, 200)))}
                          ).encode(), None
    elif how == "bytes":  # not UTF-8
        return json.dumps(row).encode()[:-1] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x80"])
                                                    ) + b"}", None
    elif how == "token":
        name = draw(st.sampled_from([n for n, k in FIELDS if k in ("float", "int")]))
        text = json.dumps({**row, name: "@@"}).replace('"@@"', draw(st.sampled_from(
            FLOAT_TOKENS)))
        return text.encode(), None
    return json.dumps(row).encode(), None


@st.composite
def cache_files(draw: st.DrawFn) -> tuple[bytes, set[str]]:
    """A cache file's bytes and the keys an exact base row stands for on a finished line."""
    lines = draw(st.lists(row_lines(), max_size=8))
    data = HEADER.encode() + b"\n"
    exact: set[str] = set()
    for k, (line, key) in enumerate(lines):
        last = k == len(lines) - 1
        unfinished = last and draw(st.integers(0, 4)) == 0
        data += line + (b"" if unfinished else b"\n")
        if key is not None and not unfinished:
            exact.add(key)
    return data, exact


def _check_served(row: dict) -> None:
    """``row`` is one the cache may serve: valid for its key, as a task would write it."""
    base = BY_KEY.get(row["key"])
    assert base is not None, ("a row under a key no candidate of the file has", row["key"])
    assert set(row) == set(KINDS), sorted(set(row) ^ set(KINDS))
    for name in RECIPE:
        assert row[name] == base[name], (name, row[name], base[name])
    assert json.loads(row["params"]) == json.loads(base["params"])
    types = {"str": (str,), "int": (int,), "bool": (bool,), "float": (float,)}
    for name, kind in FIELDS:
        value = row[name]
        assert value is None or type(value) in types[kind], (name, value)
        if kind == "str" and value is not None and name != "params":  # params: through its key
            assert len(value) <= TEXT_LIMIT and value.isprintable(), (name, value[:80])
        if kind == "float" and value is not None:
            assert math.isfinite(value), (name, value)
    measured = row["measured"].split(",")
    assert measured and set(measured) <= set(MEASURES), row["measured"]
    if row["status"] == "error":
        assert row["error"] is not None and row["ok"] is None
    else:
        assert row["status"] == "ok" and row["error"] is None
        if "verify" in measured:
            assert row["ok"] is not None and row["ok"] == (row["criterion1"] and row["criterion2"])
        else:
            assert row["ok"] is None
        if "flops" in measured:
            assert row["useful_flops"] is not None and row["computed_flops"] is not None
        if "time" in measured:
            assert row["time_s"] is not None


@FUZZ
@given(case=cache_files())
def test_fuzz_cache_rows_served_only_when_valid_for_their_key(case):
    data, exact = case
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.jsonl"
        path.write_bytes(data)
        try:
            c = open_cache(path, V)
        except ValueError as exc:
            _one_line(exc)
            assert path.read_bytes() == data  # refused: left as it is
            return
        try:
            for key, row in c.rows.items():
                assert key == row["key"]
                _check_served(row)
            assert exact <= set(c.rows), ("a valid row was not served", exact - set(c.rows))
            assert all("\n" not in note and "Traceback" not in note for note in c.notes), c.notes
            first = dict(c.rows)
        finally:
            c.close()
        c = open_cache(path, V)  # rewritten without the invalid rows: the same, said once
        try:
            assert c.rows == first and c.notes == [], c.notes
        finally:
            c.close()
        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b"" and json.loads(lines[0]) == json.loads(HEADER)
        assert {json.loads(line)["key"] for line in lines[1:-1] if line.strip()} == set(first)


# What the cache fuzzer found: json.loads takes NaN/Infinity and integers of hundreds of
# digits, which a float field of a JSON lines row then carried (served, or OverflowError).
def _with(field: str, raw: str) -> str:
    return json.dumps({**BASE[0], field: "@@"}).replace('"@@"', raw)


@pytest.mark.parametrize("raw", ["NaN", "Infinity"])
def test_a_non_finite_float_in_a_row_is_an_invalid_row(tmp_path, raw):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([HEADER, _with("mean_row", raw), "not json"]) + "\n")
    c = open_cache(path, V)
    try:
        assert c.rows == {} and "not valid" in c.notes[0]
    finally:
        c.close()


def test_an_integer_beyond_a_float_in_a_float_field_is_an_invalid_row(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([HEADER, _with("mean_row", "9" * 400)]) + "\n")
    c = open_cache(path, V)
    try:
        assert c.rows == {} and "not valid" in c.notes[0]
    finally:
        c.close()


# ------------------------------------------------------------------------------- the grid
FAMILIES = sorted(registry.REGISTRY)
PARAM_NAMES = sorted({p.name for f in FAMILIES for p in registry.get(f).params})
GRID_VALUES = st.one_of(
    st.sampled_from(["4", "8", "16", "2", "1", "0", "-1", "+4", " 4 ", "04", "sqrt", "cbrt",
                     "paper", "reference", "true", "false", "True", "yes", "1e3", "1_000",
                     "0x10", "4.0", "nan", "inf", "٣", "１６", "²", "߄", "𝟒", "9" * 18,
                     "9" * 19, "9" * 5000, "-" + "9" * 40, "\x1b[31m4", "4\x00", "", " ",
                     "=", "stride=4", "a" * 65, "é" * 300]),
    st.integers(-(10**20), 10**20).map(str),
    st.text(max_size=12),
)
GRID_SEPARATORS = st.sampled_from([",", ", ", ",,", " ,", ";", " ", "，", ",\n"])


@st.composite
def grid_items(draw: st.DrawFn) -> str:
    """One ``--grid`` value: near valid (NAME=V1,V2) or any text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=60))
    key = draw(st.one_of(st.sampled_from(PARAM_NAMES),
                         st.sampled_from(["summary-heads", "STRIDE", "", " stride ", "n",
                                          "documents", "stride\x00", "ſtride", "x" * 65,
                                          "1stride", "stride.c"]),
                         st.text(max_size=8)))
    values = draw(st.lists(GRID_VALUES, min_size=0, max_size=5))
    sep = draw(GRID_SEPARATORS)
    eq = draw(st.sampled_from(["=", "=", "=", "", "==", " = ", "＝"]))
    return f"{key}{eq}{sep.join(values)}"


class _Reached(Exception):
    """The search was reached with a valid grid: no cluster is started."""


@FUZZ
@given(items=st.lists(grid_items(), min_size=1, max_size=3),
       families=st.lists(st.sampled_from(FAMILIES), min_size=1, max_size=3, unique=True),
       n=st.sampled_from([16, 64, 1024]))
def test_fuzz_grid_values_are_a_grid_or_one_short_line(items, families, n):
    try:
        axes = parse_grid(items)
    except ValueError as exc:  # UsageError
        _one_line(exc, 300)
        axes = None
    if axes is not None:
        assert all(isinstance(v, list) and v and all(isinstance(x, str) and x == x.strip() and x
                                                     for x in v) for v in axes.values())
        try:
            _, per = _grid(families, axes, [n])
            recipes = _recipes(families, per, [n], [4], {"mode": "interleaved"})
        except ValueError as exc:
            _one_line(exc, 300)
        else:
            assert recipes and all(r["family"] in families for r in recipes)
    # the command: the same outcome, exit 2 with one line or the search reached
    argv = ["search", *families, "--n", str(n), "--block", "4"]
    for item in items:
        argv += ["--grid", item]
    with mock.patch("sparse_patterns.search._search", side_effect=_Reached):
        res = CliRunner().invoke(app, argv)
    if isinstance(res.exception, _Reached) or "internal error: _Reached" in res.stderr:
        assert axes is not None
        return
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "internal error" not in out, out[-2000:]
    assert res.exit_code == 2, (res.exit_code, repr(res.exception), out[-2000:])
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and len(err) < 300, err
