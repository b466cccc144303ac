"""Search a grid of pattern parameters on a Dask cluster: criteria, hops, FLOPs, time.

:func:`search` expands families x parameter grid x sequence lengths into
candidates and runs every candidate as one task on a ``dask.distributed``
cluster (a :class:`~distributed.LocalCluster` over this machine's cores by
default, or the ``Client`` / scheduler address given). A task
(:func:`~sparse_patterns.search._tasks.run_packed`, around
:func:`~sparse_patterns.search._tasks.run_candidate`) verifies the paper's two
criteria exactly, with the depth to full connectivity and the largest hop
distance, reads ``|A_i|`` against ``n^(1/p)`` and nnz, plans the kernel and
counts its useful and computed FLOPs, and optionally times its forward on the
worker. The rows come back as a :class:`SearchResult` (a pandas DataFrame
underneath, with ``pareto()``, ``table()``, ``to_dict()`` and ``plot()``).

Nothing is lost: with ``cache=PATH`` every row is written as its task finishes
(Parquet or JSON lines, keyed by the candidate's recipe and the package
version; the rows that finish within 0.2 s of one another are fetched in one
go, and Ctrl-C fetches those finished before it), and a search run again
after Ctrl-C, a killed worker or a lost scheduler computes only what the file
does not hold. A candidate that fails (an invalid parameter combination, out
of memory) is a row with its error; the search goes on. Tasks lost with a
worker (``client.restart()``, a killed process) are submitted again. At most
:data:`_IN_FLIGHT` tasks are out at a time, so a grid of 100,000 candidates
schedules, resumes and stops (Ctrl-C) as promptly as a small one; a cluster
left without a worker, or a scheduler that stops answering, ends the search
with one line saying what is saved (:mod:`._cluster` checks the cluster it is
given or starts).

This subpackage imports dask, distributed and pandas (the ``search`` extra);
``import sparse_patterns`` does not. The subpackage is callable:
``sparse_patterns.search(...)`` is :func:`search` (the package attribute names the
subpackage as soon as anything imports it, so the module itself must search).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .. import __version__
from ..util.checks import MAX_N, check_bool, check_choice, check_int
from ..util.modes import MODES
from ._cache import open_cache
from ._cluster import WORKER_ENV, check_not_bootstrapping, close_all
from ._cluster import connect as _connect
from ._grid import MAX_CANDIDATES, _families, _grid, _ints, _recipes
from ._plot import X_AXES as PLOT_AXES
from ._result import SearchResult
from ._tasks import MEASURES, normalize_measures, recipe_key, run_packed, unpack_row

__all__ = ["search", "SearchResult", "SearchInterrupted", "MEASURES", "WORKER_ENV", "PLOT_AXES",
           "MAX_CANDIDATES"]

#: Seconds between two fetches of finished rows: those that finish meanwhile come in one
#: gather. A fetch costs the client and the workers 1-2 ms of CPU; one a row was 8% of a grid
#: of 48 candidates of 17 ms each on 2 cores. A row waits at most this long on its worker.
_FETCH_EVERY = 0.2
#: Share of a local cluster's expected cost (:func:`_cost`) left to its shortest tasks, which
#: form one dask task group: dask queues it (more than 2 x the threads) and hands its tasks to
#: the workers one at a time as they run out, so that both finish within a short task of each
#: other. The tasks before it each get a group of their own and go to the workers at once,
#: as many to each, whose sums differed by up to 230 ms (medians of 8-10 grids 29-91 ms) on
#: a 48-candidate grid of 0.5 s on 2 workers: the expected costs order the tasks well but do
#: not weigh them exactly, and work stealing acts too late. Measured (10 grids a setting,
#: alternated, 3 runs): the workers' last tasks ended 2-6 ms apart (medians) against 29-46,
#: and a grid's median wall time was 1-6% less; with 0.35, 0.567 s against 0.571.
_QUEUED_TAIL = 0.1
#: Most tasks of a search submitted and not yet fetched: the rest wait here, in order
#: (longest first), and go out in chunks as these finish. 100,000 futures at once kept the
#: client's and the scheduler's loops busy for minutes (as_completed, cancel); a bounded
#: number keeps each round trip, Ctrl-C and a lost worker's resubmission short.
_IN_FLIGHT = 2000
#: Seconds between two checks, while no row comes, that the cluster still has a worker.
_CHECK_EVERY = 1.0
#: Seconds without an answer from the scheduler (nor a row) after which it counts as gone.
_SCHEDULER_SILENT = 60.0


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`search`: what was saved, and where (the search resumes from it)."""

    def __init__(self, saved: int, total: int, cache: str | None) -> None:
        where = (f"{saved} of {total} candidates are saved in {cache}; run again to resume"
                 if cache else f"{saved} of {total} candidates were done; no cache was given")
        super().__init__(f"search interrupted: {where}")
        self.saved, self.total, self.cache = saved, total, cache


# ----------------------------------------------------------------------------- the tasks
def _lost_row(rec: Mapping[str, Any], measured: tuple[str, ...], why: str) -> dict[str, Any]:
    """The row of a candidate whose task never returned (its worker died, every retry):
    made here, without a worker, and never cached."""
    from ._tasks import _blank  # noqa: PLC0415

    row = _blank(rec, __version__, measured)
    row.update(status="error", error=why, worker=None)
    return row


def _run(client: Any, todo: list[dict[str, Any]], cache: Any, measured: tuple[str, ...],
         task_kw: dict[str, Any], retries: int, done: Callable[[dict[str, Any]], None],
         grouped: bool = True, timeout: float = 10.0) -> None:
    """Run ``todo`` on ``client``; hand each row to ``done`` (and ``cache``) as it arrives.

    ``grouped``: the tasks form one dask task group, ``search`` (a given cluster: dask's
    queuing, one progress bar on its dashboard); else a group each (the local cluster), but
    for the shortest ones (:data:`_QUEUED_TAIL` of the expected cost), which form one group
    that dask queues. At most :data:`_IN_FLIGHT` tasks are submitted at a time (longest
    first, topped up as they finish). ``ConnectionError`` when the cluster has had no worker
    for ``timeout`` seconds, or the scheduler is lost."""
    from distributed import as_completed  # noqa: PLC0415

    futures: dict[Any, tuple[dict[str, Any], str]] = {}
    attempts: dict[str, int] = {}
    run = uuid.uuid4().hex[:8]  # task keys of one run never meet those of another
    lost: list[str] = []  # keys of tasks lost with their workers (done again under new keys)

    def task_key(rec: dict[str, Any], queued: bool) -> tuple[str, str]:
        key = recipe_key(rec, __version__)
        k = attempts[key] = attempts.get(key, 0) + 1
        # One group (dask's key_split stops at the run, 8 hex characters): the scheduler
        # holds back a large group's tasks ("root-ish", queued) and hands them out in
        # priority order (longest first) as workers free up. (With a group a family, a
        # family's group of at most 2 x the threads was not queued: it went out at once and
        # ran ahead of longer queued tasks.) A group each ("search_<hash>"), on the local
        # cluster: the tasks go to the workers at once, each starting its own in priority
        # order; queuing cost the scheduler's process and the workers' loops about 0.5 ms
        # of CPU a task more, on the two cores that run the tasks. The shortest ones there
        # (``queued``) form one group, which dask queues: see _QUEUED_TAIL.
        if queued:
            return key, f"search-{run}-{key[:12]}-{rec['family']}-{k}"
        return key, f"search_{key[:12]}-{run}-{rec['family']}-{k}"

    def rank(recs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], bool]]:
        """``recs`` longest first, each with whether it goes to the queued tail: the
        scheduler starts them in that order, so that no long task is left alone at the end."""
        ranked = sorted(((_cost(rec), i, rec) for i, rec in enumerate(recs)),
                        key=lambda x: (-x[0], x[1]))
        tail = len(ranked) if grouped else _queued_tail([cost for cost, _, _ in ranked])
        return [(rec, grouped or i >= tail) for i, (_, _, rec) in enumerate(ranked)]

    def submit(ranked: list[tuple[dict[str, Any], bool]]) -> list[Any]:
        # one graph for them all (one message to the scheduler, not one a task)
        recs = [rec for rec, _ in ranked]
        keys = [task_key(rec, queued) for rec, queued in ranked]
        futs = client.map(run_packed, recs, key=[k for _, k in keys], pure=False,
                          version=__version__, measure=measured, **task_kw)
        futures.update(zip(futs, zip(recs, (key for key, _ in keys), strict=True), strict=True))
        return futs

    waiting = rank(todo)  # not submitted yet, longest first
    waiting.reverse()  # popped from the end

    def top_up() -> None:
        """Submit the next waiting tasks once fewer than half of :data:`_IN_FLIGHT` are out."""
        room = _IN_FLIGHT - len(futures)
        if waiting and (room >= _IN_FLIGHT // 2 or not futures):
            chunk = [waiting.pop() for _ in range(min(max(1, room), len(waiting)))]
            ac.update(submit(chunk))

    def take(batch: list[Any]) -> None:
        """Fetch the rows of ``batch`` (finished futures) in one gather and hand them on;
        submit those lost with their workers (restart, killed process) again."""
        again = []
        try:
            for fut, value in _results(client, batch):
                rec, key = futures.pop(fut)
                row = _outcome(fut, rec, measured) if value is None else value
                if row is None:
                    lost.append(fut.key)
                    if attempts[key] <= retries:
                        again.append(rec)
                        continue
                    row = _lost_row(rec, measured, f"CancelledError: lost {attempts[key]} times "
                                    "with its worker (restarted or killed)")
                if cache is not None and row["worker"] is not None:  # computed by a worker
                    cache.add(row)
                done(row)
        finally:  # a traceback keeps this frame: let it hold no future
            fut = batch = None  # noqa: F841
        if again:  # as one graph again, longest first
            if client.status in ("closing", "closed"):
                raise ConnectionError("scheduler: the connection to the scheduler was lost")
            ac.update(submit(rank(again)))

    ac = as_completed([], loop=client.loop)
    top_up()
    held: list[Any] = []  # finished, their rows not fetched yet
    batch: list[Any] = []
    watch = _Watch(client, timeout)
    try:
        fetched = -_FETCH_EVERY
        while True:
            held += ac.next_batch(block=False)
            if not held and ac.is_empty() and not waiting:
                break
            wait = fetched + _FETCH_EVERY - time.monotonic()
            if held and (wait <= 0 or ac.is_empty()):
                batch, held = held, []
                fetched = time.monotonic()
                take(batch)
                watch.progress()
                top_up()
            else:
                _wait(ac, min(wait, 0.1) if held else 0.1)
                if not held:
                    watch.check()
    except KeyboardInterrupt:  # what finished before Ctrl-C reaches the cache
        with contextlib.suppress(Exception):
            held += ac.next_batch(block=False)
            if held:
                batch, held = held, []
                take(batch)
        raise
    finally:
        if futures and grouped:  # a given cluster goes on; ours is closed next, at once
            try:
                client.cancel(list(futures))
            except Exception:  # noqa: BLE001, S110 - the scheduler may be gone
                pass
        _release(client, lost)
        # a traceback keeps this frame: hold no future, so the scheduler can forget them all
        futures.clear()
        ac.clear()
        held = batch = []  # noqa: F841


class _Watch:
    """While no row comes, ask the scheduler every :data:`_CHECK_EVERY` seconds how many
    workers it has, without waiting for the answer (a busy scheduler is slow, not gone):
    ``ConnectionError`` when it has had none for ``timeout`` seconds (workers killed as
    they start), when it has not answered for :data:`_SCHEDULER_SILENT` seconds (or
    ``timeout``, if longer), or when the connection is lost, instead of waiting forever
    for rows no one computes."""

    def __init__(self, client: Any, timeout: float) -> None:
        self.client, self.timeout = client, timeout
        self.asked = self.answered = self.seen = time.monotonic()
        self.pending: Any = None  # a concurrent.futures.Future of the scheduler's answer

    def progress(self) -> None:
        self.answered = self.seen = time.monotonic()

    def check(self) -> None:
        import asyncio  # noqa: PLC0415

        now = time.monotonic()
        if self.client.status in ("closing", "closed"):
            raise ConnectionError("scheduler: the connection to the scheduler was lost")
        if self.pending is not None and self.pending.done():
            try:
                workers = len(self.pending.result())
            except Exception as exc:  # noqa: BLE001 - CommClosedError, OSError: gone
                raise ConnectionError(f"scheduler: the connection to the scheduler was lost "
                                      f"({type(exc).__name__})") from None
            finally:
                self.pending = None
            self.answered = now
            if workers:
                self.seen = now
        if now - self.seen >= self.timeout and self.answered > self.seen:
            raise ConnectionError(f"workers: none left for {self.timeout:g} s (killed as they "
                                  "start? out of memory? see the workers' logs)")
        silent = max(_SCHEDULER_SILENT, self.timeout)
        if now - self.answered >= silent:
            raise ConnectionError(f"scheduler: no answer for {silent:g} s")
        if self.pending is None and now - self.asked >= _CHECK_EVERY:
            self.asked = now
            self.pending = asyncio.run_coroutine_threadsafe(
                self.client.scheduler.ncores(), self.client.loop.asyncio_loop)


def _queued_tail(costs: list[int], share: float = _QUEUED_TAIL) -> int:
    """Where the queued tail of a local cluster's tasks starts: the first index of the
    shortest tasks (``costs`` in decreasing order) whose expected costs add up to at most
    ``share`` (:data:`_QUEUED_TAIL`) of the total.

    Examples
    --------
    >>> _queued_tail([50, 30, 8, 6, 4, 2], 0.1), _queued_tail([5, 5], 0.1), _queued_tail([], 0.1)
    (4, 2, 0)
    """
    limit, acc, i = share * sum(costs), 0, len(costs)
    while i > 0 and acc + costs[i - 1] <= limit:
        i -= 1
        acc += costs[i]
    return i


def _wait(ac: Any, timeout: float) -> None:
    """Wait until a future of ``ac`` (an ``as_completed``) finishes, at most ``timeout``
    seconds."""
    cond = getattr(ac, "thread_condition", None)  # notified each time a future finishes
    if cond is None:  # not in this version of distributed: poll
        time.sleep(min(max(0.0, timeout), 0.01))
        return
    with cond:
        if not ac.has_ready():
            cond.wait(timeout=max(0.0, timeout))


def _cost(rec: dict[str, Any]) -> int:
    """A task's expected cost, to run the longest first: its pattern's entries (closed form,
    no CSR), which is what verifying and planning it walks; 0 for an invalid candidate.

    Examples
    --------
    >>> rec = {"family": "strided", "params": {"stride": 4}, "n": 16}
    >>> _cost(rec), _cost({**rec, "n": 64}) > _cost(rec), _cost({**rec, "params": {"stride": 0}})
    (110, True, 0)
    """
    from ..patterns import registry  # noqa: PLC0415

    try:
        return int(sum(registry.make(rec["family"], int(rec["n"]), **rec["params"]).head_nnz))
    except Exception:  # noqa: BLE001 - the task reports the error in its row
        return 0


def _release(client: Any, keys: list[str]) -> None:
    """Release ``keys`` on the scheduler again: a task that finishes on a worker while
    ``client.restart()`` runs can come back to the scheduler's memory held for this client,
    which no longer has a future for it (seen: 11 of 12 rows of a search restarted at its
    first row, held until the client closed). A future made and dropped sends the release."""
    if not keys:
        return
    from distributed import Future  # noqa: PLC0415

    with contextlib.suppress(Exception):  # the scheduler may be gone
        for key in keys:
            Future(key, client)


def _results(client: Any, batch: list[Any]) -> list[tuple[Any, dict[str, Any] | None]]:
    """``(future, row or None)`` for each future of ``batch``: the rows of the finished ones
    fetched in one gather (one round trip instead of one a row); None for the others, and
    for all of them if that gather fails (a worker lost meanwhile): :func:`_outcome` then
    looks at each."""
    finished = [f for f in batch if f.status == "finished"]
    try:
        rows = ({f: unpack_row(text) for f, text in zip(finished, client.gather(finished),
                                                         strict=True)}
                if finished else {})
    except Exception:  # noqa: BLE001 - sorted out future by future in _outcome
        rows = {}
    return [(f, rows.get(f)) for f in batch]


def _outcome(fut: Any, rec: dict[str, Any], measured: tuple[str, ...]) -> dict[str, Any] | None:
    """The row a finished future holds, an error row, or None when it was lost.

    :func:`~._tasks.run_candidate` turns a candidate's own failure into its row (a task
    returns it as JSON, :func:`~._tasks.run_packed`), so a task that
    raises failed around it: its worker died every time it ran it (``KilledWorker``:
    an error row, computed again by the next search), or the workers cannot run
    this package (not installed, another version): ``OSError``, the search stops.
    """
    from distributed import KilledWorker  # noqa: PLC0415

    if fut.status == "finished":
        return unpack_row(fut.result())
    if fut.status == "error":
        exc = fut.exception()
        if isinstance(exc, KilledWorker):
            return _lost_row(rec, measured, "KilledWorker: every worker that ran it died "
                             "(out of memory? see the workers' logs)")
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise OSError(f"workers: cannot run a search task ({type(exc).__name__}: {msg}); "
                      f"install sparse-patterns {__version__} with its search extra where the "
                      "workers run")
    return None


# ----------------------------------------------------------------------------- search
def search(
    families: str | Sequence[str],
    grid: Mapping[str, Any] | None,
    ns: int | Iterable[int],
    *,
    mode: str = "interleaved",
    measure: str | Sequence[str] = ("verify", "flops"),
    client: Any = None,
    cache: str | os.PathLike[str] | None = None,
    block: int | Iterable[int] = 32,
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    repeats: int = 3,
    depth: bool | None = None,
    workers: int | None = None,
    timeout: float = 10.0,
    retries: int = 3,
    retry_errors: bool = False,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Verify, plan and optionally time every candidate of a parameter grid on Dask.

    Parameters
    ----------
    families : str or sequence of str
        Registered family names (``patterns list``).
    grid : mapping of str to a value or a list of values, or None
        Parameter name -> values. A name applies to every family that takes
        it (and must be taken by one); a family's candidates are the product
        of its names' values. Values are Python values of the parameter's
        type, or text as on the command line (``"sqrt"`` follows n).
    ns : int or iterable of int
        Sequence lengths, each in ``[1, 2**31 - 1]``.
    mode : {"interleaved", "merged", "multihead"}
        How the heads combine across steps in the verification; the kernel
        runs ``merged`` for ``merged`` and ``multihead`` otherwise.
    measure : sequence of {"verify", "flops", "time"}
        ``verify``: the exact criteria, depth and hops; ``flops``: the plan's
        useful and computed FLOPs; ``time``: the kernel's forward on the worker
        (implies ``flops``). ``|A_i|`` and nnz come with either.
    client : None, distributed.Client or str
        None: a LocalCluster of ``workers`` processes (default: one per core),
        one thread each, closed afterwards (call it under ``if __name__ ==
        "__main__":`` in a script: the workers import the script again). An
        open, synchronous Client is used as it is (a closed one is a
        ``ValueError``); a scheduler address (``tcp://HOST:8786``) is connected
        to within ``timeout`` seconds (and must have a worker by then).
    cache : path, optional
        ``.parquet`` or ``.jsonl``: rows are written as tasks finish (within
        0.2 s), and the candidates it holds (same recipe, same package version,
        at least these measures) are not computed again. A file of another
        version is left as it is and a new one is started beside it; a file
        that is not a search cache is refused; a row that contradicts its key
        is never used (said in ``notes``, computed again).
    block : int or iterable of int
        Tile size(s) of the kernel's plan, in ``[1, 4096]`` (a grid axis too).
    batch, heads, head_dim : int
        The kernel call whose FLOPs (and time) are counted: ``(batch, heads, n, head_dim)``.
    repeats : int
        Timed kernel calls after a warm-up (``time``), in ``[1, 1000]``.
    depth : bool, optional
        As :func:`~sparse_patterns.analysis.verify`: search the steps full
        connectivity needs when a criterion fails (None: when cheap).
    workers : int, optional
        Processes of the local cluster (only when ``client`` is None), in ``[1, 256]``.
    timeout : float
        Seconds to reach a scheduler address (and to find a worker on it), and
        the longest wait, while no row comes, on a cluster with no worker left.
    retries : int
        Times a task lost with its worker is submitted again, in ``[0, 100]``.
    retry_errors : bool
        Compute again the cached rows that hold an error.
    seed : int
        Seed of the kernel's random inputs (``time``).
    progress : callable, optional
        ``progress(done, total)`` after every finished candidate (and once at
        the start, counting the cached ones).

    Returns
    -------
    SearchResult

    Raises
    ------
    ValueError
        An unknown family, mode or measure, a grid name no family takes, a
        value out of range, an empty list, a malformed scheduler address, a
        closed or asynchronous Client, a cache path that is not a regular file
        (a FIFO, a device), a file that is not a search cache, a cache above the
        load limit, or a cache another search is writing (before any cluster
        starts).
    TypeError
        A grid value of the wrong type (a float for an integer parameter).
    ConnectionError
        A scheduler address not reached within ``timeout`` seconds (or what
        answers is not a Dask scheduler), a scheduler lost, or no worker left
        for ``timeout`` seconds; the message says what is saved, and where.
    RuntimeError
        The local cluster did not start; or this runs in a worker process
        importing a script that calls ``search()`` without an ``if __name__ ==
        "__main__":`` guard (the message names the guard).
    SearchInterrupted
        Ctrl-C (a ``KeyboardInterrupt``); what finished is in the cache.

    Examples
    --------
    >>> import sparse_patterns.search as sps_search
    >>> res = sps_search.search("fixed", {"stride": [8, 16], "c": 2}, 256, block=8, workers=1)
    >>> res.frame[["stride", "c", "ok", "max_hops"]].to_numpy().tolist()
    [[8, 2, True, 2], [16, 2, True, 2]]
    >>> res.pareto().frame["stride"].tolist()  # the cheaper of the two
    [16]
    """
    check_not_bootstrapping()  # a script without a main guard, run again in a worker
    fams = _families(families)
    ns_list = _ints("ns", ns, 1, MAX_N)
    blocks = _ints("block", block, 1, 4096)
    axes, per_family = _grid(fams, grid, ns_list)
    mode = check_choice("mode", mode, MODES)
    measured = normalize_measures(measure)
    fixed = {"mode": mode, "batch": check_int("batch", batch, 1, 1 << 16),
             "heads": check_int("heads", heads, 1, 1 << 16),
             "head_dim": check_int("head_dim", head_dim, 1, 1 << 14),
             "depth": None if depth is None else check_bool("depth", depth)}
    task_kw = {"repeats": check_int("repeats", repeats, 1, 1000),
               "seed": check_int("seed", seed, 0, 2**63 - 1)}
    retries = check_int("retries", retries, 0, 100)
    retry_errors = check_bool("retry_errors", retry_errors)
    if workers is not None:
        workers = check_int("workers", workers, 1, 256)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 1e6:
        raise ValueError(f"timeout: must be a number of seconds in (0, 1e6), got {timeout!r:.40}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress: expected a callable or None, got {type(progress).__name__}")
    recipes = _recipes(fams, per_family, ns_list, blocks, fixed)
    settings = {"families": fams, "grid": {k: list(v) for k, v in axes.items()},
                "axes": {f: list(per_family[f]) for f in fams}, "ns": ns_list,
                "blocks": blocks, "measure": list(measured), "version": __version__, **fixed,
                **task_kw}
    store = None if cache is None else open_cache(cache, __version__)
    try:
        return _search(store, recipes, measured, settings, client, workers, timeout, task_kw,
                       retries, retry_errors, progress)
    finally:
        if store is not None:
            store.close()


def _search(store: Any, recipes: list[dict[str, Any]], measured: tuple[str, ...],
            settings: dict[str, Any], client: Any, workers: int | None, timeout: float,
            task_kw: dict[str, Any], retries: int, retry_errors: bool,
            progress: Callable[[int, int], Any] | None) -> SearchResult:
    """:func:`search` after its checks, with its cache open (closed by the caller)."""
    notes = list(store.notes) if store is not None else []
    rows: dict[str, dict[str, Any]] = {}
    todo = []
    for rec in recipes:
        key = recipe_key(rec, __version__)
        hit = store.lookup(key, measured, retry_errors) if store is not None else None
        if hit is not None:
            rows[key] = hit
        else:
            todo.append(rec)
    reused, total = len(rows), len(recipes)

    def done(row: dict[str, Any]) -> None:
        rows[row["key"]] = row
        if progress is not None:
            progress(len(rows), total)

    if progress is not None:
        progress(reused, total)
    try:
        if todo:
            connected, owned = _connect(client, workers, float(timeout))
            own_client = connected is not client
            ended = False  # normally: else closed without waiting on busy workers
            try:
                _run(connected, todo, store, measured, task_kw, retries, done,
                     grouped=client is not None,  # ungrouped on our own local cluster
                     timeout=float(timeout))
                ended = True
            except ConnectionError as exc:  # the scheduler lost on the way
                where = (f"{len(rows)} of {total} candidates are saved in {store.path}; run "
                         "again to resume" if store is not None else "no cache was given")
                raise ConnectionError(f"{exc}; {where}") from None
            finally:
                close_all(connected, owned, own_client, quick=not ended)
    except KeyboardInterrupt:
        raise SearchInterrupted(len(rows), total,
                                None if store is None else str(store.path)) from None
    ordered = [rows[recipe_key(rec, __version__)] for rec in recipes]
    return SearchResult(ordered, settings=settings, notes=notes,
                        cache=None if store is None else str(store.path),
                        computed=total - reused, reused=reused)


class _SearchModule(types.ModuleType):
    """This subpackage, callable: ``sparse_patterns.search(...)`` runs :func:`search`."""

    def __call__(self, *args: Any, **kwargs: Any) -> SearchResult:
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _SearchModule
