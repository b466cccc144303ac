"""Profile what each pattern costs in the fused kernel, side by side with torch's attention.

:func:`profile` runs a grid of patterns and sequence lengths on one set of random
``q, k, v`` per cell and measures our implementations (``impl="numba"`` and any
other name in :data:`sparse_patterns.kernels.IMPLS`) next to two baselines:
torch's ``scaled_dot_product_attention`` (``is_causal=True`` for a causal
pattern, a dense boolean mask otherwise) and FlexAttention compiled on the CPU
with a ``BlockMask`` built from the pattern's CSR. Every runner's output is
checked against an exact float64 oracle (sampled query rows, computed from the
CSR) and, for ours, against a baseline that computes the same function, before
anything is timed: a wrong kernel is reported as wrong, never as fast. The
result is a :class:`ProfileTable` (median, min and max time, first-call time,
useful and computed FLOPs, GFLOP/s, the share of the fp32 ``torch.matmul``
throughput measured in the same run, peak memory, ratios to the baselines) that
prints as a table, a JSON document or a log-log figure.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import gc
import math
import os
import platform
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from .._validate import check_choice, check_int
from ..pattern import DENSE_LIMIT, Pattern
from ..patterns import registry
from .planning import BLOCK, MODES, plan

__all__ = ["profile", "ProfileTable", "ProfileRow", "Measurement", "BASELINES", "DTYPES"]

#: Baselines :func:`profile` knows: torch SDPA and FlexAttention (compiled, CPU).
BASELINES = ("sdpa", "flex")
#: Input dtypes :func:`profile` can generate (``bfloat16`` needs torch).
DTYPES = ("float32", "float64", "float16", "bfloat16")

#: Largest absolute error against the float64 oracle that still counts as correct.
_TOL = {"float32": 2e-4, "float64": 1e-8, "float16": 1e-2, "bfloat16": 3e-2}
_ALL_ROWS = 1024  # up to this n every query row is checked against the oracle
_SAMPLED_ROWS = 128  # above it, this many rows (first, last and random ones)
_FLEX_BLOCK = 128  # FlexAttention's block size on the CPU
_MATMUL_N = 2048  # square fp32 matmul that sets the throughput reference


# ====================================================================== results
@dataclass(frozen=True)
class Measurement:
    """One runner (an implementation of ours or a baseline) on one pattern and n.

    Attributes
    ----------
    runner : str
        ``"numba"``, ``"reference"``, ... or ``"sdpa"``, ``"flex"``.
    kind : str
        ``"impl"`` (ours) or ``"baseline"``.
    status : str
        ``"ok"``; ``"wrong"`` (its output failed the check: it was not timed);
        ``"skipped"`` (it could not run this case, see ``note``); ``"error"``.
    note : str
        What was run (``"is_causal=True"``), what was checked, or why it was skipped.
    times : tuple of float
        Seconds of every timed call (after the warm-up).
    first_s : float or None
        Seconds of the first call (includes compilation and planning caches).
    peak_bytes : int or None
        Peak memory of one call above what the process held before it: the
        larger of the resident-set high-water mark and the peak of
        ``tracemalloc`` (see :func:`profile`, Notes).
    max_err : float or None
        Largest absolute difference to the float64 oracle on the checked rows
        (None for a baseline that computes another function, such as SDPA's
        dense causal attention on a sparse causal pattern).
    """

    runner: str
    kind: str
    status: str
    note: str = ""
    times: tuple[float, ...] = ()
    first_s: float | None = None
    peak_bytes: int | None = None
    max_err: float | None = None

    @property
    def ok(self) -> bool:
        """True when the runner passed its check and was timed."""
        return self.status == "ok" and bool(self.times)

    @property
    def median_s(self) -> float | None:
        """Median of the timed calls (seconds)."""
        return float(np.median(self.times)) if self.times else None

    @property
    def min_s(self) -> float | None:
        """Fastest timed call (seconds)."""
        return min(self.times) if self.times else None

    @property
    def max_s(self) -> float | None:
        """Slowest timed call (seconds)."""
        return max(self.times) if self.times else None

    @property
    def compile_s(self) -> float | None:
        """First call minus the median: compilation and one-time set-up (seconds)."""
        if self.first_s is None or not self.times:
            return None
        return max(0.0, self.first_s - self.median_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly fields, including the derived times."""
        return {
            "runner": self.runner, "kind": self.kind, "status": self.status, "note": self.note,
            "median_s": self.median_s, "min_s": self.min_s, "max_s": self.max_s,
            "first_s": self.first_s, "compile_s": self.compile_s, "times": list(self.times),
            "peak_bytes": self.peak_bytes, "max_err": self.max_err,
        }


@dataclass(frozen=True)
class ProfileRow:
    """Everything measured for one pattern at one ``n``.

    ``useful_flops`` counts ``4 d`` per attended pair per attention head (the
    pattern's work); ``computed_flops`` the pairs the plan's tiles compute.
    Both are totals for the whole ``(batch, heads, n, head_dim)`` call.
    """

    pattern: str
    params: Mapping[str, Any]
    n: int
    causal: bool
    num_pattern_heads: int
    nnz: int
    density: float
    useful_flops: int
    computed_flops: int
    plan_s: float
    plan: Mapping[str, Any]
    measurements: tuple[Measurement, ...] = field(default=())

    @property
    def flop_ratio(self) -> float:
        """``computed_flops / useful_flops`` of the plan (1.0 = no wasted work)."""
        return self.computed_flops / self.useful_flops if self.useful_flops else 1.0

    def get(self, runner: str) -> Measurement | None:
        """The measurement of ``runner`` (None when it was not asked for)."""
        for m in self.measurements:
            if m.runner == runner:
                return m
        return None

    def gflops(self, runner: str) -> float | None:
        """Useful GFLOP/s of ``runner`` (useful FLOPs / median time)."""
        m = self.get(runner)
        if m is None or not m.ok or not m.median_s:
            return None
        return self.useful_flops / m.median_s / 1e9

    def speedup(self, impl: str, baseline: str) -> float | None:
        """``baseline time / impl time`` (medians); above 1 means ``impl`` is faster."""
        a, b = self.get(impl), self.get(baseline)
        if a is None or b is None or not a.ok or not b.ok or not a.median_s:
            return None
        return b.median_s / a.median_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly fields."""
        runs = {m.runner: m.to_dict() for m in self.measurements}
        for m in self.measurements:
            runs[m.runner]["gflops"] = self.gflops(m.runner)
        speed = {
            f"{a.runner}/{b.runner}": self.speedup(a.runner, b.runner)
            for a in self.measurements if a.kind == "impl"
            for b in self.measurements if b.kind == "baseline"
        }
        return {
            "pattern": self.pattern, "params": dict(self.params), "n": self.n,
            "causal": self.causal, "pattern_heads": self.num_pattern_heads, "nnz": self.nnz,
            "density": self.density, "useful_flops": self.useful_flops,
            "computed_flops": self.computed_flops, "flop_ratio": self.flop_ratio,
            "plan_s": self.plan_s, "plan": dict(self.plan), "runs": runs, "speedup": speed,
        }


#: Columns of :meth:`ProfileTable.table` (and of the CLI's table).
_COLUMNS = (
    "pattern", "n", "density", "useful GFLOP", "computed/useful", "impl", "median s",
    "min-max s", "compile s", "GFLOP/s", "% matmul", "peak MB", "sdpa s", "x sdpa", "flex s",
    "x flex", "check",
)


class ProfileTable:
    """The result of :func:`profile`: one :class:`ProfileRow` per pattern and ``n``.

    Attributes
    ----------
    rows : tuple of ProfileRow
    impls, baselines : tuple of str
        What was run.
    settings : dict
        ``batch``, ``heads``, ``head_dim``, ``dtype``, ``repeats``, ``mode``, ``block``, ``seed``.
    machine : dict
        Cores, threads, CPU capability as torch reports it, versions, date and
        load average before and after the run.
    matmul_gflops : float
        fp32 matmul throughput measured in the same run (``matmul_source`` says how).
    notes : tuple of str
        What could not run and why (torch missing, a mask that would not fit, ...).
    """

    def __init__(self, rows: Sequence[ProfileRow], *, impls: Sequence[str],
                 baselines: Sequence[str], settings: Mapping[str, Any],
                 machine: Mapping[str, Any], matmul_gflops: float, matmul_source: str,
                 notes: Sequence[str] = ()) -> None:
        self.rows = tuple(rows)
        self.impls = tuple(impls)
        self.baselines = tuple(baselines)
        self.settings = dict(settings)
        self.machine = dict(machine)
        self.matmul_gflops = float(matmul_gflops)
        self.matmul_source = str(matmul_source)
        self.notes = tuple(notes)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, i: int) -> ProfileRow:
        return self.rows[i]

    def __repr__(self) -> str:
        cells = ", ".join(f"{r.pattern}@{r.n}" for r in self.rows)
        return f"ProfileTable({len(self.rows)} rows: {cells}; impls={self.impls}, baselines={self.baselines})"

    @property
    def wrong(self) -> list[tuple[str, int, str]]:
        """``(pattern, n, runner)`` of every runner whose output failed its check."""
        return [(r.pattern, r.n, m.runner) for r in self.rows for m in r.measurements
                if m.status == "wrong"]

    @property
    def failed(self) -> list[tuple[str, int, str]]:
        """``(pattern, n, impl)`` of our implementations that were wrong or raised an error."""
        return [(r.pattern, r.n, m.runner) for r in self.rows for m in r.measurements
                if m.kind == "impl" and m.status in ("wrong", "error")]

    def pct_of_matmul(self, row: ProfileRow, runner: str) -> float | None:
        """Useful GFLOP/s of ``runner`` as a percentage of :attr:`matmul_gflops`."""
        g = row.gflops(runner)
        return None if g is None or not self.matmul_gflops else 100.0 * g / self.matmul_gflops

    def to_dict(self) -> dict[str, Any]:
        """The whole table as JSON-friendly data."""
        rows = []
        for r in self.rows:
            d = r.to_dict()
            for name, run in d["runs"].items():
                run["pct_matmul"] = self.pct_of_matmul(r, name)
            rows.append(d)
        return {
            "settings": self.settings, "machine": self.machine,
            "matmul": {"gflops": self.matmul_gflops, "source": self.matmul_source},
            "impls": list(self.impls), "baselines": list(self.baselines),
            "notes": list(self.notes), "rows": rows,
        }

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        """``(columns, rows)`` of formatted strings: one row per pattern, n and impl.

        Each baseline that was asked for adds two columns: its median time and
        its time over ours (``x sdpa``; above 1, ours is faster).

        Examples
        --------
        >>> t = profile(["strided"], [16], impls=("reference",), baselines=(), repeats=1,
        ...             heads=2, head_dim=4, params={"stride": 4})
        >>> cols, rows = t.table()
        >>> dict(zip(cols, rows[0]))["check"]
        'ok'
        """
        out = []
        for r in self.rows:
            names = [m.runner for m in r.measurements if m.kind == "impl"] or ["-"]
            for impl in names:
                m = r.get(impl)
                row = [r.pattern, f"{r.n:,}", f"{r.density:.4g}", f"{r.useful_flops / 1e9:.3g}",
                       f"{r.flop_ratio:.2f}", impl]
                if m is None or not m.ok:
                    row += ["-"] * 6
                else:
                    pct = self.pct_of_matmul(r, impl)
                    row += [f"{m.median_s:.4g}", f"{m.min_s:.3g}-{m.max_s:.3g}",
                            f"{m.compile_s:.2f}", f"{r.gflops(impl):.1f}", f"{pct:.0f}%",
                            _mb(m.peak_bytes)]
                for b in self.baselines:
                    mb = r.get(b)
                    if mb is None:
                        row += ["-", "-"]
                    elif not mb.ok:
                        row += [mb.status, "-"]
                    else:
                        sp_ = r.speedup(impl, b) if m is not None else None
                        row += [f"{mb.median_s:.4g}", "-" if sp_ is None else f"{sp_:.1f}x"]
                row.append("-" if m is None else m.status)
                out.append(tuple(row))
        cols = [c for c in _COLUMNS if not c.startswith(("sdpa", "x sdpa", "flex", "x flex"))]
        for b in self.baselines:
            cols[-1:-1] = [f"{b} s", f"x {b}"]
        return tuple(cols), out

    def to_markdown(self) -> str:
        """A GitHub markdown table, then the machine and the notes (ready to paste).

        Examples
        --------
        >>> t = profile(["full"], [8], impls=("reference",), baselines=(), repeats=1,
        ...             heads=1, head_dim=4)
        >>> t.to_markdown().splitlines()[0].startswith("| pattern | n |")
        True
        """
        cols, rows = self.table()
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        m, s = self.machine, self.settings
        lines.append("")
        lines.append(
            f"B={s['batch']}, H={s['heads']}, d={s['head_dim']}, {s['dtype']}, mode={s['mode']}, "
            f"median of {s['repeats']} runs after a warm-up; {m.get('cores')} cores "
            f"({m.get('cpu')}), CPU capability {m.get('cpu_capability')}, torch "
            f"{m.get('torch')}, numba {m.get('numba')}; fp32 matmul {self.matmul_gflops:.0f} "
            f"GFLOP/s ({self.matmul_source}); load average {m.get('load_before')} before, "
            f"{m.get('load_after')} after; {m.get('date')}."
        )
        lines.extend(f"- {n}" for n in self.notes)
        return "\n".join(lines)

    def plot(self, ax: Any = None) -> Any:
        """Log-log time against n per pattern and runner, with n^1.5 and n^2 guides.

        Parameters
        ----------
        ax : matplotlib.axes.Axes, optional
            Where to draw (a new figure when None).

        Returns
        -------
        matplotlib.axes.Axes

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> t = profile(["full"], [8, 16], impls=("reference",), baselines=(), repeats=1,
        ...             heads=1, head_dim=4)
        >>> ax = t.plot()
        >>> ax.get_xscale(), ax.get_yscale()
        ('log', 'log')
        >>> plt.close(ax.figure)
        """
        import matplotlib.pyplot as plt  # noqa: PLC0415

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 5))
        colors = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
        styles = {"sdpa": ("--", "s"), "flex": (":", "^")}
        names = list(dict.fromkeys(r.pattern for r in self.rows))
        runners = list(self.impls) + list(self.baselines)
        ns_all, t_first = [], []
        for pi, name in enumerate(names):
            rows = sorted((r for r in self.rows if r.pattern == name), key=lambda r: r.n)
            for k, runner in enumerate(runners):
                pts = [(r.n, r.get(runner).median_s) for r in rows
                       if r.get(runner) is not None and r.get(runner).ok]
                if not pts:
                    continue
                ls, mk = styles.get(runner, ("-", "os*Dv"[k % 5]))
                x, y = zip(*pts, strict=True)
                ax.plot(x, y, ls, marker=mk, color=colors[pi % len(colors)],
                        label=f"{name} / {runner}")
                ns_all += list(x)
                t_first.append(pts[0])
        if ns_all:
            n0, n1 = min(ns_all), max(ns_all)
            base = [t for n, t in t_first if n == n0] or [t for _, t in t_first]
            y0 = float(np.exp(np.mean(np.log(base))))
            xs = np.geomspace(n0, max(n1, n0 * 2), 32)
            for e, lab, ls in ((1.5, "n^1.5", ":"), (2.0, "n^2", "-.")):
                ax.plot(xs, y0 * (xs / n0) ** e, color="0.5", lw=0.9, ls=ls, label=f"~ {lab}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        if ns_all:
            ticks = sorted(set(ns_all))
            ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
            ax.xaxis.set_minor_formatter("")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel("forward time (s), median")
        s = self.settings
        ax.set_title(f"B={s['batch']}, H={s['heads']}, d={s['head_dim']}, {s['dtype']}, "
                     f"{s['mode']}")
        if ns_all:
            ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        return ax


def _mb(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.0f}"


# ====================================================================== memory
_LIBC: Any = None


def _malloc_trim() -> None:
    """Give freed heap pages back to the OS, so that reusing them shows in the RSS."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None)
        _LIBC.malloc_trim(0)
    except (OSError, AttributeError):
        _LIBC = False


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kb("VmHWM") is not None
    except OSError:
        return False


def _maxrss() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if platform.system() == "Darwin" else int(r) * 1024


def _measure(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """Run ``fn`` once: ``(result, seconds, peak bytes above the memory held before)``.

    The CPU kernel's recycled arrays are freed first, so that its output counts as
    new memory, as every other runner's does."""
    cpu = sys.modules.get(__package__ + ".cpu")
    if cpu is not None:
        cpu.release_workspace()
    gc.collect()
    _malloc_trim()
    exact = _reset_hwm()
    before = _status_kb("VmRSS") if exact else _maxrss()
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    after = _status_kb("VmHWM") if exact else _maxrss()
    rss = max(0, (after or 0) - (before or 0))
    return out, dt, max(rss, int(traced))


# ====================================================================== inputs and checks
def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, tuple):
        x = x[0]
    if hasattr(x, "detach"):
        x = x.detach()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _groups(pattern: Pattern, mode: str) -> list[sp.csr_matrix]:
    return [pattern.union()] if mode == "merged" else list(pattern.heads)


def _check_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    if n <= _ALL_ROWS:
        return np.arange(n)
    pick = 1 + rng.choice(n - 2, size=min(n - 2, _SAMPLED_ROWS - 2), replace=False)
    return np.unique(np.concatenate([[0, n - 1], pick]))


def _oracle_rows(q, k, v, groups, rows, scale) -> np.ndarray:
    """Exact float64 attention of the given query rows, straight from the CSR."""
    B, H, _, d = q.shape
    out = np.zeros((B, H, rows.size, d))
    for h in range(H):
        g = groups[h % len(groups)]
        for r, i in enumerate(rows):
            keys = g.indices[g.indptr[i]:g.indptr[i + 1]]
            if keys.size == 0:
                continue
            kk = k[:, h, keys].astype(np.float64)  # (B, K, d)
            s = np.einsum("bkd,bd->bk", kk, q[:, h, i].astype(np.float64)) * scale
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, h, r] = np.einsum("bk,bkd->bd", s, v[:, h, keys].astype(np.float64))
    return out


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    worst = 0.0
    for h in range(a.shape[1]):  # head by head: no full-size float64 temporaries
        with np.errstate(invalid="ignore"):
            dlt = np.abs(a[:, h].astype(np.float32) - b[:, h].astype(np.float32))
        worst = max(worst, float(np.nanmax(dlt)) if dlt.size else 0.0)
        if np.isnan(dlt).any():
            return math.inf
    return worst


# ====================================================================== baselines
def _sdpa_runner(torch: Any, pattern: Pattern, groups, heads, scale, tq, tk, tv):
    """``(fn or None, same function as the pattern?, note)`` for torch SDPA."""
    F = torch.nn.functional.scaled_dot_product_attention
    n = pattern.n
    if pattern.causal:
        same = all(g.nnz == n * (n + 1) // 2 for g in groups)
        note = "is_causal=True" + ("" if same else " (dense causal work, not this pattern)")
        return (lambda: F(tq, tk, tv, is_causal=True, scale=scale)), same, note
    if all(g.nnz == n * n for g in groups):
        return (lambda: F(tq, tk, tv, scale=scale)), True, "no mask (every pair)"
    G = len(groups)
    cells = (heads if G > 1 else 1) * n * n
    if cells > DENSE_LIMIT:
        return None, False, (
            f"skipped: a dense boolean mask would take {cells / 2**30:.2f} GiB "
            f"({cells:,} cells; the limit is {DENSE_LIMIT:,})"
        )
    mask = torch.zeros((G, n, n), dtype=torch.bool)
    for gi, g in enumerate(groups):
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.indptr))
        mask[gi][torch.from_numpy(rows), torch.from_numpy(g.indices.astype(np.int64))] = True
    mask = mask[torch.arange(heads) % G][None] if G > 1 else mask[None]
    return (lambda: F(tq, tk, tv, attn_mask=mask, scale=scale)), True, "dense boolean mask"


def _flex_block_mask(pattern: Pattern, mode: str, heads: int, block: int) -> Any:
    """The pattern's FlexAttention ``BlockMask``, from its CSR (no n x n mask).

    :func:`sparse_patterns.export.to_flex_block_mask`: full and partial blocks
    separated, a ``mask_mod`` evaluated on partial blocks only. In merged mode one
    mask head broadcasts over the attention heads.
    """
    from ..export import to_flex_block_mask  # noqa: PLC0415

    return to_flex_block_mask(pattern, mode=mode, num_heads=heads if mode == "multihead" else None,
                              block_size=block)


def _flex_runner(torch: Any, pattern: Pattern, mode: str, heads: int, scale, tq, tk, tv):
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415

    t0 = time.perf_counter()
    bm = _flex_block_mask(pattern, mode, heads, _FLEX_BLOCK)
    t_mask = time.perf_counter() - t0
    torch._dynamo.reset()  # one compiled graph per shape: no recompile limit, honest compile time
    fa = torch.compile(flex_attention, dynamic=False)
    kept = 100.0 - float(bm.sparsity())
    note = f"compiled, BlockMask {_FLEX_BLOCK}-blocks {kept:.0f}% kept, built in {t_mask:.2f} s"
    return (lambda: fa(tq, tk, tv, block_mask=bm, scale=scale)), True, note


# ====================================================================== machine
def _matmul_gflops(torch: Any) -> tuple[float, str]:
    n = _MATMUL_N
    if torch is not None:
        a = torch.randn(n, n, dtype=torch.float32)
        b = torch.randn(n, n, dtype=torch.float32)
        fn, src = (lambda: torch.matmul(a, b)), f"torch.matmul fp32 {n}x{n}"
    else:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        fn, src = (lambda: a @ b), f"numpy matmul fp32 {n}x{n} (torch missing)"
    fn()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 2.0 * n**3 / float(np.median(ts)) / 1e9, src


def _machine(torch: Any) -> dict[str, Any]:
    import numba  # noqa: PLC0415

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {
        "cores": cores, "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if torch is not None else None,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "numba_threads": numba.get_num_threads(),
        "torch": torch.__version__ if torch is not None else None,
        "numba": numba.__version__, "numpy": np.__version__,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_before": _load(),
    }


def _load() -> str | None:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return None


# ====================================================================== the profiler
def _patterns(patterns: Any, params: Mapping[str, Any]) -> list[Any]:
    if isinstance(patterns, (str, Pattern)):
        patterns = [patterns]
    items = list(patterns)
    if not items:
        raise ValueError("patterns: give at least one pattern name or Pattern")
    used: set[str] = set()
    for p in items:
        if isinstance(p, str):
            used |= {q.name for q in registry.get(p).params}
        elif not isinstance(p, Pattern):
            raise ValueError(f"patterns: expected pattern names or Patterns, got {type(p).__name__}")
    names = [p for p in items if isinstance(p, str)]
    for key in params:
        if key not in used:
            takes = ", ".join(sorted(used)) or "no parameters"
            raise ValueError(
                f"params: {key!r} applies to none of the patterns {', '.join(names) or '(Patterns)'}; "
                f"they take: {takes}"
            )
    return items


def _impl_names() -> tuple[str, ...]:
    from . import IMPLS  # noqa: PLC0415

    return tuple(str(getattr(k, "value", k)) for k in IMPLS)


def _names(arg: str, value: Any, valid: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    out = []
    for v in value:
        if v not in valid:
            raise ValueError(f"{arg}: unknown {arg[:-1]} {v!r}; valid: {', '.join(valid)}")
        if v not in out:
            out.append(str(v))
    return tuple(out)


def profile(
    patterns: str | Pattern | Iterable[str | Pattern],
    ns: int | Iterable[int],
    *,
    impls: str | Sequence[str] = ("numba",),
    baselines: str | Sequence[str] = ("sdpa", "flex"),
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    dtype: str = "float32",
    repeats: int = 5,
    mode: str = "merged",
    params: Mapping[str, Any] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    block: int = BLOCK,
    seed: int = 0,
) -> ProfileTable:
    """Time each pattern's forward attention, ours next to torch SDPA and FlexAttention.

    For every pattern and ``n`` the same random ``q, k, v`` (standard normal,
    shape ``(batch, heads, n, head_dim)``) go to every runner. Each runner is
    called once as a warm-up (its time is ``first_s``: compilation shows as
    ``compile_s = first_s - median``), once more with its memory measured and
    its output checked, and then ``repeats`` times under the clock.

    Parameters
    ----------
    patterns : str, Pattern, or a sequence of them
        Registered pattern names (generated at every ``n``) or ready
        :class:`~sparse_patterns.Pattern` objects (profiled at their own ``n``).
    ns : int or sequence of int
        Sequence lengths, each ``>= 1``.
    impls : sequence of str
        Our implementations, names from :data:`sparse_patterns.kernels.IMPLS`
        (``"numba"``, ``"reference"``, ...). May be empty (baselines only).
    baselines : sequence of str
        ``"sdpa"`` and/or ``"flex"`` (empty: none). Without torch they are
        dropped with a note and only ours run.
    batch, heads, head_dim : int
        Shape of the inputs.
    dtype : {"float32", "float64", "float16", "bfloat16"}
        Input dtype (``bfloat16`` inputs are torch tensors and need torch).
    repeats : int
        Timed calls after the warm-up, in ``[1, 1000]``.
    mode : {"merged", "multihead"}
        ``merged``: every attention head uses the union of the pattern's heads
        (one softmax); ``multihead``: attention head ``h`` uses pattern head ``h % p``.
    params : mapping, optional
        Pattern parameters shared across the patterns, applied to those that
        take them (``{"stride": "sqrt"}``); a key that no pattern takes is an error.
    progress : callable, optional
        Called as ``progress(done, total, what)`` around every step of the grid.
    block : int
        Tile size of our kernel's plan (``computed_flops`` come from that plan).
    seed : int
        Seed of the inputs and of the sampled rows the oracle checks.

    Returns
    -------
    ProfileTable

    Raises
    ------
    ValueError
        Empty ``ns`` or ``patterns``, an unknown impl, baseline, dtype or mode, a
        parameter that applies to no pattern, or nothing left to run (no impl,
        and no baseline because torch is missing).

    Notes
    -----
    **Correctness.** Every runner's output is compared with an exact float64
    oracle computed from the CSR on every query row for ``n <= 1024``, and on 128
    rows (the first, the last and random ones) above. Ours is also compared on
    every row with a baseline that computes the same function (FlexAttention
    with the pattern's mask; SDPA when it is given the pattern's dense mask or
    the pattern is full). A runner whose error exceeds the dtype's tolerance
    (2e-4 in float32) is marked ``"wrong"`` and not timed. SDPA with
    ``is_causal=True`` on a sparse causal pattern computes dense causal
    attention: it is the cost baseline, and only the oracle checks it there.

    **Memory.** ``peak_bytes`` is measured on the checked call: the resident
    set's high-water mark (Linux ``VmHWM``, reset through
    ``/proc/self/clear_refs`` after ``malloc_trim``) minus the resident set
    before, or the peak of ``tracemalloc`` (NumPy's allocations) when larger.
    It counts everything the call touches, outputs included. Its limits: pages
    the allocator already held and reuses are not counted (the arrays that the
    CPU kernel recycles are freed before the call), other threads of the
    process count too, and where ``clear_refs`` is unavailable it falls back to
    ``getrusage`` ``ru_maxrss``, which only moves when the call sets a new
    process-wide peak.

    **Throughput.** ``GFLOP/s`` is useful FLOPs (``4 d`` per attended pair per
    attention head) over the median time; ``% matmul`` compares it with a
    ``2048 x 2048`` fp32 ``torch.matmul`` timed in the same run, at its start and at
    its end (the faster of the two medians of 5 calls: a slow spell of a shared
    machine at one end does not inflate the percentages).

    Examples
    --------
    >>> t = profile(["strided"], [16], impls=("reference",), baselines=(), repeats=1,
    ...             heads=2, head_dim=4, params={"stride": 4})
    >>> r = t[0]
    >>> r.n, r.get("reference").status, r.useful_flops == 4 * 4 * 2 * r.nnz
    (16, 'ok', True)
    """
    params = dict(params or {})
    items = _patterns(patterns, params)
    if isinstance(ns, (int, np.integer)):
        ns = [ns]
    ns = [check_int("ns", v, 1) for v in ns]
    if not ns and any(isinstance(p, str) for p in items):
        raise ValueError("ns: give at least one sequence length n >= 1, got an empty list")
    impls = _names("impls", impls, _impl_names())
    baselines = _names("baselines", baselines, BASELINES)
    batch = check_int("batch", batch, 1, 1 << 16)
    heads = check_int("heads", heads, 1, 1 << 16)
    head_dim = check_int("head_dim", head_dim, 1, 1 << 14)
    repeats = check_int("repeats", repeats, 1, 1000)
    block = check_int("block", block, 1, 4096)
    dtype = check_choice("dtype", dtype, DTYPES)
    mode = check_choice("mode", mode, MODES)
    notes: list[str] = []
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        torch = None
        if dtype == "bfloat16":
            raise ValueError("dtype: 'bfloat16' needs torch, which is not installed") from None
        if baselines:
            notes.append(f"torch is not installed: baselines {', '.join(baselines)} were not run; "
                         "profiled ours only")
            baselines = ()
    if not impls and not baselines:
        raise ValueError("impls: nothing to run (no implementation, and no baseline"
                         + (" because torch is missing)" if torch is None else ")"))
    from . import attention  # noqa: PLC0415

    machine = _machine(torch)
    matmul, matmul_src = _matmul_gflops(torch)
    cells = [(p, n) for p in items if isinstance(p, str) for n in ns]
    cells += [(p, p.n) for p in items if isinstance(p, Pattern)]
    runners = [(r, "impl") for r in impls] + [(b, "baseline") for b in baselines]
    total = len(cells) * (len(runners) + 1)
    done = 0
    tol = _TOL[dtype]
    scale = 1.0 / math.sqrt(head_dim)
    rows: list[ProfileRow] = []

    def tick(what: str, step: int = 0) -> None:
        nonlocal done
        done += step
        if progress is not None:
            progress(done, total, what)

    for p, n in cells:
        if isinstance(p, str):
            spec = registry.get(p)
            taken = {q.name for q in spec.params}
            pat = registry.make(p, n, **{k: v for k, v in params.items() if k in taken})
        else:
            pat = p
        label = f"{pat.name} n={n:,}"
        tick(f"{label}: plan")
        t0 = time.perf_counter()
        pl = plan(pat, block=block, mode=mode)
        plan_s = time.perf_counter() - t0
        useful, computed = pl.flops(batch, heads, head_dim)
        groups = _groups(pat, mode)
        rng = np.random.default_rng(seed)
        x32 = [rng.standard_normal((batch, heads, n, head_dim), dtype=np.float32) for _ in range(3)]
        if dtype == "bfloat16":
            ours = [torch.from_numpy(a).to(torch.bfloat16) for a in x32]
            exact = [t.float().numpy() for t in ours]  # the rounded values, for the oracle
            tin = ours
        else:
            ours = [a.astype(dtype, copy=False) for a in x32]
            exact = ours
            tin = [torch.from_numpy(a) for a in ours] if torch is not None else None
        del x32
        check_rows = _check_rows(n, rng)
        oracle = _oracle_rows(*exact, groups, check_rows, scale)
        rows_note = (f"all {n:,} rows" if check_rows.size == n
                     else f"{check_rows.size} of {n:,} rows")
        tick(f"{label}: oracle", 1)

        # Phase 1: warm-up and checked call of every runner (baselines first, so that
        # ours can be compared on every row with a baseline of the same function).
        state: dict[str, dict[str, Any]] = {}
        for name, kind in sorted(runners, key=lambda r: r[1] == "impl"):
            tick(f"{label}: {name} (warm-up, check)")
            st: dict[str, Any] = {"kind": kind, "note": "", "status": "ok"}
            state[name] = st
            try:
                if kind == "impl":
                    q_, k_, v_ = ours

                    def fn(q_=q_, k_=k_, v_=v_, name=name, pat=pat):
                        return attention(q_, k_, v_, pat, mode=mode, impl=name, scale=scale,
                                         block=block)
                    same = True
                elif name == "sdpa":
                    fn, same, st["note"] = _sdpa_runner(torch, pat, groups, heads, scale, *tin)
                else:
                    fn, same, st["note"] = _flex_runner(torch, pat, mode, heads, scale, *tin)
                if fn is None:
                    st["status"] = "skipped"
                    notes.append(f"{label}: {name} {st['note']}")
                    continue
                st["fn"], st["same"] = fn, same
                t0 = time.perf_counter()
                fn()
                st["first"] = time.perf_counter() - t0
                out, _, st["peak"] = _measure(fn)
                out = _to_numpy(out)
                st["err"] = float(np.nanmax(np.abs(out[:, :, check_rows] - oracle),
                                            initial=0.0))
                if np.isnan(out[:, :, check_rows]).any():
                    st["err"] = math.inf
                if not same:
                    st["err"] = None  # another function (dense causal): no error to report
                else:
                    st["out"] = out
                    msg = f"oracle on {rows_note}: max error {st['err']:.2g}"
                    if st["err"] > tol:
                        st["status"] = "wrong"
                        st["note"] = _join(st["note"], msg + f" > {tol:g}")
                    else:
                        st["note"] = _join(st["note"], msg)
            except Exception as exc:  # noqa: BLE001 - one runner failing must not lose the grid
                st["status"] = "skipped" if isinstance(exc, (ValueError, MemoryError)) else "error"
                st["note"] = _join(st["note"], f"{type(exc).__name__}: {_first_line(exc)}")
                st.pop("fn", None)
                notes.append(f"{label}: {name} {st['status']}: {_first_line(exc)}")
            if kind == "impl" and st["status"] == "ok":
                for b in baselines:
                    bs = state.get(b, {})
                    if bs.get("status") == "ok" and "out" in bs:
                        diff = _max_diff(st["out"], bs["out"])
                        msg = f"{b} on every row: max difference {diff:.2g}"
                        if diff > tol:
                            st["status"] = "wrong"
                            msg += f" > {tol:g}"
                        st["note"] = _join(st["note"], msg)
                        break
            if st["status"] == "wrong":
                notes.append(f"{label}: {name} is WRONG ({st['note']}); it was not timed")
        for st in state.values():
            st.pop("out", None)

        # Phase 2: the clock, only for runners that passed their check.
        meas = []
        for name, kind in runners:
            st = state[name]
            tick(f"{label}: {name} x{repeats}")
            times: list[float] = []
            if st["status"] == "ok":
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    st["fn"]()
                    times.append(time.perf_counter() - t0)
            meas.append(Measurement(
                runner=name, kind=kind, status=st["status"], note=st["note"],
                times=tuple(times), first_s=st.get("first"),
                peak_bytes=st.get("peak"), max_err=st.get("err"),
            ))
            tick(f"{label}: {name} done", 1)
        state.clear()
        rows.append(ProfileRow(
            pattern=pat.name, params=dict(pat.params), n=n, causal=pat.causal,
            num_pattern_heads=pat.num_heads, nnz=pat.nnz, density=pat.density,
            useful_flops=useful, computed_flops=computed, plan_s=plan_s, plan=pl.describe(),
            measurements=tuple(meas),
        ))
        del ours, exact, tin, oracle
        gc.collect()
    machine["load_after"] = _load()
    again, _ = _matmul_gflops(torch)
    matmul_src += ", the faster of its medians at the start and the end"
    matmul = max(matmul, again)
    settings = {"batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype,
                "repeats": repeats, "mode": mode, "block": block, "seed": seed}
    return ProfileTable(rows, impls=impls, baselines=baselines, settings=settings,
                        machine=machine, matmul_gflops=matmul, matmul_source=matmul_src,
                        notes=notes)


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip()
    return s.splitlines()[0] if s else type(exc).__name__
