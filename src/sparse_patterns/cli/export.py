"""``patterns export``: a pattern to a framework's tensors or to a file.
"""

from __future__ import annotations

from typing import Any

import typer

from ._app import JSON, NAME, PATTERN_CONTEXT, N, cli_command, console, emit_json, int_opt
from ._args import Command, pattern_from_args


class _ExportCommand(Command):
    """``patterns export``: its ``--format`` help lists the format table, read when help is shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from ..export.formats import FORMATS, TORCH_FORMATS  # noqa: PLC0415

        files = "|".join(name for name in FORMATS if name not in TORCH_FORMATS)
        for param in self.params:
            if param.name == "fmt":
                param.help = (f"{'|'.join(TORCH_FORMATS)} (a .pt of tensors) or {files}; "
                              "default: from the suffix of -o.")
        super().format_help(ctx, formatter)


@cli_command
def export_cmd(
    ctx: typer.Context,
    name: str = NAME,
    n: int = N,
    file: str = typer.Option(None, "--file", help="Read the pattern from a saved file instead."),
    fmt: str = typer.Option(None, "--format", help="The format; default: from the suffix of -o."),
    out: str = typer.Option(..., "-o", "--output", help="Output file."),
    block: int = int_opt("block", None, "Block size (flex 128, bsa 128, layouts 16)"),
    mode: str = typer.Option("multihead", "--mode", help="multihead (head h uses h mod p) or merged."),
    num_heads: int = int_opt("num_heads", None, "Attention heads H (default p, or 1 merged)", 1, 1 << 16),
    json_out: bool = JSON,
) -> None:
    """Export a pattern to a framework's tensors or to a file.

    Pattern parameters are options of the same name: patterns export strided --n 4096
    --stride 64 --format flex -o strided.pt. A .pt holds a dict of tensors; read it with
    torch.load(f, weights_only=True).
    """
    from ..export import export_pattern  # noqa: PLC0415

    pat = pattern_from_args(name, n, ctx.args, file)
    result = export_pattern(pat, out, fmt, block=block, mode=mode, num_heads=num_heads)
    if json_out:
        emit_json(result.to_dict())
        return
    console.print(result.summary(), highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("export", context_settings=PATTERN_CONTEXT, cls=_ExportCommand)(export_cmd)
