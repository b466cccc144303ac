"""The profiler's run: :func:`profile` builds each pattern at each ``n``, plans
it, draws one set of random ``q, k, v`` per cell, checks every runner (ours and
the baselines) against an exact float64 oracle computed from the pattern's rows
on sampled query rows, and times only the runners that passed: a wrong kernel is
reported as wrong, never as fast. It never builds a pattern's whole CSR: the
oracle reads the checked rows, SDPA's dense mask is built row range by row
range, and before anything is allocated the inputs are checked against the
memory available and each baseline's estimated memory against
:func:`sparse_patterns.config.get_memory_limit`. The machine probes live in ``_machine``, the torch
baselines in ``_baselines``, our runners in ``_ours``, where inputs live and how they are
timed in ``_device``, the result types in ``_table``."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import config
from ..kernels import AUTO, BLOCK, MODES, get_backend, plan
from ..pattern import DENSE_LIMIT, Pattern
from ..patterns import registry
from ..util.checks import check_choice, check_int
from ._baselines import BASELINES, baseline_bytes, flex_runner, sdpa_runner
from ._baselines import flex_block_mask as _flex_block_mask  # noqa: F401 - tests reach it here
from ._device import DEVICES, device_for, to_numpy
from ._machine import available_bytes, fma_peak_gflops, load_average, machine_info
from ._machine import matmul_gflops as _matmul_gflops_n
from ._machine import measure as _measure  # noqa: F401 - tests reach it here
from ._ours import impl_runner
from ._table import Measurement, ProfileRow, ProfileTable

__all__ = ["profile", "DTYPES", "BASELINES", "DEVICES"]

#: Input dtypes :func:`profile` can generate (``bfloat16`` needs torch).
DTYPES = ("float32", "float64", "float16", "bfloat16")

#: Largest absolute error against the float64 oracle that still counts as correct.
_TOL = {"float32": 2e-4, "float64": 1e-8, "float16": 1e-2, "bfloat16": 3e-2}
_ALL_ROWS = 1024  # up to this n every query row is checked against the oracle
_SAMPLED_ROWS = 128  # above it, this many rows (first, last and random ones)
_MATMUL_N = 2048  # square fp32 matmul that sets the throughput reference
_BASELINE_SECONDS = 300  # a baseline that would take longer a call is skipped


def _matmul_gflops(torch: Any) -> tuple[float, str]:
    """The fp32 matmul rate at ``_MATMUL_N`` (a test shrinks it, or patches this function)."""
    return _matmul_gflops_n(torch, _MATMUL_N)


def _fma_peak(dtype: str) -> tuple[float | None, str]:
    """The host's FMA peak for ``dtype`` (GFLOP/s) and what was measured (a test patches it)."""
    return fma_peak_gflops(dtype)


# ====================================================================== inputs and the oracle
_to_numpy = to_numpy


def _check_groups(pattern: Pattern, mode: str, rows: np.ndarray) -> list[sp.csr_matrix]:
    """The ``rows`` (token indices) of the CSR each mask head uses: the union in merged
    mode, every head in multihead mode; boolean ``(len(rows), n)`` each, row ``r`` being
    token ``rows[r]``. Costs O(nnz of those rows), never the whole CSR."""
    mats = list(pattern.rows_of(rows))
    if mode != "merged" or len(mats) == 1:
        return mats
    union = mats[0]
    for m in mats[1:]:
        union = union + m
    return [union]


def _check_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    if n <= _ALL_ROWS:
        return np.arange(n)
    pick = 1 + rng.choice(n - 2, size=min(n - 2, _SAMPLED_ROWS - 2), replace=False)
    return np.unique(np.concatenate([[0, n - 1], pick]))


def _oracle_rows(q, k, v, groups, rows, scale) -> np.ndarray:
    """Exact float64 attention of the query rows ``rows``; row ``r`` of each of
    ``groups`` (:func:`_check_groups`) holds the keys of token ``rows[r]``."""
    B, H, _, d = q.shape
    out = np.zeros((B, H, rows.size, d))
    for h in range(H):
        g = groups[h % len(groups)]
        for r, i in enumerate(rows):
            keys = g.indices[g.indptr[r]:g.indptr[r + 1]]
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


def _check_inputs_fit(cells: Sequence[tuple[Any, int]], batch: int, heads: int, head_dim: int,
                      dtype: str) -> None:
    """Refuse (before allocating) a cell whose ``q, k, v`` and output exceed the memory available."""
    avail = available_bytes()
    if avail is None or not cells:
        return
    n = max(c[1] for c in cells)
    size = 2 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize
    one = batch * heads * n * head_dim
    need = 4 * one * size + one * 4  # q, k, v, the output, and one float32 draw at a time
    if need > avail:
        raise config.MemoryLimitError(
            f"n: profiling at n={n:,} needs {config.format_bytes(need)} for q, k, v and the "
            f"output ({batch} x {heads} x {n:,} x {head_dim} {dtype} each), more than the "
            f"{config.format_bytes(avail)} of memory available; use a smaller n, --heads, "
            "--batch or --head-dim"
        )


def _impl_names(asked: Any = ()) -> tuple[str, ...]:
    """Names of the backends (:func:`sparse_patterns.kernels.backend_names`) and ``"auto"``."""
    from ..kernels import backend_names  # noqa: PLC0415

    return ("auto", *backend_names())


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
    impls: str | Sequence[str] = ("auto",),
    baselines: str | Sequence[str] = ("sdpa", "flex"),
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    dtype: str | None = None,
    repeats: int = 5,
    mode: str = "merged",
    params: Mapping[str, Any] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    block: int | None = None,
    seed: int = 0,
    device: str = "cpu",
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
        Our backends (:func:`sparse_patterns.kernels.backend_names`): ``"auto"`` (the
        default: ``"numba"`` on the CPU, ``"torch"`` on CUDA), ``"numba"``,
        ``"torch"``, ``"flex"``, ``"cuda"``, ``"reference"``, ... Each runs its own
        plan at ``block`` or its default tile size. May be empty (baselines only).
    baselines : sequence of str
        ``"sdpa"`` and/or ``"flex"`` (empty: none). Without torch they are
        dropped with a note and only ours run.
    batch, heads, head_dim : int
        Shape of the inputs.
    dtype : {"float32", "float64", "float16", "bfloat16"}, optional
        Input dtype (``bfloat16`` inputs are torch tensors and need torch); default
        ``"float32"`` on the CPU, ``"bfloat16"`` on CUDA.
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
    block : int, optional
        Tile size of the plans (``computed_flops`` come from each backend's plan);
        default each backend's on the device (32 on the CPU, 128 on CUDA).
    seed : int
        Seed of the inputs and of the sampled rows the oracle checks.
    device : {"cpu", "cuda"}
        Where the inputs live. ``"cuda"``: created on the GPU once per cell,
        the GPU runners (``flex``, ``cuda``, the baselines) timed with CUDA
        events after a synchronize, their memory from
        ``torch.cuda.max_memory_allocated``; SDPA runs its flash backend where
        it can (float16, bfloat16; causal or no mask). The CPU implementations
        still run on host arrays.

    Returns
    -------
    ProfileTable

    Raises
    ------
    ValueError
        Empty ``ns`` or ``patterns``, an unknown impl, baseline, dtype, mode or
        device, ``"cuda"`` without a GPU, ``"flex"`` without FlexAttention, a
        parameter that applies to no pattern, or nothing left to run (no impl,
        and no baseline because torch is missing).
    sparse_patterns.config.MemoryLimitError
        (a ``ValueError``) before anything is allocated, when the largest cell's
        ``q, k, v`` and output exceed the memory available.

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
    It counts everything the call touches, outputs included. A baseline whose
    estimated memory (see ``sparse_patterns.profiling._baselines``: SDPA with a
    mask materializes ``2 B H n^2`` scores, FlexAttention's ``BlockMask`` holds
    ``4 G nb^2`` int32 indices) exceeds :func:`sparse_patterns.config.get_memory_limit`
    is skipped, with a note saying so; ours still runs. Its limits: pages
    the allocator already held and reuses are not counted (the arrays that the
    CPU kernel recycles are freed before the call), other threads of the
    process count too, and where ``clear_refs`` is unavailable it falls back to
    ``getrusage`` ``ru_maxrss``, which only moves when the call sets a new
    process-wide peak.

    **Throughput.** ``GFLOP/s`` is useful FLOPs (``4 d`` per attended pair per
    attention head) over the median time; ``% peak`` compares it (and the
    computed FLOPs of the runner's plan) with the host's FMA peak for the dtype,
    measured once per run (:func:`sparse_patterns.kernels.cpu.fma_peak`: bfloat16's
    for bfloat16, float32's for float32 and float16, half of it for float64; not
    on a CUDA profile); ``% matmul`` compares it with a ``2048 x 2048`` fp32
    ``torch.matmul`` timed in the same run (on the device), at its start and at
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
    device = check_choice("device", device, DEVICES)
    impls = _names("impls", impls, _impl_names(impls))
    impls = tuple(dict.fromkeys(AUTO[device][0] if i == "auto" else i for i in impls))
    for name in impls:  # a library an asked backend needs: one line, before anything runs
        get_backend(name).require()
    baselines = _names("baselines", baselines, BASELINES)
    batch = check_int("batch", batch, 1, 1 << 16)
    heads = check_int("heads", heads, 1, 1 << 16)
    head_dim = check_int("head_dim", head_dim, 1, 1 << 14)
    repeats = check_int("repeats", repeats, 1, 1000)
    block = None if block is None else check_int("block", block, 1, 4096)
    dtype = check_choice("dtype", ("bfloat16" if device == "cuda" else "float32")
                         if dtype is None else dtype, DTYPES)
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
    dev = device_for(device, torch)  # a one-line ValueError for "cuda" without a GPU
    cells = [(p, n) for p in items if isinstance(p, str) for n in ns]
    cells += [(p, p.n) for p in items if isinstance(p, Pattern)]
    _check_inputs_fit(cells, batch, heads, head_dim, dtype)
    machine = machine_info(torch)
    machine["device"] = dev.name
    matmul, matmul_src = _matmul_gflops(torch) if device == "cpu" else dev.matmul(torch, 4096)
    peak, peak_src = _fma_peak(dtype) if device == "cpu" else (
        None, "the host's FMA peak: not measured on a CUDA profile")
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
        pl = plan(pat, block=(128 if device == "cuda" else BLOCK) if block is None else block,
                  mode=mode)
        plan_s = time.perf_counter() - t0
        useful, computed = pl.flops(batch, heads, head_dim)
        rng = np.random.default_rng(seed)
        shape = (batch, heads, n, head_dim)
        if dtype == "bfloat16":
            ours = [torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(torch.bfloat16)
                    for _ in range(3)]
            exact = [t.float().numpy() for t in ours]  # the rounded values, for the oracle
        else:  # one float32 draw at a time: the same values as before, less memory
            ours = [rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
                    for _ in range(3)]
            exact = ours
        tin = None if torch is None else [  # the baselines' inputs, on the profile's device
            torch.as_tensor(a).to(dev.device) if device == "cuda" else torch.as_tensor(a)
            for a in ours]
        check_rows = _check_rows(n, rng)
        oracle = _oracle_rows(*exact, _check_groups(pat, mode, check_rows), check_rows, scale)
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
            where = dev
            try:
                if kind == "impl":
                    fn, where, st["note"], st["computed"] = impl_runner(
                        name, pattern=pat, mode=mode, scale=scale, block=block, host=ours,
                        dev=dev, torch=torch, dtype=dtype, shape=(batch, heads, n, head_dim))
                    same = True
                elif (need := _baseline_too_big(name, pat, mode, batch, heads, head_dim, dtype,
                                                computed, matmul)) is not None:
                    fn, same, st["note"] = None, False, need
                elif name == "sdpa":
                    fn, same, st["note"] = sdpa_runner(torch, pat, mode, heads, scale, *tin,
                                                       dense_limit=DENSE_LIMIT)
                else:
                    fn, same, st["note"] = flex_runner(torch, pat, mode, heads, scale, *tin)
                if fn is None:
                    st["status"] = "skipped"
                    notes.append(f"{label}: {name} {st['note']}")
                    continue
                st["fn"], st["same"], st["where"] = fn, same, where
                st["first"] = where.clock(fn)
                out, _, st["peak"] = where.measure(fn)
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
        out = None  # the last checked output: not held while the clock runs

        # Phase 2: the clock, only for runners that passed their check.
        meas = []
        for name, kind in runners:
            st = state[name]
            tick(f"{label}: {name} x{repeats}")
            times: list[float] = []
            if st["status"] == "ok":
                times = [st["where"].clock(st["fn"]) for _ in range(repeats)]
            meas.append(Measurement(
                runner=name, kind=kind, status=st["status"], note=st["note"],
                times=tuple(times), first_s=st.get("first"),
                peak_bytes=st.get("peak"), max_err=st.get("err"),
                computed_flops=st.get("computed"),
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
    machine["load_after"] = load_average()
    again, _ = _matmul_gflops(torch) if device == "cpu" else dev.matmul(torch, 4096)
    matmul_src += ", the faster of its medians at the start and the end"
    matmul = max(matmul, again)
    settings = {"batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype,
                "repeats": repeats, "mode": mode, "block": block, "seed": seed,
                "device": device}
    return ProfileTable(rows, impls=impls, baselines=baselines, settings=settings,
                        machine=machine, matmul_gflops=matmul, matmul_source=matmul_src,
                        notes=notes, fma_peak_gflops=peak, fma_peak_source=peak_src)


def _baseline_too_big(name: str, pattern: Pattern, mode: str, batch: int, heads: int,
                      head_dim: int, dtype: str, computed: float, matmul: float) -> str | None:
    """The note of a baseline skipped because it would not fit the memory limit, or
    would take more than :data:`_BASELINE_SECONDS` a call, else None.

    The time is a lower bound: the FLOPs it must do (SDPA: every pair, or the causal
    half; FlexAttention: at least the FLOPs our plan computes) at the matmul rate.
    """
    size = 2 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize
    need, what = baseline_bytes(name, pattern, mode, batch, heads, head_dim, size)
    limit = config.get_memory_limit()
    if need > limit:
        return (f"skipped: would need about {config.format_bytes(need)} ({what}), above the "
                f"memory limit of {config.format_bytes(limit)}")
    n = pattern.n
    pairs = n * (n + 1) / 2 if pattern.causal else float(n) * n
    flops = computed if name == "flex" else 4.0 * head_dim * batch * heads * pairs
    seconds = flops / (matmul * 1e9) if matmul > 0 else 0.0
    if seconds > _BASELINE_SECONDS:
        return (f"skipped: would take at least {seconds:,.0f} s a call ({flops / 1e12:,.1f} TFLOP "
                f"at the matmul rate of {matmul:.0f} GFLOP/s), above {_BASELINE_SECONDS} s")
    return None


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip()
    return s.splitlines()[0] if s else type(exc).__name__
