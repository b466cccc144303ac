"""Time ``impl="cuda"`` against torch SDPA and FlexAttention on a GPU (prints figures; asserts nothing).

For each pattern and n: the plan (pieces, computed/useful FLOP ratio), then on
the GPU the first call (numba-cuda compiles the kernels for this block, head
dimension and dtype) and the median of ``--repeats`` timed calls of our
forward, torch SDPA ``is_causal=True`` (dense causal: the cost a sparse pattern
must beat), and compiled FlexAttention with the pattern's BlockMask (the
export's ``to_flex_block_mask``: the same token pattern); the speedups, the
useful-FLOP throughput, our peak memory, and the max difference between our
output and FlexAttention's (the same attention, so it must be small). With
``--backward``, the backward passes too (ours from the saved log-sum-exp).

Timings use CUDA events after a synchronize; compare ratios from one run.
Without a GPU it prints the plans, says plainly that GPU speed was not
measured, and exits 0.

Usage: python benchmarks/kernel_cuda.py [--n 4096,16384] [--patterns strided,fixed]
       [--mode merged] [--heads 8] [--d 64] [--dtype float32] [--block 64]
       [--repeats 10] [--backward]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import sparse_patterns as sps
from sparse_patterns.kernels import cuda as kc
from sparse_patterns.kernels import plan as make_plan


def pattern_for(name: str, n: int) -> sps.Pattern:
    """The paper's settings: stride l = sqrt(n) rounded to a power of 2; fixed c = l / 8."""
    l = 2 ** round(math.log2(math.sqrt(n)))
    if name == "strided":
        return sps.make("strided", n, stride=l)
    if name == "fixed":
        return sps.make("fixed", n, stride=l, c=max(1, l // 8))
    if name == "local":
        return sps.make("local", n, window=l)
    return sps.make(name, n)


def gpu_reason(torch) -> str | None:
    """Why the GPU part cannot run here, or None."""
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    b = kc.backend()
    if b != "gpu":
        return f"numba-cuda backend is {b!r}"
    return None


def timed(torch, fn, repeats: int) -> tuple[float, float]:
    """(first call seconds, median of later calls seconds), on the current stream."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return first, statistics.median(times)


def run_gpu(torch, args, name, n, pat, pl) -> None:
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    from sparse_patterns.export.flex import to_flex_block_mask

    dt = getattr(torch, args.dtype)
    B, H, d = args.batch, args.heads, args.d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, n, d, device="cuda", dtype=dt, generator=g) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    useful, computed = pl.flops(B, H, d)

    res = {}
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    res["ours"] = timed(torch, lambda: kc.forward(q, k, v, pl, scale=scale), args.repeats)
    peak = torch.cuda.max_memory_allocated() - base
    res["sdpa causal"] = timed(
        torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), args.repeats)
    num_heads = H if args.mode == "multihead" else None
    bm = to_flex_block_mask(pat, mode=args.mode, num_heads=num_heads,
                            block_size=args.flex_block).to("cuda")
    flex = torch.compile(flex_attention)
    res["flex"] = timed(torch, lambda: flex(q, k, v, block_mask=bm, scale=scale), args.repeats)
    ours, _ = kc.forward(q, k, v, pl, scale=scale)
    diff = (ours.float() - flex(q, k, v, block_mask=bm, scale=scale).float()).abs().max().item()

    t = res["ours"][1]
    print(f"  forward  ours {t * 1e3:9.2f} ms (first call {res['ours'][0]:.1f} s)  "
          f"{useful / t / 1e12:6.2f} useful TFLOP/s  peak +{peak / 2**20:.0f} MiB  "
          f"max|ours - flex| {diff:.2e}")
    for key in ("sdpa causal", "flex"):
        first, med = res[key]
        print(f"           {key:11s} {med * 1e3:9.2f} ms (first call {first:.1f} s)  "
              f"ours is {med / t:6.2f}x faster")

    if args.backward:
        out, lse = kc.forward(q, k, v, pl, scale=scale)
        tb = timed(torch, lambda: kc.backward(q, k, v, out, lse, do, pl, scale=scale),
                   args.repeats)
        qs, ks, vs = (x.detach().requires_grad_() for x in (q, k, v))

        def sdpa_bwd():
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            torch.autograd.grad(o, (qs, ks, vs), do)

        def flex_bwd():
            o = flex(qs, ks, vs, block_mask=bm, scale=scale)
            torch.autograd.grad(o, (qs, ks, vs), do)

        ts, tf = timed(torch, sdpa_bwd, args.repeats), timed(torch, flex_bwd, args.repeats)
        print(f"  backward ours {tb[1] * 1e3:9.2f} ms ({tb[1] / t:.2f}x our forward)  "
              f"sdpa fwd+bwd {ts[1] * 1e3:.2f} ms  flex fwd+bwd {tf[1] * 1e3:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="4096,16384", help="comma-separated sequence lengths")
    ap.add_argument("--patterns", default="strided,fixed")
    ap.add_argument("--mode", default="merged", choices=("merged", "multihead"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--block", type=int, default=64, help="our tile size (threads per block)")
    ap.add_argument("--flex-block", type=int, default=128, help="FlexAttention's block size")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",") if x]

    import torch

    why = gpu_reason(torch)
    if why is None:
        print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    else:
        print(f"No CUDA GPU usable here ({why}): GPU speed NOT measured; plans only.")
    print(f"B={args.batch} H={args.heads} d={args.d} {args.dtype} mode={args.mode} "
          f"block={args.block}")
    for name in args.patterns.split(","):
        for n in ns:
            pat = pattern_for(name, n)
            t0 = time.perf_counter()
            pl = make_plan(pat, block=args.block, mode=args.mode)
            useful, computed = pl.flops(args.batch, args.heads, args.d)
            print(f"{name} n={n} {dict(pat.params)}: plan {time.perf_counter() - t0:.2f} s, "
                  f"pieces {list(pl.piece_kind)}, {useful / 1e9:.2f} useful GFLOP, "
                  f"computed/useful {pl.ratio:.2f}")
            if why is None:
                run_gpu(torch, args, name, n, pat, pl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
