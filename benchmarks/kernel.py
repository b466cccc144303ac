"""Speed and memory of the numba sparse-attention kernel against torch, from one run.

Usage::

    .venv/bin/python benchmarks/kernel.py            # the figures of issue 4
    .venv/bin/python benchmarks/kernel.py --cold     # also a cold compile (empty cache)

B=1, H=8, d=64, float32, ``mode="merged"``. Prints: the machine's fp32 and bf16 FMA peak
(:func:`sparse_patterns.kernels.cpu.fma_peak`, a register-only loop, each round, the best
used; bf16: AMX's where the bf16 forward runs on it), fp32 ``torch.matmul`` throughput and torch SDPA ``is_causal=True`` at n=16,384;
strided (l=128) and fixed (l=128, c=16) forward times, their speed-up over SDPA, their
useful-FLOP throughput as a share of the FMA peak and of the matmul rate, and the same
forwards with bf16 inputs (strided also with a new output array each call: the kernel
recycles the arrays of outputs its caller dropped, see
``sparse_patterns.kernels.cpu._pool._buffer``); the cost of going to n=65,536 with
l=sqrt(n); the forward's peak memory at 65,536 (a subprocess sampling its resident set);
the backward/forward ratios (strided, fixed; fixed also on inputs 16 bytes into a cache
line, as NumPy's large arrays are: the other inputs start on a line, as torch's tensors do)
and the bf16 backward speed-ups; a training
step's attention (``SparseAttention`` forward + backward on torch tensors) against SDPA's
causal forward + backward; and the first-call (compile or cache load) time.

The machine is shared and its speed drifts by up to 30% within a minute, so the
timings are interleaved: each of ``--rounds`` rounds times every quantity once
(the best of ``--repeats`` calls; SDPA, 2 s a call, once), the two sides of a ratio
one right after the other, the order of the list reversed every other round. Each
figure is printed from the best times over all rounds, then as the median and range
over the rounds of the same figure taken within one round. Our kernel is more sensitive
than SDPA or the matmul to other tenants' memory traffic (its time can double while
theirs grows by a third), so the two can differ.
Nothing here is asserted: the targets are printed next to the figures.
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

import numba
import numpy as np

import sparse_patterns as sps
from sparse_patterns.kernels import attention, attention_backward, plan
from sparse_patterns.kernels.cpu import (
    amx_applies,
    amx_products_here,
    bf16_applies,
    fma_peak,
    release_workspace,
)
from sparse_patterns.kernels.cpu._llvm import _AVX512_BF16

__all__: list[str] = []

B, H, D = 1, 8, 64


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def inputs(n: int, seed: int = 0, offset: int = 0) -> tuple[np.ndarray, ...]:
    """Three standard-normal ``(B, H, n, D)`` float32 arrays starting ``offset`` bytes past
    a 64-byte cache line: 0 as torch allocates its tensors (the bf16 and training-step
    figures run on torch tensors); NumPy's large arrays start 16 bytes into a line, where
    every 64-byte vector load of a row spans two lines (the fixed backward ~3% slower)."""
    rng = np.random.default_rng(seed)

    def placed() -> np.ndarray:
        size = B * H * n * D
        raw = np.empty(size + 32, np.float32)
        start = ((-raw.ctypes.data) % 64 + offset) // 4
        return rng.standard_normal(dtype=np.float32, out=raw[start:start + size].reshape(
            (B, H, n, D)))

    return tuple(placed() for _ in range(3))


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
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="calls per quantity and round, the best one kept (default 2)")
    ap.add_argument("--cold", action="store_true", help="also time a cold compile")
    ap.add_argument("--markdown", action="store_true",
                    help="also write the report to docs/benchmarks.md (this machine's section)")
    ap.add_argument("--block", type=int, default=sps.kernels.BLOCK,
                    help="tile size of the plans (default: the kernels' default, 32)")
    ap.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.block)
        return

    import torch

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"plan block: {args.block} tokens")
    x = inputs(64)
    t = time.perf_counter()
    attention(*x, sps.make("strided", 64, stride=8), mode="merged", block=args.block)
    first_fwd = time.perf_counter() - t
    o, lse = attention(*x, sps.make("strided", 64, stride=8), mode="merged", return_lse=True, block=args.block)
    t = time.perf_counter()
    attention_backward(*x, o, lse, np.ones_like(o), sps.make("strided", 64, stride=8),
                       mode="merged", block=args.block)
    first_bwd = time.perf_counter() - t
    say(f"first call (numba cache load or compile): forward {first_fwd:.2f} s, "
          f"backward {first_bwd:.2f} s")
    if args.cold:
        say(f"cold compile (empty cache, new process, forward only): {cold_compile():.1f} s")

    from sparse_patterns.torch import SparseAttention

    peak_threads = numba.get_num_threads()
    # and both once per round, the best used: a single bf16 figure taken here read 326
    # GFLOP/s in one run (2026-11-27) against 966-975 in separate runs on the same machine
    # bf16: the peak of what the forward's bf16 products run on (AMX where it takes it)
    kind16 = "bfloat16-amx" if amx_products_here() else "bfloat16"
    peaks, peaks16 = [fma_peak("float32")], [fma_peak(kind16)]
    peak_target = {"strided": 55, "fixed": 75}
    torch_threads = torch.get_num_threads()
    a = torch.randn(4096, 4096)
    a @ a
    n, n2 = 16384, 65536
    q, k, v = inputs(n)
    tq, tk, tv = (torch.from_numpy(z) for z in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sdpa(tq[:, :1, :2048], tk[:, :1, :2048], tv[:, :1, :2048], is_causal=True)
    pats = {name: pattern(name, n) for name in ("strided", "fixed")}
    plans = {name: plan(pat, mode="merged", block=args.block) for name, pat in pats.items()}
    for pat in pats.values():
        attention(q, k, v, pat, mode="merged", block=args.block)
    strided = pats["strided"]
    o, lse = attention(q, k, v, strided, mode="merged", return_lse=True, block=args.block)
    do = inputs(n, seed=1)[0]
    # the same values 16 bytes into a cache line, as NumPy's large arrays are
    qo, ko, vo = inputs(n, offset=16)
    doo = inputs(n, seed=1, offset=16)[0]
    attention_backward(q, k, v, o, lse, do, strided, mode="merged", block=args.block)
    of, lsef = attention(q, k, v, pats["fixed"], mode="merged", return_lse=True, block=args.block)
    q2, k2, v2 = inputs(n2)
    pat2 = pattern("strided", n2)
    plan(pat2, mode="merged", block=args.block)
    attention(q2, k2, v2, pat2, mode="merged", block=args.block)

    # every quantity once per round, the rounds one after another: the ratios are
    # taken within a round, so a drift of the machine's speed moves both sides
    attn = SparseAttention(strided, mode="merged", block=args.block)
    leaves = [z.clone().requires_grad_() for z in (tq, tk, tv)]
    tdo = torch.from_numpy(do)
    half = [z.to(torch.bfloat16) for z in (tq, tk, tv)]
    o16, lse16 = attention(*half, strided, mode="merged", return_lse=True, block=args.block)
    of16, lsef16 = attention(*half, pats["fixed"], mode="merged", return_lse=True,
                             block=args.block)
    do16 = tdo.to(torch.bfloat16)
    leaves16 = [z.clone().requires_grad_() for z in half]

    def train(fn, xs=leaves, grad=tdo) -> None:
        """One training step's attention: forward and backward (gradients of q, k, v)."""
        for z in xs:
            z.grad = None
        fn(*xs).backward(grad)

    train(attn)
    train(attn, leaves16, do16)
    # the two sides of each ratio timed one right after the other (the order of the
    # whole list reversed every other round): the machine's speed drifts within seconds
    timed = {
        "matmul": lambda: a @ a,
        "peak32": lambda: peaks.append(fma_peak("float32", again=True)),
        "peak16": lambda: peaks16.append(fma_peak(kind16, again=True)),
        "sdpa_train": lambda: train(lambda *x: sdpa(*x, is_causal=True)),
        "train": lambda: train(attn),
        "train_bf16": lambda: train(attn, leaves16, do16),
        "sdpa": lambda: sdpa(tq, tk, tv, is_causal=True),
        "strided": lambda: attention(q, k, v, strided, mode="merged", block=args.block),
        "strided_bf16": lambda: attention(*half, strided, mode="merged", block=args.block),
        # the same call with a new output array (the kernel otherwise recycles the
        # previous call's, which the caller dropped): what the pages of a new 32 MiB
        # array cost here
        "strided_new_out": lambda: (release_workspace(),
                                    attention(q, k, v, strided, mode="merged", block=args.block)),
        "backward": lambda: attention_backward(q, k, v, o, lse, do, strided, mode="merged",
                                               block=args.block),
        "backward_bf16": lambda: attention_backward(*half, o16, lse16, do16, strided,
                                                    mode="merged", block=args.block),
        "fixed": lambda: attention(q, k, v, pats["fixed"], mode="merged", block=args.block),
        "fixed_bf16": lambda: attention(*half, pats["fixed"], mode="merged", block=args.block),
        "backward_fixed": lambda: attention_backward(q, k, v, of, lsef, do, pats["fixed"],
                                                     mode="merged", block=args.block),
        "backward_fixed_bf16": lambda: attention_backward(*half, of16, lsef16, do16,
                                                          pats["fixed"], mode="merged",
                                                          block=args.block),
        "fixed_offset": lambda: attention(qo, ko, vo, pats["fixed"], mode="merged",
                                          block=args.block),
        "backward_fixed_offset": lambda: attention_backward(qo, ko, vo, of, lsef, doo,
                                                            pats["fixed"], mode="merged",
                                                            block=args.block),
        "strided65k": lambda: attention(q2, k2, v2, pat2, mode="merged", block=args.block),
    }
    rounds = {key: [] for key in timed}
    for r in range(args.rounds):
        for key in list(timed) if r % 2 == 0 else list(timed)[::-1]:
            rounds[key].append(best(timed[key], 1 if key.startswith("sdpa") else args.repeats))
    t = {key: np.array(val) for key, val in rounds.items()}
    mm = 2 * 4096**3 / t["matmul"] / 1e9  # GFLOP/s per round

    def spread(x: np.ndarray, fmt: str) -> str:
        """Median [min-max] of per-round figures."""
        return (f"median {format(float(np.median(x)), fmt)} "
                f"[{format(float(x.min()), fmt)}-{format(float(x.max()), fmt)}]")

    def fig(value: float, x: np.ndarray, fmt: str) -> str:
        """``value`` (the figure from the best times), then the per-round median and range."""
        return f"{format(value, fmt)} ({spread(x, fmt)})"

    mm_best = 2 * 4096**3 / t["matmul"].min() / 1e9
    peak32, peak16 = max(peaks), max(peaks16)
    arith16 = ("AMX tdpbf16ps" if kind16 == "bfloat16-amx"
               else "vdpbf16ps" if _AVX512_BF16 else "vdpbf16ps absent: fp32")
    say(f"measured FMA peak (register-only loop, {peak_threads} threads; best of the run's "
          f"{len(peaks)} measurements of each): fp32 {peak32 / 1e9:.0f} GFLOP/s, bf16 ({arith16}) "
          f"{peak16 / 1e9:.0f} GFLOP/s; torch fp32 matmul = {mm_best * 1e9 / peak32 * 100:.0f}% "
          "of the fp32 peak")
    how = ("AMX products (tdpbf16ps)" if amx_applies(plans["strided"], D)
           else "bf16 products (vdpbf16ps)" if bf16_applies(plans["strided"], D)
           else "widened to fp32")
    say(f"bf16 inputs here (forward and backward): {how}, by "
          "sparse_patterns.kernels.cpu.amx_applies and bf16_applies "
          f"(SPARSE_PATTERNS_BF16={os.environ.get('SPARSE_PATTERNS_BF16', 'auto')})")
    say(f"{args.rounds} rounds, each timing every quantity once (best of {args.repeats} calls; "
          "SDPA: 1), the two sides of a ratio one after the other, the order reversed every "
          "other round. Each figure: from the best times of all rounds, then (the median and "
          "range over rounds of the same figure taken within one round)")
    say(f"torch fp32 matmul 4096^2: {fig(mm_best, mm, '.0f')} GFLOP/s "
          f"(torch threads {torch_threads})")
    say(f"torch SDPA is_causal=True, n={n}: {fig(t['sdpa'].min() * 1e3, t['sdpa'] * 1e3, '.0f')} ms")
    useful_strided = plans["strided"].flops(B, H, D)[0]
    for name, target in (("strided", 20), ("fixed", 5)):
        pl = plans[name]
        useful, _ = pl.flops(B, H, D)
        x, b = t[name], t[name].min()
        say(f"{name:8s} n={n}: {fig(b * 1e3, x * 1e3, '.1f')} ms")
        say(f"    {fig(t['sdpa'].min() / b, t['sdpa'] / x, '.1f')}x SDPA (target >= {target}x)")
        say(f"    useful {fig(useful / b / 1e9, useful / x / 1e9, '.1f')} GFLOP/s = "
              f"{useful / b / peak32 * 100:.0f}% of the fp32 FMA peak (target >= "
              f"{peak_target[name]}%), computed {pl.ratio * useful / b / peak32 * 100:.0f}%; "
              f"{fig(useful / b / 1e9 / mm_best * 100, useful / x / 1e9 / mm * 100, '.0f')}% of "
              f"matmul; computed/useful {pl.ratio:.2f} [{', '.join(pl.piece_kind)}]")
        y = t[f"{name}_bf16"]
        say(f"    bf16 inputs: {fig(y.min() * 1e3, y * 1e3, '.1f')} ms = "
              f"{fig(b / y.min(), x / y, '.2f')}x faster than fp32 (target >= 1.7x); "
              f"{useful / y.min() / peak16 * 100:.1f}% of the bf16 peak ({arith16})")
    x = t["strided_new_out"]
    say(f"strided  n={n}, new output array each call (recycling off): "
          f"{fig(x.min() * 1e3, x * 1e3, '.1f')} ms = "
          f"{fig(useful_strided / x.min() / 1e9 / mm_best * 100, useful_strided / x / 1e9 / mm * 100, '.0f')}% "
          "of matmul")
    say(f"backward strided n={n}: {fig(t['backward'].min() * 1e3, t['backward'] * 1e3, '.0f')} ms = "
          f"{fig(t['backward'].min() / t['strided'].min(), t['backward'] / t['strided'], '.2f')}x "
          "forward (target <= 2.5x)")
    x = t["backward_fixed"]
    say(f"backward fixed   n={n}: {fig(x.min() * 1e3, x * 1e3, '.0f')} ms = "
          f"{fig(x.min() / t['fixed'].min(), x / t['fixed'], '.2f')}x forward (target <= 2.5x)")
    x, y = t["backward_fixed_offset"], t["fixed_offset"]
    say(f"    inputs 16 bytes into a cache line (NumPy's large arrays; above: 64-byte "
          f"aligned, as torch allocates): forward {fig(y.min() * 1e3, y * 1e3, '.1f')} ms, "
          f"backward {fig(x.min() * 1e3, x * 1e3, '.0f')} ms = "
          f"{fig(x.min() / y.min(), x / y, '.2f')}x forward")
    for name, key in (("strided", "backward"), ("fixed  ", "backward_fixed")):
        x, y = t[f"{key}_bf16"], t[key]
        say(f"backward {name} n={n}, bf16 inputs: {fig(x.min() * 1e3, x * 1e3, '.0f')} ms = "
              f"{fig(y.min() / x.min(), y / x, '.2f')}x faster than fp32 (target >= 1.5x)")
    x, y = t["train"], t["sdpa_train"]
    say(f"training step (SparseAttention forward + backward, strided, fp32) n={n}: "
          f"{fig(x.min() * 1e3, x * 1e3, '.0f')} ms; SDPA causal forward + backward "
          f"{fig(y.min() * 1e3, y * 1e3, '.0f')} ms = {fig(y.min() / x.min(), y / x, '.1f')}x "
          "(target >= 40x)")
    z = t["train_bf16"]
    say(f"training step, bf16 inputs: {fig(z.min() * 1e3, z * 1e3, '.0f')} ms = "
          f"{fig(x.min() / z.min(), x / z, '.2f')}x faster than fp32")
    say(f"strided n={n2} (l={pat2.params['stride']}): "
          f"{fig(t['strided65k'].min() * 1e3, t['strided65k'] * 1e3, '.0f')} ms = "
          f"{fig(t['strided65k'].min() / t['strided'].min(), t['strided65k'] / t['strided'], '.1f')}x "
          f"n={n} (target <= 10x; 16x is quadratic)")

    child = subprocess.run([sys.executable, __file__, "--memory-child", str(n2), "--block",
                            str(args.block)],
                           capture_output=True, text=True, check=True)
    m = json.loads(child.stdout.strip().splitlines()[-1])
    limit = 2 * m["qkvo_bytes"] + 200e6
    say(f"peak memory, forward n={n2}: {m['peak_above_start'] / 1e6:.0f} MB above the "
          f"process start (q, k, v: {3 * m['qkvo_bytes'] / 4e6:.0f} MB, plan "
          f"{m['plan_bytes'] / 1e6:.0f} MB, call {m['peak_during_call'] / 1e6:.0f} MB incl. "
          f"out); limit 2 x bytes(q,k,v,out) + 200 MB = {limit / 1e6:.0f} MB")
    if args.markdown:
        from _docs import machine, write_section

        body = ("B = 1, H = 8, d = 64, merged, strided l = 128 and fixed l = 128, c = 16; "
                f"`--rounds {args.rounds} --repeats {args.repeats}`, torch "
                f"{torch.__version__}, numba {numba.__version__}.\n\n```text\n"
                + "\n".join(lines) + "\n```\n")
        print(f"written to {write_section('benchmarks/kernel.py', machine(), body)}")


if __name__ == "__main__":
    main()
