"""Where a training step of ``examples/char_lm.py``'s model spends its time, per pattern.

Usage::

    .venv/bin/python benchmarks/train_step.py                    # contexts 4,096 and 8,192
    .venv/bin/python benchmarks/train_step.py --context 4096 --markdown
    .venv/bin/python benchmarks/train_step.py --dtype bfloat16     # under torch.autocast

The model is the example's (4 layers, 4 heads, d_model 256, batch 2, on the CPU); a step
is its forward, cross-entropy, backward and AdamW step on random tokens (the time does
not depend on the data), in float32 or under ``torch.autocast`` to bfloat16
(``--dtype``: the linear layers and attention then take bf16, where AMX or
``avx512_bf16`` make them faster). Four models from the same seed are timed side
by side: full causal attention (torch SDPA), strided (l = sqrt(n)) and fixed (l = 128,
c = 16) through ``SparseAttention``, and the same model with attention replaced by
``v`` -- the dense part of every step (embedding, LayerNorms, the linear layers, GELU,
the loss and the optimizer), which no attention kernel can make faster.

So the figures say how much of full attention's step a pattern removes and how much it
could remove at best: ``full / dense`` is the largest speed-up any attention kernel can
give this model here (Amdahl's law), ``attention`` the step minus the dense part. The
dense part's matrix products are put against torch's fp32 4096^2 matmul rate and the
FMA peak, both measured in the same run.

The process keeps the memory a step frees, as the example's training processes do
(:func:`char_lm.keep_freed_memory`); the heading says whether the C library took it.

The machine is shared and drifts, so each of ``--rounds`` rounds times every model once
(the best of ``--repeats`` steps), the order reversed every other round; each figure is
from the best times over all rounds, with the median over rounds of the ratio taken
within one round. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))

import char_lm  # noqa: E402

from sparse_patterns.kernels.cpu import fma_peak  # noqa: E402

__all__: list[str] = []

MODELS = ("full", "strided", "fixed", "dense")


class _Values(nn.Module):
    """Attention replaced by its values: the step keeps every other layer's work."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return v


def _model(name: str, args: argparse.Namespace) -> nn.Module:
    pats = char_lm.patterns_of("strided" if name == "dense" else name, args.context, args.layers)
    model = char_lm.model_of(args, pats, torch.device("cpu"))
    if name == "dense":
        for block in model.blocks:
            block.attn = _Values()
    return model


def _stepper(model: nn.Module, args: argparse.Namespace):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randint(0, 256, (args.batch, args.context), generator=g)
    y = torch.randint(0, 256, (args.batch, args.context), generator=g)

    half = args.dtype == "bfloat16"

    def step() -> float:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    return step


def _dense_flops(args: argparse.Namespace) -> float:
    """FLOPs of the step's matrix products outside attention: 3 x the forward's."""
    d, tokens = args.d_model, args.batch * args.context
    return 6.0 * tokens * (12 * d * d * args.layers + 256 * d)


def measure(args: argparse.Namespace) -> str:
    steps = {m: _stepper(_model(m, args), args) for m in MODELS}
    for s in steps.values():  # compile, fill the caches and the optimizer's state
        s(), s()
    a = torch.randn(4096, 4096)
    order = list(MODELS) + ["matmul"]
    best = {m: math.inf for m in order}
    rounds: list[dict[str, float]] = []
    peaks = [fma_peak("float32")]
    for r in range(args.rounds):
        t: dict[str, float] = {}
        for m in (order if r % 2 == 0 else order[::-1]):
            if m == "matmul":
                t0 = time.perf_counter()
                a @ a
                t[m] = time.perf_counter() - t0
            else:
                t[m] = min(steps[m]() for _ in range(args.repeats))
            best[m] = min(best[m], t[m])
        peaks.append(fma_peak("float32", again=True))
        rounds.append(t)

    def med(f) -> float:
        return float(np.median([f(t) for t in rounds]))

    tok = args.batch * args.context
    dense, full = best["dense"], best["full"]
    mm = 2 * 4096**3 / best["matmul"] / 1e9
    peak = max(peaks) / 1e9
    lines = [f"context {args.context}, batch {args.batch} ({tok:,} tokens a step), "
             f"{args.layers} layers, {args.heads} heads, d_model {args.d_model}, {args.dtype}; "
             f"{args.rounds} rounds, best of {args.repeats} steps each; freed memory "
             f"{'kept (glibc)' if args.kept else 'returned to the system'}",
             "",
             "| model | s / step | tokens/s | x full (median) | attention s / step |",
             "|---|---|---|---|---|"]
    for m in MODELS:
        att = "-" if m == "dense" else f"{best[m] - dense:.2f}"
        lines.append(f"| {m} | {best[m]:.2f} | {tok / best[m]:,.0f} | {full / best[m]:.2f}x "
                     f"({med(lambda t, m=m: t['full'] / t[m]):.2f}x) | {att} |")
    gf = _dense_flops(args) / dense / 1e9
    lines += ["",
              f"- attention is {1 - dense / full:.0%} of full attention's step; no kernel can "
              f"make this model more than {full / dense:.2f}x faster than full here "
              f"(median {med(lambda t: t['full'] / t['dense']):.2f}x).",
              f"- strided's attention costs {(best['strided'] - dense) / (full - dense):.1%} "
              f"of full's, fixed's {(best['fixed'] - dense) / (full - dense):.1%}.",
              f"- the dense part's matrix products: {_dense_flops(args) / 1e9:.0f} GFLOP a step, "
              f"{gf:.0f} GFLOP/s counting the whole dense step = {gf / mm:.0%} of torch's fp32 "
              f"4096^2 matmul ({mm:.0f} GFLOP/s) and {gf / peak:.0%} of the fp32 FMA peak "
              f"({peak:.0f} GFLOP/s), both measured in this run."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", default="4096,8192", help="contexts, comma-separated")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="float32, or bfloat16 under torch.autocast")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="steps per model and round")
    ap.add_argument("--markdown", action="store_true",
                    help="write the section of docs/benchmarks.md for this machine")
    args = ap.parse_args()
    for flag in ("batch", "rounds", "repeats"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag}: must be >= 1, got {getattr(args, flag)}")
    contexts = [c.strip() for c in args.context.split(",") if c.strip()]
    for c in contexts:
        if not c.isdigit() or int(c) < 256 or int(c) & (int(c) - 1):
            ap.error(f"--context: {c!r} must be a power of two >= 256")
    if not contexts:
        ap.error(f"--context: {args.context!r} names no context; powers of two >= 256")
    args.layers, args.heads, args.d_model, args.seed = 4, 4, 256, 0
    args.kept = char_lm.keep_freed_memory()
    blocks = []
    for n in map(int, contexts):
        args.context = n
        blocks.append(measure(args))
        print(blocks[-1] + "\n", flush=True)
    if args.markdown:
        from _docs import machine, write_section

        body = (f"torch {torch.__version__}, {torch.get_num_threads()} torch threads. "
                "The model and step of `examples/char_lm.py`; `dense` is that model with "
                "attention replaced by `v`.\n\n" + "\n\n".join(blocks))
        name = "benchmarks/train_step.py" + (" --dtype bfloat16" if args.dtype != "float32" else "")
        print(write_section(name, machine(), body))


if __name__ == "__main__":
    main()
