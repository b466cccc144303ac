"""Speed and memory of the numba sparse-attention kernel against torch, from one run.

Usage::

    .venv/bin/python benchmarks/kernel.py            # the figures of issue 4
    .venv/bin/python benchmarks/kernel.py --cold     # also a cold compile (empty cache)

B=1, H=8, d=64, float32, ``mode="merged"``. Prints: fp32 ``torch.matmul`` throughput
and torch SDPA ``is_causal=True`` at n=16,384; strided (l=128) and fixed (l=128,
c=16) forward times, their speed-up over SDPA and their useful-FLOP throughput as
a share of the matmul rate; the cost of going to n=65,536 with l=sqrt(n); the
forward's peak memory at 65,536 (a subprocess sampling its resident set); the
backward/forward ratio; and the first-call (compile or cache load) time. Timings
are the best of ``--repeats`` calls; ratios are taken from this one run. Nothing
here is asserted: the targets are printed next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import sparse_patterns as sps
from sparse_patterns.kernels import attention, attention_backward, plan

__all__: list[str] = []

B, H, D = 1, 8, 64


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def inputs(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(3))


def pattern(name: str, n: int):
    if name == "strided":
        return sps.make("strided", n, stride="sqrt" if n != 16384 else 128)
    return sps.make("fixed", n, stride=128, c=16)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(n: int, block: int) -> None:
    """In a fresh process: peak resident memory of one forward at ``n`` (JSON on stdout)."""
    x = inputs(64)
    attention(*x, sps.make("strided", 64, stride=8), mode="merged", block=block)  # load the kernel
    base = rss()
    q, k, v = inputs(n)
    pat = sps.make("strided", n, stride="sqrt")
    plan(pat, mode="merged", block=block)
    before = rss()
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.0005)

    th = threading.Thread(target=sample)
    th.start()
    out = attention(q, k, v, pat, mode="merged", block=block)
    done.set()
    th.join()
    peak[0] = max(peak[0], rss())
    print(json.dumps({
        "n": n, "qkvo_bytes": 4 * q.nbytes, "peak_above_start": peak[0] - base,
        "peak_during_call": peak[0] - before, "plan_bytes": before - base - 3 * q.nbytes,
        "out_ok": bool(np.isfinite(out).all()),
    }))


def cold_compile() -> float:
    """Seconds of a first call in a new process with an empty numba cache."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NUMBA_CACHE_DIR=d)
        code = ("import time, numpy as np, sparse_patterns as sps; t = time.perf_counter(); "
                "x = np.ones((1, 1, 64, 8), np.float32); "
                "sps.attention(x, x, x, sps.make('strided', 64, stride=8)); "
                "print(time.perf_counter() - t)")
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
        return float(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also time a cold compile")
    ap.add_argument("--block", type=int, default=sps.kernels.BLOCK,
                    help="tile size of the plans (default: the kernels' default, 32)")
    ap.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.block)
        return

    import torch

    print(f"plan block: {args.block} tokens")
    x = inputs(64)
    t = time.perf_counter()
    attention(*x, sps.make("strided", 64, stride=8), mode="merged", block=args.block)
    first_fwd = time.perf_counter() - t
    o, lse = attention(*x, sps.make("strided", 64, stride=8), mode="merged", return_lse=True, block=args.block)
    t = time.perf_counter()
    attention_backward(*x, o, lse, np.ones_like(o), sps.make("strided", 64, stride=8),
                       mode="merged", block=args.block)
    first_bwd = time.perf_counter() - t
    print(f"first call (numba cache load or compile): forward {first_fwd:.2f} s, "
          f"backward {first_bwd:.2f} s")
    if args.cold:
        print(f"cold compile (empty cache, new process, forward only): {cold_compile():.1f} s")

    a = torch.randn(4096, 4096)
    a @ a
    t_mm = best(lambda: a @ a, args.repeats)
    mm = 2 * 4096**3 / t_mm / 1e9
    print(f"torch fp32 matmul 4096^2: {mm:.0f} GFLOP/s (torch threads {torch.get_num_threads()})")

    n = 16384
    q, k, v = inputs(n)
    tq, tk, tv = (torch.from_numpy(z) for z in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sdpa(tq[:, :1, :2048], tk[:, :1, :2048], tv[:, :1, :2048], is_causal=True)
    t_sdpa = best(lambda: sdpa(tq, tk, tv, is_causal=True), max(1, args.repeats - 1))
    print(f"torch SDPA is_causal=True, n={n}: {t_sdpa * 1e3:.0f} ms")

    res = {}
    for name, target in (("strided", 20), ("fixed", 5)):
        pat = pattern(name, n)
        pl = plan(pat, mode="merged", block=args.block)
        attention(q, k, v, pat, mode="merged", block=args.block)
        t = best(lambda pat=pat: attention(q, k, v, pat, mode="merged", block=args.block), args.repeats)
        useful, computed = pl.flops(B, H, D)
        res[name] = t
        print(f"{name:8s} n={n}: {t * 1e3:7.1f} ms  {t_sdpa / t:5.1f}x SDPA (target >= {target}x)"
              f"  useful {useful / t / 1e9:5.1f} GFLOP/s = {useful / t / 1e9 / mm:4.0%} of matmul"
              f" (target >= 40%)  computed/useful {pl.ratio:.2f}  [{', '.join(pl.piece_kind)}]")

    pat = pattern("strided", n)
    o, lse = attention(q, k, v, pat, mode="merged", return_lse=True, block=args.block)
    do = np.ones_like(o)
    attention_backward(q, k, v, o, lse, do, pat, mode="merged", block=args.block)
    t_b = best(lambda: attention_backward(q, k, v, o, lse, do, pat, mode="merged", block=args.block), args.repeats)
    print(f"backward strided n={n}: {t_b * 1e3:.0f} ms = {t_b / res['strided']:.2f}x forward "
          "(target <= 3x)")

    n2 = 65536
    q2, k2, v2 = inputs(n2)
    pat2 = pattern("strided", n2)
    plan(pat2, mode="merged", block=args.block)
    attention(q2, k2, v2, pat2, mode="merged", block=args.block)
    t2 = best(lambda: attention(q2, k2, v2, pat2, mode="merged", block=args.block), max(1, args.repeats - 1))
    print(f"strided n={n2} (l={pat2.params['stride']}): {t2 * 1e3:.0f} ms = "
          f"{t2 / res['strided']:.1f}x n={n} (target <= 10x; 16x is quadratic)")

    child = subprocess.run([sys.executable, __file__, "--memory-child", str(n2), "--block",
                            str(args.block)],
                           capture_output=True, text=True, check=True)
    m = json.loads(child.stdout.strip().splitlines()[-1])
    limit = 2 * m["qkvo_bytes"] + 200e6
    print(f"peak memory, forward n={n2}: {m['peak_above_start'] / 1e6:.0f} MB above the "
          f"process start (q, k, v: {3 * m['qkvo_bytes'] / 4e6:.0f} MB, plan "
          f"{m['plan_bytes'] / 1e6:.0f} MB, call {m['peak_during_call'] / 1e6:.0f} MB incl. "
          f"out); limit 2 x bytes(q,k,v,out) + 200 MB = {limit / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
