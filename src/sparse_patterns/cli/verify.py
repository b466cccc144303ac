"""``patterns verify`` (the paper's two criteria, exactly) and ``patterns analyze`` (|A_i| vs n)."""

from __future__ import annotations

import typer
from rich.table import Table

from ..patterns import registry
from ._app import (
    PATTERN_CONTEXT,
    UsageError,
    app,
    cli_command,
    console,
    emit_json,
    parse_ns,
    parse_params,
    pattern_from_args,
)

__all__ = ["verify_cmd", "analyze_cmd", "DEFAULT"]

#: What ``patterns verify`` checks with no pattern: the README's main job.
DEFAULT = ("strided", 16384, ["--stride", "128"])


def _split_steps(name: str | None, args: list[str]) -> tuple[int | None, list[str]]:
    """Take ``--p P`` out of the pattern options unless the pattern has a parameter ``p``."""
    takes_p = name is not None and name in registry.REGISTRY and any(
        q.name == "p" for q in registry.REGISTRY[name].params
    )
    if takes_p:
        return None, args
    out, steps, k = [], None, 0
    while k < len(args):
        tok = args[k]
        if tok == "--p" or tok.startswith("--p="):
            if "=" in tok:
                val = tok.split("=", 1)[1]
                k += 1
            elif k + 1 < len(args):
                val = args[k + 1]
                k += 2
            else:
                raise UsageError("p: --p needs a value (an integer >= 1)")
            try:
                steps = int(val)
            except ValueError:
                raise UsageError(f"p: must be an integer >= 1, got {val!r}") from None
            continue
        out.append(tok)
        k += 1
    return steps, out


def _mark(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def _print_report(r, explanation) -> None:
    ps = ", ".join(f"{k}={v}" for k, v in r.params.items())
    what = "block pairs" if r.level == "block" else "pairs"
    console.print(
        f"[bold]{r.name}[/]({ps})  n={r.n:,}  p={r.p}  mode={r.mode}  "
        f"residual={'on' if r.residual else 'off'}  "
        f"targets={r.targets:,} {what} ({'j <= i' if r.causal else 'all pairs'})",
        highlight=False,
    )
    t = Table(title="Factorization criteria (Child et al. 2019, sec. 4.1)")
    t.add_column("criterion")
    t.add_column("result", justify="center")
    t.add_column(f"failing {what}", justify="right")
    t.add_row(f"1. every j <= i connected across the {r.p} steps", _mark(r.criterion1),
              f"{r.not_in_last:,}")
    t.add_row(f"2. through a path of at most {r.p + 1} positions", _mark(r.criterion2),
              f"{r.unreachable:,}")
    console.print(t)
    h = Table(title="Hop distances")
    h.add_column("steps", justify="right")
    h.add_column(what, justify="right")
    h.add_column("share", justify="right")
    for k, v in r.hops.items():
        h.add_row(str(k), f"{v:,}", f"{v / max(r.targets, 1):.2%}")
    h.add_row("unreachable", f"{r.unreachable:,}", f"{r.unreachable / max(r.targets, 1):.2%}")
    console.print(h)
    b = Table(title=f"|A_i| budgets (n^(1/p) = {r.budgets[0].root:.2f})" +
              (" - block-level upper bounds" if r.level == "block" else ""))
    for col in ("head", "max |A_i|", "mean |A_i|", "max/n^(1/p)", "nnz", "nnz/(n n^(1/p))"):
        b.add_column(col, justify="right")
    for x in r.budgets:
        b.add_row(x.head, f"{x.max_row:,}", f"{x.mean_row:.2f}", f"{x.max_over_root:.2f}",
                  f"{x.nnz:,}", f"{x.nnz_over_budget:.2f}")
    console.print(b)
    if r.level == "block":
        console.print(
            f"certified through full blocks alone: {'yes' if r.certified else 'no'}; "
            f"{r.partial_pairs:,} target block pairs rely on partial blocks",
            highlight=False,
        )
    if r.depth_checked:
        dep = "never connects" if r.depth is None else f"{r.depth} step(s)"
        console.print(f"full connectivity needs: {dep}", highlight=False)
    elif not r.criterion2:
        console.print("full connectivity needs: not searched (too costly at this n; "
                      "pass --depth to force)", highlight=False)
    verdict = "[green bold]VERIFIED[/]" if r.ok else "[red bold]NOT VERIFIED[/]"
    console.print(f"{verdict}  {r.summary()}  ({r.seconds:.2f} s)", highlight=False)
    if explanation is not None:
        console.print(f"counter-example (i, j) = {r.counterexample}: {explanation}",
                      highlight=False, markup=False)


@app.command("verify", context_settings=PATTERN_CONTEXT)
@cli_command
def verify_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Pattern name (default: strided, n=16384, stride 128)."),
    n: int = typer.Option(None, "--n", help="Sequence length."),
    mode: str = typer.Option("interleaved", "--mode",
                             help="interleaved (step m uses head m), merged or multihead."),
    residual: bool = typer.Option(True, "--residual/--no-residual",
                                  help="Add the identity at every step."),
    steps: int = typer.Option(None, "--steps",
                              help="Number of steps p (also --p unless the pattern takes p)."),
    block: int = typer.Option(None, "--block", help="Verify the block layout at this block size."),
    depth: bool = typer.Option(None, "--depth/--no-depth",
                               help="Force (or skip) the search for the steps full "
                                    "connectivity needs."),
    file: str = typer.Option(None, "--file", help="A saved pattern (.npz, .safetensors, .json)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check the paper's two criteria exactly: exit 0 when both hold, 1 when one fails.

    Pattern parameters are options of the same name (--stride 128 --c 8).
    """
    from ..analysis import explain, verify  # noqa: PLC0415

    p_opt, args = _split_steps(name, list(ctx.args))
    if steps is not None and p_opt is not None and steps != p_opt:
        raise UsageError(f"p: --p {p_opt} and --steps {steps} disagree")
    p = steps if steps is not None else p_opt
    if name is None and file is None:
        name = DEFAULT[0]
        n = DEFAULT[1] if n is None else n
        args = args or list(DEFAULT[2])
    pat = pattern_from_args(name, n, args, file)
    target = pat.to_blocks(block) if block is not None else pat
    report = verify(target, p=p, mode=mode, residual=residual, depth=depth,
                    progress=None if not json_out else False)
    expl = None
    if report.counterexample is not None and block is None:
        i, j = report.counterexample
        expl = explain(pat, i, j, p=report.p, mode=report.mode, residual=report.residual)
    if json_out:
        d = report.to_dict()
        if expl is not None:
            d["explanation"] = {"path": list(expl.path) if expl.path else None,
                                "steps": list(expl.steps), "reason": expl.reason}
        emit_json(d)
    else:
        _print_report(report, expl)
    if not report.ok:
        raise typer.Exit(1)


@app.command("analyze", context_settings=PATTERN_CONTEXT)
@cli_command
def analyze_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Pattern name (see `patterns list`)."),
    ns: str = typer.Option("1024,4096,16384,65536", "--n",
                           help="Comma-separated sequence lengths."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Sweep n and fit the growth of max |A_i| (compare with 1/p; use --stride sqrt).

    Pattern parameters are options of the same name; integer parameters that
    should follow n take 'sqrt' or 'cbrt'.
    """
    from ..analysis import scaling  # noqa: PLC0415

    registry.get(name)
    params = parse_params(name, list(ctx.args))
    table = scaling(name, parse_ns(ns), **params)
    if json_out:
        emit_json(table.to_dict())
        return
    ps = ", ".join(f"{k}={v}" for k, v in params.items())
    t = Table(title=f"{name}({ps}): |A_i| against n")
    follow = [k for k, v in params.items() if isinstance(v, str) and v in ("sqrt", "cbrt")]
    for col in ("n", *follow, "max |A_i|", "mean |A_i|", f"n^(1/{table.p})", "max/n^(1/p)",
                "nnz", "nnz/(n n^(1/p))"):
        t.add_column(col, justify="right")
    for k, n in enumerate(table.ns):
        root = n ** (1.0 / table.p)
        t.add_row(
            f"{n:,}", *(str(table.resolved[k][f]) for f in follow), f"{table.max_row[k]:,}",
            f"{table.mean_row[k]:.2f}", f"{root:.2f}", f"{table.max_row[k] / root:.2f}",
            f"{table.nnz[k]:,}", f"{table.nnz[k] / (n * root):.2f}",
        )
    console.print(t)
    fit = "n/a (one n)" if table.exponent != table.exponent else f"{table.exponent:.3f}"
    mfit = "n/a" if table.mean_exponent != table.mean_exponent else f"{table.mean_exponent:.3f}"
    console.print(
        f"fitted exponent of max |A_i|: {fit}  (mean |A_i|: {mfit});  expected 1/p = "
        f"{table.expected:.3f} (p = {table.p})",
        highlight=False,
    )
