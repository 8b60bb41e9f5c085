"""Static T5 decoding: the cache loop's decisions at fixed shapes, with nothing read back inside a step.

The oracle for the logits is Hugging Face's T5 itself, run without a cache on
each candidate's own prefix; the oracle for the samples is the cache loop
(:meth:`QueryGenerator._cache_decode`) without batch invariance, which
decides from the same uniforms.
"""

from __future__ import annotations

import pytest
import torch

from qac.querygen.generate import DecodingPlan, QueryGenerator, generator_model_type, resolve_decode
from qac.querygen.static_decode import StaticT5Decoder, supports_static_decode
from test_querygen_generate import PASSAGES, settings
from test_static_step import DataDependentOps

EOS = 102


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


def t5_model(version: str, layers: int = 2, seed: int = 0):
    """A random T5 over MiniLM's vocabulary: v1.0 (ReLU, tied and scaled output) or v1.1 (gated GELU, untied)."""
    from transformers import T5Config, T5ForConditionalGeneration

    style = {} if version == "1.0" else dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=layers, num_decoder_layers=layers,
                      num_heads=4, pad_token_id=0, eos_token_id=EOS, decoder_start_token_id=0, **style)
    torch.manual_seed(seed)
    return T5ForConditionalGeneration(config).eval()


def favour_the_end(model, below_top: float = 1.0):
    """Set the end token's logit just below the row's largest, so candidates end at different steps (a random
    model rarely ends)."""
    return model.lm_head.register_forward_hook(lambda _, __, out: out.index_copy(
        -1, torch.tensor([EOS]), out.amax(-1, keepdim=True) - below_top))


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("sampling", [{}, dict(repeat_penalty=2.0, min_new_tokens=3, temperature=0.8),
                                      dict(top_k=5, top_p=0.7)])
@pytest.mark.parametrize("sync_every", [1, 3])
def test_static_decoding_takes_the_cache_loops_decisions(tokenizer, version, sampling, sync_every):
    """Same samples as the cache loop. (A decision within float noise of an edge can go either way in both
    loops, as between batch sizes; the tiny model's top-25 or top-5 decisions here have no such near-tie,
    while its nucleus over the whole vocabulary does: the logits test below bounds the noise itself.)"""
    model = t5_model(version)
    hook = favour_the_end(model)
    try:
        sampled = settings(max_new_tokens=10, **sampling)
        cache, cache_stats = QueryGenerator(model, tokenizer, sampled, batch_invariant=False,
                                            sync_every=sync_every).generate_candidates(PASSAGES, batch_size=4)
        static, static_stats = QueryGenerator(model, tokenizer, sampled, batch_invariant=False, sync_every=sync_every,
                                              decode="static").generate_candidates(PASSAGES, batch_size=4)
    finally:
        hook.remove()
    assert static == cache
    assert (static_stats.tokens, static_stats.decisions) == (cache_stats.tokens, cache_stats.decisions)
    # candidates end at different steps, so the carried finished rows were exercised
    candidates = len(PASSAGES) * sampled.queries_per_passage
    assert candidates < static_stats.tokens < 0.8 * candidates * sampled.max_new_tokens


def decode_recording_logits(model, decoder, inputs, uniforms):
    """Encode ``inputs`` with ``model`` and decode them with ``decoder``, recording each step's output logits
    (as fp32): the encoder states, the decode result and the list of logits."""
    steps = []
    hook = decoder.head.register_forward_hook(lambda _, __, out: steps.append(out.detach().float()))
    try:
        with torch.no_grad():
            hidden = model.get_encoder()(**inputs).last_hidden_state
            result = decoder.decode(hidden, inputs["attention_mask"], uniforms, sync_every=1)
    finally:
        hook.remove()
    return hidden, result, steps


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_each_steps_logits_equal_huggingface_t5_on_the_candidates_prefix(tokenizer, version):
    """Teacher-forced oracle: the uncached model over start token + the tokens the static loop emitted."""
    model = t5_model(version, layers=3)
    sampled = settings(max_new_tokens=7, queries_per_passage=4)
    decoder = StaticT5Decoder(model, sampled, start_id=0, eos_id=EOS, pad_id=0)
    texts = [text for _, text in PASSAGES[:3]]
    inputs = tokenizer(texts, truncation=True, max_length=48, padding=True, return_tensors="pt",
                       return_token_type_ids=False)
    hidden, result, steps = decode_recording_logits(model, decoder, inputs, torch.rand(12, 7, dtype=torch.float64))
    assert len(steps) == 7
    rows = torch.arange(12)
    prefix = torch.cat([torch.zeros(12, 1, dtype=torch.long), result.generated[:, :6]], 1)
    with torch.no_grad():
        reference = model(encoder_outputs=(hidden.repeat_interleave(4, 0),),
                          attention_mask=inputs["attention_mask"].repeat_interleave(4, 0),
                          decoder_input_ids=prefix, use_cache=False).logits
    for step, logits in enumerate(steps):
        running = rows[result.lengths >= step]            # rows that had not ended before this step
        expected = reference[running, step]
        scale = float(expected.abs().max())
        assert torch.allclose(logits.reshape(12, -1)[running], expected, rtol=0, atol=1e-5 * scale)


def test_half_precision_decoding_keeps_half_weights_and_the_models_logits_to_bf16_rounding(tokenizer):
    """With an autocast dtype the decoder's weights are held in it once (no cast per step), the residual
    stream stays fp32: the first step's logits equal the fp32 model's to bf16 rounding."""
    model = t5_model("1.0", layers=2)
    sampled = settings(max_new_tokens=3, queries_per_passage=2)
    decoder = StaticT5Decoder(model, sampled, start_id=0, eos_id=EOS, pad_id=0, autocast_dtype=torch.bfloat16)
    assert {p.dtype for p in decoder.blocks.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}      # the model itself is left as it was
    inputs = tokenizer([text for _, text in PASSAGES[:2]], padding=True, return_tensors="pt",
                       return_token_type_ids=False)
    hidden, _, steps = decode_recording_logits(model, decoder, inputs, torch.rand(4, 3, dtype=torch.float64))
    with torch.no_grad():
        reference = model(encoder_outputs=(hidden,), attention_mask=inputs["attention_mask"],
                          decoder_input_ids=torch.zeros(2, 1, dtype=torch.long)).logits[:, -1]
    first = steps[0].reshape(4, -1)[::2]
    scale = float(reference.abs().max())
    # bf16 keeps 8 significant bits (relative rounding 2^-8 per operation); a 2-layer decoder compounds a few
    assert torch.allclose(first, reference, rtol=0, atol=16 * 2 ** -8 * scale)
    assert not torch.equal(first, reference)


def test_a_step_reads_nothing_back_from_the_device(tokenizer):
    """Every op of the step is on the device's data: a CUDA graph can hold it and the host never waits in it."""
    model = t5_model("1.1")
    sampled = settings(max_new_tokens=4, repeat_penalty=1.5, min_new_tokens=2, temperature=0.9)
    decoder = StaticT5Decoder(model, sampled, start_id=0, eos_id=EOS, pad_id=0)
    inputs = tokenizer([text for _, text in PASSAGES[:2]], padding=True, return_tensors="pt",
                       return_token_type_ids=False)
    hidden = model.get_encoder()(**inputs).last_hidden_state.detach()
    calls = []
    original = decoder._step
    decoder._step = lambda *args: calls.append(1) or _recorded(original, *args)
    decoder.decode(hidden, inputs["attention_mask"], torch.rand(6, 4, dtype=torch.float64), sync_every=4)
    assert len(calls) == 4


def _recorded(step, *args):
    with DataDependentOps() as recorder:
        step(*args)
    assert recorder.count > 50 and recorder.ops == []


def test_the_decoding_loop_is_chosen_by_device_model_and_invariance(tokenizer, tmp_path):
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_decode("auto", "t5", cuda, batch_invariant=False) == "static"
    assert resolve_decode("auto", "mt5", cuda, batch_invariant=False) == "static"
    assert resolve_decode("auto", "t5", cpu, batch_invariant=False) == "cache"
    assert resolve_decode("auto", "t5", cuda, batch_invariant=True) == "cache"
    assert resolve_decode("auto", "encoder-decoder", cuda, batch_invariant=False) == "cache"
    assert resolve_decode("auto", None, cuda, batch_invariant=False) == "cache"
    assert resolve_decode("static", "t5", cpu, batch_invariant=False) == "static"
    with pytest.raises(ValueError, match="T5-style generators only; this one is a encoder-decoder"):
        resolve_decode("static", "encoder-decoder", cpu, batch_invariant=False)
    with pytest.raises(ValueError, match="auto, cache or static"):
        resolve_decode("graph", "t5", cpu, batch_invariant=False)

    t5 = t5_model("1.0", layers=1)
    t5.save_pretrained(tmp_path / "t5")
    assert generator_model_type(tmp_path / "t5") == "t5" and generator_model_type(tmp_path / "none") is None
    tiny = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32)
    bert2bert = EncoderDecoderModel(EncoderDecoderConfig.from_encoder_decoder_configs(tiny, tiny))
    assert supports_static_decode(t5) and not supports_static_decode(bert2bert)
    with pytest.raises(ValueError, match="T5-style"):
        StaticT5Decoder(bert2bert, settings(), start_id=0, eos_id=EOS, pad_id=0)
    with pytest.raises(ValueError, match="batch_invariant"):
        QueryGenerator(t5, tokenizer, settings(), batch_invariant=True, decode="static")


@pytest.mark.parametrize("overrides, device, expected", [
    ({}, "cpu", {"dtype": "float32", "batch_invariant": True}),
    ({"batch_invariant": False}, "cpu", {"dtype": "float32", "batch_invariant": False, "batch_size": 64}),
    ({"batch_invariant": False, "decode": "static", "sync_every": 8}, "cpu",
     {"dtype": "float32", "batch_invariant": False, "batch_size": 64, "sync_every": 8, "decode": "static"}),
    ({"dtype": "bf16"}, "cuda", {"dtype": "torch.bfloat16", "batch_invariant": False, "batch_size": 64,
                                 "decode": "static"}),
    ({"dtype": "bf16", "decode": "cache"}, "cuda", {"dtype": "torch.bfloat16", "batch_invariant": False,
                                                    "batch_size": 64}),
])
def test_the_stage_fingerprints_what_changes_samples(tmp_path, overrides, device, expected):
    from qac.params import base_params

    t5_model("1.0", layers=1).save_pretrained(tmp_path)
    section = base_params().querygen.model_copy(update=overrides)
    plan = DecodingPlan.for_stage(section, torch.device(device), tmp_path)
    assert plan.compute == expected and plan.decode == expected.get("decode", "cache")


def test_the_stage_refuses_static_decoding_it_cannot_run(tmp_path):
    from qac.errors import UserError
    from qac.params import base_params

    section = base_params().querygen
    t5_model("1.0", layers=1).save_pretrained(tmp_path / "t5")
    with pytest.raises(UserError, match="querygen.decode: static needs batch invariance off.*float32"):
        DecodingPlan.for_stage(section.model_copy(update={"decode": "static"}), torch.device("cpu"), tmp_path / "t5")
    with pytest.raises(UserError, match="T5-style generators only.*model without a model type"):
        DecodingPlan.for_stage(section.model_copy(update={"decode": "static", "batch_invariant": False}),
                               torch.device("cpu"), tmp_path / "missing")
