"""What one candidate of a search computes: a pure function of its recipe.

A **recipe** is a plain dict that names one candidate completely: the family,
its resolved parameters, ``n``, the verification ``mode``, the plan's ``block``,
the kernel call's ``batch``, ``heads`` and ``head_dim``, and whether to search
the depth. :func:`recipe_key` hashes it together with the package version:
that key is the candidate's identity in the cache. :func:`run_candidate` turns
a recipe into one **row** (a flat dict of the fields in :data:`FIELDS`): it
builds the pattern from its rule, verifies it (the structured or streamed
check, never an ``n x n`` array), plans it and counts the plan's FLOPs (the
profiler's count, :meth:`~sparse_patterns.kernels.ExecutionPlan.flops`), and
optionally times the kernel's forward. It never raises for a bad candidate:
an exception becomes a row with ``status="error"`` and the message, so a grid
goes on past an invalid parameter combination.

Workers import this module by name (``sparse_patterns.search._tasks``), so the
package must be installed where the workers run. Memory per task is bounded:
inside a ``dask.distributed`` worker, :func:`sparse_patterns.config.memory_limit`
is lowered to half the worker's memory limit, so a candidate too big for its
worker is refused with a one-line error before it allocates.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

__all__ = ["MEASURES", "COSTS", "FIELDS", "TEXT_LIMIT", "recipe_key", "recipe_of", "clean_text",
           "run_candidate", "run_packed", "unpack_row", "normalize_measures", "kernel_mode"]

#: Most characters of a row's free text (an error message, a worker's name) that a search
#: keeps and prints: a message can quote a hostile value megabytes long.
TEXT_LIMIT = 300
#: Control characters (C0, DEL, C1) and the invisible marks that reorder text on a terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")

#: What a candidate can measure: the exact verification, the plan's FLOPs, the kernel's time.
MEASURES = ("verify", "flops", "time")

#: Every field of a row and its kind (``str``, ``int``, ``float``, ``bool``), in column order.
#: Columns :meth:`SearchResult.pareto` and :meth:`SearchResult.plot` can take as the cost.
COSTS = ("computed_flops", "useful_flops", "time_s", "nnz")

FIELDS: tuple[tuple[str, str], ...] = (
    ("key", "str"), ("version", "str"), ("family", "str"), ("params", "str"), ("n", "int"),
    ("mode", "str"), ("kernel_mode", "str"), ("block", "int"), ("batch", "int"),
    ("heads", "int"), ("head_dim", "int"), ("depth_search", "str"), ("measured", "str"),
    ("status", "str"), ("error", "str"),
    # the verification (analysis.verify)
    ("ok", "bool"), ("criterion1", "bool"), ("criterion2", "bool"), ("p", "int"),
    ("depth", "int"), ("depth_checked", "bool"), ("max_hops", "int"), ("unreachable", "int"),
    ("not_in_last", "int"), ("method", "str"),
    # |A_i| of the union against n^(1/p) (analysis.budgets)
    ("max_row", "int"), ("mean_row", "float"), ("root", "float"), ("max_over_root", "float"),
    ("mean_over_root", "float"), ("nnz", "int"),
    # the kernel's plan (kernels.plan), forward FLOPs of one (batch, heads, n, head_dim) call
    ("useful_flops", "float"), ("computed_flops", "float"), ("flop_ratio", "float"),
    ("tiles", "int"), ("pieces", "int"),
    # the kernel's forward on the worker (kernels.attention), median of `repeats` calls
    ("time_s", "float"), ("time_first_s", "float"), ("repeats", "int"),
    # bookkeeping
    ("verify_s", "float"), ("plan_s", "float"), ("seconds", "float"), ("worker", "str"),
    ("finished", "str"),
)

#: The fields a candidate computes (cleared when it fails).
RESULTS = tuple(name for name, _ in FIELDS[[f for f, _ in FIELDS].index("ok"):])


def normalize_measures(measure: Any) -> tuple[str, ...]:
    """``measure`` as a tuple in :data:`MEASURES` order; ``"time"`` implies ``"flops"``.

    Examples
    --------
    >>> normalize_measures(["time"]), normalize_measures("verify")
    (('flops', 'time'), ('verify',))
    """
    items = [measure] if isinstance(measure, str) else measure
    try:
        items = list(items)
    except TypeError:
        raise TypeError(f"measure: expected a sequence of {', '.join(MEASURES)}, got "
                        f"{type(measure).__name__}") from None
    for m in items:
        if m not in MEASURES:
            raise ValueError(f"measure: unknown measure {m!r}; valid: {', '.join(MEASURES)}")
    if not items:
        raise ValueError(f"measure: give at least one of {', '.join(MEASURES)}")
    got = set(items) | ({"flops"} if "time" in items else set())
    return tuple(m for m in MEASURES if m in got)


def kernel_mode(mode: str) -> str:
    """The plan's mode for a verification mode: ``merged`` stays, the others run ``multihead``.

    An interleaved layer uses one pattern head per step; over the ``p`` layers
    its attention heads cost what ``multihead`` (head ``h`` uses pattern head
    ``h mod p``) costs in one layer, so both are planned as ``multihead``.

    Examples
    --------
    >>> kernel_mode("interleaved"), kernel_mode("merged")
    ('multihead', 'merged')
    """
    return "merged" if mode == "merged" else "multihead"


def recipe_key(recipe: Mapping[str, Any], version: str) -> str:
    """The cache key of a candidate: a hash of its recipe (canonical JSON) and the version.

    Examples
    --------
    >>> r = {"family": "strided", "params": {"stride": 4}, "n": 16}
    >>> recipe_key(r, "0.1.0") == recipe_key(dict(reversed(list(r.items()))), "0.1.0")
    True
    >>> recipe_key(r, "0.1.0") == recipe_key(r, "0.2.0")
    False
    """
    text = json.dumps({"recipe": recipe, "version": version}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def recipe_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe a row says it computed (its ``key`` must be :func:`recipe_key` of it).

    Examples
    --------
    >>> r = {"family": "strided", "params": {"stride": 4}, "n": 16, "mode": "interleaved",
    ...      "block": 4, "batch": 1, "heads": 2, "head_dim": 8, "depth": None}
    >>> recipe_of(_blank(r, "0.1.0", ("verify",))) == r
    True
    """
    depth = {"none": None, "true": True, "false": False}[row["depth_search"]]
    return {"family": row["family"], "params": json.loads(row["params"]), "n": row["n"],
            "mode": row["mode"], "block": row["block"], "batch": row["batch"],
            "heads": row["heads"], "head_dim": row["head_dim"], "depth": depth}


def clean_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` fit to print: control characters made spaces, cut to ``limit`` characters.

    Examples
    --------
    >>> clean_text("a\\x1b[31mb\\nc"), clean_text("9" * 500, 8)
    ('a [31mb c', '99999999... (500 characters)')
    """
    head = _CONTROL.sub(" ", text[: limit + 1])
    return head if len(text) <= limit else f"{head[:limit]}... ({len(text):,} characters)"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return clean_text(lines[0]) if lines else type(exc).__name__


def _worker_memory_limit() -> int | None:
    """The memory limit of the dask worker running this task, or None outside one."""
    try:
        from distributed import get_worker  # noqa: PLC0415

        limit = get_worker().memory_manager.memory_limit
    except (ImportError, ValueError, AttributeError):
        return None
    return int(limit) if limit else None


def _memory_scope() -> contextlib.AbstractContextManager[Any]:
    """Half the worker's memory limit as the package's memory limit, when lower."""
    from .. import config  # noqa: PLC0415

    limit = _worker_memory_limit()
    if limit is None or limit // 2 >= config.get_memory_limit():
        return contextlib.nullcontext()
    return config.memory_limit(max(1, limit // 2))


def _blank(recipe: Mapping[str, Any], version: str, measured: Iterable[str]) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(name for name, _ in FIELDS)
    row.update(
        key=recipe_key(recipe, version), version=version, family=recipe["family"],
        params=json.dumps(recipe["params"]), n=int(recipe["n"]),
        mode=recipe["mode"], kernel_mode=kernel_mode(recipe["mode"]), block=int(recipe["block"]),
        batch=int(recipe["batch"]), heads=int(recipe["heads"]),
        head_dim=int(recipe["head_dim"]), depth_search=str(recipe.get("depth")).lower(),
        measured=",".join(measured), worker=f"{socket.gethostname()}:{os.getpid()}",
    )
    return row


def run_candidate(recipe: Mapping[str, Any], version: str, measure: Iterable[str] = ("verify", "flops"),
                  *, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """Compute one candidate's row: criteria, depth, hops, budgets, FLOPs, optionally time.

    Parameters
    ----------
    recipe : mapping
        ``family``, ``params`` (resolved), ``n``, ``mode`` (of the verification),
        ``block``, ``batch``, ``heads``, ``head_dim`` and ``depth`` (None, True
        or False, as :func:`~sparse_patterns.analysis.verify` takes it).
    version : str
        The package version the row is keyed with: the version installed here
        (``RuntimeError`` otherwise, so that no row mixes versions).
    measure : iterable of str
        Among :data:`MEASURES`.
    repeats : int
        Timed calls of the kernel after one warm-up call (with ``"time"``).
    seed : int
        Seed of the kernel's random ``q, k, v`` (with ``"time"``).

    Returns
    -------
    dict
        One row: every name of :data:`FIELDS`. ``status`` is ``"ok"``, or
        ``"error"`` with ``error`` holding ``"ExceptionType: message"``; fields
        not measured are None.

    Examples
    --------
    >>> r = {"family": "strided", "params": {"stride": 4}, "n": 16, "mode": "interleaved",
    ...      "block": 4, "batch": 1, "heads": 2, "head_dim": 8, "depth": None}
    >>> from sparse_patterns import __version__
    >>> row = run_candidate(r, __version__)
    >>> row["status"], row["ok"], row["max_hops"], row["useful_flops"] == 4 * 8 * (70 + 40)
    ('ok', True, 2, True)
    >>> run_candidate({**r, "family": "fixed", "params": {"stride": 4, "c": 8}}, __version__)["error"]
    'ValueError: c: must be an integer [1, 4], got 8'
    """
    from .. import __version__  # noqa: PLC0415

    if version != __version__:  # raised, not a row: the search stops (see search._outcome)
        raise RuntimeError(f"this worker has sparse-patterns {__version__}, the search "
                           f"{version}")
    measured = normalize_measures(list(measure))
    t0 = time.perf_counter()
    row = _blank(recipe, version, measured)
    try:
        with _memory_scope():
            _compute(row, recipe, measured, repeats, seed)
        row["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - one candidate failing must not lose the grid
        row.update(dict.fromkeys(RESULTS))
        row["status"] = "error"
        row["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
    row["seconds"] = time.perf_counter() - t0
    row["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    row["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return row


def run_packed(recipe: Mapping[str, Any], version: str,
               measure: Iterable[str] = ("verify", "flops"), *, repeats: int = 3,
               seed: int = 0) -> str:
    """:func:`run_candidate`'s row as one JSON text: what a search's task returns.

    A row is about 50 fields of plain values; as a dict, a dask worker measures and
    serializes it field by field, 0.6-0.9 ms of the worker's CPU per task more than one
    string costs (500 tasks on this 2-core machine's local cluster), and the
    candidates of a grid at n = 16,384 take about 18 ms each. NaN and infinities pass
    as JSON's ``NaN`` and ``Infinity`` (:func:`unpack_row` reads them back).

    Examples
    --------
    >>> r = {"family": "strided", "params": {"stride": 4}, "n": 16, "mode": "interleaved",
    ...      "block": 4, "batch": 1, "heads": 2, "head_dim": 8, "depth": None}
    >>> from sparse_patterns import __version__
    >>> row = unpack_row(run_packed(r, __version__))
    >>> row["status"], row["max_hops"], sorted(row) == sorted(name for name, _ in FIELDS)
    ('ok', 2, True)
    """
    return json.dumps(run_candidate(recipe, version, measure, repeats=repeats, seed=seed),
                      separators=(",", ":"))


def unpack_row(text: str) -> dict[str, Any]:
    """The row that :func:`run_packed` returned as JSON, its free text cleaned
    (:func:`clean_text`: a worker elsewhere is not trusted to print on this terminal)."""
    row = json.loads(text)
    if not isinstance(row, dict):
        raise ValueError(f"workers: a task returned a {type(row).__name__}, not a search row")
    for name in ("error", "worker", "method", "finished"):
        if isinstance(row.get(name), str):
            row[name] = clean_text(row[name])
    return row


def _compute(row: dict[str, Any], recipe: Mapping[str, Any], measured: tuple[str, ...],
             repeats: int, seed: int) -> None:
    from ..analysis.budget import budgets  # noqa: PLC0415
    from ..patterns import registry  # noqa: PLC0415

    pat = registry.make(recipe["family"], int(recipe["n"]), **recipe["params"])
    if "verify" in measured:
        from ..analysis import verify  # noqa: PLC0415

        t = time.perf_counter()
        rep = verify(pat, mode=recipe["mode"], depth=recipe.get("depth"))
        row["verify_s"] = time.perf_counter() - t
        row.update(ok=rep.ok, criterion1=rep.criterion1, criterion2=rep.criterion2, p=rep.p,
                   depth=rep.depth, depth_checked=rep.depth_checked, max_hops=rep.max_hops,
                   unreachable=rep.unreachable, not_in_last=rep.not_in_last, method=rep.method)
        union = rep.budgets[-1]
    else:
        union = budgets(pat)[-1]
        row["p"] = pat.num_heads
    row.update(max_row=union.max_row, mean_row=union.mean_row, root=union.root,
               max_over_root=union.max_over_root, mean_over_root=union.mean_row / union.root,
               nnz=union.nnz)
    if "flops" not in measured:
        return
    from ..kernels import plan  # noqa: PLC0415

    t = time.perf_counter()
    pl = plan(pat, block=int(recipe["block"]), mode=kernel_mode(recipe["mode"]), cache=False)
    row["plan_s"] = time.perf_counter() - t
    useful, computed = pl.flops(int(recipe["batch"]), int(recipe["heads"]),
                                int(recipe["head_dim"]))
    row.update(useful_flops=float(useful), computed_flops=float(computed),
               flop_ratio=computed / useful if useful else 1.0, tiles=pl.num_tiles,
               pieces=pl.num_pieces)
    if "time" in measured:
        row["time_first_s"], row["time_s"] = _time_forward(pl, recipe, repeats, seed)
        row["repeats"] = int(repeats)


def _time_forward(pl: Any, recipe: Mapping[str, Any], repeats: int, seed: int
                  ) -> tuple[float, float]:
    """``(first call, median of repeats)`` seconds of the CPU kernel's forward on ``pl``."""
    import numpy as np  # noqa: PLC0415

    from .. import config  # noqa: PLC0415
    from ..kernels import attention  # noqa: PLC0415

    shape = (int(recipe["batch"]), int(recipe["heads"]), int(recipe["n"]), int(recipe["head_dim"]))
    need = 4 * int(np.prod(shape, dtype=np.int64)) * 4  # q, k, v and the output, float32
    if need > config.get_memory_limit():
        raise config.MemoryLimitError(
            f"time: the kernel's q, k, v and output ({' x '.join(map(str, shape))} float32) "
            f"need {config.format_bytes(need)}, above the memory limit of "
            f"{config.format_bytes(config.get_memory_limit())}; measure without 'time' or "
            "use fewer heads")
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    t = time.perf_counter()
    attention(q, k, v, pl, mode=pl.mode)
    first = time.perf_counter() - t
    times = []
    for _ in range(max(1, int(repeats))):
        t = time.perf_counter()
        attention(q, k, v, pl, mode=pl.mode)
        times.append(time.perf_counter() - t)
    return first, float(np.median(times))
