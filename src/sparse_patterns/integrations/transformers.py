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

Lengths: a pattern's ``n`` is the model's context length (``max_position_embeddings``).
A sequence of that length runs the pattern; a shorter one, with a causal pattern, its
first rows (what those positions attend in a full-length sequence, which a causal
pattern never lets see later tokens).

Masks: a causal mask, with or without right padding, is the pattern itself (a padded
query row attends what the pattern gives it; no real token attends a pad, which
comes after it); packed sequences (a block-diagonal causal mask, from
``position_ids`` that restart) become the family's packed documents, one call per
distinct packing. A mask is boolean or additive (0, and -inf or at most -1e4 where
masked), one for every head, of the batch's size or 1. Any other mask (left padding,
a custom 4D mask, a bias on the scores) is refused in one line, never ignored, and so
is what the pattern cannot express: soft-capped scores, attention sinks, a position
bias, attention weights (``output_attentions``), cross-attention and encoder-decoder
models. A sliding window comes in the model's mask, as for SDPA: refused where it
binds (a query with keys further back in its document than the window), else the
same mask as without it.

Causality: a causal layer (a decoder's) needs a causal pattern; in a bidirectional
layer (an encoder's) the pattern is all it attends.

``generate()`` with a KV cache (dynamic or static): the prompt runs as a shorter
sequence (a prompt under ``n / 16`` tokens, needing no gradients, gathers its rows
rather than run the kernel on a zero tail up to ``n``); each decode step's queries
attend the pattern's rows of their positions against the cached keys (gathered,
:func:`_decoded`). A batch of prompts of different lengths (left padding) is refused,
as above, and so is a cache that does not hold every earlier position (a sliding
window's), by the model's ``position_ids``.
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


def _is_cross_attention(module: Any) -> bool:
    """A cross-attention module, as transformers' models mark or name them."""
    return (getattr(module, "is_cross_attention", False) is True
            or type(module).__name__.endswith("CrossAttention"))


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
        length (``config.max_position_embeddings``); a shorter sequence runs a causal
        pattern's first rows.
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
        whose length does not divide the layers, patterns of different ``n`` or an
        ``n`` that is not the model's context length, a head count the pattern's heads
        cannot map to.

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
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"model: {type(model).__name__} is an encoder-decoder; the backend runs "
                         "decoder-only models (a cross-attention's keys are another sequence, "
                         "which a pattern over one sequence does not describe)")
    cross = [type(m).__name__ for m in model.modules() if _is_cross_attention(m)]
    if cross:
        raise ValueError(f"model: {type(model).__name__} has cross-attention layers ({cross[0]}), "
                         "whose keys are another sequence, which a pattern over one sequence "
                         "does not describe")
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
    text = getattr(model.config, "get_text_config", lambda: model.config)()
    context = getattr(text, "max_position_embeddings", None)
    if isinstance(context, int) and context != pats[0].n:
        raise ValueError(f"patterns: n={pats[0].n} is not the model's context length "
                         f"{context} (config.max_position_embeddings); make the patterns "
                         f"at n={context}")
    heads = getattr(text, "num_attention_heads", None)
    for i, layer in enumerate(layers):
        p = pats[i % len(pats)]
        if getattr(layer, "is_causal", True) and not p.causal:
            raise ValueError(f"patterns: {p.name} is not causal, but layer {i} attends causally "
                             "(a decoder's self-attention); give causal patterns")
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


#: Arguments of transformers' attention functions that change what attention computes.
_UNSUPPORTED = {"softcap": "tanh soft-capped scores", "s_aux": "attention sinks",
                "position_bias": "a bias on the scores"}

#: An additive mask's entries at or below this mask their pair: ``exp`` of it is 0 in float64.
_MASKED = -1e4


def _allowed(mask: Any) -> Any:
    """The pairs a mask lets attend: a boolean mask as it is, an additive one where 0 (its
    other entries must mask: -inf, the dtype's minimum or at most :data:`_MASKED`)."""
    import torch  # noqa: PLC0415

    if mask.dtype == torch.bool:
        return mask
    ok = mask == 0
    bad = ~(ok | (mask <= _MASKED))  # NaN included
    if bool(bad.any()):
        bias = mask[bad][0].item()
        raise ValueError(f"attention_mask: an additive mask holds {bias:g}, a bias on the scores "
                         f"(only 0 and masking values <= {_MASKED:g} map to a pattern)")
    return ok


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
            rows = _allowed(mask[b, 0, a : a + _ROWS])  # (R, L)
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

    ``query`` ``(B, H, L, d)``, ``key`` and ``value`` ``(B, H_kv, S, d)`` with ``H`` a
    multiple of ``H_kv`` and ``L <= S <= n``: ``L < S`` are decode steps against a KV
    cache (the queries are the last ``L`` positions, or as the mask places them).
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
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"{name}: the model asks for {what}, which the sparse backend "
                             "does not compute")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: the sparse backend returns no attention weights "
                         "(run the model with output_attentions=False)")
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    if causal and not pattern.causal:
        raise ValueError(f"pattern: {pattern.name} is not causal, but layer "
                         f"{getattr(module, 'layer_idx', '?')} attends causally; give a causal "
                         "pattern")
    B, H, L, d = query.shape
    S, n = key.shape[2], pattern.n
    if S > n:
        raise ValueError(f"pattern: n={n} is shorter than the sequence, {S} positions "
                         f"(keys, cached ones included); the pattern's n bounds the context")
    if (S != n or L != S) and not pattern.causal:
        raise ValueError(f"pattern: {pattern.name} is not causal, so it runs only sequences of "
                         f"exactly n={n} with no KV cache; got {L} queries on {S} keys")
    Hk = key.shape[1]
    if H % Hk:
        raise ValueError(f"key: {Hk} key heads do not divide the {H} query heads")
    if attention_mask is not None and (attention_mask.ndim != 4 or attention_mask.shape[0] not in
                                       (1, B) or tuple(attention_mask.shape[1:]) != (1, L, S)):
        raise ValueError(f"attention_mask: shape {tuple(attention_mask.shape)}, expected "
                         f"({B} or 1, 1, {L}, {S}): one mask for every head")
    if L != S:  # decode steps against a KV cache
        if not causal:
            raise ValueError(f"key: {S} keys for {L} queries in a bidirectional layer "
                             "(cross-attention or a cache); the sparse backend runs those only in "
                             "causal layers")
        start = _first_position(attention_mask, L, S, kwargs.get("position_ids"))
        out = _decoded(query, key, value, pattern, mode, scaling, start)
        return out.transpose(1, 2).contiguous(), None
    docs = None
    if attention_mask is not None:
        docs = _documents_of(attention_mask)
        if docs is None:
            raise ValueError(
                "attention_mask: only causal masks, right padding and packed sequences map "
                "to the pattern; got another mask (left padding, a sliding window that "
                "binds, or a custom mask)")
        docs = docs * B if len(docs) < B else docs  # a mask of batch 1, broadcast
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if S * _SHORT < n and not grads and (docs is None or all(x is None for x in docs)):
        # a short prompt of a long-context model: its rows gathered, not a tail of n - S
        out = _decoded(query, key, value, pattern, mode, scaling, 0)
        return out.transpose(1, 2).contiguous(), None
    if Hk != H:  # grouped-query heads, as transformers' repeat_kv
        key = key.repeat_interleave(H // Hk, dim=1)
        value = value.repeat_interleave(H // Hk, dim=1)
    if S < n:  # a shorter sequence: the pattern's first S rows, the rest a zero tail
        query, key, value = (torch.nn.functional.pad(t, (0, 0, 0, n - S))
                             for t in (query, key, value))
        if docs is not None:
            docs = [x if x is None else x + (n - S,) for x in docs]
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
    return out[:, :, :S].transpose(1, 2).contiguous(), None


#: A sequence this many times shorter than ``n``, run without gradients (a prompt), gathers
#: its rows (:func:`_decoded`) instead of running the kernel on a zero tail up to ``n``.
_SHORT = 16


def _first_position(mask: Any, L: int, S: int, position_ids: Any = None) -> int:
    """The position of the first of ``L`` queries decoded against ``S`` keys, which must
    be the positions ``0 .. S - 1`` in order.

    Without a mask, as transformers' SDPA path aligns it: one query is the last position,
    several start at 0 (its ``is_causal``: an empty or static cache's prompt). Else read
    off the mask, which must let query ``r`` see exactly the keys ``0 .. start + r`` in
    every batch row. The model's ``position_ids``, where given, must agree (a
    sliding-window cache, which keeps only the latest keys, does not)."""
    import torch  # noqa: PLC0415

    start = _masked_start(mask, L, S) if mask is not None else (S - 1 if L == 1 else 0)
    if position_ids is not None and getattr(position_ids, "ndim", 0) == 2:
        want = torch.arange(start, start + L, device=position_ids.device)
        if position_ids.shape[-1] != L or not bool((position_ids == want).all()):
            got = position_ids[0, : min(3, position_ids.shape[-1])].tolist()
            raise ValueError(
                f"position_ids: queries at positions {got}..., but the {S} cached keys put "
                f"them at {start}...; the sparse backend decodes only against a cache of "
                "every earlier position (not a sliding-window cache)")
    return start


def _masked_start(mask: Any, L: int, S: int) -> int:
    """:func:`_first_position`'s start read off a ``(B, 1, L, S)`` mask (its shape checked
    by :func:`attention_forward`)."""
    import torch  # noqa: PLC0415

    B = mask.shape[0]
    start = int(_allowed(mask[0, 0, 0]).sum()) - 1
    idx = torch.arange(S, device=mask.device)
    for a in range(0, L, _ROWS):
        rows = _allowed(mask[:, 0, a : a + _ROWS])  # (B, R, S)
        want = idx[None, :] <= start + idx[a : a + rows.shape[1], None]
        if not bool((rows == want[None]).all()):
            raise ValueError(
                "attention_mask: decoding with a KV cache needs every query to see exactly "
                "the keys up to its position in every batch row (no padding); got another "
                f"mask over {B} x {L} queries and {S} keys (left padding or a custom mask)")
    if start < 0 or start + L > S:
        raise ValueError(f"attention_mask: the queries' positions {start}..{start + L - 1} "
                         f"are not within the {S} keys")
    return start


#: Bytes of gathered key and value rows a decode step holds at a time.
_GATHER_BYTES = 64 << 20


def _decoded(query: Any, key: Any, value: Any, pattern: Pattern, mode: str,
             scaling: float | None, start: int) -> Any:
    """Attention of the queries at positions ``start .. start + L - 1`` on the pattern's
    rows of those positions, their keys gathered from ``key`` and ``value`` ``(B, H_kv,
    S, d)`` (query head ``h`` reads key head ``h // (H / H_kv)``, as ``repeat_kv``; only
    the gathered rows are expanded, never the cache); ``(B, H, L, d)``. Softmax in
    float32 at least; a row with no keys is 0, as in the kernels."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    B, H, L, d = query.shape
    p = pattern.num_heads
    ct = torch.promote_types(query.dtype, torch.float32)
    scale = d ** -0.5 if scaling is None else scaling
    out = torch.empty_like(query)
    groups = ([(None, slice(None))] if mode == "merged"
              else [(h, slice(h, None, p)) for h in range(p)])
    item = key.element_size() + (0 if key.dtype == ct else ct.itemsize)  # gathered, widened
    per_row = max(1, pattern.max_row_count()) * B * H * d * item * 2
    step = max(1, _GATHER_BYTES // per_row)
    kv_of = torch.arange(H, device=key.device) // (H // key.shape[1])
    for head, hs in groups:
        kv = kv_of[hs]
        h = kv.numel()
        for a in range(0, L, step):
            b = min(L, a + step)
            rows = pattern.rows(start + a, start + b, head=head)
            counts = np.diff(rows.indptr)
            C = max(1, int(counts.max(initial=0)))
            r = np.repeat(np.arange(b - a), counts)
            c = np.arange(rows.indices.size) - np.repeat(rows.indptr[:-1], counts)
            idx = np.zeros((b - a, C), dtype=np.int64)
            idx[r, c] = rows.indices
            seen = np.zeros((b - a, C), dtype=bool)
            seen[r, c] = True
            it = torch.from_numpy(idx).to(query.device).reshape(-1)
            ok = torch.from_numpy(seen).to(query.device)
            kg = key.index_select(2, it).index_select(1, kv).view(B, h, b - a, C, d).to(ct)
            vg = value.index_select(2, it).index_select(1, kv).view(B, h, b - a, C, d).to(ct)
            q = query[:, hs, a:b].to(ct).unsqueeze(-2)  # (B, h, R, 1, d)
            s = (q @ kg.transpose(-1, -2)).squeeze(-2) * scale  # (B, h, R, C)
            w = torch.softmax(s.masked_fill(~ok, -torch.inf), dim=-1)
            w = torch.where(ok.any(-1, keepdim=True), w, 0.0)
            out[:, hs, a:b] = (w.unsqueeze(-2) @ vg).squeeze(-2).to(query.dtype)
    return out


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
