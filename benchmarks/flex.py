"""``impl="flex"`` (the plan's pieces, each in its block-compact order) against plain
FlexAttention with the natural-order ``BlockMask``, both compiled on the CPU, from one run.

Usage::

    .venv/bin/python benchmarks/flex.py                      # the table of issue 22, item 3
    .venv/bin/python benchmarks/flex.py --n 4096 --rounds 2  # a quicker look

B=1, H=8, d=64, float32, ``mode="merged"``, plan ``block=128`` (FlexAttention's block).
Patterns: strided (l = 128) and fixed (l = 128, c = 16) at each ``--n``. Runners, all
``torch.compile(flex_attention)`` underneath:

* ``natural``: one call with the pattern's ``BlockMask`` in token order
  (:func:`sparse_patterns.export.to_flex_block_mask`: full and partial blocks, the
  family's formula as ``mask_mod``), what a FlexAttention user writes today;
* ``flex``: :func:`sparse_patterns.kernels.flex.flex_attention_plan` with the formula
  ``mask_mod`` (the default on the CPU), pieces merged by log-sum-exp;
* ``flex-bits``: the same with the bit-table ``mask_mod`` (any pattern).

Every runner's output is compared with the float64 oracle (the dense reference on 256
sampled query rows) before it is timed. The machine is shared, so the timings are
interleaved: each of ``--rounds`` rounds times every runner once per cell (the best of
``--repeats`` calls); a ratio is printed from the best times over all rounds, and as
the median and range of the ratios taken within one round. Compilation (first call) is
printed separately. Nothing is asserted: the target (>= 10x for strided) is printed
next to the figures.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from kernel import best  # benchmarks/kernel.py: the best of `repeats` timed calls
from torch.nn.attention.flex_attention import flex_attention

import sparse_patterns as sps
from sparse_patterns.export import to_flex_block_mask
from sparse_patterns.kernels import plan
from sparse_patterns.kernels.flex import flex_attention_plan

__all__: list[str] = []

B, H, D, BLOCK = 1, 8, 64, 128


def make(name: str, n: int):
    return (sps.make("strided", n, stride=128) if name == "strided"
            else sps.make("fixed", n, stride=128, c=16))


def oracle_error(out: torch.Tensor, q, k, v, pat, rows: np.ndarray) -> float:
    """Largest |out - exact| on ``rows``, exact = float64 softmax over the rows' keys."""
    m = pat.union()
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    o = out.double().numpy()
    worst = 0.0
    for i in rows:
        keys = m.indices[m.indptr[i]:m.indptr[i + 1]]
        s = np.einsum("bhkd,bhd->bhk", kd[:, :, keys], qd[:, :, i]) / np.sqrt(D)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        want = np.einsum("bhk,bhkd->bhd", s, vd[:, :, keys])
        worst = max(worst, float(np.abs(o[:, :, i] - want).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="4096,16384", help="sequence lengths, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    fa = torch.compile(flex_attention, dynamic=False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, load {os.getloadavg()[0]:.2f}")
    cells = []
    for name in ("strided", "fixed"):
        for n in ns:
            pat = make(name, n)
            pl = plan(pat, block=BLOCK, mode="merged")
            g = torch.Generator().manual_seed(n)
            q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
            nat = to_flex_block_mask(pat, mode="merged", block_size=BLOCK)
            runners = {
                "natural": lambda q=q, k=k, v=v, nat=nat: fa(q, k, v, block_mask=nat),
                "flex": lambda q=q, k=k, v=v, pl=pl, pat=pat: flex_attention_plan(
                    q, k, v, pl, pattern=pat, mask="formula"),
                "flex-bits": lambda q=q, k=k, v=v, pl=pl: flex_attention_plan(
                    q, k, v, pl, mask="bits"),
            }
            rows = np.unique(np.r_[0, n - 1, np.random.default_rng(0).integers(0, n, 254)])
            first, err = {}, {}
            for r, fn in runners.items():
                t = time.perf_counter()
                out = fn()
                first[r] = time.perf_counter() - t
                err[r] = oracle_error(out, q, k, v, pat, rows)
            kept = 100.0 - float(nat.sparsity())
            cells.append(dict(name=name, n=n, runners=runners, first=first, err=err, kept=kept,
                              tiles=pl.num_tiles, ratio=pl.ratio, times={r: [] for r in runners}))
            print(f"{name} n={n:,}: natural BlockMask keeps {kept:.1f}% of its blocks; the plan "
                  f"has {pl.num_tiles} tiles in {pl.num_pieces} pieces ({', '.join(pl.piece_kind)}),"
                  f" computed/useful {pl.ratio:.2f}; first calls "
                  + ", ".join(f"{r} {s:.1f} s" for r, s in first.items()), flush=True)
    for rnd in range(args.rounds):
        for c in cells:
            for r, fn in c["runners"].items():
                c["times"][r].append(best(fn, args.repeats))
        print(f"round {rnd + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", flush=True)
    print()
    print("| pattern | n | natural BlockMask (s) | impl='flex' (s) | speed-up | flex, bit-table "
          "mask (s) | speed-up | max error vs float64 (natural / flex / bits) |")
    print("|---|---|---|---|---|---|---|---|")
    for c in cells:
        t = {r: min(ts) for r, ts in c["times"].items()}
        within = {r: [a / b for a, b in zip(c["times"]["natural"], ts, strict=True)]
                  for r, ts in c["times"].items()}
        sp = {r: f"{t['natural'] / t[r]:.1f}x (rounds {np.median(within[r]):.1f}x, "
                 f"{min(within[r]):.1f}-{max(within[r]):.1f})" for r in ("flex", "flex-bits")}
        e = c["err"]
        print(f"| {c['name']} | {c['n']:,} | {t['natural']:.3f} | {t['flex']:.3f} | {sp['flex']} "
              f"| {t['flex-bits']:.3f} | {sp['flex-bits']} | {e['natural']:.1e} / {e['flex']:.1e} "
              f"/ {e['flex-bits']:.1e} |")
    print()
    print("target: impl='flex' >= 10x faster than the natural-order BlockMask for strided; "
          f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
