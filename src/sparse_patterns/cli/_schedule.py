"""``--schedule`` and ``--documents``: the layers of a schedule (from text or a ``.json``
file) and packed documents, parsed with the same one-line errors as every option
(:mod:`._args`), for ``patterns verify`` and ``patterns render``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._args import MAX_N, UsageError, first_line, read_regular, registry, shown, split_steps

if TYPE_CHECKING:
    from ..pattern import Pattern

__all__ = ["MAX_LAYERS", "MAX_SCHEDULE_FILE", "parse_schedule", "parse_documents",
           "render_schedule_check", "schedule_from_args"]

#: Largest ``--schedule`` JSON file read (bytes).
MAX_SCHEDULE_FILE = 1 << 20

#: Most layers a ``--schedule`` may have: more than any model has, a bound on the input.
MAX_LAYERS = 256

#: Layer parameters a schedule may not give: the command sets them for every layer.
_SET_ELSEWHERE = {
    "n": "every layer is made at --n",
    "documents": "every layer is made inside the --documents of the command",
    "name": "a layer's pattern is the NAME before its parameters",
}


def _schedule_items(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``--schedule``: ``(name, params)`` per layer, from the text or from a ``.json`` file."""
    if text.strip().lower().endswith(".json"):
        import json  # noqa: PLC0415

        path = text.strip()
        data = read_regular("schedule", path, MAX_SCHEDULE_FILE, "the most a schedule file may be")
        try:
            items = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise UsageError(f"schedule: {shown(path)} is not valid JSON: {first_line(exc)}") from None
        form = 'a JSON list of {"pattern": NAME, "params": {...}}'
        if not isinstance(items, list):
            raise UsageError(f"schedule: {shown(path)} must hold {form}, got {type(items).__name__}")
        out = []
        for k, item in enumerate(items):
            if (not isinstance(item, dict) or not isinstance(item.get("pattern"), str)
                    or not set(item) <= {"pattern", "params"}
                    or not isinstance(item.get("params", {}), dict)):
                raise UsageError(f"schedule: layer {k + 1} of {shown(path)} must be "
                                 f'{{"pattern": NAME, "params": {{...}}}}, got {shown(item)}')
            out.append((item["pattern"], dict(item.get("params", {}))))
        return out
    out = []
    for k, part in enumerate(text.split(",")):
        name, *pairs = [t.strip() for t in part.split(":")]
        params: dict[str, Any] = {}
        for pair in pairs:
            key, eq, val = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or not key or not val.strip():
                raise UsageError(f"schedule: layer {k + 1} {shown(part.strip())} must be NAME or "
                                 "NAME:KEY=VALUE[:KEY=VALUE...] (e.g. local:window=128)")
            if key in params:
                raise UsageError(f"schedule: layer {k + 1} {shown(part.strip())} gives {key} twice")
            params[key] = val.strip()
        out.append((name, params))
    return out


def parse_schedule(text: str, n: int, documents: list[int] | None = None) -> list[Pattern]:
    """The layers of ``--schedule``: comma-separated ``NAME[:KEY=VALUE[:KEY=VALUE...]]``, or a
    ``.json`` file holding a list of ``{"pattern": NAME, "params": {...}}``; each made at n
    (inside every document, when ``documents`` are given, as a packed training run has them).

    Examples
    --------
    >>> [(p.name, dict(p.params)) for p in parse_schedule("local:window=2,full:causal=false", 8)]
    [('local', {'window': 2, 'causal': True}), ('full', {'causal': False})]
    >>> parse_schedule("local:window", 8)
    Traceback (most recent call last):
    ...
    sparse_patterns.cli._args.UsageError: schedule: layer 1 'local:window' must be NAME or NAME:KEY=VALUE[:KEY=VALUE...] (e.g. local:window=128)
    """
    items = _schedule_items(text)
    if not items:
        raise UsageError(f"schedule: needs at least one layer, got {shown(text)}")
    if len(items) > MAX_LAYERS:
        raise UsageError(f"schedule: {len(items):,} layers; at most {MAX_LAYERS} (more than "
                         "a model has; each layer adds a pass of the exact check)")
    out = []
    for k, (name, params) in enumerate(items):
        if not name:
            raise UsageError(f"schedule: layer {k + 1} has no pattern name in {shown(text)}")
        for key, why in _SET_ELSEWHERE.items():
            if key in params:
                raise UsageError(f"schedule: layer {k + 1} ({shown(name)}) gives {key}="
                                 f"{shown(params[key])}; {why}")
        try:
            out.append(registry.make(name, n, **params) if documents is None
                       else registry.make(name, n, documents=documents, **params))
        except ValueError as exc:
            if isinstance(exc, MemoryError):  # config.MemoryLimitError: reported as such
                raise
            raise UsageError(f"schedule: layer {k + 1} ({name}): {first_line(exc)}") from None
    return out


def parse_documents(text: str) -> list[int]:
    """``--documents 1024,3072`` (lengths) or ``0,1024,4096`` (cu_seqlens offsets) as ints.

    Examples
    --------
    >>> parse_documents("1024, 3072")
    [1024, 3072]
    """
    out = []
    for part in text.split(","):
        if re.fullmatch(r"\s*[+-]?[0-9]{1,18}\s*", part, re.ASCII) is None:
            raise UsageError(f"documents: expected comma-separated integers (lengths, or offsets "
                             f"from 0), got {shown(text)}")
        out.append(int(part))
    return out


def render_schedule_check(view: str, **given: Any) -> None:
    """``patterns render --schedule``: the hops view, without the options of other views."""
    if view != "hops":
        raise UsageError(f"view: --schedule draws the hops view, got --view {view}")
    extra = [f"--{key}" for key, value in given.items() if value is not None]
    if extra:
        raise UsageError(f"schedule: --schedule takes no {', '.join(extra)} (options of the "
                         "matrix and image views)")


def schedule_from_args(schedule: str | None, documents: str | None, n: int | None,
                       name: str | None, file: str | None, args: Sequence[str], p: int | None,
                       block: int | None, mode: str, depth: bool | None,
                       ) -> tuple[list[Pattern], list[int] | None]:
    """``patterns verify --schedule S [--documents D]``: the layers and documents, or a usage error."""
    if schedule is None:
        raise UsageError("documents: --documents applies to a schedule; give --schedule too")
    # typer may take an unknown option (--p, --stride) for the pattern name: look at both
    p_opt, rest = split_steps(None, ([name] if name is not None else []) + list(args))
    if p is not None and p_opt is not None and p != p_opt:
        raise UsageError(f"p: --p {p_opt} and --steps {p} disagree")
    p = p if p is not None else p_opt
    if rest:
        raise UsageError(f"schedule: --schedule takes no pattern name or pattern options, got "
                         f"{shown(' '.join(rest))}; give each layer's parameters inside it "
                         "(local:window=128,full)")
    clash = [what for what, given in (
        ("--file", file is not None), ("--block", block is not None),
        ("--depth/--no-depth", depth is not None), (f"--mode {mode}", mode != "interleaved"),
    ) if given]
    if clash:
        raise UsageError(f"schedule: --schedule takes no {', '.join(clash)}: its layers run in "
                         "order, one step each, at token level")
    if n is None:
        raise UsageError(f"n: --n is required with --schedule (an integer [1, {MAX_N}])")
    docs = None if documents is None else parse_documents(documents)
    layers = parse_schedule(schedule, n, docs)
    if p is not None and p != len(layers):
        raise UsageError(f"p: a schedule of {len(layers)} layer(s) is verified with p = "
                         f"{len(layers)}, got {p}")
    return layers, docs
