"""Correctness of ``impl="torch"`` on a GPU, outputs and gradients, before timing it.

Usage (on the GPU machine: a few minutes, FlexAttention compiling for each case; ``--device cpu --n 400`` on a CPU)::

    PYTHONPATH=src python3 benchmarks/gpu_check.py

For each case (strided merged and multihead with n not a multiple of the stride,
fixed with its summary keys, a local window, strided in packed documents) and dtype
(bfloat16 through FlashAttention, float32 through memory-efficient attention), it
runs ``sparse_patterns.torch.sparse_attention(..., impl="torch")`` forward and
backward and prints the largest error of the output and of each gradient against
dense masked attention computed in float64 from the same (rounded) inputs, relative
to the largest reference value, and the piece kinds the plan ran. Nothing is asserted:
bf16 errors of a few 1e-3 and fp32 errors of about 1e-6 are what the kernels give.
"""

from __future__ import annotations

import argparse
import time

import torch

import sparse_patterns as sps
from sparse_patterns.kernels import plan
from sparse_patterns.kernels.torch_path import piece_shapes
from sparse_patterns.torch import sparse_attention


def cases(n: int) -> list[tuple[str, object, str]]:
    l = max(2, int(round(n ** 0.5))) + 1  # n not a multiple of the stride
    third = n // 3
    return [
        ("strided merged", sps.make("strided", n, stride=l), "merged"),
        ("strided multihead", sps.make("strided", n, stride=l), "multihead"),
        ("fixed merged", sps.make("fixed", n, stride=128, c=16), "merged"),
        ("local", sps.make("local", n, window=127), "merged"),
        ("strided documents", sps.make("strided", n, stride=l,
                                       documents=[third, n - 2 * third, third]), "merged"),
    ]


def dense(q, k, v, mask):
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    B, H, d = 1, 2, 64
    print(f"{dev}; torch {torch.__version__}; B={B} H={H} d={d} n={args.n}", flush=True)
    for name, pat, mode in cases(args.n):
        shapes = piece_shapes(plan(pat, block=128, mode=mode), pat)
        kinds = ", ".join("sdpa" if s is not None else "flex" for s in shapes)
        masks = torch.from_numpy(pat.union().toarray() if mode == "merged" else pat.to_dense())
        for dtype in (torch.bfloat16, torch.float32):
            g = torch.Generator().manual_seed(0)
            x = [torch.randn(B, H, args.n, d, generator=g).to(dtype).to(dev) for _ in range(4)]
            q, k, v = (t.clone().requires_grad_(True) for t in x[:3])
            t0 = time.perf_counter()
            try:
                out = sparse_attention(q, k, v, pat, mode=mode, impl="torch")
                grads = torch.autograd.grad(out, (q, k, v), x[3])
            except Exception as e:  # noqa: BLE001 - one line per failing case
                print(f"{name:18s} {str(dtype)[6:]:9s} FAILED: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:160]}", flush=True)
                continue
            took = time.perf_counter() - t0
            r = [t.detach().double().requires_grad_(True) for t in x[:3]]
            m = masks.to(dev)
            m = m[None] if mode == "merged" else m[torch.arange(H) % m.shape[0]][None]
            ref = dense(*r, m)
            want = torch.autograd.grad(ref, r, x[3].double())
            errs = [((a.double() - b).abs().max() / b.abs().max()).item()
                    for a, b in zip((out, *grads), (ref, *want), strict=True)]
            print(f"{name:18s} {str(dtype)[6:]:9s} [{kinds}] out {errs[0]:.1e}  dq {errs[1]:.1e}"
                  f"  dk {errs[2]:.1e}  dv {errs[3]:.1e}  ({took:.2f} s with compilation)",
                  flush=True)


if __name__ == "__main__":
    main()
