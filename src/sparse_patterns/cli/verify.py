"""``patterns verify`` and ``patterns analyze``: the paper's two criteria, exactly, and the growth of |A_i|.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from ._app import FILE, JSON, PATTERN_CONTEXT, N, cli_command, console, emit_json, int_opt
from ._args import (
    Command,
    UsageError,
    parse_ns,
    parse_params,
    pattern_from_args,
    registry,
    split_steps,
)
from ._schedule import schedule_from_args

#: What ``patterns verify`` checks with no pattern: the README's main job.
DEFAULT = ("strided", 16384, ["--stride", "128"])


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


@cli_command
def verify_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Pattern name (default: strided, n=16384, stride 128)."),
    n: int = N,
    mode: str = typer.Option("interleaved", "--mode",
                             help="interleaved (step m uses head m), merged or multihead."),
    residual: bool = typer.Option(True, "--residual/--no-residual",
                                  help="Add the identity at every step."),
    steps: int = int_opt("steps", None, "Number of steps p (also --p unless the pattern takes p)"),
    block: int = int_opt("block", None, "Verify the block layout at this block size"),
    depth: bool = typer.Option(None, "--depth/--no-depth",
                               help="Force (or skip) the search for the steps full "
                                    "connectivity needs."),
    file: str = FILE,
    schedule: str = typer.Option(
        None, "--schedule", metavar="<str>",
        help="Verify a schedule of layers instead, each made at --n: layers separated by commas, "
             "each NAME or NAME:KEY=VALUE:KEY=VALUE (e.g. local:window=128,full), or a .json "
             'file with a list of {"pattern": NAME, "params": {...}}.'),
    documents: str = typer.Option(
        None, "--documents", metavar="<str>",
        help="With --schedule: packed documents, as lengths (1024,3072) or cu_seqlens offsets "
             "from 0 (0,1024,4096): every layer is made inside each document, targets stay "
             "inside a document, and a pair across documents fails (a leak)."),
    json_out: bool = JSON,
) -> None:
    """Check the paper's two criteria exactly: exit 0 when both hold, 1 when one fails.

    Pattern parameters are options of the same name (--stride 128 --c 8). With
    --schedule the layers run in order (p = their number) and exit 1 also means a leak.
    """
    from ..analysis import verify  # noqa: PLC0415

    p_opt, args = split_steps(name, list(ctx.args))
    if steps is not None and p_opt is not None and steps != p_opt:
        raise UsageError(f"p: --p {p_opt} and --steps {steps} disagree")
    p = steps if steps is not None else p_opt
    if schedule is not None or documents is not None:
        from ..analysis import verify_schedule  # noqa: PLC0415

        layers, docs = schedule_from_args(schedule, documents, n, name, file, args, p, block,
                                          mode, depth)
        report = verify_schedule(layers, documents=docs, residual=residual, explain_failure=True)
    else:
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


@cli_command
def analyze_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Pattern name (see `patterns list`)."),
    ns: str = typer.Option("1024,4096,16384,65536", "--n",
                           help="Comma-separated sequence lengths."),
    json_out: bool = JSON,
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


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("verify", cls=Command, context_settings=PATTERN_CONTEXT)(verify_cmd)
    app.command("analyze", cls=Command, context_settings=PATTERN_CONTEXT)(analyze_cmd)
