"""Time and peak memory of every stage from n = 2^14 to 2^20 (issue 18, item 4).

Usage::

    .venv/bin/python benchmarks/scale.py                          # 2^14 .. 2^20, the targets
    .venv/bin/python benchmarks/scale.py --plot figures/scale.png --json scale.json
    .venv/bin/python benchmarks/scale.py --max-log2 17 --no-extras  # a quick run
    .venv/bin/python benchmarks/scale.py --ab /path/to/old/src    # + A/B at n = 16,384

B=1, H=8, d=64, float32, ``mode="merged"``, strided with stride ``round(sqrt(n))``
and the paper's window. For every n and stage, a fresh process (``scale.py --one
STAGE N``) runs the stage once and prints one JSON line; its peak memory is that
process's high-water mark (``VmHWM``, i.e. maxrss), interpreter and imports
included (the table also gives the mark before the stage began: "base"). Each
process first loads what the stage needs (imports, the numba kernels from their
cache, torch, matplotlib) on a tiny pattern, untimed and reported as "load". Stages:

* ``plan``: ``make`` then ``kernels.plan(mode="merged")`` (default block), timed apart;
* ``verify``: ``make`` + exact token-level :func:`sparse_patterns.analysis.verify`
  (``mode`` as ``patterns verify``: interleaved); its ``method`` is printed;
* ``forward``: random q, k, v; the plan is built first (untimed, shown as "plan");
  one ``attention`` call timed, after a warm-up call at full n only when n <= 2^16
  (above, a single call: the kernels are already loaded, see "load"); peak memory
  also as the excess over bytes(q, k, v, out); 4 rows x 2 heads checked against a
  float64 softmax over ``pattern.rows(i, i + 1).indices``;
* ``backward`` (n <= 2^(max-log2 - 1)): a timed forward with ``return_lse=True``,
  then a timed ``attention_backward``; their ratio; excess over bytes(q, k, v, out,
  dout, dq, dk, dv);
* ``export``: ``make`` + ``export_pattern(pat, "x.pt", "flex")`` into a temporary
  directory, what ``patterns export strided --n N --format flex`` does;
* ``render``: ``make`` + the matrix view saved as PNG, what ``patterns render
  strided --n N -o x.png`` does.

Extras (``--extras-log2`` caps their n, ``--no-extras`` skips them): exact verify of
fixed (stride 1024, c 32) and strided (stride 1024) at 2^20, plan of fixed (stride
512, c 32) at 2^18. Every process runs under ``RLIMIT_AS`` (``--mem-limit-gb``,
default 20, never above the caller's own limit) and ``--timeout``; a stage that dies
is reported as "failed (reason)" and the run goes on. ``--ab SRC`` also times the
forward and verify at n = 16,384 with the package at ``SRC`` (a checkout's ``src``
of the commit to compare with) against this one, alternating, best of
``--ab-rounds``.

Timings are wall clock on a shared machine; compare only figures of one run.
Nothing here is asserted: the targets are printed next to the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

__all__: list[str] = []

B, H, D = 1, 8, 64
STAGES = ("plan", "verify", "forward", "backward", "export", "render")
GB, MB = 1e9, 1e6
#: max |ours - float64 oracle| the spot check calls exact for float32
TOL = 1e-4


# ------------------------------------------------------------------ child side


def _hwm() -> int:
    """Peak resident memory of this process so far, in bytes (VmHWM, else maxrss)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _make(family: str, n: int, params: dict):
    import sparse_patterns as sps

    return sps.make(family, n, **params)


def _inputs(n: int, count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, H, n, D), dtype=np.float32) for _ in range(count)]


def _clock(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _oracle_error(q, k, v, out, pattern) -> float:
    """max |out - float64 softmax attention| over 4 rows x 2 heads."""
    n = q.shape[2]
    rows = sorted({0, n // 3, (2 * n) // 3 + 1 if n > 3 else n - 1, n - 1})
    err = 0.0
    for i in rows:
        idx = pattern.rows(i, i + 1).indices
        for h in (0, H - 1):
            s = (k[0, h, idx].astype(np.float64) @ q[0, h, i].astype(np.float64)) / math.sqrt(D)
            w = np.exp(s - s.max())
            ref = (w / w.sum()) @ v[0, h, idx].astype(np.float64)
            err = max(err, float(np.abs(out[0, h, i] - ref).max()))
    return err


def _one(stage: str, n: int, family: str, params: dict, verify_mode: str, check: bool) -> dict:
    """Run one stage once in this (fresh) process; return its figures."""
    import sparse_patterns as sps

    res: dict = {"stage": stage, "n": n, "family": family, "params": params,
                 "package": os.path.dirname(sps.__file__)}
    t0 = time.perf_counter()
    small = dict(params, stride=64) if "stride" in params else params
    if family == "fixed":
        small["c"] = min(int(params.get("c", 8)), 8)
    if stage == "plan":
        from sparse_patterns.kernels import plan

        plan(_make(family, 4096, small), mode="merged")
        res["load_s"] = time.perf_counter() - t0
        res["base_bytes"] = _hwm()
        pat, res["make_s"] = _clock(lambda: _make(family, n, params))
        pl, res["plan_s"] = _clock(lambda: plan(pat, mode="merged"))
        res["time_s"] = res["make_s"] + res["plan_s"]
        res["ratio"] = getattr(pl, "ratio", None)
    elif stage == "verify":
        from sparse_patterns.analysis import verify

        verify(_make(family, 4096, small), mode=verify_mode, progress=False)
        res["load_s"] = time.perf_counter() - t0
        res["base_bytes"] = _hwm()
        t = time.perf_counter()
        pat = _make(family, n, params)
        rep = verify(pat, mode=verify_mode, progress=False)
        res["time_s"] = time.perf_counter() - t
        res.update(ok=bool(rep.ok), method=getattr(rep, "method", "?"), level=rep.level,
                   mode=verify_mode, targets=int(rep.targets))
    elif stage in ("forward", "backward"):
        from sparse_patterns.kernels import attention, attention_backward, plan

        x = _inputs(512, 4)
        tiny = _make("strided", 512, {"stride": 23})
        o, lse = attention(*x[:3], tiny, mode="merged", return_lse=True)
        attention(*x[:3], tiny, mode="merged")
        if stage == "backward":
            attention_backward(*x[:3], o, lse, x[3], tiny, mode="merged")
        del x, o, lse
        res["load_s"] = time.perf_counter() - t0
        arrays, res["inputs_s"] = _clock(lambda: _inputs(n, 3 if stage == "forward" else 4))
        q, k, v = arrays[:3]
        pat, res["make_s"] = _clock(lambda: _make(family, n, params))
        pl, res["plan_s"] = _clock(lambda: plan(pat, mode="merged"))
        res["warmup_call"] = n <= 2**16
        if stage == "forward":
            if res["warmup_call"]:
                warm = attention(q, k, v, pl, mode="merged")
                del warm  # dropped before the timed call, as a caller would
            res["base_bytes"] = _hwm()
            out, res["time_s"] = _clock(lambda: attention(q, k, v, pl, mode="merged"))
            res["io_bytes"] = 4 * q.nbytes
            if check:
                res["max_abs_err"] = _oracle_error(q, k, v, out, pat)
        else:
            do = arrays[3]
            if res["warmup_call"]:
                o, lse = attention(q, k, v, pl, mode="merged", return_lse=True)
                warm = attention_backward(q, k, v, o, lse, do, pl, mode="merged")
                del warm, o, lse
            res["base_bytes"] = _hwm()
            (o, lse), res["forward_s"] = _clock(
                lambda: attention(q, k, v, pl, mode="merged", return_lse=True))
            _, res["time_s"] = _clock(
                lambda: attention_backward(q, k, v, o, lse, do, pl, mode="merged"))
            res["ratio"] = res["time_s"] / res["forward_s"]
            res["io_bytes"] = 8 * q.nbytes
    elif stage in ("export", "render"):
        with tempfile.TemporaryDirectory() as tmp:
            if stage == "export":
                from sparse_patterns.export import export_pattern

                def run(pat, name):
                    path = os.path.join(tmp, name + ".pt")
                    export_pattern(pat, path, "flex")
                    return path
            else:
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt

                from sparse_patterns.render import render_view, save_figure

                def run(pat, name):
                    fig = render_view("matrix", pat)
                    path = os.path.join(tmp, name + ".png")
                    save_figure(fig, path)
                    plt.close(fig)
                    return path

            run(_make(family, 4096, small), "tiny")
            res["load_s"] = time.perf_counter() - t0
            res["base_bytes"] = _hwm()
            t = time.perf_counter()
            path = run(_make(family, n, params), "big")
            res["time_s"] = time.perf_counter() - t
            res["file_bytes"] = os.path.getsize(path)
    else:
        raise ValueError(f"stage: unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    res["peak_bytes"] = _hwm()
    if "io_bytes" in res:
        res["excess_bytes"] = res["peak_bytes"] - res["io_bytes"]
    return res


# ----------------------------------------------------------------- parent side


def _limit_memory(limit: int):
    def apply():
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return apply


def run_stage(stage: str, n: int, args, family: str = "strided", params: dict | None = None,
              pythonpath: str | None = None) -> dict:
    """Run ``stage`` at ``n`` in a fresh process under the memory limit; its JSON, or a failure."""
    if params is None:
        params = {"stride": round(math.sqrt(n))}
    cmd = [sys.executable, os.path.abspath(__file__), "--one", stage, str(n), "--family", family,
           "--params", json.dumps(params), "--verify-mode", args.verify_mode]
    if pythonpath is not None:
        cmd.append("--no-check")
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    base = {"stage": stage, "n": n, "family": family, "params": params}
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout,
                              preexec_fn=_limit_memory(int(args.mem_limit_gb * GB)))
    except subprocess.TimeoutExpired:
        return dict(base, failed=f"timeout after {args.timeout:.0f} s")
    wall = time.perf_counter() - t
    out: dict = {}
    for line in reversed(proc.stdout.splitlines()):
        try:
            out = json.loads(line)
            break
        except ValueError:
            continue
    out = out if isinstance(out, dict) else {}
    if "error" in out or proc.returncode != 0 or not out:
        if "error" in out:
            reason = out["error"]
        elif proc.returncode < 0:
            reason = f"killed by {signal.Signals(-proc.returncode).name}"
        else:
            tail = proc.stderr.strip().splitlines()
            reason = f"exit {proc.returncode}: {tail[-1] if tail else 'no output'}"
        return dict(base, failed=reason[:200])
    out["process_s"] = wall
    return out


def _fmt(r: dict | None) -> str:
    if r is None:
        return "-"
    if "failed" in r:
        return "failed"
    return f"{r['time_s']:.2f} / {r['peak_bytes'] / MB:.0f}"


def _verdict(ok: bool | None) -> str:
    return "not run" if ok is None else ("met" if ok else "NOT met")


def print_table(ns: list[int], stages: list[str], results: dict) -> None:
    print("\n== time s / peak MB (maxrss of the stage's process) ==")
    head = f"{'n':>9s} {'stride':>6s} " + "".join(f"{s:>15s}" for s in stages)
    print(head)
    for n in ns:
        print(f"{n:>9,d} {round(math.sqrt(n)):>6d} "
              + "".join(f"{_fmt(results.get((s, n))):>15s}" for s in stages))
    print("\n== details ==")
    for (stage, n), r in results.items():
        label = f"{stage:8s} n={n:>9,d}"
        if "failed" in r:
            print(f"{label}: failed ({r['failed']})")
            continue
        base = f"load {r['load_s']:.1f} s, base {r['base_bytes'] / MB:.0f} MB"
        if stage == "plan":
            extra = f"make {r['make_s']:.2f} s + plan {r['plan_s']:.2f} s; computed/useful {r['ratio']:.2f}"
        elif stage == "verify":
            extra = (f"{r['level']} level, method={r['method']}, mode={r['mode']}, ok={r['ok']}, "
                     f"pairs={r['targets']:,}")
        elif stage == "forward":
            extra = (f"plan {r['plan_s']:.2f} s (untimed); "
                     f"{'after a warm-up call' if r['warmup_call'] else 'single call, kernels loaded first'}; "
                     f"excess over q,k,v,out {r['excess_bytes'] / MB:.0f} MB; "
                     f"max abs err vs float64 {r.get('max_abs_err', float('nan')):.1e}")
        elif stage == "backward":
            extra = (f"forward {r['forward_s']:.2f} s, backward/forward {r['ratio']:.2f}; "
                     f"excess over 8 arrays {r['excess_bytes'] / MB:.0f} MB")
        else:
            extra = f"file {r['file_bytes'] / 1e3:.0f} kB"
        print(f"{label}: {extra} ({base})")


def print_targets(results: dict, extras: dict, ab: dict | None) -> None:
    big, half = 2**20, 2**19
    lines = []

    def get(key):
        return results.get(key) or extras.get(key)

    def add(text: str, r: dict | None, check) -> None:
        if r is None:
            lines.append(f"  {text}: not run")
        elif "failed" in r:
            lines.append(f"  {text}: failed ({r['failed']}) -> NOT met")
        else:
            figure, ok = check(r)
            lines.append(f"  {text}: {figure} -> {_verdict(ok)}")

    add("strided 2^20 make+plan <= 5 s, <= 300 MB", get(("plan", big)),
        lambda r: (f"{r['time_s']:.2f} s, {r['peak_bytes'] / MB:.0f} MB "
                   f"(base {r['base_bytes'] / MB:.0f} MB)",
                   r["time_s"] <= 5 and r["peak_bytes"] <= 300 * MB))
    add("strided 2^20 forward <= 30 s, peak <= bytes(q,k,v,out) + 1 GB, exact",
        get(("forward", big)),
        lambda r: (f"{r['time_s']:.1f} s (single call), excess {r['excess_bytes'] / GB:.2f} GB, "
                   f"err {r.get('max_abs_err', float('nan')):.1e}",
                   r["time_s"] <= 30 and r["excess_bytes"] <= GB
                   and r.get("max_abs_err", 1.0) <= TOL))
    add("backward 2^19 completes, <= 3x forward, peak <= bytes(8 arrays) + 1 GB",
        get(("backward", half)),
        lambda r: (f"{r['time_s']:.1f} s = {r['ratio']:.2f}x forward, "
                   f"excess {r['excess_bytes'] / GB:.2f} GB",
                   r["ratio"] <= 3 and r["excess_bytes"] <= GB))
    for fam, key in (("strided (l=1024)", ("verify", big)),
                     ("fixed (l=1024, c=32)", ("verify-fixed", big))):
        add(f"verify {fam} 2^20, token level, <= 60 s, <= 2 GB", get(key),
            lambda r: (f"{r['time_s']:.2f} s, {r['peak_bytes'] / MB:.0f} MB, method={r['method']}, "
                       f"ok={r['ok']}",
                       r["level"] == "token" and r["time_s"] <= 60 and r["peak_bytes"] <= 2 * GB))
    add("fixed (l=512, c=32) 2^18 plan <= 3 s, <= 1 GB", get(("plan-fixed", 2**18)),
        lambda r: (f"plan {r['plan_s']:.2f} s (make {r['make_s']:.2f} s), "
                   f"{r['peak_bytes'] / MB:.0f} MB",
                   r["plan_s"] <= 3 and r["peak_bytes"] <= GB))
    for stage, limit in (("export", 5), ("render", 10)):
        add(f"{stage} strided 2^20 <= {limit} s, <= 2 GB", get((stage, big)),
            lambda r, limit=limit: (f"{r['time_s']:.2f} s, {r['peak_bytes'] / MB:.0f} MB",
                                    r["time_s"] <= limit and r["peak_bytes"] <= 2 * GB))
    if ab is None:
        lines.append("  no regression at n=16,384 (forward, verify): not measured "
                     "(give --ab SRC)")
    else:
        for stage, (new, old) in ab.items():
            if new is None or old is None:
                lines.append(f"  no regression at 16,384, {stage}: failed -> NOT met")
                continue
            lines.append(f"  no regression at 16,384, {stage}: {new * 1e3:.1f} ms vs "
                         f"{old * 1e3:.1f} ms = {new / old:.2f}x (met if <= 1.10x) -> "
                         f"{_verdict(new <= 1.10 * old)}")
    print("\n== targets (issue 18, item 4) ==")
    print("\n".join(lines))


def plot(ns: list[int], results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (at, am) = plt.subplots(1, 2, figsize=(11, 4.2))

    def series(stage, field, scale=1.0):
        pts = [(n, results[(stage, n)]) for n in ns if (stage, n) in results]
        pts = [(n, r[field] / scale) for n, r in pts if "failed" not in r and field in r]
        return [p[0] for p in pts], [p[1] for p in pts]

    color = {stage: f"C{k}" for k, stage in enumerate(("make",) + STAGES)}
    time_lines = [("make", "plan", "make_s"), ("plan", "plan", "plan_s"),
                  ("verify", "verify", "time_s"), ("forward", "forward", "time_s"),
                  ("backward", "backward", "time_s"), ("export", "export", "time_s"),
                  ("render", "render", "time_s")]
    for label, stage, field in time_lines:
        x, y = series(stage, field)
        if x:
            at.plot(x, y, "o-", label=label, color=color[label])
    for label, stage in (("make+plan", "plan"), ("verify", "verify"), ("forward", "forward"),
                         ("backward", "backward"), ("export", "export"), ("render", "render")):
        x, y = series(stage, "peak_bytes", MB)
        if x:
            am.plot(x, y, "o-", label=label, color=color[stage])
    x, y = series("forward", "io_bytes", MB)
    if x:
        am.plot(x, y, "k--", lw=1, label="bytes(q,k,v,out)")
    for ax in (at, am):
        firsts = [float(ln.get_ydata()[0]) for ln in ax.get_lines()]
        if firsts:
            g = np.array(ns, float)
            ax.plot(g, max(firsts) * (g / g[0]) ** 1.5, ":", color="gray", label="n^1.5 guide")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    at.set_ylabel("time (s)")
    at.set_title("time per stage (one process each)")
    am.set_ylabel("peak memory, maxrss (MB)")
    am.set_title("peak memory per stage")
    fig.suptitle("strided l=round(sqrt(n)), B=1 H=8 d=64 fp32 merged", fontsize=10)
    fig.tight_layout()
    from sparse_patterns.render import save_figure

    save_figure(fig, path, dpi=110)
    plt.close(fig)
    print(f"\nwrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-log2", type=int, default=14, help="smallest n = 2^K (default 14)")
    ap.add_argument("--max-log2", type=int, default=20, help="largest n = 2^K (default 20)")
    ap.add_argument("--stages", default=",".join(STAGES),
                    help=f"comma-separated stages (default {','.join(STAGES)})")
    ap.add_argument("--extras-log2", type=int, default=20,
                    help="run the extra target lines only where n <= 2^K (default 20)")
    ap.add_argument("--no-extras", action="store_true", help="skip the extra target lines")
    ap.add_argument("--mem-limit-gb", type=float, default=20.0,
                    help="RLIMIT_AS of every stage's process, GB (default 20)")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds a stage's process may run (default 900)")
    ap.add_argument("--verify-mode", default="interleaved",
                    help="verify's mode (default interleaved, as patterns verify)")
    ap.add_argument("--ab", metavar="SRC", default=None,
                    help="also time forward and verify at n=16,384 with the package at SRC")
    ap.add_argument("--ab-rounds", type=int, default=3, help="A/B rounds (default 3)")
    ap.add_argument("--plot", metavar="PNG", default=None, help="write the log-log figure here")
    ap.add_argument("--json", metavar="PATH", default=None, help="write the raw figures here")
    ap.add_argument("--one", nargs=2, metavar=("STAGE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--family", default="strided", help=argparse.SUPPRESS)
    ap.add_argument("--params", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-check", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        stage, n = args.one[0], int(args.one[1])
        params = json.loads(args.params) if args.params else {"stride": round(math.sqrt(n))}
        try:
            res = _one(stage, n, args.family, params, args.verify_mode, not args.no_check)
        except (Exception, MemoryError) as exc:  # reported by the parent as "failed (...)"
            msg = str(exc).splitlines()[0] if str(exc) else ""
            print(json.dumps({"error": f"{type(exc).__name__}: {msg}"}), flush=True)
            sys.exit(1)
        print(json.dumps(res), flush=True)
        return

    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        ap.error(f"--stages: unknown stage {bad[0]!r}; use some of {', '.join(STAGES)}")
    if not 1 <= args.min_log2 <= args.max_log2 <= 24:
        ap.error(f"--min-log2/--max-log2: need 1 <= {args.min_log2} <= {args.max_log2} <= 24")
    ns = [2**k for k in range(args.min_log2, args.max_log2 + 1)]
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = args.mem_limit_gb * GB if hard == resource.RLIM_INFINITY else min(args.mem_limit_gb * GB, hard)
    print(f"B={B} H={H} d={D} float32 mode=merged; strided, stride round(sqrt(n)), paper window; "
          f"n = 2^{args.min_log2} .. 2^{args.max_log2}; each stage in its own process, "
          f"RLIMIT_AS {cap / GB:.1f} GB, timeout {args.timeout:.0f} s")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)

    results: dict = {}
    for n in ns:
        for stage in stages:
            if stage == "backward" and n > 2 ** (args.max_log2 - 1):
                continue
            r = run_stage(stage, n, args)
            results[(stage, n)] = r
            print(f"  n={n:>9,d} {stage:8s} {_fmt(r)}"
                  + (f" ({r['failed']})" if "failed" in r else ""), flush=True)

    extras: dict = {}
    if not args.no_extras:
        todo = [(("verify-fixed", 2**20), "verify", "fixed", {"stride": 1024, "c": 32}),
                (("plan-fixed", 2**18), "plan", "fixed", {"stride": 512, "c": 32})]
        if ("verify", 2**20) not in results:
            todo.append((("verify", 2**20), "verify", "strided", {"stride": 1024}))
        for key, stage, family, params in todo:
            if key[1] > 2**args.extras_log2:
                continue
            r = run_stage(stage, key[1], args, family, params)
            extras[key] = r
            print(f"  extra {family}{params} n={key[1]:,} {stage}: {_fmt(r)}"
                  + (f" ({r['failed']})" if "failed" in r else ""), flush=True)

    ab = None
    if args.ab is not None:
        n = 2**14
        ab, times, ab_pkg = {}, {}, "?"
        for _ in range(args.ab_rounds):
            for stage in ("forward", "verify"):
                for side, pp in (("new", None), ("old", args.ab)):
                    r = run_stage(stage, n, args, pythonpath=pp)
                    times.setdefault((stage, side), []).append(r.get("time_s"))
                    if side == "old" and "package" in r:
                        ab_pkg = r["package"]
        for stage in ("forward", "verify"):
            best = {side: min((t for t in times[(stage, side)] if t is not None), default=None)
                    for side in ("new", "old")}
            ab[stage] = (best["new"], best["old"])
        print(f"\nA/B at n=16,384: best of {args.ab_rounds} alternating rounds; "
              f"old package from {ab_pkg}")

    print_table(ns, stages, results)
    if extras:
        print("\n== extras ==")
        print_table_extras(extras)
    print_targets(results, extras, ab)
    if args.json:
        raw = {"results": [r for r in results.values()], "extras": list(extras.values()),
               "ab": ab}
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(ns, results, args.plot)


def print_table_extras(extras: dict) -> None:
    for (name, n), r in extras.items():
        label = f"{r['family']}{r['params']} n={n:,} {name.split('-')[0]}"
        if "failed" in r:
            print(f"{label}: failed ({r['failed']})")
        elif name.startswith("plan"):
            print(f"{label}: make {r['make_s']:.2f} s + plan {r['plan_s']:.2f} s, peak "
                  f"{r['peak_bytes'] / MB:.0f} MB (base {r['base_bytes'] / MB:.0f} MB)")
        else:
            print(f"{label}: {r['time_s']:.2f} s, peak {r['peak_bytes'] / MB:.0f} MB (base "
                  f"{r['base_bytes'] / MB:.0f} MB), {r['level']} level, method={r['method']}, "
                  f"ok={r['ok']}")


if __name__ == "__main__":
    main()
