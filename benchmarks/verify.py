"""Timings of exact verification (issue 3): prints figures, asserts nothing.

    .venv/bin/python benchmarks/verify.py [--quick]

1. strided (stride 256) and fixed (stride 256, c = 32) at n = 65,536, verified
   exactly, interleaved (the target: < 10 s each) and merged;
2. at n = 8,192, verify against scipy.sparse.csgraph.shortest_path(unweighted=True)
   computing the same hop distances on the merged graph (target: >= 50x), one run;
3. block level at n = 2^20, block 128: fixed (stride 1024, c = 32) and BigBird
   (target: < 10 s each).

Timings are wall clock on whatever machine runs this; compare only figures
printed by one run. The first call compiles (or loads) the numba kernels and is
excluded.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from sparse_patterns import make
from sparse_patterns.analysis import verify


def _t(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def main(quick: bool = False) -> None:
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    # compile / load the kernels (parallel forms: n >= 2048 tokens, nb >= 2048 blocks)
    t = time.perf_counter()
    for mode in ("interleaved", "merged"):
        verify(make("fixed", 4096, stride=64), progress=False, mode=mode)
        verify(make("fixed", 2**18, stride=1024).to_blocks(128), progress=False, mode=mode)
    print(f"warm-up (numba compile or cache load): {time.perf_counter() - t:.1f}s")

    n = 16384 if quick else 65536
    print(f"\n== token level, n = {n:,} (exact: every pair) ==")
    print(f"{'pattern':32s} {'mode':12s} {'generate':>9s} {'verify':>8s}  result")
    for name, kw in [("strided", {"stride": 256}), ("fixed", {"stride": 256, "c": 32})]:
        pat, tg = _t(lambda name=name, kw=kw: make(name, n, **kw))
        _, th = _t(lambda pat=pat: pat.heads)
        for mode in ("interleaved", "merged"):
            r, tv = _t(lambda pat=pat, mode=mode: verify(pat, mode=mode, progress=False))
            label = f"{name}({', '.join(f'{k}={v}' for k, v in kw.items())})"
            print(f"{label:32s} {mode:12s} {tg + th:8.2f}s {tv:7.2f}s  ok={r.ok} "
                  f"pairs={r.targets:,} hops={r.hops}", flush=True)

    n = 4096 if quick else 8192
    print(f"\n== against scipy.sparse.csgraph.shortest_path(unweighted=True), n = {n:,} ==")
    from scipy.sparse.csgraph import shortest_path

    for name, kw in [("strided", {"stride": int(np.sqrt(n))}),
                     ("fixed", {"stride": int(np.sqrt(n)), "c": int(np.sqrt(n)) // 8})]:
        pat = make(name, n, **kw)
        _ = pat.heads
        pat.union()
        rm, tm = _t(lambda pat=pat: verify(pat, mode="merged", progress=False))
        ri, ti = _t(lambda pat=pat: verify(pat, mode="interleaved", progress=False))
        # edge j -> a when a reads j: the transpose of the union (rows are outputs)
        g = pat.union().T.tocsr().astype(np.float64)
        d, ts = _t(lambda g=g: shortest_path(g, method="auto", directed=True, unweighted=True))
        low = np.tril(np.ones((n, n), bool), -1).T  # j < i, as D[j, i]
        same = (rm.hops[1] == int(((d == 1) & low).sum()) + n
                and rm.hops[2] == int(((d == 2) & low).sum()))
        del d
        print(f"{name}({kw}): scipy {ts:.2f}s | verify merged {tm:.3f}s -> {ts / tm:.0f}x "
              f"(same hop counts: {same}) | verify interleaved {ti:.3f}s -> {ts / ti:.0f}x",
              flush=True)

    nb = 2**16 if quick else 2**20
    print(f"\n== block level, n = {nb:,}, block 128 ==")
    for name, kw in [("fixed", {"stride": 1024, "c": 32}), ("bigbird", {"block": 128})]:
        pat = make(name, nb, **kw)
        bl, tb = _t(lambda pat=pat: pat.to_blocks(128))
        for mode in ("interleaved", "merged"):
            r, tv = _t(lambda bl=bl, mode=mode: verify(bl, mode=mode, progress=False))
            print(f"{name}({kw}) {mode:12s}: to_blocks {tb:.2f}s verify {tv:.2f}s ok={r.ok} "
                  f"certified={r.certified} partial_pairs={r.partial_pairs:,} "
                  f"counterexample={r.counterexample}", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
