"""The transformers attention backend against transformers' own SDPA with the pattern as
a boolean mask (a reference attention function registered here), in float64: outputs
within 1e-10 and gradients within 1e-8, for GPT-2 and Llama (grouped-query heads)
configs at context 256 (no download), one pattern or a per-layer schedule; right
padding and packed sequences; shorter sequences and ``generate()`` with a KV cache
against the same reference and against recomputing without a cache; and the one-line
refusals."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import sparse_patterns as sps  # noqa: E402
from sparse_patterns.integrations import transformers as backend  # noqa: E402

N = 256
REF = "sps_dense_reference"


def _reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """SDPA with the layer's pattern (the union of its heads) and the model's mask."""
    pattern, mode, _, _ = getattr(module, backend._ATTR)
    assert mode == "merged"
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    L, S = query.shape[2], key.shape[2]  # the queries are the last L of S positions
    mask = torch.from_numpy(pattern.rows(S - L, S)[:, :S].toarray())[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module", autouse=True)
def _registered():
    from transformers.masking_utils import sdpa_mask

    backend.register()
    transformers.AttentionInterface.register(REF, _reference)
    transformers.masking_utils.AttentionMaskInterface.register(REF, sdpa_mask)


def _gpt2(layers=2):
    cfg = transformers.GPT2Config(n_layer=layers, n_head=4, n_embd=32, n_positions=N,
                                  vocab_size=37, attn_pdrop=0.0, resid_pdrop=0.0,
                                  embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation=backend.NAME)


def _llama(layers=2):
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, hidden_size=32,
                                   intermediate_size=64, vocab_size=37,
                                   max_position_embeddings=N, bos_token_id=0, eos_token_id=0,
                                   pad_token_id=0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=backend.NAME)


SCHEDULES = {
    "strided": [sps.make("strided", N, stride=16)],
    "local-strided": [sps.make("local", N, window=20), sps.make("strided", N, stride=16)],
    "fixed": [sps.make("fixed", N, stride=32, c=4)],
}


def _run(model, impl, ids, **kw):
    model.config._attn_implementation = impl
    out = model(input_ids=ids, labels=ids, **kw)
    grads = torch.autograd.grad(out.loss, [p for p in model.parameters()], allow_unused=True)
    return out.logits, grads


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama-gqa"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_forward_and_gradients_equal_dense_masked_sdpa(build, schedule):
    torch.manual_seed(0)
    model = backend.configure(build().double(), SCHEDULES[schedule])
    ids = torch.randint(0, 37, (2, N), generator=torch.Generator().manual_seed(1))
    got, gg = _run(model, backend.NAME, ids)
    want, wg = _run(model, REF, ids)
    assert (got - want).abs().max().item() < 1e-10
    for a, b in zip(gg, wg, strict=True):
        if b is not None:
            assert (a - b).abs().max().item() < 1e-8


def test_right_padding_and_packed_sequences_match_the_masked_reference():
    torch.manual_seed(0)
    model = backend.configure(_llama().double(), SCHEDULES["strided"])
    ids = torch.randint(1, 37, (2, N), generator=torch.Generator().manual_seed(2))
    pad = torch.ones(2, N, dtype=torch.long)
    pad[1, 200:] = 0  # right padding
    model.config._attn_implementation = backend.NAME
    got = model(input_ids=ids, attention_mask=pad).logits
    model.config._attn_implementation = REF
    want = model(input_ids=ids, attention_mask=pad).logits
    assert (got[0] - want[0]).abs().max() < 1e-10 and (got[1, :200] - want[1, :200]).abs().max() < 1e-10
    # packed: transformers reads documents off position_ids only without a cache
    pos = torch.cat([torch.arange(100), torch.arange(N - 100)])[None].expand(2, -1)
    model.config._attn_implementation = backend.NAME
    got = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    model.config._attn_implementation = REF
    want = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    assert (got - want).abs().max() < 1e-10
    second = model(input_ids=ids[:, 100:], use_cache=False).logits  # the second document alone
    assert (got[:, 100:] - second).abs().max() < 1e-10


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama-gqa"])
@pytest.mark.parametrize("schedule", ["local-strided", "fixed"])
def test_a_shorter_sequence_is_the_full_lengths_prefix(build, schedule):
    torch.manual_seed(0)
    model = backend.configure(build().double(), SCHEDULES[schedule])
    ids = torch.randint(0, 37, (2, N), generator=torch.Generator().manual_seed(4))
    full = model(input_ids=ids).logits
    got, gg = _run(model, backend.NAME, ids[:, :100])
    want, wg = _run(model, REF, ids[:, :100])
    assert (got - full[:, :100]).abs().max().item() < 1e-10
    assert (got - want).abs().max().item() < 1e-10
    for a, b in zip(gg, wg, strict=True):
        if b is not None:
            assert (a - b).abs().max().item() < 1e-8


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama-gqa"])
@pytest.mark.parametrize("mode", ["merged", "multihead"])
def test_generate_with_a_kv_cache_decodes_the_patterns_rows(build, mode):
    """Greedy generation with the cache equals recomputing every prefix without one, and
    each cached step's logits equal the masked reference's."""
    torch.manual_seed(0)
    model = backend.configure(build().double(), SCHEDULES["local-strided"], mode=mode).eval()
    prompt = torch.randint(1, 37, (2, 60), generator=torch.Generator().manual_seed(5))
    model.generation_config.eos_token_id = None  # 40 new tokens, whatever they are
    kw = dict(max_new_tokens=40, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    model.config._attn_implementation = backend.NAME
    got = model.generate(input_ids=prompt, **kw)
    again = model.generate(input_ids=prompt, use_cache=False, **kw)
    assert torch.equal(got.sequences, again.sequences)
    assert got.sequences.shape == (2, 100)
    for a, b in zip(got.logits, again.logits, strict=True):
        assert (a - b).abs().max().item() < 1e-10
    if mode == "merged":  # the reference applies the union of the heads
        model.config._attn_implementation = REF
        want = model.generate(input_ids=prompt, **kw)
        assert torch.equal(got.sequences, want.sequences)
        for a, b in zip(got.logits, want.logits, strict=True):
            assert (a - b).abs().max().item() < 1e-10


def test_generate_with_a_static_cache_and_a_short_prompt():
    """A 12-token prompt (gathered rows, not a tail up to n) with the default and with a
    static cache, whose prompt runs against the whole empty cache without a mask."""
    torch.manual_seed(0)
    model = backend.configure(_llama().double(), SCHEDULES["local-strided"]).eval()
    model.generation_config.eos_token_id = None
    prompt = torch.randint(1, 37, (2, 12), generator=torch.Generator().manual_seed(6))
    kw = dict(max_new_tokens=30, do_sample=False, output_logits=True,
              return_dict_in_generate=True, pad_token_id=0)
    model.config._attn_implementation = backend.NAME
    again = model.generate(input_ids=prompt, use_cache=False, **kw)
    for cache in ({}, {"cache_implementation": "static"}):
        got = model.generate(input_ids=prompt, **cache, **kw)
        assert torch.equal(got.sequences, again.sequences)
        for a, b in zip(got.logits, again.logits, strict=True):
            assert (a - b).abs().max().item() < 1e-10


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_decode_steps_match_float64_within_rounding(dtype):
    """Two decode queries (positions 88, 89, as their mask places them) of a multihead
    strided layer on 90 cached keys, in half precision, against the same rows in float64
    (each head its pattern head, each pair of heads its key head)."""
    model = backend.configure(_llama(1), SCHEDULES["strided"], mode="multihead")
    layer = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, h, L, 8, generator=g, dtype=torch.float64)
               for h, L in ((4, 2), (2, 90), (2, 90)))
    mask = torch.arange(90)[None, :] <= torch.tensor([[88], [89]])  # positions 88, 89
    got, _ = backend.attention_forward(layer, q.to(dtype), k.to(dtype), v.to(dtype),
                                       mask[None, None])
    assert got.dtype == dtype and got.shape == (2, 2, 4, 8)
    pat, tol = SCHEDULES["strided"][0], {torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    for h in range(4):
        for r, i in enumerate((88, 89)):
            cols = torch.from_numpy(pat.rows(i, i + 1, head=h % 2).indices)
            kk, vv = k[:, h // 2, cols], v[:, h // 2, cols]
            w = torch.softmax(torch.einsum("bd,bcd->bc", q[:, h, r], kk) / 8 ** 0.5, -1)
            want = torch.einsum("bc,bcd->bd", w, vv)
            assert (got[:, r, h].double() - want).abs().max().item() < tol


def test_a_sliding_window_is_refused_where_it_binds():
    cfg = transformers.MistralConfig(num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, hidden_size=32,
                                     intermediate_size=64, vocab_size=37,
                                     max_position_embeddings=N, sliding_window=16,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.MistralForCausalLM._from_config(cfg, attn_implementation=backend.NAME)
    model = backend.configure(model, SCHEDULES["strided"]).eval()
    model.generation_config.eos_token_id = None
    with pytest.raises(ValueError, match=r"^position_ids: queries at positions \[16\]"):
        model.generate(input_ids=torch.ones(1, 10, dtype=torch.long), max_new_tokens=20,
                       do_sample=False, pad_token_id=0)
    ids = torch.randint(1, 37, (1, N), generator=torch.Generator().manual_seed(10))
    with pytest.raises(ValueError, match=r"^attention_mask: .* a sliding window that binds"):
        model(input_ids=ids)  # the window in the model's mask
    pos = torch.arange(N) % 16  # packed documents no longer than the window: it never binds
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=pos[None], use_cache=False).logits
        alone = model(input_ids=ids[:, 48:64], use_cache=False).logits
    assert (got[:, 48:64] - alone).abs().max().item() < 1e-5


def test_a_model_trains_with_the_backend():
    torch.manual_seed(0)
    model = backend.configure(_gpt2(), SCHEDULES["local-strided"])
    ids = torch.randint(0, 37, (4, N), generator=torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.1


def test_refusals_are_one_line():
    model = backend.configure(_llama(), SCHEDULES["strided"])
    ids = torch.randint(1, 37, (1, N))
    left = torch.ones(1, N, dtype=torch.long)
    left[0, :10] = 0
    with pytest.raises(ValueError, match=r"^attention_mask: only causal masks"):
        model(input_ids=ids, attention_mask=left)
    with pytest.raises(ValueError, match=r"^pattern: n=256 is shorter than the sequence, 257"):
        model.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match=r"^attention_mask: only causal masks"):
        model.generate(input_ids=ids[:, :20], attention_mask=left[:, :20], max_new_tokens=2,
                       do_sample=False)  # left padding: the prompt's mask is refused
    holes = torch.tensor([True, False, True]).view(1, 1, 1, 3)  # a query that skips a key
    q, kv = torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"^attention_mask: decoding with a KV cache needs"):
        backend.attention_forward(model.model.layers[0].self_attn, q, kv, kv, holes)
    with pytest.raises(ValueError, match=r"^patterns: n=128 is not the model's context length "
                                         r"256 \(config.max_position_embeddings\)"):
        backend.configure(_llama(), sps.make("strided", 128, stride=16))
    gpt = _gpt2()
    gpt.config.attn_pdrop = 0.1
    gpt = transformers.GPT2LMHeadModel._from_config(gpt.config, attn_implementation=backend.NAME)
    backend.configure(gpt, SCHEDULES["strided"]).train()
    with pytest.raises(ValueError, match=r"^dropout: "):
        gpt(input_ids=ids)
    with pytest.raises(ValueError, match=r"^patterns: a schedule of 3 cannot repeat"):
        backend.configure(_llama(), SCHEDULES["strided"] * 3)
    with pytest.raises(ValueError, match=r"^patterns: strided has 2 heads, which cannot map"):
        backend.configure(_three_heads(), SCHEDULES["strided"], mode="multihead")
    sdpa = transformers.LlamaForCausalLM._from_config(_llama().config, attn_implementation="sdpa")
    with pytest.raises(ValueError, match=r"^model: built with attn_implementation='sdpa'"):
        backend.configure(sdpa, SCHEDULES["strided"])


def _attention_inputs(B=2, L=64, S=64, seed=8):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, 4, L, 8, generator=g, dtype=torch.float64),
            torch.randn(B, 2, S, 8, generator=g, dtype=torch.float64),
            torch.randn(B, 2, S, 8, generator=g, dtype=torch.float64))


def _small_llama(pattern, n=64):
    cfg = _llama(1).config
    cfg.max_position_embeddings = n
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=backend.NAME)
    return backend.configure(model, pattern), model.model.layers[0].self_attn


def test_masks_of_batch_one_and_additive_masks_equal_boolean_ones():
    """A packed mask of batch 1 applies to every batch row (as SDPA broadcasts it), and an
    additive mask (0 and -inf, the dtype's minimum or -1e9) reads as the boolean one."""
    _, layer = _small_llama(sps.make("strided", 64, stride=8))
    q, k, v = _attention_inputs()
    i, j = torch.arange(64)[:, None], torch.arange(64)[None, :]
    doc = torch.arange(64) >= 20
    mask = ((doc[:, None] == doc[None, :]) & (j <= i))[None, None]  # two documents
    want, _ = backend.attention_forward(layer, q, k, v, mask.expand(2, -1, -1, -1))
    got, _ = backend.attention_forward(layer, q, k, v, mask)
    assert torch.equal(got, want)
    for off in (-torch.inf, torch.finfo(torch.float64).min, -1e9):
        add = torch.zeros(1, 1, 64, 64, dtype=torch.float64).masked_fill(~mask, off)
        assert torch.equal(backend.attention_forward(layer, q, k, v, add)[0], want)
    alone = backend.attention_forward(layer, q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], None)[0]
    assert (want[:, 20:] - alone).abs().max().item() < 1e-12  # the second document alone


def test_what_the_pattern_cannot_express_is_refused():
    """Masks per head, biases, soft-capping, sinks, attention weights, a non-causal
    pattern in a causal layer: one line each, naming the argument."""
    _, layer = _small_llama(sps.make("strided", 64, stride=8))
    q, k, v = _attention_inputs()
    causal = torch.ones(64, 64, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match=r"^attention_mask: shape \(2, 4, 64, 64\), expected"):
        backend.attention_forward(layer, q, k, v, causal.expand(2, 4, -1, -1))
    bias = torch.zeros(1, 1, 64, 64, dtype=torch.float64).masked_fill(~causal, -torch.inf)
    with pytest.raises(ValueError, match=r"^attention_mask: an additive mask holds -0.5, a bias"):
        backend.attention_forward(layer, q, k, v, bias - 0.5 * causal)
    for kw in ({"softcap": 30.0}, {"s_aux": torch.zeros(4)},
               {"position_bias": torch.zeros(1, 4, 64, 64)}):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=f"^{name}: the model asks for"):
            backend.attention_forward(layer, q, k, v, None, **kw)
    with pytest.raises(ValueError, match=r"^output_attentions: the sparse backend returns no"):
        backend.attention_forward(layer, q, k, v, None, output_attentions=True)
    with pytest.raises(ValueError, match=r"^attention_mask: an additive mask holds nan"):
        backend.attention_forward(layer, q, k, v, bias.masked_fill(causal, torch.nan))
    two_way = sps.make("local", 64, window=8, causal=False)
    with pytest.raises(ValueError, match=r"^patterns: local is not causal, but layer 0 attends"):
        _small_llama(two_way)
    setattr(layer, backend._ATTR, (two_way, "merged", "auto", None))
    with pytest.raises(ValueError, match=r"^pattern: local is not causal, but layer 0 attends"):
        backend.attention_forward(layer, q, k, v, None)


def _bert(n=64):
    cfg = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=4, hidden_size=32,
                                  intermediate_size=64, vocab_size=37, max_position_embeddings=n,
                                  attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    return transformers.BertModel._from_config(cfg, attn_implementation=backend.NAME).double()


def test_a_bidirectional_layer_runs_the_pattern_alone():
    """In an encoder (BERT) the pattern is all the layer attends: a non-causal pattern
    equals transformers' SDPA with it as the mask; it runs only full-length sequences."""
    torch.manual_seed(0)
    pattern = sps.make("local", 64, window=8, causal=False)
    model = backend.configure(_bert().eval(), pattern)
    layer = backend._attention_layers(model)[0]
    assert layer.is_causal is False
    q, k, v = _attention_inputs()
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # BERT: a key head per head
    got, _ = backend.attention_forward(layer, q, k, v, None)
    mask = torch.from_numpy(pattern.union().toarray())
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (got - want.transpose(1, 2)).abs().max().item() < 1e-12
    ids = torch.randint(1, 37, (2, 64), generator=torch.Generator().manual_seed(9))
    later = ids.clone()
    later[:, 5] = (later[:, 5] + 1) % 37  # within position 0's window, after it
    with torch.no_grad():
        a, b = (model(input_ids=x).last_hidden_state for x in (ids, later))
    assert (a[:, 0] - b[:, 0]).abs().max().item() > 1e-6
    with pytest.raises(ValueError, match=r"^pattern: local is not causal, so it runs only"):
        model(input_ids=ids[:, :40])


def test_encoder_decoders_and_cross_attention_are_refused():
    bart = transformers.BartConfig(encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                   decoder_attention_heads=4, d_model=32, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, vocab_size=37, max_position_embeddings=N)
    bart = transformers.BartModel._from_config(bart, attn_implementation=backend.NAME)
    with pytest.raises(ValueError, match=r"^model: BartModel is an encoder-decoder"):
        backend.configure(bart, SCHEDULES["strided"])
    gpt = _gpt2().config
    gpt.add_cross_attention = True
    gpt = transformers.GPT2LMHeadModel._from_config(gpt, attn_implementation=backend.NAME)
    with pytest.raises(ValueError, match=r"^model: GPT2LMHeadModel has cross-attention layers"):
        backend.configure(gpt, SCHEDULES["strided"])


def test_the_head_check_reads_a_composite_models_text_config():
    text = _three_heads().config
    vision = transformers.CLIPVisionConfig(num_hidden_layers=1, num_attention_heads=2,
                                           hidden_size=16, intermediate_size=32, image_size=16,
                                           patch_size=8)
    cfg = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_id=36)
    llava = transformers.LlavaForConditionalGeneration._from_config(
        cfg, attn_implementation=backend.NAME)
    with pytest.raises(ValueError, match=r"^patterns: strided has 2 heads, which cannot map"):
        backend.configure(llava, SCHEDULES["strided"], mode="multihead")


def _three_heads():
    cfg = transformers.LlamaConfig(num_hidden_layers=1, num_attention_heads=3,
                                   num_key_value_heads=3, hidden_size=24, intermediate_size=32,
                                   vocab_size=37, max_position_embeddings=N, bos_token_id=0,
                                   eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=backend.NAME)
