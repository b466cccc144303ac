"""Train a small character-level transformer once per attention pattern, and compare.

Does a pattern that verifies also learn? The Sparse Transformer paper (Child et al.
2019, arXiv 1904.10509) claims that factorized attention matches dense attention, and
that on data without periodic structure (text) the strided pattern routes information
worse than the fixed one. This script checks both at a small scale on text every
machine has: the Python standard library's own source (read from ``sysconfig``'s
paths; nothing is downloaded), as bytes.

For each pattern (full causal attention through torch SDPA, strided, fixed, local,
and a layer schedule alternating local and strided) it trains the same model (4
layers, 4 heads, d_model 256) from the same seed on the same batches, each in its own
process, then reports bits per character on held-out text, training tokens per
second and peak memory, prints a table and saves the loss curves to
``figures/char_lm.png``. The defaults finish in under 15 minutes on 2 CPU cores, the
first run's compilation of the kernels included::

    python examples/char_lm.py                      # every pattern, the defaults
    python examples/char_lm.py --steps 50 --context 1024 --patterns full,strided
    python examples/char_lm.py --device cuda --context 4096 --steps 1000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PATTERNS = ("full", "strided", "fixed", "local", "schedule")


def corpus(limit: int) -> np.ndarray:
    """The standard library's ``.py`` files, sorted by path, as bytes (at most ``limit``)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts or "test" in p.parts:
            continue
        try:
            b = p.read_bytes()
        except OSError:
            continue
        out.append(b)
        size += len(b)
        if size >= limit:
            break
    data = np.frombuffer(b"".join(out)[:limit], dtype=np.uint8)
    if data.size < 1 << 20:
        raise SystemExit(f"corpus: only {data.size} bytes of standard library source found "
                         f"under {root}")
    return data


def patterns_of(name: str, n: int, layers: int) -> list | None:
    """The pattern of every layer (None: dense causal attention)."""
    import sparse_patterns as sps

    l = max(2, round(math.sqrt(n)))
    make = {
        "strided": lambda: sps.make("strided", n, stride=l),
        "fixed": lambda: sps.make("fixed", n, stride=128, c=16),
        "local": lambda: sps.make("local", n, window=l),
    }
    if name == "full":
        return None
    if name == "schedule":
        return [make["local"]() if i % 2 == 0 else make["strided"]() for i in range(layers)]
    return [make[name]()] * layers


def model_of(args, pats, device):
    import torch
    from torch import nn

    from sparse_patterns.torch import SparseAttention

    d, H = args.d_model, args.heads

    class Block(nn.Module):
        def __init__(self, pat):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.attn = None if pat is None else SparseAttention(pat, mode="merged")

        def forward(self, x):
            B, L, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, L, 3, H, d // H).permute(2, 0, 3, 1, 4)
            if self.attn is None:
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                a = self.attn(q, k, v)
            x = x + self.proj(a.transpose(1, 2).reshape(B, L, d))
            return x + self.mlp(self.ln2(x))

    class CharLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, d)
            self.pos = nn.Parameter(torch.zeros(args.context, d))
            self.blocks = nn.ModuleList(
                Block(None if pats is None else pats[i]) for i in range(args.layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 256)

        def forward(self, idx):
            x = self.emb(idx) + self.pos
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    torch.manual_seed(args.seed)
    return CharLM().to(device)


def keep_freed_memory() -> bool:
    """Have glibc's ``malloc`` keep the memory a training step frees for the next one.

    A step frees and allocates the same large activations again. By default glibc hands
    blocks above its mmap threshold (32 MB at most) back to the system when they are
    freed, and trims the heap's free top above twice that; the next step then takes
    them again a page at a time, each page faulted in and zeroed by the kernel: tens of
    thousands of faults a step at this model's size. Thresholds of 1 GiB keep that
    memory in the process, as the caching allocators (jemalloc, tcmalloc) that
    PyTorch's CPU performance guide recommends do; peak memory grows by what a step
    frees. Returns whether the C library took the settings (False, and nothing
    changed, where it is not glibc).
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(
        libc.mallopt(m_trim_threshold, 1 << 30))


def train_one(args) -> dict:
    """Train the pattern ``args.only``; the result as a dict (printed as JSON)."""
    import torch

    keep_freed_memory()
    torch.set_num_threads(args.threads or torch.get_num_threads())
    device = torch.device(args.device)
    data = corpus(args.corpus_bytes)
    split = int(data.size * 0.95)
    train, held = data[:split], data[split:]
    L, B = args.context, args.batch
    pats = patterns_of(args.only, L, args.layers)
    model = model_of(args, pats, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = np.random.default_rng(args.seed)  # the same batches for every pattern
    starts = rng.integers(0, train.size - L - 1, size=(args.steps, B))

    def batch(src, s):
        x = np.stack([src[i : i + L + 1] for i in s]).astype(np.int64)
        t = torch.from_numpy(x).to(device)
        return t[:, :-1], t[:, 1:]

    losses, t_train = [], 0.0
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(train, starts[step])
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= 2:  # the first steps compile and warm the caches
            t_train += time.perf_counter() - t0
        losses.append(loss.item() / math.log(2))
        print(json.dumps({"progress": step + 1}), flush=True)
    model.eval()
    held_starts = np.linspace(0, held.size - L - 2, args.eval_batches * B).astype(np.int64)
    tot = 0.0
    with torch.no_grad():
        for i in range(args.eval_batches):
            x, y = batch(held, held_starts[i * B : (i + 1) * B])
            tot += torch.nn.functional.cross_entropy(model(x).reshape(-1, 256),
                                                     y.reshape(-1)).item()
    return {
        "pattern": args.only,
        "bpc": tot / args.eval_batches / math.log(2),
        "tokens_per_s": (args.steps - 2) * B * L / t_train if t_train else float("nan"),
        "peak_mb": (torch.cuda.max_memory_allocated() / 1e6 if device.type == "cuda"
                    else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3),
        "losses": losses,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patterns", default=",".join(PATTERNS),
                    help=f"comma-separated, from {', '.join(PATTERNS)}")
    ap.add_argument("--steps", type=int, default=120, help="training steps (default 120)")
    ap.add_argument("--context", type=int, default=2048, help="context length (default 2048)")
    ap.add_argument("--batch", type=int, default=2, help="sequences per step (default 2)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--corpus-bytes", type=int, default=8 << 20)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--figure", default=str(HERE.parent / "figures" / "char_lm.png"))
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = [p for p in args.patterns.split(",") if p]
    for p in names:
        if p not in PATTERNS:
            ap.error(f"--patterns: unknown pattern {p!r}; choose from {', '.join(PATTERNS)}")
    for flag in ("steps", "context", "batch", "layers", "heads", "d_model", "eval_batches"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    if args.d_model % args.heads:
        ap.error(f"--d-model: {args.d_model} is not a multiple of --heads {args.heads}")
    if args.device != "cpu":  # before a training process starts, not as its traceback
        import torch

        try:
            kind = torch.device(args.device).type
        except RuntimeError:
            ap.error(f"--device: {args.device!r} is not a torch device; cpu or cuda")
        if kind not in ("cpu", "cuda"):
            ap.error(f"--device: {args.device!r}; cpu or cuda")
        if kind == "cuda" and not torch.cuda.is_available():
            ap.error(f"--device: {args.device!r}, but this torch ({torch.__version__}) sees no "
                     "CUDA device; cpu or cuda")
    if args.only:
        print(json.dumps(train_one(args)), flush=True)
        return 0

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    results, t_start = [], time.perf_counter()
    base = [sys.executable, __file__] + [a for a in sys.argv[1:]]
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn()) as bar:
        for name in names:
            task = bar.add_task(f"{name:9s}", total=args.steps)
            proc = subprocess.Popen(base + ["--only", name], stdout=subprocess.PIPE, text=True,
                                    env=dict(os.environ))
            last = None
            for line in proc.stdout:
                msg = json.loads(line)
                if "progress" in msg:
                    bar.update(task, completed=msg["progress"])
                else:
                    last = msg
            if proc.wait() != 0 or last is None:
                raise SystemExit(f"{name}: training failed (exit {proc.returncode})")
            results.append(last)
    full = next((r for r in results if r["pattern"] == "full"), None)
    print(f"\ncontext {args.context}, {args.steps} steps of {args.batch} sequences, "
          f"{args.layers} layers, {args.heads} heads, d_model {args.d_model}, {args.device}; "
          f"{(time.perf_counter() - t_start) / 60:.1f} min in all")
    print("| pattern | held-out bits/char | tokens/s | x full | peak MB |")
    print("|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['tokens_per_s'] / full['tokens_per_s']:.2f}x" if full else "-"
        print(f"| {r['pattern']} | {r['bpc']:.3f} | {r['tokens_per_s']:,.0f} | {ratio} "
              f"| {r['peak_mb']:,.0f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        ax.plot(np.arange(1, len(r["losses"]) + 1), r["losses"],
                label=f"{r['pattern']} ({r['bpc']:.2f} held-out)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss, bits per character")
    ax.set_title(f"char LM on the Python standard library, context {args.context}")
    ax.legend()
    fig.tight_layout()
    Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.figure, dpi=120)
    print(f"loss curves: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
