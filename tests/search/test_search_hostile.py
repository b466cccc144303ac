"""Hostile input to ``patterns search`` and its cache (issue 54): every case ends as one
line or the correct result. The cache: links and lock files that point elsewhere, rows
that contradict their keys or carry megabytes of text and terminal escapes, files above
the load limit, FIFOs and devices, foreign files. The grid: values beyond any range,
Unicode digits. The schedule: bounded submission, no worker left, a hung or garbage
scheduler, closed clients, a script without a main guard. Small n only; the servers are
local socket threads."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("distributed")
pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from typer.testing import CliRunner  # noqa: E402

import sparse_patterns as sps  # noqa: E402
from sparse_patterns import config  # noqa: E402
from sparse_patterns.cli import app  # noqa: E402
from sparse_patterns.search._cache import ROW_BYTES, open_cache  # noqa: E402
from sparse_patterns.search._tasks import run_candidate  # noqa: E402

V = sps.__version__
REC = {"family": "strided", "params": {"stride": 4, "window": "paper", "causal": True}, "n": 16,
       "mode": "interleaved", "block": 4, "batch": 1, "heads": 2, "head_dim": 8, "depth": None}


def _row(**recipe):
    """A real row, computed here (no cluster): strided at n=16 by default."""
    return run_candidate({**REC, **recipe}, V, ("verify", "flops"))


def _jsonl(path, *rows, header=True):
    lines = ([json.dumps({"format": "sparse-patterns search cache", "schema": 1, "version": V})]
             if header else [])
    path.write_text("\n".join(lines + [json.dumps(r) for r in rows]) + "\n")


def run(*args: str):
    return CliRunner().invoke(app, ["search", *args])


def _one_line(r, code: int, message: str) -> str:
    assert r.exit_code == code, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    return lines[0]


# ----------------------------------------------------------------------------- 1: the cache
def test_a_lock_file_that_is_a_link_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "r.jsonl.lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"^cache: the lock file .*r\.jsonl\.lock' of .* is a "
                                         r"symbolic link; remove it"):
        open_cache(tmp_path / "r.jsonl", V)
    assert victim.read_text() == "precious\n" and not (tmp_path / "r.jsonl").exists()
    os.mkfifo(tmp_path / "s.jsonl.lock")
    with pytest.raises(ValueError, match=r"lock file .*s\.jsonl\.lock' of .* is a FIFO; remove"):
        open_cache(tmp_path / "s.jsonl", V)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_every_spelling_of_a_path_shares_one_lock(tmp_path, suffix):
    real = tmp_path / f"r{suffix}"
    link = tmp_path / f"link{suffix}"
    link.symlink_to(real)
    first = open_cache(real, V)
    try:
        for spelling in (link, tmp_path / "." / f"r{suffix}", tmp_path / "x" / ".." / f"r{suffix}"):
            (tmp_path / "x").mkdir(exist_ok=True)
            with pytest.raises(ValueError, match="is in use by another search"):
                open_cache(spelling, V)
    finally:
        first.close()
    # the file beside it, for another version's cache: its own name is locked too
    old = tmp_path / f"o{suffix}"
    open_cache(old, "0.0.1").close()
    held = open_cache(old, V)
    assert held.path.name == f"o.v{V}{suffix}"
    try:
        with pytest.raises(ValueError, match="is in use by another search"):
            open_cache(held.path, V)
    finally:
        held.close()
    # writing through the link writes the file itself, never replaces the link
    c = open_cache(link, V)
    c.add(_row())
    c.close()
    assert link.is_symlink() and len(open_cache(real, V).rows) == 1


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rows_that_contradict_their_key_are_recomputed_never_served(tmp_path, suffix):
    good, other = _row(), _row(n=32)
    bad = [
        {**good, "n": 999},                                   # another n under this key
        {**other, "ok": not other["ok"]},                     # the verdict flipped
        {**_row(params={"stride": 8, "window": "paper", "causal": True}), "params": "[8]"},
        {**good, "key": "0" * 24},
        {**_row(n=64), "error": "x"},
    ]
    path = tmp_path / f"r{suffix}"
    c = open_cache(path, V)
    for row in bad:
        c.add(row)
    c.close()
    c = open_cache(path, V)
    assert c.rows == {}
    assert len(c.notes) == 1 and "holds 5 rows that are not valid (first: " in c.notes[0]
    assert "do not match its key" in c.notes[0] and "computed again" in c.notes[0]
    c.add(good)
    c.close()
    c = open_cache(path, V)  # the invalid rows are gone from the file: said once
    assert list(c.rows) == [good["key"]] and c.notes == []
    c.close()


def test_a_row_whose_params_is_a_list_is_an_invalid_row(tmp_path):
    row = _row()
    _jsonl(tmp_path / "r.jsonl", {**row, "params": "[4, 8]"}, {**row, "params": ["x"]})
    c = open_cache(tmp_path / "r.jsonl", V)
    assert c.rows == {} and "holds 2 rows that are not valid (first: line 2, params that are " \
        "a list, not an object)" in c.notes[0]
    c.close()


def test_text_in_rows_is_cut_and_stripped_before_printing(tmp_path):
    err = {**_row(), **{k: None for k in ("ok", "criterion1", "criterion2", "p", "depth",
           "depth_checked", "max_hops", "unreachable", "not_in_last", "method", "max_row",
           "mean_row", "root", "max_over_root", "mean_over_root", "nnz", "useful_flops",
           "computed_flops", "flop_ratio", "tiles", "pieces", "verify_s", "plan_s")}}
    err.update(status="error", error="ValueError: \x1b[2J\x1b]0;pwned\x07" + "A" * 50_000,
               worker="host\x1b[31m:1")
    path = tmp_path / "r.jsonl"
    _jsonl(path, err)
    huge = tmp_path / "h.jsonl"  # a line past MAX_LINE is an invalid row, never read whole
    _jsonl(huge, {**err, "error": "A" * 5_000_000})
    c = open_cache(huge, V)
    assert c.rows == {} and "(first: line 2, longer than 65,536 bytes)" in c.notes[0]
    c.close()
    c = open_cache(path, V)
    row = c.rows[err["key"]]
    c.close()
    assert "\x1b" not in row["error"] and "\x07" not in row["error"] and len(row["error"]) < 400
    assert row["error"].endswith("(50,026 characters)") and "\x1b" not in row["worker"]
    r = run("strided", "--n", "16", "--grid", "stride=4", "--block", "4", "--heads", "2",
            "--head-dim", "8", "--cache", str(path), "--all")
    assert r.exit_code == 1, r.output  # a candidate errored
    assert "\x1b" not in r.output and "\x07" not in r.output and len(r.output) < 5000
    assert "failed: strided stride=4 n=16: ValueError:  [2J ]0;pwned AAAA" in r.stderr


def test_loading_is_bounded_by_the_load_limit(tmp_path):
    row = _row()
    path = tmp_path / "r.jsonl"
    _jsonl(path, *([{"key": row["key"], "status": "ok"}] * 40))
    with config.load_limit(20 * ROW_BYTES), pytest.raises(
            ValueError, match=r"^cache: .*r\.jsonl' holds more than 20 rows, above the load "
                              r"limit of .*\(rows count 4,096 bytes each; config.set_load_limit\)$"):
        open_cache(path, V)
    with config.load_limit(100), pytest.raises(ValueError, match=r"is [\d,]+ bytes, above the load"):
        open_cache(path, V)
    assert not (tmp_path / "r.jsonl.lock").exists()


def test_a_parquet_declaring_huge_rows_is_refused_before_reading(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparse_patterns.search._cache import _arrow_schema

    schema = _arrow_schema(V)
    # a thousand null rows: a file of a few kB (nulls are run-length encoded); as rows they
    # would take ROW_BYTES each, four times the load limit here
    cols = [pa.nulls(1000, type=f.type) for f in schema]
    path = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_arrays(cols, schema=schema), path)
    limit = 250 * ROW_BYTES
    assert path.stat().st_size < limit
    with config.load_limit(limit), pytest.raises(
            ValueError, match=r"r\.parquet' declares 1,000 rows, above the load limit"):
        open_cache(path, V)
    big = tmp_path / "s.parquet"  # one row whose error is 4 MB of one letter (compresses)
    row = {f.name: None for f in schema}
    row.update(_row(), error="A" * 4_000_000)
    pq.write_table(pa.Table.from_pylist([row], schema=schema), big, compression="zstd")
    assert big.stat().st_size < limit
    with config.load_limit(limit), pytest.raises(ValueError, match="declares .* bytes of rows"):
        open_cache(big, V)


@pytest.mark.parametrize("kind", ["fifo", "dev", "dir"])
def test_a_cache_path_must_be_a_regular_file(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "r.jsonl"
        os.mkfifo(path)
        what = "is a FIFO"
    elif kind == "dev":
        path = tmp_path / "z.jsonl"
        path.symlink_to("/dev/zero")
        what = "is a character device"
    else:
        path = tmp_path / "d.parquet"
        path.mkdir()
        what = "is a directory"
    with pytest.raises(ValueError, match=f"^cache: .* {what}; give a regular file's path"):
        open_cache(path, V)
    r = run("strided", "--n", "16", "--grid", "stride=4", "--cache", str(path))
    _one_line(r, 2, what)
    assert not list(tmp_path.glob("*.lock"))


def test_a_foreign_file_is_not_a_search_cache_and_left_untouched(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n')
    r = run("strided", "--n", "16", "--grid", "stride=4", "--cache", str(path))
    _one_line(r, 2, "f.jsonl' is not a search cache (no header naming it one); it is left as it is")
    junk = tmp_path / "j.parquet"
    junk.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"j\.parquet' is not a search cache \(not a readable "
                                         r"Parquet file"):
        open_cache(junk, V)
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n' and junk.read_bytes() == b"PAR1 not really"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.jsonl", "j.parquet"]
    empty = tmp_path / "e.jsonl"  # an empty file holds nothing to lose: it becomes the cache
    empty.touch()
    c = open_cache(empty, V)
    c.close()
    assert json.loads(empty.read_text())["format"] == "sparse-patterns search cache"
