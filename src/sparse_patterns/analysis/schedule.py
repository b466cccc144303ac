"""Layer schedules: what a stack of attention layers connects, document by document.

A schedule is a list of layer patterns ``[L_1, .., L_P]`` (``[local(n, 128),
local(n, 128), full(n)]``, or strided's A1 then A2 as two layers); layer k
attends through the union of its heads ``A_k``. With the residual it connects
``M_k = A_k + I`` and the reachability after it is ``R_k = M_k R_{k-1}``
(boolean products, rows are outputs, ``R_1 = M_1``): exactly
:func:`~sparse_patterns.analysis.verify` in interleaved mode with ``p = P`` on
the pattern whose heads are the layer unions. Every ``R_k`` comes from
``R_{k-1}`` in one forward pass (bit rows over a bounded chunk of source
columns at a time), so the work grows linearly with the number of layers.
``documents`` (lengths or ``cu_seqlens`` offsets, :func:`document_offsets`)
keeps the target pairs inside a document, checks each document's sub-pattern
on its own and adds the **leak** check: a path between documents exists iff
some layer has an entry ``(i, j)`` across documents (paths compose edge by
edge), so every layer's rows are streamed once (``Pattern.rows``, a bounded
number at a time) and the first such entry is the counter-example. No n x n
array is built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp

from .. import config
from ..documents import document_offsets
from ..pattern import MODES, Pattern
from ..util.checks import check_bool, check_choice, check_int
from ..util.stream import check_fits
from . import _numba as K
from ._common import nthreads, row_sizes, runs, steps
from ._paths import EXPLAIN_LIMIT, METHODS, _check_progress, explain
from ._printable import Printable
from .report import Explanation, _mark

__all__ = ["ScheduleReport", "verify_schedule", "document_offsets", "verify_as_schedule",
           "check_layers"]

#: Largest number of entries of a document's layers for which ``explain_failure`` builds their CSR.
EXPLAIN_ENTRIES = 1 << 24

#: Most bytes the reachability bit matrices of one chunk of source columns take (all of them
#: together); less when the memory limit is lower.
CHUNK_BYTES = 128 << 20

#: Output rows per parallel task of the reachability kernel.
REACH_BLOCK = 64

Runs = tuple[np.ndarray, np.ndarray, np.ndarray]


# ----------------------------------------------------------------------- input
def check_layers(layers: Any) -> list[Pattern]:
    """``layers`` as a list of Patterns of one ``n``; a one-line ``ValueError`` otherwise.

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> len(check_layers([sps.make("local", 8, window=2)] * 3))
    3
    >>> check_layers([])
    Traceback (most recent call last):
    ...
    ValueError: layers: a schedule needs at least one layer, got an empty sequence
    """
    if isinstance(layers, Pattern):
        raise ValueError("layers: expected a list of Patterns (one per layer), got one Pattern; "
                         "use verify() for a single pattern")
    if isinstance(layers, (str, bytes)) or not isinstance(layers, (list, tuple)):
        raise ValueError(f"layers: expected a list of Patterns (one per layer), got "
                         f"{type(layers).__name__}")
    out = list(layers)
    if not out:
        raise ValueError("layers: a schedule needs at least one layer, got an empty sequence")
    for k, layer in enumerate(out):
        if not isinstance(layer, Pattern):
            raise ValueError(f"layers: layers[{k}] must be a Pattern, got {type(layer).__name__}")
        if layer.n != out[0].n:
            raise ValueError(f"layers: layers[{k}] has n={layer.n} but layers[0] has "
                             f"n={out[0].n}; every layer must have the same n")
    return out


# ---------------------------------------------------------------------- report
@dataclass(frozen=True)
class ScheduleReport(Printable):
    """The outcome of :func:`verify_schedule`.

    Layers are numbered 1..P in ``reachable``, ``hops`` and the printed table;
    ``leak_example`` gives the 0-based index into the schedule's list.

    Attributes
    ----------
    ok : bool
        Both criteria hold and nothing leaks across documents.
    criterion1, criterion2 : bool
        Every target pair is in ``R_P``; has a hop distance ``<= P`` (the same with the residual).
    reachable : tuple of int
        Entry ``k - 1``: the target pairs in ``R_k``, connected after layer k.
    layers_to_connect : int or None
        The first k with every target pair in ``R_k``; None if no layer gets there.
    hops : dict of int to int
        ``k -> target pairs whose hop distance (first k with the pair in R_k) is k``, k = 1..P.
    unreachable, not_in_last : int
        Target pairs with no hop distance (criterion 2), outside ``R_P`` (criterion 1).
    counterexample, counterexample1, counterexample2 : tuple of int, or None
        As in :class:`~sparse_patterns.analysis.VerifyReport`: the smallest failing ``(i, j)``
        of criterion 2 if it fails, else of criterion 1; then each criterion's own.
    p, n, targets : int
        Layers P, sequence length, target pairs (inside one document, ``j <= i`` when causal).
    residual, causal : bool
        Identity added at every layer; every layer causal (targets ``j <= i``, else all pairs).
    documents : tuple of int, or None
        The ``cu_seqlens`` offsets, or None when no documents were given.
    leak : bool or None
        Some layer has an entry between two documents (None without documents).
    leak_example : tuple of int, or None
        ``(layer, i, j)``: the first such entry, ``layer`` indexing the schedule (0-based).
    leak_entries : tuple of int, or None
        Entries between documents, per layer.
    layer_names, layer_nnz : tuple
        ``name(params)`` and the entries of every layer's union of heads.
    seconds : float
        Wall time.
    explanation : Explanation or None
        ``explain_failure=True``: why the counter-example fails (sequence positions,
        steps ``L1 .. LP``).
    """

    ok: bool
    criterion1: bool
    criterion2: bool
    reachable: tuple[int, ...]
    layers_to_connect: int | None
    hops: dict[int, int]
    unreachable: int
    not_in_last: int
    counterexample: tuple[int, int] | None
    counterexample1: tuple[int, int] | None
    counterexample2: tuple[int, int] | None
    p: int
    residual: bool
    causal: bool
    n: int
    targets: int
    documents: tuple[int, ...] | None
    leak: bool | None
    leak_example: tuple[int, int, int] | None
    leak_entries: tuple[int, ...] | None
    layer_names: tuple[str, ...]
    layer_nnz: tuple[int, ...]
    seconds: float = 0.0
    explanation: Explanation | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; ``explanation`` appears only when the report carries one."""
        d = asdict(self)
        d["hops"] = {int(k): int(v) for k, v in self.hops.items()}
        for key, value in d.items():
            if isinstance(value, tuple):
                d[key] = list(value)
        if self.explanation is None:
            del d["explanation"]
        else:
            d["explanation"] = self.explanation.to_dict()
        return d

    def summary(self) -> str:
        """One line: pass/fail, the failing pair, the leak."""
        docs = "" if self.documents is None else f", {len(self.documents) - 1} documents"
        head = (f"schedule of {self.p} layer{'s' * (self.p != 1)} n={self.n}{docs}"
                f"{'' if self.residual else ' no-residual'}: ")
        bad = []
        if not self.criterion1:
            bad.append(f"criterion 1 fails for {self.not_in_last:,} pairs")
        if not self.criterion2:
            bad.append(f"criterion 2 fails for {self.unreachable:,} pairs")
        if bad:
            bad[-1] += f"; e.g. (i, j) = {self.counterexample}"
        if self.leak:
            k, i, j = self.leak_example  # type: ignore[misc]
            bad.append(f"leaks across documents: layers[{k}] has (i, j) = ({i}, {j})")
        if not bad:
            where = " within each document" if self.documents is not None else ""
            return head + f"both criteria hold for all {self.targets:,} target pairs{where}" + (
                ", no leak" if self.leak is False else "")
        return head + "; ".join(bad)

    def table(self) -> Any:
        """The report as a rich renderable: the layers, the criteria, the hops, the verdict.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> r = verify_schedule([make("local", 16, window=3), make("full", 16)])
        >>> r.text(100).splitlines()[-1].split("  ")[0]
        'VERIFIED'
        """
        return _schedule_table(self)


def _schedule_table(r: ScheduleReport) -> Any:
    from rich.console import Group  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    docs = "one document" if r.documents is None else f"{len(r.documents) - 1} documents"
    out: list[Any] = [Text.from_markup(
        f"[bold]schedule[/] of {r.p} layer{'s' * (r.p != 1)}  n={r.n:,}  {docs}  "
        f"residual={'on' if r.residual else 'off'}  targets={r.targets:,} pairs "
        f"({'j <= i' if r.causal else 'all pairs'}{', inside a document' * (r.documents is not None)})"
    )]
    t = Table(title="Reachability after each layer")
    t.add_column("layer", justify="right")
    t.add_column("pattern", overflow="fold", ratio=1)
    for col in ("nnz", "reachable", "share"):
        t.add_column(col, justify="right", no_wrap=True)
    if r.leak_entries is not None:
        t.add_column("across docs", justify="right", no_wrap=True)
    for k in range(r.p):
        row = [str(k + 1), r.layer_names[k], f"{r.layer_nnz[k]:,}", f"{r.reachable[k]:,}",
               f"{r.reachable[k] / max(r.targets, 1):.2%}"]
        if r.leak_entries is not None:
            row.append(f"{r.leak_entries[k]:,}")
        t.add_row(*row)
    out.append(t)
    c = Table(title=f"Factorization criteria with p = {r.p} layers (Child et al. 2019, sec. 4.1)")
    for col, just in (("criterion", "left"), ("result", "center"), ("failing pairs", "right")):
        c.add_column(col, justify=just)
    c.add_row(f"1. every target pair connected after the {r.p} layers", _mark(r.criterion1),
              f"{r.not_in_last:,}")
    c.add_row(f"2. through a path of at most {r.p + 1} positions", _mark(r.criterion2),
              f"{r.unreachable:,}")
    if r.leak is not None:
        c.add_row("no path between different documents", _mark(not r.leak),
                  f"{sum(r.leak_entries or ()):,} entries")
    out.append(c)
    h = Table(title="Hop distances")
    for col in ("layers needed", "pairs", "share"):
        h.add_column(col, justify="right")
    for k, v in r.hops.items():
        h.add_row(str(k), f"{v:,}", f"{v / max(r.targets, 1):.2%}")
    h.add_row("unreachable", f"{r.unreachable:,}", f"{r.unreachable / max(r.targets, 1):.2%}")
    out.append(h)
    dep = ("not within these layers" if r.layers_to_connect is None
           else f"after layer {r.layers_to_connect}")
    out.append(Text(f"full connectivity{' within each document' * (r.documents is not None)}: {dep}"))
    verdict = "[green bold]VERIFIED[/]" if r.ok else "[red bold]NOT VERIFIED[/]"
    line = Text.from_markup(verdict)
    line.append(f"  {r.summary()}  ({r.seconds:.2f} s)")
    out.append(line)
    if r.explanation is not None:
        out.append(Text(f"counter-example (i, j) = {r.counterexample}: {r.explanation}"))
    return Group(*out)


# ------------------------------------------------------------------- streaming
class _Leaks:
    """Per layer: entries across documents, the first one, and the union's nnz."""

    def __init__(self, P: int) -> None:
        self.count = [0] * P
        self.first: list[tuple[int, int] | None] = [None] * P
        self.nnz = [0] * P


def _layer_runs(layer: Pattern, k: int, lo: int, hi: int, offs: np.ndarray | None,
                leaks: _Leaks | None) -> Runs:
    """Runs of rows ``[lo, hi)`` of a layer's union, ``layer.chunk_rows()`` rows at a time, clipped
    to each row's document and counted from its start (``offs`` None: kept as they are); what
    falls outside (leaks) is counted in ``leaks``, with the first such entry. O(runs), not O(nnz)."""
    chunk = layer.chunk_rows()
    ptrs = [np.zeros(1, np.int64)]
    rsts, rlns = [], []
    total = 0
    for a in range(lo, hi, chunk):
        b = min(hi, a + chunk)
        m = layer.rows(a, b)  # (b - a, n) union of the heads
        ptr, rst, rln = runs(m)
        if leaks is not None:
            leaks.nnz[k] += int(m.nnz)
        if offs is not None:
            d = np.searchsorted(offs, np.arange(a, b, dtype=np.int64), side="right") - 1
            per = np.diff(ptr)
            dlo = np.repeat(offs[d], per)  # (runs,) start of each run's row document
            s = np.maximum(rst, dlo)
            e = np.minimum(rst + rln, np.repeat(offs[d + 1], per))
            keep = e > s
            csum = np.zeros(rst.size + 1, np.int64)
            np.cumsum(np.where(keep, e - s, 0), out=csum[1:])
            out = np.diff(m.indptr) - (csum[ptr[1:]] - csum[ptr[:-1]])  # (b - a,) leaks per row
            if leaks is not None and out.any():
                leaks.count[k] += int(out.sum())
                if leaks.first[k] is None:
                    r = int(np.flatnonzero(out)[0])
                    cols = m.indices[m.indptr[r]:m.indptr[r + 1]]
                    j = int(cols[0]) if cols[0] < offs[d[r]] else int(
                        cols[np.searchsorted(cols, offs[d[r] + 1])])
                    leaks.first[k] = (a + r, j)
            if not keep.all():
                kept = np.zeros(rst.size + 1, np.int64)  # kept runs before each run
                np.cumsum(keep, out=kept[1:])
                ptr = kept[ptr]
                s, e, dlo = s[keep], e[keep], dlo[keep]
            rst, rln = s - dlo, e - s
        ptrs.append(ptr[1:] + total)
        rsts.append(rst)
        rlns.append(rln)
        total += int(ptr[-1])
    empty = np.zeros(0, np.int64)
    return (np.concatenate(ptrs), np.concatenate(rsts) if rsts else empty,
            np.concatenate(rlns) if rlns else empty)


def _rows_of(part: Runs, s: int, e: int) -> Runs:
    """The rows ``[s, e)`` of a run structure, as a structure of their own."""
    ptr, rst, rln = part
    p = ptr[s:e + 1]
    a, b = int(p[0]), int(p[-1])
    return p - a, rst[a:b], rln[a:b]


def _document(parts: list[Runs], d: int, residual: bool, causal: bool):
    """Hop counts, failures and reachable pairs per layer of one document of length d.

    One forward pass through the layers (:func:`~._numba.reach_kernel`), ``CHUNK_BYTES`` of
    source columns at a time: the work per layer does not grow with the number of layers.
    """
    P = len(parts)
    st = steps(parts, P, "interleaved", d)
    nbuf = 2 if residual else 3  # R_{k-1}, R_k (and E_k without the residual), (d, wc) words each
    nthr = nthreads()
    fixed = (32 * nbuf + 8 * nthr) * d  # the rows' states, the threads' source lists
    budget = min(CHUNK_BYTES, config.get_memory_limit() // 2) - fixed
    wc = int(max(1, min((d + 63) >> 6, budget // (8 * (nbuf * d + nthr)))))
    check_fits("schedule", fixed + 8 * wc * (nbuf * d + nthr),
               "a shorter sequence or documents (the check keeps at least 64 source columns "
               "of every position per layer)")
    ne = 0 if residual else d
    work = (np.zeros((2, d, wc), np.uint64), np.zeros((2, d, 4), np.int64),
            np.zeros((ne, wc), np.uint64), np.zeros((ne, 4), np.int64),
            np.zeros((nthr, wc), np.uint64), np.zeros((nthr, d), np.int64))
    with numba.parallel_chunksize(1):  # causal rows cost more further down: blocks go on demand
        reach, hops, bad = K.pick("reach_kernel", d)(
            d, P, st.step_base, st.rptr, st.rst, st.rln, residual, causal, REACH_BLOCK, *work)
    targets = d * (d + 1) // 2 if causal else d * d
    m1 = targets - int(reach[-1])
    m2 = targets - int(hops[1:].sum())
    bad1 = None if bad[0] < 0 else (int(bad[0]), int(bad[1]))
    bad2 = None if bad[2] < 0 else (int(bad[2]), int(bad[3]))
    return hops, m1, m2, bad1, bad2, reach, targets


def _csr_of(part: Runs, d: int) -> sp.csr_matrix:
    """The (d, d) boolean CSR of a run structure."""
    ptr, rst, rln = part
    total = int(rln.sum())
    off = np.repeat(np.cumsum(rln) - rln, rln)
    idx = np.repeat(rst, rln) + (np.arange(total, dtype=np.int64) - off)
    indptr = np.zeros(d + 1, np.int64)
    np.cumsum(row_sizes(ptr, rln), out=indptr[1:])
    return sp.csr_matrix((np.ones(total, np.bool_), idx.astype(np.int32), indptr.astype(np.int32)),
                         shape=(d, d))


def _explain(layers: list[Pattern], offs: np.ndarray | None, s: int, e: int, i: int, j: int,
             residual: bool, causal: bool) -> Explanation | None:
    """:func:`explain` of ``(i, j)`` on the sub-pattern of document ``[s, e)`` (None if too big)."""
    d = e - s
    if d > EXPLAIN_LIMIT:
        return None
    parts = [_layer_runs(layer, k, s, e, offs, None) for k, layer in enumerate(layers)]
    if sum(int(part[2].sum()) for part in parts) > EXPLAIN_ENTRIES:
        return None
    names = tuple(f"L{k + 1}" for k in range(len(layers)))
    sub = Pattern([_csr_of(part, d) for part in parts], causal=causal, head_names=names)
    ex = explain(sub, i - s, j - s, p=len(layers), residual=residual)
    where = "" if offs is None else f" inside document [{s}, {e})"
    if ex.path is None:
        reason = (f"no path through the {len(layers)} layers joins input {j} to output {i}{where} "
                  f"({'residual' if residual else 'no residual'})")
        return Explanation(i, j, None, (), None, False, reason)
    path = tuple(x + s for x in ex.path)
    reason = f"hop distance {ex.hops}" + ("" if ex.in_last else f"; not connected after layer "
                                          f"{len(layers)} (no residual)")
    return Explanation(i, j, path, ex.steps, ex.hops, ex.in_last, reason)


# ----------------------------------------------------------------------- verify
def verify_schedule(
    layers: Sequence[Pattern],
    *,
    documents: Sequence[int] | np.ndarray | None = None,
    residual: bool = True,
    explain_failure: bool = False,
) -> ScheduleReport:
    """Verify a schedule of attention layers exactly: reachability per layer, criteria, leaks.

    Parameters
    ----------
    layers : list of Pattern
        One pattern per layer, in the order they run (layer 1 reads the input);
        a layer attends through the union of its heads. Every layer has the same n.
    documents : sequence of int, optional
        Packed documents: lengths summing to n, or ``cu_seqlens`` offsets
        starting at 0 and ending at n (see :func:`document_offsets`). Target
        pairs are then those inside one document, each document's sub-pattern
        is verified on its own, and the leak check runs. None: the whole
        sequence is one document and no leak is reported.
    residual : bool
        Add the identity at every layer (a residual stream keeps what a position had).
    explain_failure : bool
        Attach the :func:`~sparse_patterns.analysis.explain` of the
        counter-example, on its document's sub-pattern (up to ``EXPLAIN_LIMIT``
        tokens and ``EXPLAIN_ENTRIES`` entries), to ``report.explanation``.

    Returns
    -------
    ScheduleReport

    Raises
    ------
    ValueError
        An empty schedule, an item that is not a Pattern, layers of different
        n, bad ``documents`` (see :func:`document_offsets`), a non-bool flag.

    See Also
    --------
    sparse_patterns.analysis.verify : the same check on the heads of one pattern;
        ``verify(list_of_patterns)`` comes here.

    Notes
    -----
    Layer k connects ``M_k = A_k (+ I)`` restricted to each document, and
    ``R_k = M_k R_{k-1}``, ``R_1 = M_1`` (rows are outputs); a pair's hop
    distance is the first k with the pair in ``R_k``. Targets are ``j <= i``
    when every layer is causal, else every pair of a document. With the
    residual ``R_k`` only grows; without it ``reachable`` checks every prefix
    ``L_1 .. L_k`` again. A path that leaves a document and comes back is not
    counted: it needs an entry across documents, which the leak check
    reports. Memory: the runs of one document (or one chunk of rows) per layer,
    and the bit rows of ``R_{k-1}`` and ``R_k`` over ``CHUNK_BYTES`` (128 MiB, at
    most half the memory limit) of source columns at a time.

    References
    ----------
    R. Child, S. Gray, A. Radford, I. Sutskever, "Generating Long Sequences
    with Sparse Transformers", arXiv:1904.10509, 2019, section 4.1.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> local, full = make("local", 16, window=3), make("full", 16)
    >>> r = verify_schedule([local, local])
    >>> r.ok, r.reachable, r.layers_to_connect, r.counterexample
    (False, (58, 91), None, (7, 0))
    >>> r = verify_schedule([local, local, full])
    >>> r.ok, r.reachable, r.hops, r.layers_to_connect
    (True, (58, 91, 136), {1: 58, 2: 33, 3: 45}, 3)

    Two documents of 8: the window and the full layer both reach across.

    >>> r = verify_schedule([local, full], documents=[8, 8])
    >>> r.criterion1, r.reachable, r.leak, r.leak_example, r.leak_entries
    (True, (52, 72), True, (0, 8, 5), (6, 64))
    """
    t0 = time.perf_counter()
    layers = check_layers(layers)
    residual = check_bool("residual", residual)
    explain_failure = check_bool("explain_failure", explain_failure)
    n = layers[0].n
    given = documents is not None
    offs = document_offsets(documents, n)
    causal = all(layer.causal for layer in layers)
    P = len(layers)
    leaks = _Leaks(P)
    budget = max(1, min(layer.chunk_rows() for layer in layers))
    hops = np.zeros(P + 1, np.int64)
    reach = np.zeros(P, np.int64)
    miss1 = miss2 = targets = 0
    bad: list[tuple[int, int, int] | None] = [None, None]  # (document, i, j) of criterion 1, 2
    D = offs.size - 1
    d0 = 0
    while d0 < D:  # a group: one document, or several whose rows fit in one chunk
        d1 = d0 + 1
        while d1 < D and int(offs[d1 + 1] - offs[d0]) <= budget:
            d1 += 1
        lo, hi = int(offs[d0]), int(offs[d1])
        parts = [_layer_runs(layer, k, lo, hi, offs if given else None, leaks)
                 for k, layer in enumerate(layers)]
        for d in range(d0, d1):
            s, e = int(offs[d]), int(offs[d + 1])
            sub = [_rows_of(part, s - lo, e - lo) for part in parts]
            h, m1, m2, b1, b2, rc, tg = _document(sub, e - s, residual, causal)
            hops += h
            reach += rc
            miss1 += int(m1)
            miss2 += int(m2)
            targets += tg
            for q, b in enumerate((b1, b2)):
                if b is not None and bad[q] is None:
                    bad[q] = (d, b[0] + s, b[1] + s)
        d0 = d1
    first = bad[1] if bad[1] is not None else bad[0]
    done = np.flatnonzero(reach == targets)
    leak = leak_example = leak_entries = None
    if given:
        leak = any(leaks.count)
        leak_entries = tuple(leaks.count)
        k = next((k for k, c in enumerate(leaks.count) if c), None)
        leak_example = None if k is None else (k, *leaks.first[k])
    explanation = None
    if explain_failure and first is not None:
        d = first[0]
        explanation = _explain(layers, offs if given else None, int(offs[d]), int(offs[d + 1]),
                               first[1], first[2], residual, causal)
    return ScheduleReport(
        ok=miss1 == 0 and miss2 == 0 and not leak, criterion1=miss1 == 0, criterion2=miss2 == 0,
        reachable=tuple(int(x) for x in reach),
        layers_to_connect=int(done[0]) + 1 if done.size else None,
        hops={k: int(hops[k]) for k in range(1, P + 1)}, unreachable=miss2, not_in_last=miss1,
        counterexample=first and first[1:], counterexample1=bad[0] and bad[0][1:],
        counterexample2=bad[1] and bad[1][1:], p=P, residual=residual, causal=causal, n=n,
        targets=targets, documents=tuple(int(x) for x in offs) if given else None, leak=leak,
        leak_example=leak_example, leak_entries=leak_entries,
        layer_names=tuple(_layer_name(layer) for layer in layers), layer_nnz=tuple(leaks.nnz),
        seconds=time.perf_counter() - t0, explanation=explanation,
    )


def _layer_name(layer: Pattern) -> str:
    return f"{layer.name}({', '.join(f'{k}={v}' for k, v in layer.params.items())})"


def verify_as_schedule(
    layers: Sequence[Pattern],
    *,
    p: int | None = None,
    mode: str = "interleaved",
    residual: bool = True,
    progress: Callable[[int, int], None] | None = None,
    depth: bool | None = None,
    explain_failure: bool = False,
    method: str = "auto",
) -> ScheduleReport:
    """``verify(list_of_patterns, ...)``: :func:`verify_schedule`, once verify's options are checked.

    ``p`` is None or the number of layers, ``mode`` interleaved, ``depth`` None
    or False, ``method`` not structured; ``progress`` is called once, at the end.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> verify_as_schedule([make("local", 16, window=3)] * 2, p=3)
    Traceback (most recent call last):
    ...
    ValueError: p: a schedule of 2 layers is verified with p = 2 (one step per layer), got p=3
    """
    layers = check_layers(layers)
    P = len(layers)
    if p is not None and check_int("p", p, 1) != P:
        raise ValueError(f"p: a schedule of {P} layers is verified with p = {P} (one step per "
                         f"layer), got p={p}")
    if check_choice("mode", mode, MODES) != "interleaved":
        raise ValueError(f"mode: a schedule runs its layers in order ('interleaved'); got {mode!r}")
    if depth is not None and check_bool("depth", depth):
        raise ValueError("depth: a schedule reports layers_to_connect within its layers; "
                         "there is no depth search (pass depth=None or False)")
    if check_choice("method", method, METHODS) == "structured":
        raise ValueError("method: 'structured' applies to one generated pattern, not a "
                         "schedule; use 'auto' or 'generic'")
    progress = _check_progress(progress)
    report = verify_schedule(layers, residual=residual, explain_failure=explain_failure)
    if progress is not None:
        progress(1, 1)
    return report
