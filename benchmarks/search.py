"""Timings of ``sparse_patterns.search`` (issue 23): prints figures, asserts nothing.

    .venv/bin/python benchmarks/search.py [--workers 2] [--n 16384] [--time] [--rounds 2]

One grid of 48 candidates at n = 16,384 (fixed: stride 32..256 x c 2..16 x 1 or 2
summary heads; strided: the same strides, both windows; local and dilated: window
64..512), each
verified exactly and planned (``--time``: also the kernel's forward timed):

1. serially in this process (numba with its default threads), after a warm-up;
   then again with one thread (numba's and the plan's, as a worker has);
2. on a LocalCluster of ``--workers`` processes (one thread each), end to end:
   starting the cluster, the workers' imports, the grid, closing it;
3. on the same kind of cluster already started and warmed (the grid alone), run as
   ``search`` runs its own local cluster (a dask task group a candidate, but for the
   shortest ones: one group that dask queues; a cluster given to ``search`` gets one
   group for them all, dask's queuing).

1 and 3 alternate for ``--rounds`` rounds (a shared machine's load moves), after a
round 0 of both that is printed but not counted: the first grid of a run, serial and
cluster alike, was 10-40% slower than the next ones in most runs (the cluster's
processes just started beside it). The target is 3 at most 0.6x the serial time on a
2-core machine. The serial run keeps
more than one core busy (the plan's chunks on a thread pool, numba's parallel loops;
CPU time over wall time is printed with it), but on this grid the second core buys
little: the one-thread run's time divided by the workers is the least a cluster of
one-thread workers can take, printed as a fraction of the serial time. Then the
scheduler's overhead per task: 1,000 no-op tasks through the same cluster, and
per round the grid's wall x workers minus the tasks' own time, per task. Timings
are wall clock on whatever machine runs this; compare only figures printed by
one run.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np


def grid() -> tuple[list[str], dict[str, list]]:
    """The 48 candidates: 32 fixed, 8 strided, 4 local, 4 dilated (window: ints to local and
    dilated, the names to strided)."""
    return ["fixed", "strided", "local", "dilated"], {
        "stride": [32, 64, 128, 256], "c": [2, 4, 8, 16], "summary_heads": [1, 2],
        "window": [64, 128, 256, 512, "paper", "reference"],
    }


def _noop(x: int) -> int:
    return x


def _warm() -> None:
    """Import and load the kernels on a worker (what its first task would pay)."""
    from sparse_patterns import __version__
    from sparse_patterns.search._tasks import run_candidate

    rec = {"family": "fixed", "params": {"stride": 32, "c": 4}, "n": 1024, "mode": "interleaved",
           "block": 32, "batch": 1, "heads": 8, "head_dim": 64, "depth": None}
    run_candidate(rec, __version__, ("verify", "flops", "time"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--time", action="store_true", help="also time the kernel on each candidate")
    ap.add_argument("--rounds", type=int, default=2, help="serial / cluster pairs, interleaved")
    args = ap.parse_args()

    import sparse_patterns.search as search_module
    from sparse_patterns import __version__
    from sparse_patterns.search import _connect, _grid, _recipes, search
    from sparse_patterns.search._tasks import normalize_measures, run_candidate

    run = search_module._run  # 3. as on search's own local cluster, though a client is given
    search_module._run = lambda *a, **kw: run(*a, **{**kw, "grouped": False})

    measure = normalize_measures(["verify", "flops", "time"] if args.time else ["verify", "flops"])
    fams, g = grid()
    _, per = _grid(fams, g, [args.n])
    fixed = {"mode": "interleaved", "batch": 1, "heads": 8, "head_dim": 64, "depth": None}
    recipes = _recipes(fams, per, [args.n], [32], fixed)
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} cores; {len(recipes)} candidates at n = {args.n:,}, measure = "
          f"{', '.join(measure)}", flush=True)

    t = time.perf_counter()
    _warm()
    print(f"warm-up in this process (imports, numba cache): {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    client, owned = _connect(None, args.workers, 30.0)
    client.run(_warm)
    print(f"cluster start + warm-up of its {args.workers} workers: {time.perf_counter() - t:.2f} s "
          "(not in 1. and 3.)", flush=True)
    serial_s, warm_s, ratios = [], [], []
    try:
        for k in range(args.rounds + 1):  # A/B interleaved: a shared machine's load moves
            t, cpu = time.perf_counter(), time.process_time()
            serial = [run_candidate(r, __version__, measure) for r in recipes]
            serial_s.append(time.perf_counter() - t)
            busy_serial = (time.process_time() - cpu) / serial_s[-1]
            tag = f"round {k}" if k else "round 0 (warm-up, not counted)"
            bad = sum(r["status"] != "ok" for r in serial)
            one = _one_thread(lambda: [run_candidate(r, __version__, measure) for r in recipes])
            print(f"{tag}: 1. serial, one process:            {serial_s[-1]:7.2f} s  "
                  f"({bad} errors; {busy_serial:.2f} cores busy on average); with one thread "
                  f"{one:.2f} s, so {args.workers} one-thread workers can at best take "
                  f"{min(1.0, one / args.workers / serial_s[-1]):.2f}x the serial time",
                  flush=True)
            t = time.perf_counter()
            res = search(fams, g, args.n, measure=measure, client=client)
            warm_s.append(time.perf_counter() - t)
            ratios.append(warm_s[-1] / serial_s[-1])
            busy = sum(r["seconds"] for r in res.rows)
            print(f"{tag}: 3. local cluster, started, warm:   {warm_s[-1]:7.2f} s  = "
                  f"{warm_s[-1] / serial_s[-1]:.2f}x serial; tasks' own time {busy:.2f} s, "
                  f"{(warm_s[-1] * args.workers - busy) / len(res) * 1e3:.1f} ms per task of "
                  "scheduling, transfer and idle tail", flush=True)
            same = all(a["ok"] == b["ok"] and a["computed_flops"] == b["computed_flops"]
                       for a, b in zip(serial, res.rows, strict=True))
            if not same:
                print("   ROWS DIFFER from the serial ones")
            if k == 0:  # the warm-up round
                serial_s, warm_s, ratios = [], [], []
        _overhead(client)
    finally:
        client.close()
        for thing in owned:
            thing.close()
    t = time.perf_counter()
    search(fams, g, args.n, measure=measure, workers=args.workers)
    t_e2e = time.perf_counter() - t
    print(f"2. local cluster, end to end (start, imports, grid, close): {t_e2e:.2f} s = "
          f"{t_e2e / min(serial_s):.2f}x the best serial", flush=True)
    print(f"best of {args.rounds}: serial {min(serial_s):.2f} s, cluster {min(warm_s):.2f} s = "
          f"{min(warm_s) / min(serial_s):.2f}x serial (target <= 0.6x); the rounds' own ratios "
          f"{', '.join(f'{x:.2f}' for x in ratios)}x, median {float(np.median(ratios)):.2f}x")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _one_thread(run: Any) -> float:
    """Seconds ``run()`` takes with numba and the plan's chunks on one thread."""
    import numba

    from sparse_patterns.kernels import planning

    threads, before = numba.get_num_threads(), planning.planning_threads
    numba.set_num_threads(1)
    planning.planning_threads = lambda: 1
    try:
        t = time.perf_counter()
        run()
        return time.perf_counter() - t
    finally:
        numba.set_num_threads(threads)
        planning.planning_threads = before


def _overhead(client: Any, count: int = 1000) -> None:
    # keyed as search keys its tasks on its own local cluster: a task group each, handed to
    # the workers at once
    run = os.urandom(4).hex()
    client.gather(client.map(_noop, range(50), key=[f"noop_{i}-{run}-warm" for i in range(50)]))
    t = time.perf_counter()
    client.gather(client.map(_noop, range(count), key=[f"noop_{i}-{run}" for i in range(count)]))
    dt = time.perf_counter() - t
    print(f"   scheduler overhead: {count:,} no-op tasks in {dt:.2f} s = {dt / count * 1e3:.2f} ms "
          "per task (submit to result, all in flight at once)")


if __name__ == "__main__":
    main()
