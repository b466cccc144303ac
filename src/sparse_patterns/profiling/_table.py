"""What the profiler returns: one :class:`Measurement` per runner, one
:class:`ProfileRow` per pattern and ``n``, and the :class:`ProfileTable` that
holds them and prints itself: :meth:`ProfileTable.table` (a compact set of
columns that fits 80 columns, or every column with ``wide=True``; it prints as
a rich table), :meth:`ProfileTable.to_dict` (JSON) and
:meth:`ProfileTable.to_markdown` (every column, ready to paste). The log-log
figure is :func:`sparse_patterns.render.profile.plot_profile`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Measurement", "ProfileRow", "ProfileTable", "ProfileGrid", "COLUMNS", "WIDE_COLUMNS"]


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
        ``tracemalloc`` (see :func:`~sparse_patterns.profiling.profile`, Notes).
    max_err : float or None
        Largest absolute difference to the float64 oracle on the checked rows
        (None for a baseline that computes another function, such as SDPA's
        dense causal attention on a sparse causal pattern).
    computed_flops : int or None
        FLOPs the runner's own plan computes, when it is not the row's plan
        (``impl="flex"`` plans with FlexAttention's 128-token tiles).

    Examples
    --------
    >>> m = Measurement("numba", "impl", "ok", times=(0.3, 0.1, 0.2), first_s=1.2)
    >>> m.ok, m.median_s, m.min_s, round(m.compile_s, 6)
    (True, 0.2, 0.1, 1.0)
    """

    runner: str
    kind: str
    status: str
    note: str = ""
    times: tuple[float, ...] = ()
    first_s: float | None = None
    peak_bytes: int | None = None
    max_err: float | None = None
    computed_flops: int | None = None

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
            "computed_flops": self.computed_flops,
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

    def get(self, runner: str, kind: str | None = None) -> Measurement | None:
        """The measurement of ``runner`` (None when it was not asked for); ``kind``
        (``"impl"`` or ``"baseline"``) tells our ``"flex"`` from the ``"flex"`` baseline,
        ours first when not given."""
        for m in self.measurements:
            if m.runner == runner and kind in (None, m.kind):
                return m
        return None

    def gflops(self, runner: str, computed: bool = False) -> float | None:
        """GFLOP/s of our ``runner`` (FLOPs / median time): useful FLOPs, or with
        ``computed`` the FLOPs its plan computes."""
        m = self.get(runner)
        if m is None or not m.ok or not m.median_s:
            return None
        flops = self.useful_flops
        if computed:
            flops = m.computed_flops if m.computed_flops is not None else self.computed_flops
        return flops / m.median_s / 1e9

    def speedup(self, impl: str, baseline: str) -> float | None:
        """``baseline time / impl time`` (medians); above 1 means ``impl`` is faster."""
        a, b = self.get(impl, "impl"), self.get(baseline, "baseline")
        if a is None or b is None or not a.ok or not b.ok or not a.median_s:
            return None
        return b.median_s / a.median_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly fields."""
        runs = {run_key(self, m): m.to_dict() for m in self.measurements}
        for m in self.measurements:
            runs[run_key(self, m)]["gflops"] = self.gflops(m.runner) if m.kind == "impl" else (
                self.useful_flops / m.median_s / 1e9 if m.ok and m.median_s else None)
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


def run_key(row: ProfileRow, m: Measurement) -> str:
    """The key of ``m`` in ``to_dict()["runs"]``: its runner, ``"<name> (baseline)"`` for a
    baseline named like one of ours (the ``"flex"`` baseline beside ``impl="flex"``)."""
    clash = m.kind == "baseline" and any(
        o.kind == "impl" and o.runner == m.runner for o in row.measurements)
    return f"{m.runner} (baseline)" if clash else m.runner


# ====================================================================== the printed table
#: Columns of ``ProfileTable.table(wide=True)`` and of the markdown; each
#: baseline adds ``"<b> s"`` and ``"x <b>"`` before ``check``.
WIDE_COLUMNS = (
    "pattern", "n", "density", "useful GFLOP", "computed/useful", "impl", "median s",
    "min-max s", "compile s", "GFLOP/s", "% peak", "% peak computed", "% matmul", "peak MB",
    "check",
)
#: Columns of the compact ``ProfileTable.table()``; each baseline adds ``"x <b>"``
#: before ``check``. They fit 80 columns.
COLUMNS = ("pattern", "n", "impl", "median ms", "GFLOP/s", "% peak", "% matmul", "check")

#: Headers of the rich table (the markdown and JSON keep the long names).
_SHORT = {"density": "dens", "useful GFLOP": "GFLOP", "computed/useful": "c/u",
          "median s": "median", "min-max s": "min-max", "compile s": "1st-med",
          "median ms": "ms", "GFLOP/s": "GF/s", "% matmul": "%mm", "peak MB": "MB",
          "% peak": "%pk", "% peak computed": "%pkc"}
#: What a short header means (the legend under the rich table).
_MEANING = {
    "GFLOP": "useful work (4 d per attended pair per head)",
    "c/u": "computed / useful FLOPs of the plan",
    "median": "median seconds per call",
    "ms": "median milliseconds per call",
    "1st-med": "first call minus median (compilation)",
    "GF/s": "useful GFLOP/s",
    "%pk": "useful GFLOP/s of the FMA peak",
    "%pkc": "computed GFLOP/s of the FMA peak",
    "%mm": "useful GFLOP/s of fp32 matmul",
    "MB": "peak memory of one call",
}
_LEFT = ("pattern", "impl", "check")


def _short(col: str) -> str:
    if col.startswith("x "):
        return "x" + col[2:]
    if col.endswith(" s") and col[:-2] not in ("median", "min-max", "compile"):
        return col[:-2]  # "sdpa s" -> "sdpa"
    return _SHORT.get(col, col)


@dataclass(frozen=True)
class ProfileGrid:
    """The formatted cells of a :class:`ProfileTable`: unpacks as ``columns, rows``
    and prints as a rich table (``rich.print(grid)``) with short headers, then
    its caption: the run's settings, machine, a legend and the notes.

    Attributes
    ----------
    columns : tuple of str
        Column names (long form, as in the markdown).
    rows : list of tuple of str
        One row per pattern, n and implementation.
    title, caption : str
        Printed above and below the rich table.

    Examples
    --------
    >>> grid = ProfileGrid(("pattern", "n", "check"), [("full", "8", "ok")])
    >>> columns, rows = grid
    >>> dict(zip(columns, rows[0]))
    {'pattern': 'full', 'n': '8', 'check': 'ok'}
    """

    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    title: str = ""
    caption: str = ""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.columns, self.rows))

    def __rich__(self) -> Any:
        """A ``rich.table.Table`` and its caption: long cells fold, never end in ``…``."""
        from rich import box  # noqa: PLC0415
        from rich.console import Group  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415
        from rich.text import Text  # noqa: PLC0415

        t = Table(title=self.title or None, title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
        for c in self.columns:
            t.add_column(_short(c), justify="left" if c in _LEFT else "right", overflow="fold")
        check = self.columns.index("check") if "check" in self.columns else None
        for r in self.rows:
            wrong = check is not None and r[check] == "wrong"
            t.add_row(*map(Text, r), style="bold red" if wrong else None)
        return Group(t, Text(self.caption)) if self.caption else t


class ProfileTable:
    """The result of :func:`~sparse_patterns.profiling.profile`: one :class:`ProfileRow`
    per pattern and ``n``.

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
    fma_peak_gflops : float or None
        The host's FMA peak for the profiled dtype, measured once in the run
        (``fma_peak_source`` says how); None on a CUDA profile.
    notes : tuple of str
        What could not run and why (torch missing, a mask that would not fit, ...).
    """

    def __init__(self, rows: Sequence[ProfileRow], *, impls: Sequence[str],
                 baselines: Sequence[str], settings: Mapping[str, Any],
                 machine: Mapping[str, Any], matmul_gflops: float, matmul_source: str,
                 notes: Sequence[str] = (), fma_peak_gflops: float | None = None,
                 fma_peak_source: str = "FMA peak: not measured") -> None:
        self.rows = tuple(rows)
        self.impls = tuple(impls)
        self.baselines = tuple(baselines)
        self.settings = dict(settings)
        self.machine = dict(machine)
        self.matmul_gflops = float(matmul_gflops)
        self.matmul_source = str(matmul_source)
        self.fma_peak_gflops = None if fma_peak_gflops is None else float(fma_peak_gflops)
        self.fma_peak_source = str(fma_peak_source)
        self.notes = tuple(notes)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[ProfileRow]:
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

    def pct_of_peak(self, row: ProfileRow, runner: str, computed: bool = False) -> float | None:
        """Useful (or ``computed``) GFLOP/s of ``runner`` as a percentage of
        :attr:`fma_peak_gflops` (None when the peak was not measured).

        Examples
        --------
        >>> row = ProfileRow("full", {}, 8, False, 1, 64, 1.0, 1000, 2000, 0.0, {},
        ...                  (Measurement("numba", "impl", "ok", times=(1e-6,)),))
        >>> t = ProfileTable([row], impls=("numba",), baselines=(), settings={}, machine={},
        ...                  matmul_gflops=1.0, matmul_source="-", fma_peak_gflops=4.0)
        >>> t.pct_of_peak(row, "numba"), t.pct_of_peak(row, "numba", computed=True)
        (25.0, 50.0)
        """
        g = row.gflops(runner, computed=computed)
        peak = self.fma_peak_gflops
        return None if g is None or not peak else 100.0 * g / peak

    def to_dict(self) -> dict[str, Any]:
        """The whole table as JSON-friendly data."""
        rows = []
        for r in self.rows:
            d = r.to_dict()
            for m in r.measurements:
                run = d["runs"][run_key(r, m)]
                ours = m.kind == "impl"
                run["pct_matmul"] = self.pct_of_matmul(r, m.runner) if ours else None
                run["computed_gflops"] = r.gflops(m.runner, computed=True) if ours else None
                run["pct_fma_peak"] = self.pct_of_peak(r, m.runner) if ours else None
                run["pct_fma_peak_computed"] = (self.pct_of_peak(r, m.runner, computed=True)
                                                if ours else None)
            rows.append(d)
        return {
            "settings": self.settings, "machine": self.machine,
            "matmul": {"gflops": self.matmul_gflops, "source": self.matmul_source},
            "fma_peak": {"gflops": self.fma_peak_gflops, "source": self.fma_peak_source},
            "impls": list(self.impls), "baselines": list(self.baselines),
            "notes": list(self.notes), "rows": rows,
        }

    def _cells(self) -> list[dict[str, str]]:
        """Every column of every (pattern, n, impl) row, formatted."""
        out = []
        for r in self.rows:
            names = [m.runner for m in r.measurements if m.kind == "impl"] or ["-"]
            for impl in names:
                m = r.get(impl, "impl")
                c = {"pattern": r.pattern, "n": f"{r.n:,}", "density": f"{r.density:.4g}",
                     "useful GFLOP": f"{r.useful_flops / 1e9:.3g}",
                     "computed/useful": f"{r.flop_ratio:.2f}", "impl": impl}
                timed = ("median s", "median ms", "min-max s", "compile s", "GFLOP/s",
                         "% peak", "% peak computed", "% matmul", "peak MB")
                if m is None or not m.ok:
                    c.update(dict.fromkeys(timed, "-"))
                else:
                    pct = self.pct_of_matmul(r, impl)
                    ms = 1e3 * m.median_s
                    c.update({
                        "median s": f"{m.median_s:.4g}",
                        "median ms": f"{ms:.4g}" if ms < 1e4 else f"{ms:,.0f}",
                        "min-max s": f"{m.min_s:.3g}-{m.max_s:.3g}",
                        "compile s": f"{m.compile_s:.2f}", "GFLOP/s": f"{r.gflops(impl):.1f}",
                        "% peak": _pct(self.pct_of_peak(r, impl)),
                        "% peak computed": _pct(self.pct_of_peak(r, impl, computed=True)),
                        "% matmul": f"{pct:.0f}%", "peak MB": _mb(m.peak_bytes),
                    })
                for b in self.baselines:
                    mb = r.get(b, "baseline")
                    if mb is None:
                        c[f"{b} s"], c[f"x {b}"] = "-", "-"
                    elif not mb.ok:
                        c[f"{b} s"], c[f"x {b}"] = mb.status, "-"
                    else:
                        sp_ = r.speedup(impl, b) if m is not None else None
                        c[f"{b} s"] = f"{mb.median_s:.4g}"
                        c[f"x {b}"] = "-" if sp_ is None else f"{sp_:.1f}x"
                c["check"] = "-" if m is None else m.status
                out.append(c)
        return out

    def columns(self, wide: bool = False) -> tuple[str, ...]:
        """The column names of :meth:`table`: compact, or every one with ``wide=True``.

        Examples
        --------
        >>> t = ProfileTable([], impls=("numba",), baselines=("sdpa",), settings={},
        ...                  machine={}, matmul_gflops=1.0, matmul_source="-")
        >>> t.columns()
        ('pattern', 'n', 'impl', 'median ms', 'GFLOP/s', '% peak', '% matmul', 'x sdpa', 'check')
        >>> t.columns(wide=True)[-3:]
        ('sdpa s', 'x sdpa', 'check')
        """
        if wide:
            extra = [c for b in self.baselines for c in (f"{b} s", f"x {b}")]
            return (*WIDE_COLUMNS[:-1], *extra, "check")
        return (*COLUMNS[:-1], *(f"x {b}" for b in self.baselines), "check")

    def table(self, wide: bool = False) -> ProfileGrid:
        """The formatted table: one row per pattern, n and impl.

        It unpacks as ``columns, rows`` (tuples of strings) and prints as a rich
        table whose caption gives the settings, the machine, a legend of the
        short headers and the notes. The compact default (median ms, GFLOP/s,
        % of matmul, and for each baseline its time over ours: ``x sdpa``,
        above 1 ours is faster) fits an 80-column terminal; ``wide=True`` adds
        density, work, the plan's computed/useful FLOPs, min-max and
        compilation times, peak memory and the baselines' own times.

        Examples
        --------
        >>> from sparse_patterns.profiling import profile
        >>> t = profile(["strided"], [16], impls=("reference",), baselines=(), repeats=1,
        ...             heads=2, head_dim=4, params={"stride": 4})
        >>> cols, rows = t.table()
        >>> dict(zip(cols, rows[0]))["check"]
        'ok'
        >>> len(t.table(wide=True).columns)
        15
        """
        cols = self.columns(wide)
        rows = [tuple(c[k] for k in cols) for c in self._cells()]
        shown = [_short(c) for c in cols]
        legend = [f"{k}: {v}" for k, v in _MEANING.items() if k in shown]
        xs = [s for s in shown if s.startswith("x")]
        if xs:
            legend.append(f"{', '.join(xs)}: baseline time / ours (above 1: ours is faster)")
        caption = "\n".join([*self._summary(), "; ".join(legend) + ".",
                             *(f"note: {n}" for n in self.notes)])
        unit = "seconds" if wide else "milliseconds"
        return ProfileGrid(cols, rows, title=f"patterns profile: forward time per call ({unit})",
                           caption=caption)

    def _summary(self) -> list[str]:
        m, s = self.machine, self.settings
        return [
            f"B={s.get('batch')} H={s.get('heads')} d={s.get('head_dim')} {s.get('dtype')} "
            f"{s.get('mode')} on {s.get('device', 'cpu')}; median of {s.get('repeats')} after a "
            f"warm-up; {m.get('date')}",
            f"{m.get('cores')} cores, CPU capability {m.get('cpu_capability')}; "
            f"load {m.get('load_before')} -> {m.get('load_after')}",
            f"{self.matmul_source}: {self.matmul_gflops:.0f} GFLOP/s",
            f"{self.fma_peak_source}: " + (f"{self.fma_peak_gflops:.0f} GFLOP/s"
                                           if self.fma_peak_gflops else "-"),
        ]

    def to_markdown(self) -> str:
        """A GitHub markdown table of every column, then the machine and the notes.

        Examples
        --------
        >>> from sparse_patterns.profiling import profile
        >>> t = profile(["full"], [8], impls=("reference",), baselines=(), repeats=1,
        ...             heads=1, head_dim=4)
        >>> t.to_markdown().splitlines()[0].startswith("| pattern | n |")
        True
        """
        cols, rows = self.table(wide=True)
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        m, s = self.machine, self.settings
        lines.append("")
        lines.append(
            f"B={s['batch']}, H={s['heads']}, d={s['head_dim']}, {s['dtype']}, mode={s['mode']}, "
            f"device={s.get('device', 'cpu')}, "
            f"median of {s['repeats']} runs after a warm-up; {m.get('cores')} cores "
            f"({m.get('cpu')}), CPU capability {m.get('cpu_capability')}, torch "
            f"{m.get('torch')}, numba {m.get('numba')}; fp32 matmul {self.matmul_gflops:.0f} "
            f"GFLOP/s ({self.matmul_source}); "
            + (f"{self.fma_peak_gflops:.0f} GFLOP/s " if self.fma_peak_gflops else "")
            + f"({self.fma_peak_source}); load average {m.get('load_before')} before, "
            f"{m.get('load_after')} after; {m.get('date')}."
        )
        lines.extend(f"- {n}" for n in self.notes)
        return "\n".join(lines)


def _mb(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.0f}"


def _pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.0f}%"
