"""A Hugging Face transformers attention backend: a model's attention runs a sparse pattern.

:func:`register` adds ``attn_implementation="sparse_patterns"`` to
``transformers.AttentionInterface`` (and its mask function to
``AttentionMaskInterface``); :func:`configure` gives each attention layer of a model
its pattern: one for every layer, or a per-layer schedule such as
``[local, local, strided]`` (repeated over the layers). The layers then call
:func:`sparse_patterns.torch.sparse_attention` (``impl="auto"``: numba on the CPU,
the PyTorch-kernels path on CUDA) on the model's ``q, k, v`` as they come:
grouped-query heads are expanded as transformers' ``repeat_kv`` does, the model's
``scaling`` is the score scale, and attention dropout must be 0.

Masks: a causal mask, with or without right padding, is the pattern itself (a padded
query row attends what the pattern gives it; no real token attends a pad, which
comes after it); packed sequences (a block-diagonal causal mask, from
``position_ids`` that restart) become the family's packed documents, one call per
distinct packing. Any other mask (left padding, a custom 4D mask) is refused in
one line, never ignored. ``generate()`` with a KV cache is refused in one line:
decode steps would need the pattern's rows of the new positions against the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..pattern import Pattern

__all__ = ["NAME", "register", "configure", "attention_forward"]

#: The ``attn_implementation`` name this backend registers.
NAME = "sparse_patterns"

_ATTR = "_sparse_patterns"


def _transformers() -> Any:
    try:
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise ValueError(
            "transformers: the backend needs transformers >= 5 "
            f"(pip install 'sparse-patterns[transformers]'); not importable ({e})") from e
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise ValueError(f"transformers: the backend needs transformers >= 5, found "
                         f"{transformers.__version__}")
    return transformers


def register() -> str:
    """Register :data:`NAME` with transformers' attention and mask interfaces; returns it.

    Examples
    --------
    >>> register()
    'sparse_patterns'
    """
    tf = _transformers()
    from transformers.masking_utils import sdpa_mask  # noqa: PLC0415

    tf.AttentionInterface.register(NAME, attention_forward)
    tf.masking_utils.AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def _attention_layers(model: Any) -> list[Any]:
    """The model's self-attention modules, by layer index (modules with a ``layer_idx``
    whose config chose an attention implementation)."""
    layers = {}
    for m in model.modules():
        idx = getattr(m, "layer_idx", None)
        if isinstance(idx, int) and hasattr(m, "config") and any(
                hasattr(m, a) for a in ("q_proj", "c_attn", "qkv_proj", "query")):
            layers.setdefault(idx, m)
    return [layers[i] for i in sorted(layers)]


def configure(model: Any, patterns: Pattern | Sequence[Pattern], *, mode: str = "merged",
              impl: str = "auto", block: int | None = None) -> Any:
    """Give every attention layer of ``model`` its pattern; returns ``model``.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Built with ``attn_implementation="sparse_patterns"`` (after :func:`register`).
    patterns : Pattern or sequence of Pattern
        One pattern for every layer, or a schedule repeated over the layers (its
        length must divide the number of layers). Each ``n`` is the model's context
        length: every sequence it runs has that length.
    mode : {"merged", "multihead"}
        ``merged``: every attention head uses the union of the pattern's heads;
        ``multihead``: attention head ``h`` uses pattern head ``h % p`` (the model's
        head count must then be a multiple of ``p``).
    impl : str
        The backend (``"auto"``: numba on the CPU, ``"torch"`` on CUDA).
    block : int, optional
        Tile size of the plans (the backend's default on the device).

    Raises
    ------
    ValueError
        A model with no attention layers or not built for this backend, a schedule
        whose length does not divide the layers, patterns of different ``n``, a head
        count the pattern's heads cannot map to.

    Examples
    --------
    >>> import torch, sparse_patterns as sps
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=11,
    ...                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    >>> model = GPT2LMHeadModel._from_config(cfg, attn_implementation=register())
    >>> model = configure(model, sps.make("strided", 32, stride=4))
    >>> model(input_ids=torch.zeros(1, 32, dtype=torch.long)).logits.shape
    torch.Size([1, 32, 11])
    """
    from ..kernels.planning import check_mode  # noqa: PLC0415
    from ..torch import check_impl  # noqa: PLC0415

    mode = check_mode(mode)
    impl = check_impl(impl)
    pats = [patterns] if isinstance(patterns, Pattern) else list(patterns)
    if not pats or not all(isinstance(p, Pattern) for p in pats):
        raise ValueError("patterns: give a Pattern or a non-empty sequence of Patterns")
    layers = _attention_layers(model)
    if not layers:
        raise ValueError(f"model: no attention layers found in {type(model).__name__}")
    impl_name = getattr(model.config, "_attn_implementation", None)
    if impl_name != NAME:
        raise ValueError(f"model: built with attn_implementation={impl_name!r}; build it "
                         f"with attn_implementation={NAME!r} (after register())")
    if len(layers) % len(pats):
        raise ValueError(f"patterns: a schedule of {len(pats)} cannot repeat over the model's "
                         f"{len(layers)} attention layers; give 1 or a divisor of {len(layers)}")
    ns = {p.n for p in pats}
    if len(ns) > 1:
        raise ValueError(f"patterns: every pattern needs one n (the context length), got "
                         f"{sorted(ns)}")
    heads = getattr(model.config, "num_attention_heads", None)
    for p in pats:
        if mode == "multihead" and heads is not None and heads % p.num_heads:
            raise ValueError(
                f"patterns: {p.name} has {p.num_heads} heads, which cannot map onto the "
                f"model's {heads} attention heads (multihead needs a multiple of "
                f"{p.num_heads}); use mode='merged'")
    for i, layer in enumerate(layers):
        setattr(layer, _ATTR, (pats[i % len(pats)], mode, impl, block))
    return model


# --------------------------------------------------------------------- masks
#: Query rows of the model's mask read at a time: the checks hold (rows, L), never (L, L).
_ROWS = 256


def _documents_of(mask: Any) -> list[tuple[int, ...] | None] | None:
    """Per batch row, the document lengths of a mask that is causal within each document
    and right-padded (None for a row that is plain causal), or None when the mask is
    neither.

    Read ``_ROWS`` query rows at a time: query ``i`` of a real token must see exactly the
    keys ``first_i .. i`` (no later key, ``i - first_i + 1`` keys in all), where
    ``first_i`` is its document's first token (the previous row's, or ``i`` itself where
    a document starts); the keys any query sees must be a prefix (right padding).
    """
    import torch  # noqa: PLC0415

    B, _, L, S = mask.shape
    if S != L:
        return None
    idx = torch.arange(L, device=mask.device)
    out: list[tuple[int, ...] | None] = []
    for b in range(B):
        first = torch.empty(L, dtype=torch.long, device=mask.device)
        count = torch.empty(L, dtype=torch.long, device=mask.device)
        valid = torch.zeros(L, dtype=torch.bool, device=mask.device)
        for a in range(0, L, _ROWS):
            rows = mask[b, 0, a : a + _ROWS]
            rows = rows if rows.dtype == torch.bool else rows == 0  # (R, L)
            i = idx[a : a + rows.shape[0], None]
            if bool((rows & (idx[None, :] > i)).any()):
                return None  # attends a later key: not causal
            first[a : a + rows.shape[0]] = rows.to(torch.uint8).argmax(dim=1)
            count[a : a + rows.shape[0]] = rows.sum(dim=1)
            valid |= rows.any(dim=0)
        length = int(valid.long().cumprod(0).sum())  # the valid prefix
        if bool(valid[length:].any()):
            return None  # a valid key after a pad: left padding or holes
        f, c, i = first[:length], count[:length], idx[:length]
        if not bool((c == i - f + 1).all()):
            return None  # not every key from the document's start (a window, a custom mask)
        starts = (f == i).nonzero().ravel()
        if length and not bool(((f[1:] == f[:-1]) | (f[1:] == i[1:])).all() and f[0] == 0):
            return None  # a query whose first key is not its document's start
        bounds = [*starts.tolist(), length]
        lengths = tuple(bounds[k + 1] - bounds[k] for k in range(len(bounds) - 1))
        pad = L - length
        out.append(None if len(lengths) <= 1 else lengths + ((pad,) if pad else ()))
    return out


def attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                      scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[Any, None]:
    """transformers' attention function: ``(B, L, H, d)`` output, no weights.

    ``query`` ``(B, H, L, d)``, ``key`` and ``value`` ``(B, H_kv, L, d)`` with
    ``H`` a multiple of ``H_kv``.
    """
    import torch  # noqa: PLC0415

    from ..torch import sparse_attention  # noqa: PLC0415

    spec = getattr(module, _ATTR, None)
    if spec is None:
        raise ValueError(f"model: layer {getattr(module, 'layer_idx', '?')} has no pattern; "
                         "call sparse_patterns.integrations.transformers.configure(model, "
                         "pattern) first")
    pattern, mode, impl, block = spec
    if dropout:
        raise ValueError(f"dropout: the sparse backend runs with attention dropout 0, got "
                         f"{dropout} (set the config's attention dropout to 0)")
    B, H, L, d = query.shape
    if key.shape[2] != L:
        raise ValueError(
            f"generate: {key.shape[2]} cached keys for {L} new queries; the sparse backend "
            "does not decode with a KV cache (use_cache=False, or generate with another "
            "attn_implementation)")
    if L != pattern.n:
        raise ValueError(f"pattern: n={pattern.n} is not the sequence length {L}; every "
                         f"sequence must have the pattern's n (pad or pack to it)")
    Hk = key.shape[1]
    if H % Hk:
        raise ValueError(f"key: {Hk} key heads do not divide the {H} query heads")
    if Hk != H:  # grouped-query heads, as transformers' repeat_kv
        key = key.repeat_interleave(H // Hk, dim=1)
        value = value.repeat_interleave(H // Hk, dim=1)
    docs = None
    if attention_mask is not None:
        docs = _documents_of(attention_mask)
        if docs is None:
            raise ValueError(
                "attention_mask: only causal masks, right padding and packed sequences map "
                "to the pattern; got another mask (left padding or a custom mask)")
    if docs is None or all(x is None for x in docs):
        out = sparse_attention(query, key, value, pattern, mode=mode, scale=scaling,
                               impl=impl, block=block)
    else:
        out = torch.empty_like(query)
        groups: dict[Any, list[int]] = {}
        for b, lengths in enumerate(docs):
            groups.setdefault(lengths, []).append(b)
        for lengths, rows in groups.items():
            pat = pattern if lengths is None else _packed(pattern, lengths)
            sel = torch.tensor(rows, device=query.device)
            out[sel] = sparse_attention(query[sel], key[sel], value[sel], pat, mode=mode,
                                        scale=scaling, impl=impl, block=block)
    return out.transpose(1, 2).contiguous(), None


def _packed(pattern: Pattern, lengths: tuple[int, ...]) -> Pattern:
    """The pattern's family inside documents of ``lengths`` (a registered family only)."""
    from ..patterns import registry  # noqa: PLC0415

    spec = registry.REGISTRY.get(pattern.name)
    params = {k: v for k, v in pattern.params.items() if k != "documents"}
    if spec is None or pattern.rule is None or "documents" in pattern.params:
        raise ValueError(
            f"attention_mask: packed sequences need the pattern of a registered family "
            f"(generated by sps.make) to repeat inside each document; {pattern.name!r} is not")
    return registry.make(pattern.name, pattern.n, documents=list(lengths), **params)
