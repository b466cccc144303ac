"""A/B of the CPU kernel's switches kept for A/B runs, each branch against the default.

Usage::

    .venv/bin/python benchmarks/ab_switches.py             # 6 rounds
    .venv/bin/python benchmarks/ab_switches.py --rounds 8

B=1, H=8, d=64, ``mode="merged"``, n=16,384: strided (l=128), fixed (l=128, c=16) and
local (window 128), float32 and bfloat16 (torch) inputs, one plan per pattern. The
switches are module globals of :mod:`sparse_patterns.kernels.cpu._forward` and
:mod:`sparse_patterns.kernels.cpu._backward`, read at each call:

* ``_PREFETCH`` (forward; backward): software prefetch of the next block's rows, on
  (kept) against off;
* ``_BY_HEAD``: strided's two pieces run head by head in one parallel loop (kept) against
  one parallel loop per piece over every head;
* ``_CHUNK_BYTES``: 0, every head at once (kept), against one head's rows (the pieces of a
  softmax group run head by head, the state stored normally).

One process, every quantity timed once per round with each setting, the order of the two
settings reversed every other round (A B, B A, ...: ABBA over two rounds), so that the
machine's drift moves both sides. Prints, per case, the median over rounds of the time
ratio kept / removed (below 1: the kept branch is faster), its range, and the median
times; and the machine (``/proc/cpuinfo``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import numba
import numpy as np
import torch
from _docs import machine

import sparse_patterns as sps
from sparse_patterns.kernels import attention, attention_backward, plan
from sparse_patterns.kernels.cpu import _backward as bw
from sparse_patterns.kernels.cpu import _forward as fw
from sparse_patterns.kernels.cpu import amx_applies, bf16_applies

__all__: list[str] = []

B, H, N, D = 1, 8, 16384, 64
PATTERNS = {
    "strided": lambda: sps.make("strided", N, stride=128),
    "fixed": lambda: sps.make("fixed", N, stride=128, c=16),
    "local": lambda: sps.make("local", N, window=128),
}

# switch -> (its setting in the kept branch, in the removed one), as (module, name, value)
SWITCHES = {
    "_PREFETCH (forward)": ([(fw, "_PREFETCH", True)], [(fw, "_PREFETCH", False)]),
    "_PREFETCH (backward)": ([(bw, "_PREFETCH", True)], [(bw, "_PREFETCH", False)]),
    "_PREFETCH (both)": ([(fw, "_PREFETCH", True), (bw, "_PREFETCH", True)],
                         [(fw, "_PREFETCH", False), (bw, "_PREFETCH", False)]),
    "_BY_HEAD": ([(fw, "_BY_HEAD", True)], [(fw, "_BY_HEAD", False)]),
    "_CHUNK_BYTES": ([(fw, "_CHUNK_BYTES", 0)], [(fw, "_CHUNK_BYTES", 4 * N * D * 4)]),
}

# (switch, pattern, what is timed): the paths each switch affects
CASES = [
    ("_PREFETCH (forward)", "strided", "forward"),
    ("_PREFETCH (forward)", "fixed", "forward"),
    ("_PREFETCH (forward)", "local", "forward"),
    ("_PREFETCH (backward)", "strided", "backward"),
    ("_PREFETCH (backward)", "fixed", "backward"),
    ("_PREFETCH (backward)", "local", "backward"),
    ("_PREFETCH (both)", "strided", "forward+backward"),
    ("_BY_HEAD", "strided", "forward"),
    ("_CHUNK_BYTES", "strided", "forward"),
]


def apply(settings) -> None:
    for module, name, value in settings:
        setattr(module, name, value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds (default 6; even: ABBA)")
    args = ap.parse_args()
    defaults = {(m, name): getattr(m, name) for kept, _ in SWITCHES.values()
                for m, name, _ in kept}
    rng = np.random.default_rng(0)
    x32 = [rng.standard_normal((B, H, N, D), dtype=np.float32) for _ in range(4)]
    inputs = {"float32": x32,
              "bfloat16": [torch.from_numpy(a).to(torch.bfloat16) for a in x32]}
    plans = {name: plan(make(), mode="merged") for name, make in PATTERNS.items()}
    saved = {(p, dt): attention(*x[:3], plans[p], mode="merged", return_lse=True)
             for p in plans for dt, x in inputs.items()}

    def call(pattern: str, dtype: str, what: str):
        x, pl = inputs[dtype], plans[pattern]
        if what == "forward":
            return lambda: attention(*x[:3], pl, mode="merged")
        if what == "backward":
            o, lse = saved[pattern, dtype]
            return lambda: attention_backward(*x[:3], o, lse, x[3], pl, mode="merged")

        def step():
            o, lse = attention(*x[:3], pl, mode="merged", return_lse=True)
            attention_backward(*x[:3], o, lse, x[3], pl, mode="merged")
        return step

    cases = [(s, p, dt, what) for s, p, what in CASES for dt in inputs]
    times = {case: ([], []) for case in cases}  # kept, removed
    for case in cases:  # every path once with each setting before timing
        for side in (0, 1):
            apply(SWITCHES[case[0]][side])
            call(*case[1:])()
        apply(SWITCHES[case[0]][0])
    t_start = time.perf_counter()
    for r in range(args.rounds):
        for case in cases:
            fn = call(*case[1:])
            for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                apply(SWITCHES[case[0]][side])
                t = time.perf_counter()
                fn()
                times[case][side].append(time.perf_counter() - t)
            apply(SWITCHES[case[0]][0])
        print(f"round {r + 1}/{args.rounds} done, {time.perf_counter() - t_start:.0f} s",
              flush=True)
    for (m, name), value in defaults.items():
        setattr(m, name, value)

    pl = plans["strided"]
    how = ("AMX products" if amx_applies(pl, D) else "bf16 products (vdpbf16ps)"
           if bf16_applies(pl, D) else "widened to float32")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n{machine()}, {numba.get_num_threads()} numba threads; {when}; bf16 inputs: "
          f"{how} (SPARSE_PATTERNS_BF16={os.environ.get('SPARSE_PATTERNS_BF16', 'auto')})")
    print(f"n = {N}, B = {B}, H = {H}, d = {D}, merged; {args.rounds} rounds, the two "
          "settings alternated ABBA in one process; ratio = kept / removed time, median "
          "[range] over rounds (< 1: the kept branch is faster)\n")
    print("| switch | pattern | timed | inputs | kept ms | removed ms | kept / removed |")
    print("| --- | --- | --- | --- | ---: | ---: | --- |")
    for case in cases:
        kept, removed = (np.array(t) for t in times[case])
        ratio = kept / removed
        print(f"| {case[0]} | {case[1]} | {case[3]} | {case[2]} | "
              f"{np.median(kept) * 1e3:.1f} | {np.median(removed) * 1e3:.1f} | "
              f"{np.median(ratio):.3f} [{ratio.min():.3f}-{ratio.max():.3f}] |")


if __name__ == "__main__":
    main()
