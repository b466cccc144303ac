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
import socket
import sys
import threading
import time

import pytest

pytest.importorskip("distributed")
pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from typer.testing import CliRunner  # noqa: E402

import sparse_patterns as sps  # noqa: E402
from sparse_patterns import config  # noqa: E402
from sparse_patterns.cli import app  # noqa: E402
from sparse_patterns.search import search  # noqa: E402
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
    os.link(victim, tmp_path / "h.jsonl.lock")  # a hard link: no O_NOFOLLOW stops it
    with pytest.raises(ValueError, match=r"h\.jsonl\.lock' of .* is a hard link to another file"):
        open_cache(tmp_path / "h.jsonl", V)
    assert victim.read_text() == "precious\n"


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


# ----------------------------------------------------------------------------- 2: the grid
@pytest.mark.parametrize(
    "args,message",
    [
        (["--grid", "stride=" + "9" * 30, "--grid", "c=2"],
         "grid: stride: must be an integer of at most 18 ASCII digits or 'sqrt'/'cbrt', got "
         "'999999999999999999999999999999'"),
        (["--grid", "stride=8", "--grid", "c=" + "7" * 5000],
         "grid: c: must be an integer of at most 18 ASCII digits, got "
         "'77777777777777777777777777777777777777... (5,000 characters)"),
        (["--grid", "stride=\u0668", "--grid", "c=2"], "got '\u0668'"),  # ARABIC-INDIC EIGHT
        (["--stride", "\u0668", "--c", "2"], "got '\u0668'"),  # the same parser as --grid
        (["--grid", "stride=8", "--grid", "c=1e3"], "grid: c: must be an integer"),
    ],
)
def test_grid_values_are_checked_like_options(args, message):
    r = run("fixed", "--n", "64", *args)
    line = _one_line(r, 2, message)
    assert len(line) < 200 and r.stdout == ""


def test_a_grid_value_of_the_api_is_checked_the_same_way():
    with pytest.raises(ValueError, match=r"^grid: stride: must be an integer of at most 18 ASCII "
                                         r"digits or 'sqrt'/'cbrt', got 10{30}$"):
        search("fixed", {"stride": 10**30, "c": 2}, 64)


# ----------------------------------------------------------------------------- 2: scheduling
@pytest.fixture(scope="module")
def inproc():
    """A cluster of 2 worker threads in this process, on tcp (a scheduler address too)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                           dashboard_address=":0")
    client = Client(cluster, set_as_default=False)
    yield client, cluster
    client.close()
    cluster.close()


def test_submission_is_bounded(inproc, monkeypatch):
    """A grid goes out a few tasks at a time (a small bound here), longest first, and every
    row comes back equal to the candidate computed here."""
    from distributed import Client

    from sparse_patterns.search import _tasks

    search_mod = sys.modules["sparse_patterns.search"]
    monkeypatch.setattr(search_mod, "_IN_FLIGHT", 4)
    sizes = []
    real_map = Client.map

    def spy(self, func, *iterables, **kw):
        sizes.append(len(iterables[0]))
        return real_map(self, func, *iterables, **kw)

    monkeypatch.setattr(Client, "map", spy)
    res = search("strided", {"stride": [2, 3, 4, 5, 6, 7]}, [16, 32], block=4, heads=2,
                 head_dim=8, client=inproc[0])
    assert sum(sizes) == 12 and max(sizes) <= 4 and len(sizes) >= 3
    for row in res.rows:
        mine = _tasks.run_candidate(_tasks.recipe_of(row), V, ("verify", "flops"))
        assert (row["ok"], row["max_hops"], row["computed_flops"]) == (
            mine["ok"], mine["max_hops"], mine["computed_flops"])


def test_no_worker_left_is_one_line_saying_what_is_saved(tmp_path, monkeypatch):
    from distributed import Client, LocalCluster

    search_mod = sys.modules["sparse_patterns.search"]
    monkeypatch.setattr(search_mod, "_IN_FLIGHT", 2)
    monkeypatch.setattr(search_mod, "_CHECK_EVERY", 0.1)
    path = tmp_path / "r.jsonl"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster,
                                                                 set_as_default=False) as client:
        def progress(done, total):
            if done == 1:  # the only worker goes away after the first row
                cluster.scale(0)
                cluster.sync(cluster._correct_state)

        t = time.monotonic()
        with pytest.raises(ConnectionError, match=r"^workers: none left for 1 s .*; (\d+) of 12 "
                                                  r"candidates are saved in .*r\.jsonl'?; run again"):
            search("strided", {"stride": [2, 3, 4, 5, 6, 7]}, [16, 32], block=4, heads=2,
                   head_dim=8, client=client, cache=path, timeout=1, progress=progress)
        assert time.monotonic() - t < 60  # a hang guard, not a timing
    store = open_cache(path, V)
    assert 1 <= len(store.rows) < 12
    store.close()


def test_ctrl_c_stops_a_bounded_search_and_says_what_is_saved(inproc, tmp_path, monkeypatch):
    from sparse_patterns.search import SearchInterrupted

    search_mod = sys.modules["sparse_patterns.search"]
    monkeypatch.setattr(search_mod, "_IN_FLIGHT", 2)

    def progress(done, total):
        if done >= 3:
            raise KeyboardInterrupt

    path = tmp_path / "r.parquet"
    with pytest.raises(SearchInterrupted) as info:
        search("strided", {"stride": [2, 3, 4, 5, 6, 7]}, [16, 32], block=4, heads=2,
               head_dim=8, client=inproc[0], cache=path, progress=progress)
    assert 3 <= info.value.saved < 12 and info.value.total == 12
    store = open_cache(path, V)
    assert len(store.rows) == info.value.saved
    store.close()


def test_a_search_in_which_every_candidate_errors_exits_1(inproc):
    r = run("fixed", "--n", "64", "--grid", "stride=8", "--grid", "c=9,10", "--scheduler",
            inproc[1].scheduler_address)
    assert r.exit_code == 1, r.output
    assert "2 candidates: 0 verified, 0 failing a criterion, 2 errors" in r.stdout
    assert r.stderr.count("failed: fixed") == 2


# ----------------------------------------------------------------------------- 3: schedulers
def _fake_server(kind: str) -> tuple[str, socket.socket]:
    """A local server that answers as ``kind``: garbage, an HTTP page, a frame announcing
    2**60 bytes, one byte every 0.3 s, silence, or an immediate close."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def handle(conn):
        with conn:
            try:
                if kind == "garbage":
                    conn.sendall(b"\x00garbage!" * 100)
                elif kind == "http":
                    conn.recv(100)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
                elif kind == "huge":
                    conn.sendall((1 << 60).to_bytes(8, "little") + b"\x00" * 64)
                elif kind == "drip":
                    for _ in range(30):
                        conn.sendall(b"\x01")
                        time.sleep(0.3)
                elif kind == "close":
                    return
                time.sleep(8)
            except OSError:
                pass

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"tcp://127.0.0.1:{srv.getsockname()[1]}", srv


@pytest.mark.parametrize(
    "kind,message",
    [("garbage", "is not a Dask scheduler (its first message announces"),
     ("http", "no answer from"), ("huge", "announces 1,152,921,504,606,846,976 bytes"),
     ("drip", "no answer from"), ("silent", "no answer from"),
     ("close", "closed the connection before saying what it is")],
)
def test_a_fake_scheduler_is_one_line_within_the_timeout(kind, message):
    address, srv = _fake_server(kind)
    try:
        t = time.monotonic()
        with pytest.raises(ConnectionError, match=r"^scheduler: ") as info:
            search("strided", {"stride": 4}, 16, client=address, timeout=1)
        assert time.monotonic() - t < 5  # a hang guard: was 10 s to 61 s
        assert message in str(info.value) and "\n" not in str(info.value)
        r = run("strided", "--n", "16", "--grid", "stride=4", "--scheduler", address,
                "--timeout", "1")
        _one_line(r, 2, message)
    finally:
        srv.close()


@pytest.mark.parametrize("address,message", [
    ("tcp://127.0.0.1:99999x", "client: not a scheduler address"),
    ("tcp://" + "a" * 5000 + ":8786", "no answer from|cannot reach"),
    ("tcp://127.0.0.1:1", "cannot reach 'tcp://127.0.0.1:1' within 1 s"),
])
def test_a_malformed_or_unreachable_address_is_one_line(address, message):
    t = time.monotonic()
    with pytest.raises((ValueError, ConnectionError), match=message) as info:
        search("strided", {"stride": 4}, 16, client=address, timeout=1)
    assert time.monotonic() - t < 5 and len(str(info.value)) < 300


def test_a_closed_client_is_a_clear_error(inproc):
    from distributed import Client

    closed = Client(inproc[1], set_as_default=False)
    closed.close()
    with pytest.raises(ValueError, match=r"^client: the given distributed.Client is closed; give "
                                         r"an open one"):
        search("strided", {"stride": 4}, 16, client=closed)


def test_a_search_from_a_thread_works(inproc):
    out = {}

    def go():
        try:
            out["res"] = search("strided", {"stride": 4}, 16, block=4, client=inproc[0])
        except BaseException as exc:  # noqa: BLE001 - looked at below
            out["exc"] = exc

    thread = threading.Thread(target=go)
    thread.start()
    thread.join(120)
    assert "exc" not in out and out["res"].rows[0]["ok"] is True


@pytest.mark.alone
def test_a_script_without_a_main_guard_gets_one_error_naming_it(tmp_path):
    import subprocess

    script = tmp_path / "unguarded.py"
    script.write_text("from sparse_patterns.search import search\n"
                      "search('strided', {'stride': 4}, 16, workers=2)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.count("Traceback") == 1, proc.stderr  # the script's own, once
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: search: the local cluster's workers did not start")
    assert 'if __name__ == "__main__":' in last
