"""What :func:`~sparse_patterns.analysis.verify` and :func:`~sparse_patterns.analysis.explain` return.

A :class:`VerifyReport` holds the outcome of the exact check of the Sparse
Transformer's two criteria (Child et al. 2019, arXiv:1904.10509, section 4.1),
token or block level alike: both checks build it through
:meth:`VerifyReport.from_counts`, the one place that turns raw counts into a
report. It prints itself: :meth:`VerifyReport.table` is a rich renderable
(the criteria, the hop histogram, the budgets and the verdict) and
:meth:`VerifyReport.to_dict` a JSON-ready dict. An :class:`Explanation` is a
shortest path for one pair, or the reason none exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._printable import Printable
from .budget import HeadBudget

__all__ = ["VerifyReport", "Explanation"]


@dataclass(frozen=True)
class Explanation:
    """A shortest path from input ``j`` to output ``i``, or why none exists.

    ``path`` lists the positions ``(j, a, ..., i)``, one per step boundary: the
    pair is in ``R_k`` with ``k = len(path) - 1 = hops``, step m going from
    ``path[m - 1]`` to ``path[m]`` through ``steps[m - 1]`` (a head name, or
    ``"residual"`` for the identity). ``in_last`` says whether the pair is in
    ``R_p`` (criterion 1).
    """

    i: int
    j: int
    path: tuple[int, ...] | None
    steps: tuple[str, ...]
    hops: int | None
    in_last: bool
    reason: str

    def __str__(self) -> str:
        if self.path is None:
            return self.reason
        out = str(self.path[0])
        for a, s in zip(self.path[1:], self.steps, strict=True):
            out += f" -[{s}]-> {a}"
        return out

    def to_dict(self) -> dict[str, Any]:
        """The path, the head of every step and the reason, JSON-ready."""
        return {"path": list(self.path) if self.path else None, "steps": list(self.steps),
                "reason": self.reason}


@dataclass(frozen=True)
class VerifyReport(Printable):
    """The outcome of :func:`~sparse_patterns.analysis.verify`.

    Attributes
    ----------
    ok : bool
        Both criteria hold.
    criterion1 : bool
        Every target pair is in ``R_p`` (connected across the p steps).
    criterion2 : bool
        Every target pair has a hop distance ``<= p`` (a path of at most p + 1
        positions). With the residual the two coincide.
    hops : dict of int to int
        ``k -> number of target pairs whose hop distance is k``, for k = 1..p.
    unreachable : int
        Target pairs with no hop distance (criterion 2 failures).
    not_in_last : int
        Target pairs outside ``R_p`` (criterion 1 failures).
    counterexample : tuple of int, or None
        A pair ``(i, j)`` breaking criterion 2 if it fails, else one breaking
        criterion 1, else None (the smallest i, then the smallest j).
    counterexample1, counterexample2 : tuple of int, or None
        The smallest pair breaking criterion 1, respectively criterion 2.
    p, mode, residual : int, str, bool
        What was checked.
    n : int
        Sequence length (tokens).
    causal : bool
        Targets are ``j <= i`` (causal) or every pair.
    targets : int
        Number of target pairs (block pairs at block level).
    budgets : tuple of HeadBudget
        ``|A_i|`` figures per head and for the union (see :func:`budgets`).
    depth : int or None
        Steps full connectivity needs (heads repeating with period p in
        interleaved mode), or None when it never connects or was not computed
        (see ``depth_checked``).
    depth_checked : bool
        Whether ``depth`` is known.
    level : {"token", "block"}
        Granularity; at block level pairs, hops and counter-examples are block pairs.
    block : int or None
        Block size at block level.
    certified : bool or None
        Block level: the criteria hold through full blocks alone, which proves
        them for every token pair.
    partial_pairs : int
        Block level: target block pairs connected only through partial blocks.
    seconds : float
        Wall time of the check.
    explanation : Explanation or None
        Why the counter-example fails (``verify(..., explain_failure=True)``
        at token level), else None.
    method : {"generic", "structured-offsets", "structured-periodic"}
        What decided it: the generic check of every row, or the exact
        structured check of :mod:`.structured` (offset sets of
        translation-invariant heads, or the period of fixed heads).
    """

    ok: bool
    criterion1: bool
    criterion2: bool
    hops: dict[int, int]
    unreachable: int
    not_in_last: int
    counterexample: tuple[int, int] | None
    counterexample1: tuple[int, int] | None
    counterexample2: tuple[int, int] | None
    p: int
    mode: str
    residual: bool
    n: int
    causal: bool
    targets: int
    budgets: tuple[HeadBudget, ...]
    depth: int | None
    depth_checked: bool
    name: str = "custom"
    params: dict[str, Any] = field(default_factory=dict)
    level: str = "token"
    block: int | None = None
    certified: bool | None = None
    partial_pairs: int = 0
    seconds: float = 0.0
    explanation: Explanation | None = None
    method: str = "generic"

    @property
    def hops_histogram(self) -> np.ndarray:
        """``int64 (p + 1,)``: ``hops`` as an array, entry k for hop distance k (entry 0 is 0)."""
        return np.array([0] + [self.hops.get(k, 0) for k in range(1, self.p + 1)], np.int64)

    @property
    def max_hops(self) -> int | None:
        """The largest hop distance ``<= p`` that occurs, or None when no pair connects."""
        return max((k for k, v in self.hops.items() if v > 0), default=None)

    @classmethod
    def from_counts(
        cls,
        hops: np.ndarray,
        miss1: int,
        miss2: int,
        bad1: tuple[int, int] | None,
        bad2: tuple[int, int] | None,
        *,
        p: int,
        n: int,
        causal: bool,
        started: float,
        targets: int | None = None,
        search_depth: Callable[[], tuple[int | None, bool]] | None = None,
        **fields: Any,
    ) -> VerifyReport:
        """The report of a check from its raw counts (the one constructor path).

        ``hops[k]`` counts the target pairs of hop distance k (index 0 unused),
        ``miss1``/``miss2`` the criterion 1/2 failures, ``bad1``/``bad2`` their
        smallest pairs and ``started`` the ``time.perf_counter()`` at the start.
        ``targets`` defaults to the token pairs of n (``j <= i`` when causal).
        When criterion 2 holds the depth is the largest hop distance; else
        ``search_depth()``, if given, returns ``(depth, depth_checked)``.
        ``fields`` are the remaining attributes (``mode``, ``budgets``...).
        """
        c1, c2 = int(miss1) == 0, int(miss2) == 0
        depth, depth_checked = None, False
        if c2:
            ks = [k for k in range(1, p + 1) if hops[k] > 0]
            depth, depth_checked = (max(ks) if ks else None), True
        elif search_depth is not None:
            depth, depth_checked = search_depth()
        return cls(
            ok=c1 and c2,
            criterion1=c1,
            criterion2=c2,
            hops={k: int(hops[k]) for k in range(1, p + 1)},
            unreachable=int(miss2),
            not_in_last=int(miss1),
            counterexample=bad2 if bad2 is not None else bad1,
            counterexample1=bad1,
            counterexample2=bad2,
            p=p,
            n=n,
            causal=causal,
            targets=(n * (n + 1) // 2 if causal else n * n) if targets is None else targets,
            depth=depth,
            depth_checked=depth_checked,
            seconds=time.perf_counter() - started,
            **fields,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (hop keys become strings in JSON).

        ``explanation`` appears only when the report carries one.
        """
        d = asdict(self)
        d["budgets"] = [b.to_dict() for b in self.budgets]
        d["hops"] = {int(k): int(v) for k, v in self.hops.items()}
        for key in ("counterexample", "counterexample1", "counterexample2"):
            d[key] = list(d[key]) if d[key] is not None else None
        d["params"] = {k: v for k, v in self.params.items()}
        if self.explanation is None:
            del d["explanation"]
        else:
            d["explanation"] = self.explanation.to_dict()
        return d

    def summary(self) -> str:
        """One line: pass/fail and the failing pair."""
        what = "blocks" if self.level == "block" else "pairs"
        head = (
            f"{self.name} n={self.n} p={self.p} {self.mode}"
            f"{'' if self.residual else ' no-residual'}: "
        )
        if self.ok:
            return head + f"both criteria hold for all {self.targets:,} target {what}"
        bad = []
        if not self.criterion1:
            bad.append(f"criterion 1 fails for {self.not_in_last:,} {what}")
        if not self.criterion2:
            bad.append(f"criterion 2 fails for {self.unreachable:,} {what}")
        return head + "; ".join(bad) + f"; e.g. (i, j) = {self.counterexample}"

    def table(self) -> Any:
        """The report as a rich renderable: what was checked, three tables, the verdict.

        Returns
        -------
        rich.console.Group
            Print it with ``rich.console.Console().print(report.table())``.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> from sparse_patterns.analysis import verify
        >>> verify(make("strided", 16, stride=4)).text(100).splitlines()[-1].split("  ")[0]
        'VERIFIED'
        """
        return _report_table(self)


_METHOD_NOTES = {
    "generic": "every target pair, row by row",
    "structured-offsets": "exact, from the sumsets of the heads' offset sets",
    "structured-periodic": "exact, one search per residue of the block length",
}


def _mark(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def _report_table(r: VerifyReport) -> Any:
    from rich.console import Group  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    ps = ", ".join(f"{k}={v}" for k, v in r.params.items())
    what = "block pairs" if r.level == "block" else "pairs"
    out: list[Any] = [Text.from_markup(
        f"[bold]{r.name}[/]({ps})  n={r.n:,}  p={r.p}  mode={r.mode}  "
        f"residual={'on' if r.residual else 'off'}  "
        f"targets={r.targets:,} {what} ({'j <= i' if r.causal else 'all pairs'})"
    )]
    t = Table(title="Factorization criteria (Child et al. 2019, sec. 4.1)")
    t.add_column("criterion")
    t.add_column("result", justify="center")
    t.add_column(f"failing {what}", justify="right")
    t.add_row(f"1. every j <= i connected across the {r.p} steps", _mark(r.criterion1),
              f"{r.not_in_last:,}")
    t.add_row(f"2. through a path of at most {r.p + 1} positions", _mark(r.criterion2),
              f"{r.unreachable:,}")
    out.append(t)
    h = Table(title="Hop distances")
    h.add_column("steps", justify="right")
    h.add_column(what, justify="right")
    h.add_column("share", justify="right")
    for k, v in r.hops.items():
        h.add_row(str(k), f"{v:,}", f"{v / max(r.targets, 1):.2%}")
    h.add_row("unreachable", f"{r.unreachable:,}", f"{r.unreachable / max(r.targets, 1):.2%}")
    out.append(h)
    b = Table(title=f"|A_i| budgets (n^(1/p) = {r.budgets[0].root:.2f})" +
              (" - block-level upper bounds" if r.level == "block" else ""))
    for col in ("head", "max |A_i|", "mean |A_i|", "max/n^(1/p)", "nnz", "nnz/(n n^(1/p))"):
        b.add_column(col, justify="right")
    for x in r.budgets:
        b.add_row(x.head, f"{x.max_row:,}", f"{x.mean_row:.2f}", f"{x.max_over_root:.2f}",
                  f"{x.nnz:,}", f"{x.nnz_over_budget:.2f}")
    out.append(b)
    if r.level == "block":
        out.append(Text(
            f"certified through full blocks alone: {'yes' if r.certified else 'no'}; "
            f"{r.partial_pairs:,} target block pairs rely on partial blocks"
        ))
    out.append(Text(f"decided by: {r.method} ({_METHOD_NOTES.get(r.method, 'exact')})"))
    if r.depth_checked:
        dep = "never connects" if r.depth is None else f"{r.depth} step(s)"
        out.append(Text(f"full connectivity needs: {dep}"))
    elif not r.criterion2:
        out.append(Text("full connectivity needs: not searched (too costly at this n; "
                        "pass --depth to force)"))
    verdict = "[green bold]VERIFIED[/]" if r.ok else "[red bold]NOT VERIFIED[/]"
    line = Text.from_markup(verdict)
    line.append(f"  {r.summary()}  ({r.seconds:.2f} s)")
    out.append(line)
    if r.explanation is not None:
        out.append(Text(f"counter-example (i, j) = {r.counterexample}: {r.explanation}"))
    return Group(*out)
