"""``patterns verify`` (the paper's two criteria, exactly) and ``patterns analyze`` (|A_i| vs n)."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

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


class _ProgressBar:
    """A ``progress(done, total)`` callback drawing a rich bar once a run has lasted ``delay`` seconds."""

    def __init__(self, label: str, delay: float = 1.0) -> None:
        self.label = label
        self.delay = delay
        self.start = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if done >= total or time.perf_counter() - self.start < self.delay:
                return
            from rich.progress import Progress  # noqa: PLC0415

            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


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
    from ..analysis import verify  # noqa: PLC0415

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
    bar = _ProgressBar("verifying") if not json_out and sys.stdout.isatty() else None
    try:
        report = verify(target, p=p, mode=mode, residual=residual, depth=depth, progress=bar,
                        explain_failure=True)
    finally:
        if bar is not None:
            bar.close()
    if json_out:
        emit_json(report.to_dict())
    else:
        console.print(report.table())
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
    else:
        console.print(table.table())
