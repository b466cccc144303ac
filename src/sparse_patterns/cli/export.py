"""``patterns export``: write a pattern for FlexAttention, DeepSpeed, xformers,
Triton or Block-Sparse-Attention (a ``.pt`` of tensors), or as a file
(``.npz``, ``.safetensors``, ``.json`` recipe) that ``--file`` reads back.

Parse, one call (:func:`sparse_patterns.export.export_pattern`), print; the
formats and their suffixes come from the one table, ``export.formats.FORMATS``."""

from __future__ import annotations

import typer

from ..export.formats import FORMATS, TORCH_FORMATS
from ._app import PATTERN_CONTEXT, app, cli_command, console, emit_json, pattern_from_args

__all__ = ["export_cmd"]

_FORMAT_HELP = (
    f"{'|'.join(TORCH_FORMATS)} (a .pt of tensors) or "
    f"{'|'.join(name for name in FORMATS if name not in TORCH_FORMATS)}; "
    "default: from the suffix of -o."
)


@app.command("export", context_settings=PATTERN_CONTEXT)
@cli_command
def export_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Pattern name (see `patterns list`)."),
    n: int = typer.Option(None, "--n", help="Sequence length."),
    file: str = typer.Option(None, "--file", help="Read the pattern from a saved file instead."),
    fmt: str = typer.Option(None, "--format", help=_FORMAT_HELP),
    out: str = typer.Option(..., "-o", "--output", help="Output file."),
    block: int = typer.Option(None, "--block", help="Block size (flex 128, bsa 128, layouts 16)."),
    mode: str = typer.Option("multihead", "--mode", help="multihead (head h uses h mod p) or merged."),
    num_heads: int = typer.Option(None, "--num-heads", help="Attention heads H (default p, or 1 merged)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
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
