"""The first decoder step, cross-attention keys and values included, runs once per passage, not per candidate.

The reference is the definition of a candidate: each candidate decoded alone
from its passage's own encoder states, the whole prefix through the decoder
without a cache at every step, sampling from its passage's stream. The loop
(batches, caches, pruning, the shared first step) must give the same tokens.
"""

from __future__ import annotations

import pytest
import torch

from qac.querygen.generate import QueryGenerator, SamplingSettings, adjust_logits
from qac.querygen.sampling import passage_uniforms, sample_tokens
from base_settings import sampling_settings

PASSAGES = [(f"doc{i}#0", "Protein folding in yeast cells depends on chaperones. " * (1 + i % 3) + f"Case {i}.")
            for i in range(5)]
SETTINGS = sampling_settings(queries_per_passage=4, max_new_tokens=7, max_source_len=40, seed=11, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


def tiny_t5():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, pad_token_id=0, eos_token_id=102, decoder_start_token_id=0)
    torch.manual_seed(0)
    return T5ForConditionalGeneration(config).eval()


def tiny_bert2bert(tiny_bert_dir):
    from transformers import EncoderDecoderModel

    torch.manual_seed(0)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(str(tiny_bert_dir), str(tiny_bert_dir)).eval()
    for config in (model.config, model.generation_config):
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 101, 0, 102
    return model


def tiny_prefix_lm():
    from qac.querygen.prefix_lm import build_prefix_lm

    return build_prefix_lm("tiny:minilm", seed=0)[0].eval()


def cross_projections(model) -> list[torch.nn.Linear]:
    """The Linear modules that project encoder states to cross-attention keys and values (the prefix LM's
    passage keys and values come from its self-attention key/value projections)."""
    from qac.querygen.prefix_lm import PrefixLM

    if isinstance(model, PrefixLM):
        return [m for layer in model.bert.encoder.layer for m in (layer.attention.self.key, layer.attention.self.value)]
    if model.config.model_type == "t5":
        return [m for block in model.decoder.block for m in (block.layer[1].EncDecAttention.k, block.layer[1].EncDecAttention.v)]
    return [m for layer in model.decoder.bert.encoder.layer
            for m in (layer.crossattention.self.key, layer.crossattention.self.value)]


@pytest.fixture(scope="module", params=["t5", "bert2bert", "prefix_lm"])
def model(request, tiny_bert_dir):
    torch.set_num_threads(1)
    return {"t5": tiny_t5, "prefix_lm": tiny_prefix_lm,
            "bert2bert": lambda: tiny_bert2bert(tiny_bert_dir)}[request.param]()


@pytest.fixture(scope="module")
def one_by_one(model, tokenizer) -> list[list[str]]:
    return candidates_one_by_one(model, tokenizer, SETTINGS)


@torch.no_grad()
def candidates_one_by_one(model, tokenizer, settings: SamplingSettings) -> list[list[str]]:
    """Every candidate decoded alone, without a cache: ``C`` texts per passage."""
    generator = QueryGenerator(model, tokenizer, settings)     # for its special ids only
    start, eos = generator.start_id, generator.eos_id
    texts = []
    for pid, text in PASSAGES:
        ids = tokenizer(settings.prefix + text, truncation=True, max_length=settings.max_source_len,
                        return_tensors="pt")["input_ids"]
        mask = torch.ones_like(ids)
        encoder = model.get_encoder()(input_ids=ids, attention_mask=mask)
        uniforms = passage_uniforms(settings.seed, pid, settings.queries_per_passage, settings.max_new_tokens)
        passage = []
        for c in range(settings.queries_per_passage):
            emitted = torch.zeros((1, 0), dtype=torch.long)
            for step in range(settings.max_new_tokens):
                decoder_ids = torch.cat([torch.tensor([[start]]), emitted], dim=1)
                logits = model(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=decoder_ids,
                               use_cache=False).logits[:, -1].float()
                logits = adjust_logits(logits, emitted, settings, eos)
                token, _ = sample_tokens(logits, uniforms[c, step][None], settings.top_k, settings.top_p)
                if int(token) == eos:
                    break
                emitted = torch.cat([emitted, token[None]], dim=1)
            passage.append(tokenizer.decode(emitted[0], skip_special_tokens=True))
        texts.append(passage)
    return texts


@pytest.mark.parametrize("batch_invariant, sync_every", [(True, 1), (False, 1), (False, 3)])
def test_sampled_candidates_equal_each_candidate_decoded_alone(model, tokenizer, one_by_one, batch_invariant,
                                                                sync_every):
    expected = one_by_one
    generator = QueryGenerator(model, tokenizer, SETTINGS, batch_invariant=batch_invariant, sync_every=sync_every)
    ours, stats = generator.generate_candidates(PASSAGES, batch_size=3)
    assert ours == expected
    assert stats.tokens > len(PASSAGES) * SETTINGS.queries_per_passage     # candidates of several tokens
    assert len({text for passage in ours for text in passage}) > len(PASSAGES)   # candidates differ


def test_cross_attention_keys_and_values_are_projected_once_per_passage(model, tokenizer):
    """Forward hooks count the encoder positions the key/value projections see: one pass over each passage
    per layer (batch of 3 and of 2, padded to their longest), never one per candidate."""
    rows: list[int] = []
    hooks = [m.register_forward_hook(lambda _, args, __: rows.append(args[0].shape[:-1].numel()))
             for m in cross_projections(model)]
    try:
        QueryGenerator(model, tokenizer, SETTINGS, batch_invariant=False).generate_candidates(PASSAGES, batch_size=3)
    finally:
        for hook in hooks:
            hook.remove()
    lengths = [len(ids) for ids in tokenizer([text for _, text in PASSAGES], truncation=True,
                                             max_length=SETTINGS.max_source_len)["input_ids"]]
    lengths.sort(reverse=True)
    padded = 3 * lengths[0] + 2 * lengths[3]              # longest first: passages 0-2, then 3-4
    projections = len(cross_projections(model))
    from qac.querygen.prefix_lm import PrefixLM

    if isinstance(model, PrefixLM):
        # the same modules also project the query tokens: one per running row and step, at most C per passage
        decoded = len(PASSAGES) * SETTINGS.queries_per_passage * SETTINGS.max_new_tokens
        assert padded * projections <= sum(rows) <= (padded + decoded) * projections
    else:
        assert sum(rows) == padded * projections
