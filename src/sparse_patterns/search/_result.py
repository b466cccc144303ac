"""What :func:`~sparse_patterns.search.search` returns: the rows, as a DataFrame, and
the views of them (the Pareto front per n, a table, JSON, a figure).

The frame has one row per candidate, in grid order: every field of
:data:`~sparse_patterns.search._tasks.FIELDS` (integers as pandas ``Int64``,
flags as ``boolean``, so a failed candidate's missing values stay missing)
and one column per family parameter after ``family``, named as the parameter
(``stride``, ``c``), or ``param_NAME`` where the name is also a field
(bigbird's ``block``, factorized's ``p``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis import Printable
from ._tasks import COSTS, FIELDS

__all__ = ["SearchResult", "COSTS"]
_FIELD_NAMES = tuple(name for name, _ in FIELDS)


def _param_column(name: str) -> str:
    return f"param_{name}" if name in _FIELD_NAMES else name


def _plain(value: Any) -> Any:
    """A JSON-ready scalar: pandas NA and NaN become None, numpy scalars Python ones."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    try:
        import pandas as pd  # noqa: PLC0415

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:  # pragma: no cover - pandas comes with the search extra
        pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class SearchResult(Printable):
    """The rows of a search, a pandas DataFrame underneath (:attr:`frame`).

    Parameters
    ----------
    rows : sequence of dict
        One row per candidate (the fields of ``FIELDS``), in grid order.
    settings : mapping
        What was searched (families, grid, ns, mode, measure, kernel shape).
    notes : sequence of str
        What happened on the way (a cache set aside, ...).
    cache : str, optional
        The cache file the rows were written to.
    computed, reused : int
        Candidates computed by this search, and read from the cache.

    Examples
    --------
    >>> rows = [{"key": "a", "family": "strided", "params": '{"stride": 4}', "n": 16,
    ...          "status": "ok", "ok": True, "max_hops": 2, "computed_flops": 900.0,
    ...          "measured": "verify,flops"},
    ...         {"key": "b", "family": "strided", "params": '{"stride": 8}', "n": 16,
    ...          "status": "ok", "ok": True, "max_hops": 2, "computed_flops": 700.0,
    ...          "measured": "verify,flops"}]
    >>> res = SearchResult(rows, settings={"grid": {"stride": [4, 8]}})
    >>> len(res), res.frame["stride"].tolist(), res.pareto().frame["key"].tolist()
    (2, [4, 8], ['b'])
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]], *, settings: Mapping[str, Any] | None = None,
                 notes: Sequence[str] = (), cache: str | None = None, computed: int = 0,
                 reused: int = 0) -> None:
        self.rows = [{**dict.fromkeys(_FIELD_NAMES), **r} for r in rows]
        self.settings = dict(settings or {})
        self.notes = list(notes)
        self.cache = cache
        self.computed, self.reused = int(computed), int(reused)
        self.frame = _frame(self.rows)

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, column: str) -> Any:
        return self.frame[column]

    def __repr__(self) -> str:
        c = self.counts()
        return (f"SearchResult({c['candidates']} candidates: {c['verified']} verified, "
                f"{c['failed']} not, {c['errors']} errors)")

    def counts(self) -> dict[str, int]:
        """Candidates; verified, failing a criterion, and errors; computed and cached."""
        st = [r["status"] for r in self.rows]
        return {"candidates": len(self.rows),
                "verified": sum(r["status"] == "ok" and r["ok"] is True for r in self.rows),
                "failed": sum(r["status"] == "ok" and r["ok"] is False for r in self.rows),
                "errors": st.count("error"), "computed": self.computed, "cached": self.reused}

    @property
    def errors(self) -> Any:
        """The rows whose task failed (``status == "error"``), with their ``error``."""
        return self.frame[self.frame["status"] == "error"]

    # ------------------------------------------------------------------ views
    def pareto(self, by: str = "computed_flops") -> SearchResult:
        """The cheapest verified candidates per n: the Pareto front of (``by``, max hops).

        Among the candidates that verified (both criteria) at each n, those
        that no other beats on both the cost ``by`` and the largest hop
        distance (fewer hops: information travels in fewer steps). Ties on
        both are all kept. Sorted by n, then by cost.

        Parameters
        ----------
        by : {"computed_flops", "useful_flops", "time_s", "nnz"}

        Returns
        -------
        SearchResult
            The front's rows (same settings and notes).
        """
        if by not in COSTS:
            raise ValueError(f"by: must be one of {', '.join(map(repr, COSTS))}; got {by!r}")
        keep = []
        by_n: dict[int, list[dict[str, Any]]] = {}
        for r in self.rows:
            if r["status"] == "ok" and r["ok"] is True and r.get(by) is not None:
                by_n.setdefault(int(r["n"]), []).append(r)
        for n in sorted(by_n):
            last: tuple[Any, Any] | None = None  # (cost, hops) of the last row kept
            for r in sorted(by_n[n], key=lambda r: (r[by], r["max_hops"])):
                pair = (r[by], r["max_hops"])
                if last is None or pair[1] < last[1] or pair == last:
                    keep.append(r)
                    last = pair
        return SearchResult(keep, settings=self.settings, notes=self.notes, cache=self.cache,
                            computed=self.computed, reused=self.reused)

    def label(self, row: Mapping[str, Any]) -> str:
        """A candidate's name: the family and the parameters the grid varies (``fixed stride=64 c=4``)."""
        params = json.loads(row["params"]) if row.get("params") else {}
        axes = self.settings.get("axes", {}).get(row["family"], self.settings.get("grid", {}))
        shown = [k for k in axes if k in params]
        parts = [str(row["family"])] + [f"{k}={params[k]}" for k in shown]
        if len(self.settings.get("blocks", ())) > 1:
            parts.append(f"block={row['block']}")
        return " ".join(parts)

    def _lines(self) -> tuple[list[str], list[list[str]]]:
        timed = any(r.get("time_s") is not None for r in self.rows)
        # a verified row's depth is its max hops: the column shows only beside other rows
        deep = any(r["ok"] is not True for r in self.rows)
        cols = (["candidate", "n", "ok"] + (["depth"] if deep else []) + ["hops", "max/root",
                "nnz", "GFLOP", "c/u"] + (["ms"] if timed else []))
        if any(r["status"] == "error" for r in self.rows):
            cols.append("error")
        lines = []
        for r in self.rows:
            err = r["status"] == "error"
            cells = [self.label(r), f"{r['n']:,}",
                     "error" if err else {True: "yes", False: "no", None: "-"}[r["ok"]]]
            if deep:
                cells.append(_num(r["depth"]))
            cells += [_num(r["max_hops"]), _num(r["max_over_root"], ".2f"), _count(r["nnz"]),
                      _num(_div(r["computed_flops"], 1e9), ".3g"), _num(r["flop_ratio"], ".2f")]
            if timed:
                cells.append(_num(_div(r["time_s"], 1e-3), ".3g"))
            if "error" in cols:
                cells.append(r["error"] or "")
            lines.append(cells)
        return cols, lines

    def table(self, title: str | None = None) -> Any:
        """The rows as a rich table (print it with ``rich.console.Console().print``).

        ``hops``: the largest hop distance; ``max/root``: ``max |A_i| / n^(1/p)`` of
        the union; ``GFLOP``: what the kernel computes (the plan's tiles) in one
        forward of the settings' shape; ``c/u``: its ratio to the pattern's own
        pairs; ``ms``: the forward's median time on the worker.

        Examples
        --------
        >>> SearchResult([], settings={}).text().splitlines()[0].strip()
        'Search: 0 candidates'
        """
        from rich import box  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415

        cols, lines = self._lines()
        c = self.counts()
        t = Table(title=title or f"Search: {c['candidates']} candidates", caption=self._caption(),
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
        for k, col in enumerate(cols):
            wide = max((len(cells[k]) for cells in lines), default=0) if k == 0 else None
            t.add_column(col, justify="left" if k == 0 or col == "error" else "right",
                         no_wrap=k == 0, min_width=wide)
        for cells in lines:
            t.add_row(*cells)
        return t

    def _caption(self) -> str:
        s = self.settings
        if not s.get("mode"):
            return ""
        return (f"mode={s['mode']}; max/root = max |A_i| / n^(1/p); GFLOP computed by the plan "
                f"(tiles {','.join(map(str, s.get('blocks', [])))}) in one forward, B={s.get('batch')} "
                f"H={s.get('heads')} d={s.get('head_dim')}; c/u = computed/useful")

    def to_markdown(self) -> str:
        """The rows as a GitHub markdown table.

        Examples
        --------
        >>> SearchResult([], settings={}).to_markdown().splitlines()[0]
        '| candidate | n | ok | hops | max/root | nnz | GFLOP | c/u |'
        """
        cols, lines = self._lines()
        out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in lines]
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """Settings, counts, notes, the cache path, every row (params as a dict) and the
        keys of the Pareto front (None when the rows were not verified), JSON-ready."""
        rows = []
        for r in self.rows:
            d = {k: _plain(v) for k, v in r.items()}
            d["params"] = json.loads(r["params"]) if r.get("params") else {}
            rows.append(d)
        verified = any(r["ok"] is not None for r in self.rows) or not self.rows
        return {"settings": self.settings, "counts": self.counts(), "cache": self.cache,
                "notes": self.notes, "rows": rows,
                "pareto": [r["key"] for r in self.pareto().rows] if verified else None}

    def plot(self, x: str = "max_hops", y: str = "computed_flops", ax: Any = None) -> Any:
        """Cost against max hops (or against n), the Pareto front drawn; returns the Axes.

        See :func:`sparse_patterns.search._plot.plot_search`.
        """
        from ._plot import plot_search  # noqa: PLC0415

        return plot_search(self, x=x, y=y, ax=ax)


def _div(value: Any, by: float) -> float | None:
    return None if value is None else value / by


def _num(value: Any, fmt: str = "") -> str:
    value = _plain(value)
    return "-" if value is None else format(value, fmt)


def _count(value: Any) -> str:
    """An integer for people: ``9,088`` as is, ``391,168`` -> ``'391k'``, ``2.1e6`` -> ``'2.1M'``.

    Examples
    --------
    >>> _count(9088), _count(391168), _count(2_097_152), _count(None)
    ('9,088', '391k', '2.1M', '-')
    """
    value = _plain(value)
    if value is None:
        return "-"
    if value < 10_000:
        return f"{value:,}"
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:,}"  # pragma: no cover - unreachable


def _frame(rows: list[dict[str, Any]]) -> Any:
    """The rows as a DataFrame: each field a column of its kind (nullable ``Int64`` and
    ``boolean``, ``float64``, objects), the candidate's parameters as columns after
    ``family``. Built column by column in one constructor (an ``astype`` per column
    after building from the rows took 3x as long: 3.7 against 1.3 ms for 48 rows, at
    the end of every search)."""
    import pandas as pd  # noqa: PLC0415

    kinds = {"int": "Int64", "bool": "boolean", "float": "float64"}
    parsed = [json.loads(r["params"]) if r.get("params") else {} for r in rows]
    names = list(dict.fromkeys(k for p in parsed for k in p))
    columns = {}
    for name, kind in FIELDS:
        columns[name] = pd.array([r[name] for r in rows], dtype=kinds.get(kind, object))
        if name == "family":
            for k in names:
                columns[_param_column(k)] = pd.array([p.get(k) for p in parsed], dtype=object)
    return pd.DataFrame(columns)
