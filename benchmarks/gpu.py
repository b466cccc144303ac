"""Sparse attention on a GPU against torch SDPA and FlexAttention, forward and backward, one run.

Usage::

    .venv/bin/python benchmarks/gpu.py                       # the H200 table: < 4 minutes
    .venv/bin/python benchmarks/gpu.py --quick               # 16k and 64k, d = 64, 1 repeat
    .venv/bin/python benchmarks/gpu.py --n 65536 --d 128 --runners sdpa,torch --markdown
    .venv/bin/python benchmarks/gpu.py --device cpu --n 1024,2048 --dtype float32  # CPU check

Patterns: ``strided`` (``sps.make("strided", n, stride=round(sqrt(n)))``) and ``fixed``
(``sps.make("fixed", n, stride=128, c=16)``), ``mode="merged"``, at each ``--n``
(16,384, 65,536, 262,144, 1,048,576 by default) and ``--d`` (64, 128); B = 1, H = 8,
``--dtype`` bfloat16 on a GPU (float32 by default on the CPU). Runners, each timed
forward and forward + backward (``loss = (out * g).sum()`` with a fixed random ``g``,
then ``torch.autograd.grad`` of q, k and v):

* ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, dense causal:
  the cost a sparse pattern must beat (one row per n and d, shared by the patterns);
* ``flex-natural``: ``torch.compile(flex_attention)`` with the pattern's BlockMask in
  natural token order (:func:`sparse_patterns.export.flex.to_flex_block_mask`, block
  128, the family's formula as ``mask_mod``): what a FlexAttention user writes today;
* ``torch``: ``sparse_patterns.kernels.attention(q, k, v, pat, mode="merged",
  impl="torch")``; gradients through ``sparse_patterns.torch.sparse_attention``;
* ``cuda``: the same with ``impl="cuda"`` (numba-cuda).

Per runner and pass it prints: ``prep s`` (building the BlockMask or the plan, once
per pattern and n, not timed with the calls), the median of the timed calls in ms
(CUDA events after a warm-up call; ``time.perf_counter`` on the CPU), ``1st s`` (the
warm-up call's wall time: compilation), ``MiB`` (``torch.cuda.max_memory_allocated``
after ``reset_peak_memory_stats``, less what was allocated before the timed calls,
i.e. the inputs: the call's own working memory, its output included; "n/a" on the
CPU), useful TFLOP/s, its share ``%mm`` of the ``torch.matmul`` rate measured at the
start of the run (``--matmul-size`` square, best of a few), the speed-up over SDPA of
the same n, d and pass (``~`` where SDPA's time is extrapolated as n^2 from a smaller
n), and ``err``: the forward's largest error on 64 sampled query rows (first, last,
random), relative to the largest output there, against a float64 oracle computed from
the same (rounded) inputs, the row's keys read from ``pat.rows(i, i + 1)`` (SDPA: the
causal row). Useful FLOPs: ``4 d`` per attended pair per batch and head, i.e.
``pat.nnz * 4 * d * B * H``, what ``sps.plan(pat, block=128,
mode="merged").flops(B, H, d)[0]`` returns (the union's pairs), without building the
plan (a minute for fixed at 2^20); SDPA's are ``4 d B H n (n + 1) / 2``; forward +
backward counts 3.5 times the forward, as FlashAttention's papers do.

Time is scarce, so the run plans its own: a call estimated (from the runner's FLOP
rate at the previous n, else from a guessed share of the matmul rate) above
``--max-call-s`` is skipped; one above ``--once-s`` is timed once, and without the
warm-up call where the runner's last warm-up showed its first call costing under 5%
more than a timed one (SDPA at 2^20: one call, ``1st s`` "-"); a cell whose estimated
cost (preparation, compilation as last observed, calls) would pass the ``--budget``
deadline (seconds from the start, imports included) is skipped, and so is a plan
whose building and forward would. The loops run d outermost, then n ascending, so
under pressure d = 128 at the largest n goes first; a cold GPU compiles every
FlexAttention graph (each pattern, n, d and pass: seconds to tens of seconds), which
is most of the time: narrow a run with ``--runners``, ``--patterns``, ``--n``, ``--d``.
Every choice is printed in its cell. Errors are caught per cell and printed there on
one line; each row is printed (flushed) as soon as it is measured; the total wall
time at the end. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__: list[str] = []

B, H = 1, 8
RUNNERS = ("sdpa", "flex-natural", "torch", "cuda")
PASSES = ("fwd", "f+b")
FB_FACTOR = 3.5  # forward + backward FLOPs over forward FLOPs (FlashAttention's convention)
FLEX_BLOCK = 128
ORACLE_ROWS = 64
#: share of the matmul rate assumed for a runner before it has been measured once
GUESS_EFF = {"sdpa": 0.4, "flex-natural": 0.25, "torch": 0.15, "cuda": 0.01}
#: compilation (first call less a timed call) assumed before one was observed, seconds
GUESS_COMPILE = {
    "cuda": {"sdpa": (1, 1), "flex-natural": (15, 40), "torch": (20, 50), "cuda": (10, 10)},
    "cpu": {"sdpa": (0, 0), "flex-natural": (15, 15), "torch": (20, 20), "cuda": (0, 0)},
}
PLAN_PAIRS_PER_S = 1e9  # plan building, attended pairs a second (fixed at 2^20: ~1 minute)
MASK_CELLS_PER_S = 1e7  # natural BlockMask building, (n / 128)^2 cells a second


def one_line(e: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters."""
    msg = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_pattern(name: str, n: int):
    import sparse_patterns as sps

    if name == "strided":
        return sps.make("strided", n, stride=round(math.sqrt(n)))
    if name == "fixed":
        return sps.make("fixed", n, stride=128, c=16)
    raise ValueError(f"--patterns: unknown pattern {name!r} (strided, fixed)")


# ------------------------------------------------------------------ timing
@dataclass
class Device:
    """Where the run happens: synchronization, timed calls, peak memory."""

    name: str  # "cuda" or "cpu"

    @property
    def cuda(self) -> bool:
        return self.name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def timed(self, fn) -> tuple[float, Any]:
        """(seconds, result) of one call; on CUDA by events, the end recorded after a
        device-wide synchronize (numba-cuda or side streams included)."""
        import torch

        if not self.cuda:
            t = time.perf_counter()
            out = fn()
            return time.perf_counter() - t, out
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        out = fn()
        torch.cuda.synchronize()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3, out

    def reset_peak(self) -> int:
        if not self.cuda:
            return 0
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def peak_since(self, base: int) -> float | None:
        if not self.cuda:
            return None
        import torch

        return float(torch.cuda.max_memory_allocated() - base)

    def tidy(self) -> None:
        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.empty_cache()


def matmul_rate(dev: Device, dtype, size: int, tries: int = 5) -> tuple[float, int]:
    """(FLOP/s, size) of ``torch.matmul`` of two square matrices: the best of ``tries``
    calls at ``size``, or at the first power of 2 from 512 whose call takes over 0.1 s (a
    CPU without bf16 arithmetic multiplies at about 1 GFLOP/s)."""
    import torch

    g = torch.Generator(device=dev.name).manual_seed(0)
    s = min(512, size)
    while True:
        a, b = (torch.randn(s, s, device=dev.name, dtype=dtype, generator=g) for _ in range(2))
        t, _ = dev.timed(lambda a=a, b=b: a @ b)  # also the warm-up (cuBLAS, thread pools)
        if s >= size or t > 0.1:
            break
        s = min(2 * s, size)
    best = min(dev.timed(lambda: a @ b)[0] for _ in range(tries))
    return 2.0 * s**3 / best, s


# ------------------------------------------------------------------ oracle
def oracle_rows(q, k, v, rows: np.ndarray, keys_of, chunk: int = 65536):
    """float64 ``(R, B, H, d)`` exact attention outputs of ``rows``; ``keys_of(i)`` gives
    row i's keys (a LongTensor on q's device). Keys are streamed in chunks, merged by a
    running maximum, so a causal row of 2^20 keys stays small."""
    import torch

    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for i in rows:
        keys = keys_of(int(i))
        qi = q[:, :, int(i)].double()
        m = torch.full(qi.shape[:2], -math.inf, dtype=torch.float64, device=q.device)
        s = torch.zeros_like(m)
        acc = torch.zeros_like(qi)
        for a in range(0, keys.numel(), chunk):
            ks = keys[a : a + chunk]
            kk, vv = k.index_select(2, ks).double(), v.index_select(2, ks).double()
            sc = torch.einsum("bhd,bhcd->bhc", qi, kk) * scale
            m2 = torch.maximum(m, sc.amax(-1))
            p = torch.exp(sc - m2[..., None])
            c = torch.exp(m - m2)
            s = s * c + p.sum(-1)
            acc = acc * c[..., None] + torch.einsum("bhc,bhcd->bhd", p, vv)
            m = m2
        out.append(acc / s[..., None])
    return torch.stack(out)


def rel_error(out, rows: np.ndarray, ref) -> float:
    """max |out - ref| over the rows, over max |ref|."""
    import torch

    idx = torch.as_tensor(rows, device=ref.device)
    got = torch.as_tensor(out, device=ref.device).index_select(2, idx).double().permute(2, 0, 1, 3)
    return float((got - ref).abs().max() / ref.abs().max())


# ------------------------------------------------------------------ state
@dataclass
class Result:
    """One runner, one pass: the figures or why there are none."""

    ms: float | None = None
    first_s: float | None = None
    peak: float | None = None
    tflops: float | None = None
    share: float | None = None
    speedup: str = ""
    err: float | None = None
    note: str = ""  # "unavailable: ...", "skipped: ...", "error: ..."


@dataclass
class Run:
    args: Any
    dev: Device
    dtype: Any
    mm: float
    deadline: float
    rate: dict = field(default_factory=dict)  # (runner, pass, pattern) -> work FLOP/s
    compile_s: dict = field(default_factory=dict)  # (runner, pass) -> last first - median
    sdpa: dict = field(default_factory=dict)  # (n, d, pass) -> seconds measured
    rows: list = field(default_factory=list)  # for --markdown
    flex: Any = None  # the compiled flex_attention, made on first use

    def estimate(self, runner: str, pas: str, pattern: str | None, work: float) -> float:
        r = self.rate.get((runner, pas, pattern)) or self.rate.get((runner, pas, None))
        if r is None:
            r = GUESS_EFF[runner] * self.mm
        return work / r

    def cost(self, runner: str, pas: str, pattern: str | None,
             work: float) -> tuple[float, bool, bool, float]:
        """(seconds a call, timed once?, warm-up call?, seconds in all) of one pass, est."""
        est = self.estimate(runner, pas, pattern, (FB_FACTOR if pas == "f+b" else 1.0) * work)
        once = est > self.args.once_s
        # a long call is timed without a warm-up call only where the runner's last warm-up
        # showed its first call costing under 5% more (SDPA; not a runner that compiles)
        warm = not once or self.compile_guess(runner, pas) > 0.05 * est
        total = ((self.compile_guess(runner, pas) if warm else 0.0)
                 + est * ((1 if once else self.args.repeats) + (1 if warm else 0)))
        return est, once, warm, total

    def compile_guess(self, runner: str, pas: str) -> float:
        got = self.compile_s.get((runner, pas))
        if got is not None:
            return got
        return GUESS_COMPILE[self.dev.name][runner][PASSES.index(pas)]

    def sdpa_time(self, n: int, d: int, pas: str) -> tuple[float | None, bool]:
        """(SDPA seconds, estimated?) for the cell: measured, else n^2 from a smaller n."""
        if (n, d, pas) in self.sdpa:
            return self.sdpa[(n, d, pas)], False
        known = [m for (m, dd, p) in self.sdpa if dd == d and p == pas and m < n]
        if not known:
            return None, True
        m = max(known)
        return self.sdpa[(m, d, pas)] * (n * (n + 1.0)) / (m * (m + 1.0)), True


# ------------------------------------------------------------------ runners
def flex_compiled():
    """``torch.compile(flex_attention, dynamic=False)`` in a frame of its own, with room for
    many graphs (one per pattern, n, d and pass) and an error, never eager FlexAttention
    (dense n x n scores), past the limit."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    def flex_call(*a, **kw):
        return flex_attention(*a, **kw)

    fn = torch.compile(flex_call, dynamic=False, fullgraph=True)
    cfg = torch._dynamo.config
    patch = {}
    if hasattr(cfg, "recompile_limit"):
        patch["recompile_limit"] = max(256, cfg.recompile_limit)
    else:  # older torch
        patch["cache_size_limit"] = max(256, cfg.cache_size_limit)
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        patch["fail_on_recompile_limit_hit"] = True

    def call(*a, **kw):
        with cfg.patch(**patch):
            return fn(*a, **kw)

    return call


def backend_reason(impl: str, q, pat) -> str | None:
    """Why ``impl`` cannot run these inputs (its backend's reasons; None: it can)."""
    from sparse_patterns.kernels import Inputs, get_backend

    why = get_backend(impl).reasons(Inputs.of({"q": q}), None, pat)
    return "; ".join(why) if why else None


def sps_block(impl: str, device: str) -> int:
    """The tile size ``impl`` plans with on ``device`` by default."""
    from sparse_patterns.kernels import get_backend

    return int(get_backend(impl).default_block(device))


def calls(runner: str, x: dict, pat, bm, flex) -> tuple:
    """(forward, forward + backward) callables of a runner on the cell's inputs."""
    import torch
    import torch.nn.functional as F

    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    qg, kg, vg = x["qg"], x["kg"], x["vg"]

    def grads(out):
        return torch.autograd.grad((out * g).sum(), (qg, kg, vg))

    if runner == "sdpa":
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                lambda: grads(F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)))
    if runner == "flex-natural":
        return (lambda: flex(q, k, v, block_mask=bm),
                lambda: grads(flex(qg, kg, vg, block_mask=bm)))
    from sparse_patterns import kernels
    from sparse_patterns import torch as spt

    return (lambda: kernels.attention(q, k, v, pat, mode="merged", impl=runner),
            lambda: grads(spt.sparse_attention(qg, kg, vg, pat, mode="merged", impl=runner)))


def measure(run: Run, runner: str, pas: str, fn, *, once: bool, warm: bool, useful: float,
            work: float, pattern: str | None, check=None) -> Result:
    """Time one pass of one runner: a warm-up call (if ``warm``), then one call (``once``)
    or up to ``--repeats`` calls (fewer once one takes longer than ``--once-s``)."""
    args, dev = run.args, run.dev
    res = Result()
    first = None
    if warm:  # a warm-up call: compilation, autotuning, first-use caches
        t = time.perf_counter()
        out = fn()
        dev.sync()
        first = time.perf_counter() - t
        if check is not None:
            res.err = check(out)
        del out
    base = dev.reset_peak()
    times, peaks = [], []
    for r in range(1 if once else max(1, args.repeats)):
        dt, out = dev.timed(fn)
        times.append(dt)
        peaks.append(dev.peak_since(base))  # before the oracle's own memory
        if check is not None and res.err is None:  # no warm-up call: check this one
            res.err = check(out)
            del out
            base = dev.reset_peak()
        else:
            del out
        if dt > args.once_s and r == 0:
            break
    peak = None if peaks[0] is None else max(peaks)
    t = statistics.median(times)
    factor = FB_FACTOR if pas == "f+b" else 1.0
    res.ms, res.first_s, res.peak = t * 1e3, first, peak
    res.tflops = factor * useful / t / 1e12
    res.share = 100.0 * factor * useful / t / run.mm
    run.rate[(runner, pas, pattern)] = factor * work / t
    run.rate.setdefault((runner, pas, None), factor * work / t)
    if first is not None:
        run.compile_s[(runner, pas)] = max(0.0, first - t)
    return res


def cell(run: Run, runner: str, pas: str, fn, *, n: int, d: int, useful: float, work: float,
         pattern: str | None, prep_est: float, check=None) -> Result:
    """One pass of one runner: skipped by the rules, measured, or its error on one line."""
    args = run.args
    est, once, warm, cost = run.cost(runner, pas, pattern, work)
    if est > args.max_call_s:
        return Result(note=f"skipped: ~{est:.0f} s a call (est.) > --max-call-s "
                           f"{args.max_call_s:g}")
    cost += prep_est
    left = run.deadline - time.perf_counter()
    if cost > left:
        return Result(note=f"skipped: time budget (~{cost:.0f} s needed, {max(left, 0):.0f} s "
                           "left of --budget)")
    try:
        res = measure(run, runner, pas, fn, once=once, warm=warm, useful=useful, work=work,
                      pattern=pattern, check=check)
    except Exception as e:  # noqa: BLE001 - printed in the cell, the run goes on
        run.dev.tidy()
        return Result(note=f"error: {one_line(e)}")
    if runner == "sdpa":
        run.sdpa[(n, d, pas)] = res.ms / 1e3
        res.speedup = "1.00"
    else:
        ref, guessed = run.sdpa_time(n, d, pas)
        if ref is not None:
            res.speedup = f"{'~' if guessed else ''}{ref / (res.ms / 1e3):.2f}"
    return res


# ------------------------------------------------------------------ table
COLS = [("pattern", 8), ("n", 9), ("d", 3), ("runner", 12), ("prep s", 6)]
PASS_COLS = [("ms", 9), ("1st s", 6), ("MiB", 7), ("TF/s", 7), ("%mm", 5), ("xSDPA", 6)]


def fmt_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}"


def fmt_tflops(x: float) -> str:
    return f"{x:.3g}" if x >= 0.01 else f"{x:.1e}"


def pass_cells(r: Result) -> list[str]:
    if r.note:
        return [r.note]
    return [fmt_ms(r.ms), "-" if r.first_s is None else f"{r.first_s:.1f}",
            "n/a" if r.peak is None else f"{r.peak / 2**20:,.0f}", fmt_tflops(r.tflops),
            f"{r.share:.1f}", r.speedup or "-"]


def header() -> str:
    left = " ".join(f"{h:>{w}}" for h, w in COLS)
    span = sum(w + 1 for _, w in PASS_COLS) - 1
    names = " ".join(f"{h:>{w}}" for h, w in PASS_COLS)
    return (f"{'':{len(left)}} | {'forward':^{span}} | {'forward + backward':^{span}} |\n"
            f"{left} | {names} | {names} | {'err':>8}")


def row_text(lead: list[str], fwd: Result, fb: Result) -> str:
    out = " ".join(f"{s:>{w}}" for s, (_, w) in zip(lead, COLS, strict=True))
    for r in (fwd, fb):
        if r is fb and fb.note and fb.note == fwd.note:
            break  # one note for both passes
        c = pass_cells(r)
        out += " | " + (c[0] if r.note else " ".join(
            f"{s:>{w}}" for s, (_, w) in zip(c, PASS_COLS, strict=True)))
    return out + " | " + (f"{fwd.err:8.1e}" if fwd.err is not None else f"{'-':>8}")


def markdown(rows: list) -> str:
    names = [h for h, _ in COLS] + [f"{p} {h}" for p in PASSES for h, _ in PASS_COLS] + ["err"]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for lead, fwd, fb in rows:
        cells = list(lead)
        for r in (fwd, fb):
            c = pass_cells(r)
            cells += c + [""] * (len(PASS_COLS) - len(c))
        cells.append(f"{fwd.err:.1e}" if fwd.err is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def emit(run: Run, lead: list[str], fwd: Result, fb: Result) -> None:
    run.rows.append((lead, fwd, fb))
    print(row_text(lead, fwd, fb), flush=True)


# ------------------------------------------------------------------ the run
@dataclass
class Shared:
    """What the cells of one (pattern, n) share across d: the pattern object (the plan
    cache is keyed by it), its pair count, the natural BlockMask, the plan times, the
    oracle's rows."""

    pats: dict = field(default_factory=dict)  # (pattern, n) -> Pattern
    nnz: dict = field(default_factory=dict)  # (pattern, n) -> pairs of the union
    masks: dict = field(default_factory=dict)  # (pattern, n) -> (BlockMask on device, kept)
    planned: dict = field(default_factory=dict)  # (pattern, n, impl) -> plan seconds
    rows: dict = field(default_factory=dict)  # n -> the oracle's query rows


def prepare(run: Run, sh: Shared, runner: str, p: str, n: int, useful: float,
            lead: list[str]):
    """Build what a runner needs before its calls (the natural BlockMask, or the plan,
    timed apart); returns (BlockMask or None, kept blocks or None, a note or "")."""
    dev, pat, nb = run.dev, sh.pats[(p, n)], -(-n // FLEX_BLOCK)
    if runner == "flex-natural":
        if (p, n) in sh.masks:
            return (*sh.masks[(p, n)], "")
        est = nb * nb / MASK_CELLS_PER_S
    else:
        blk = sps_block(runner, dev.name)
        if (p, n, runner) in sh.planned or blk is None:
            return None, None, ""
        # a plan is worth building only if the forward can run after it
        call, _, _, fwd = run.cost(runner, "fwd", p, useful)
        if call > run.args.max_call_s:
            return None, None, (f"skipped: ~{call:.0f} s a forward call (est.) > "
                                f"--max-call-s {run.args.max_call_s:g}")
        est = sh.nnz[(p, n)] / PLAN_PAIRS_PER_S + fwd
    left = run.deadline - time.perf_counter()
    if est > left:
        what = "BlockMask" if runner == "flex-natural" else "plan and forward"
        return None, None, (f"skipped: time budget ({what} ~{est:.0f} s, "
                            f"{max(left, 0):.0f} s left)")
    try:
        t = time.perf_counter()
        if runner == "flex-natural":
            from sparse_patterns.export.flex import to_flex_block_mask

            bm = to_flex_block_mask(pat, mode="merged", block_size=FLEX_BLOCK)
            kept = int(bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum())
            sh.masks[(p, n)] = (bm.to(dev.name), kept)
            took = time.perf_counter() - t
            print(f"# {p} n={n:,}: natural BlockMask keeps {kept:,} of {nb * (nb + 1) // 2:,} "
                  f"causal 128-blocks ({took:.1f} s to build)", flush=True)
            lead[4] = f"{took:.1f}"
            return (*sh.masks[(p, n)], "")
        import sparse_patterns as sps

        pl = sps.plan(pat, block=blk, mode="merged")
        took = sh.planned[(p, n, runner)] = time.perf_counter() - t
        print(f"# {p} n={n:,}: impl={runner!r} plan (block {blk}) {took:.1f} s, pieces "
              f"{', '.join(pl.piece_kind)}, computed/useful {pl.ratio:.2f}", flush=True)
        lead[4] = f"{took:.1f}"
        return None, None, ""
    except Exception as e:  # noqa: BLE001
        run.dev.tidy()
        return None, None, f"error: preparing: {one_line(e)}"


def run_nd(run: Run, sh: Shared, n: int, d: int, patterns: list[str], runners: list[str],
           static: dict[str, str]) -> None:
    """Every pattern and runner at one n and d."""
    import torch

    dev = run.dev
    if n not in sh.rows:
        rng = np.random.default_rng(n)
        sh.rows[n] = np.unique(np.r_[0, n - 1, rng.integers(0, n, ORACLE_ROWS - 2)])
        for p in patterns:
            sh.pats[(p, n)] = pat = make_pattern(p, n)
            sh.nnz[(p, n)] = pat.nnz
            print(f"# {p} n={n:,}: {dict(pat.params)}, {pat.nnz / n:,.0f} keys a row on "
                  f"average, density {pat.nnz / (n * (n + 1) / 2):.2%} of causal", flush=True)
    rows = sh.rows[n]
    gen = torch.Generator(device=dev.name).manual_seed(1000 * n + d)
    x = {s: torch.randn(B, H, n, d, device=dev.name, dtype=run.dtype, generator=gen)
         for s in "qkvg"}
    x.update({s + "g": x[s].detach().requires_grad_() for s in "qkv"})
    scale_work = 4.0 * d * B * H
    causal = scale_work * n * (n + 1) / 2

    def checker(keys_of, inputs=x):
        cache = {}

        def err_of(out):
            if "ref" not in cache:
                cache["ref"] = oracle_rows(inputs["q"], inputs["k"], inputs["v"], rows, keys_of)
            return rel_error(out, rows, cache["ref"])

        return err_of

    if "sdpa" in runners:
        fwd_fn, fb_fn = calls("sdpa", x, None, None, None)
        fwd = cell(run, "sdpa", "fwd", fwd_fn, n=n, d=d, useful=causal, work=causal,
                   pattern=None, prep_est=0.0,
                   check=checker(lambda i: torch.arange(i + 1, device=dev.name)))
        fb = cell(run, "sdpa", "f+b", fb_fn, n=n, d=d, useful=causal, work=causal,
                  pattern=None, prep_est=0.0)
        emit(run, ["causal", f"{n:,}", str(d), "sdpa", "-"], fwd, fb)
    for p in patterns:
        pat = sh.pats[(p, n)]
        useful = scale_work * sh.nnz[(p, n)]

        def keys_of(i, pat=pat):
            return torch.as_tensor(pat.rows(i, i + 1).indices.astype(np.int64),
                                   device=dev.name)

        check = checker(keys_of)
        for runner in runners:
            if runner == "sdpa":
                continue
            lead = [p, f"{n:,}", str(d), runner, "-"]
            why = static.get(runner)
            if why is None and runner != "flex-natural":
                why = backend_reason(runner, x["q"], pat)
                why = f"unavailable: {why}" if why else None
            if why is None:
                bm, kept, why = prepare(run, sh, runner, p, n, useful, lead)
            if why:
                emit(run, lead, Result(note=why), Result(note=why))
                continue
            work = useful if kept is None else scale_work * kept * FLEX_BLOCK**2
            if runner == "flex-natural" and run.flex is None:
                run.flex = flex_compiled()
            fwd_fn, fb_fn = calls(runner, x, pat, bm, run.flex)
            fwd = cell(run, runner, "fwd", fwd_fn, n=n, d=d, useful=useful, work=work,
                       pattern=p, prep_est=0.0, check=check)
            if runner == "flex-natural" and not dev.cuda:
                fb = Result(note="unavailable: compiled FlexAttention on the CPU has no "
                                 "backward")
            else:
                fb = cell(run, runner, "f+b", fb_fn, n=n, d=d, useful=useful, work=work,
                          pattern=p, prep_est=0.0)
            emit(run, lead, fwd, fb)
            dev.tidy()
    del x
    dev.tidy()


def main() -> int:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="16384,65536,262144,1048576",
                    help="sequence lengths, comma-separated")
    ap.add_argument("--d", default="64,128", help="head dimensions, comma-separated")
    ap.add_argument("--patterns", default="strided,fixed", help="strided and/or fixed")
    ap.add_argument("--runners", default=",".join(RUNNERS), help=", ".join(RUNNERS))
    ap.add_argument("--device", default=None, help="cuda if available, else cpu")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                    help="bfloat16 on CUDA, float32 on the CPU by default")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per cell (median)")
    ap.add_argument("--quick", action="store_true", help="n = 16k and 64k, d = 64, 1 repeat")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds from the start; cells that would pass it are skipped "
                         "(210 on CUDA, 150 on the CPU)")
    ap.add_argument("--max-call-s", type=float, default=None,
                    help="skip a call estimated longer (15 s on CUDA, 20 s on the CPU)")
    ap.add_argument("--once-s", type=float, default=None,
                    help="a call estimated longer is timed once, with no warm-up call where "
                         "compiling was seen to be cheap (1 s on CUDA, 0.25 s on the CPU)")
    ap.add_argument("--matmul-size", type=int, default=None,
                    help="matmul rate reference: size x size (8192 on CUDA, 2048 on the CPU; "
                         "smaller where a call takes over 0.1 s)")
    args = ap.parse_args()

    import torch

    if args.quick:
        args.n, args.d, args.repeats = "16384,65536", "64", 1
    dev = Device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.name not in ("cuda", "cpu"):
        ap.error(f"--device: cuda or cpu, got {dev.name!r}")
    if dev.cuda and not torch.cuda.is_available():
        ap.error("--device cuda: torch.cuda.is_available() is False")
    dtype_name = args.dtype or ("bfloat16" if dev.cuda else "float32")
    dtype = getattr(torch, dtype_name)
    args.budget = args.budget if args.budget is not None else (210.0 if dev.cuda else 150.0)
    if args.once_s is None:
        args.once_s = 1.0 if dev.cuda else 0.25
    if args.max_call_s is None:
        args.max_call_s = 15.0 if dev.cuda else 20.0
    size = args.matmul_size or (8192 if dev.cuda else 2048)
    ns = [int(s) for s in args.n.split(",") if s]
    ds = [int(s) for s in args.d.split(",") if s]
    patterns = [s for s in args.patterns.split(",") if s]
    runners = [s for s in args.runners.split(",") if s]
    for r in runners:
        if r not in RUNNERS:
            ap.error(f"--runners: unknown runner {r!r} ({', '.join(RUNNERS)})")
    for p in patterns:
        make_pattern(p, 256)  # a bad name fails here, not after minutes

    where = torch.cuda.get_device_name() if dev.cuda else (
        f"CPU, {torch.get_num_threads()} threads, capability "
        f"{torch.backends.cpu.get_cpu_capability()}")
    print(f"{where}; torch {torch.__version__}; B={B} H={H} {dtype_name} mode=merged; "
          f"n {', '.join(f'{n:,}' for n in ns)}; d {', '.join(map(str, ds))}", flush=True)
    mm, size = matmul_rate(dev, dtype, size)
    print(f"torch.matmul {size}^2 {dtype_name}: {mm / 1e12:.3g} TFLOP/s (best of 5): the %mm "
          "reference", flush=True)

    static: dict[str, str] = {}  # runner -> why it cannot run at all here
    if "cuda" in runners and not dev.cuda:
        static["cuda"] = ("unavailable: needs a CUDA device (numba-cuda's simulator is far "
                          "too slow to time)")
    if "flex-natural" in runners:
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError as e:
            static["flex-natural"] = f"unavailable: {one_line(e)}"
    print(f"choices: timed calls {args.repeats} (median) after a warm-up call; a call "
          f"estimated > --once-s {args.once_s:g} s timed once (without the warm-up call where "
          "the last first call cost < 5% more: SDPA, 1st s '-'); "
          f"> --max-call-s {args.max_call_s:g} s skipped; cells that would pass --budget "
          f"{args.budget:g} s skipped; SDPA of a skipped cell extrapolated as n^2 (~)",
          flush=True)
    run = Run(args=args, dev=dev, dtype=dtype, mm=mm, deadline=t_start + args.budget)
    print(header(), flush=True)
    sh = Shared()
    for d in ds:  # d outermost: under time pressure the last d goes first
        for n in ns:
            run_nd(run, sh, n, d, patterns, runners, static)
    total = time.perf_counter() - t_start
    if args.markdown:
        from _docs import machine, write_section

        table = markdown(run.rows)
        print()
        print(table)
        host = torch.cuda.get_device_name() if dev.cuda else machine()
        body = (f"B = 1, H = 8, {dtype_name}, merged; torch {torch.__version__}; "
                f"torch.matmul {size}^2 {dtype_name} {mm / 1e12:.3g} TFLOP/s (the %mm "
                f"reference); total {total:.0f} s.\n\n{table}\n")
        print(f"written to {write_section('benchmarks/gpu.py', host, body)}")
    print(f"\ntotal wall time {total:.1f} s (budget {args.budget:g} s)", flush=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
