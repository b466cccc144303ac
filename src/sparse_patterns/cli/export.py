"""``patterns export``: write a pattern for FlexAttention, DeepSpeed, xformers,
Triton or Block-Sparse-Attention (a ``.pt`` of tensors), or as a file
(``.npz``, ``.safetensors``, ``.json`` recipe) that ``--file`` reads back."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import (
    PATTERN_CONTEXT,
    UsageError,
    app,
    cli_command,
    console,
    emit_json,
    pattern_from_args,
)

__all__ = ["export_cmd", "export_pattern", "EXPORT_FORMATS"]

#: ``--format`` choices and the suffix each writes
EXPORT_FORMATS = {
    "flex": ".pt", "deepspeed": ".pt", "xformers": ".pt", "triton": ".pt", "bsa": ".pt",
    "npz": ".npz", "safetensors": ".safetensors", "json": ".json",
}


def export_pattern(pattern, fmt: str | None, out: str, *, block: int | None = None,
                   mode: str = "multihead", num_heads: int | None = None) -> dict:
    """Write ``pattern`` in format ``fmt`` to ``out``; return a summary dict."""
    from ..export import save, save_torch_export  # noqa: PLC0415

    path = Path(out)
    suffix = path.suffix.lower()
    if fmt is None:
        by_suffix = {v: k for k, v in EXPORT_FORMATS.items() if v != ".pt"}
        if suffix not in by_suffix:
            raise UsageError(
                f"format: give --format ({', '.join(EXPORT_FORMATS)}); the suffix "
                f"{suffix or '(none)'!r} of {out!r} does not name one"
            )
        fmt = by_suffix[suffix]
    if fmt not in EXPORT_FORMATS:
        raise UsageError(f"format: must be one of {', '.join(EXPORT_FORMATS)}; got {fmt!r}")
    want = EXPORT_FORMATS[fmt]
    if suffix != want:
        raise UsageError(f"output: --format {fmt} writes a {want} file; got {out!r}")
    if want == ".pt":
        save_torch_export(pattern, path, fmt, block=block, mode=mode, num_heads=num_heads)
    else:
        if block is not None or mode != "multihead" or num_heads is not None:
            raise UsageError(f"block: --block, --mode and --num-heads apply to the torch formats, not {fmt}")
        save(pattern, path)
    return {"file": str(path), "format": fmt, "name": pattern.name, "n": pattern.n,
            "heads": pattern.num_heads, "bytes": path.stat().st_size}


@app.command("export", context_settings=PATTERN_CONTEXT)
@cli_command
def export_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Pattern name (see `patterns list`)."),
    n: int = typer.Option(None, "--n", help="Sequence length."),
    file: str = typer.Option(None, "--file", help="Read the pattern from a saved file instead."),
    fmt: str = typer.Option(
        None, "--format",
        help="flex|deepspeed|xformers|triton|bsa (a .pt of tensors) or npz|safetensors|json; "
             "default: from the suffix of -o.",
    ),
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
    pat = pattern_from_args(name, n, ctx.args, file)
    info = export_pattern(pat, fmt, out, block=block, mode=mode, num_heads=num_heads)
    if json_out:
        emit_json(info)
        return
    console.print(
        f"wrote {info['file']}  ({info['format']}, {info['name']}, n={info['n']}, "
        f"heads={info['heads']}, {info['bytes']:,} bytes)",
        highlight=False, markup=False, soft_wrap=True,
    )
