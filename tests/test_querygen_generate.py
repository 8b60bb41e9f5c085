"""Query sampling: the paper's top-k/top-p distribution, per-passage streams, batch-size invariance."""

from __future__ import annotations

import math

import pytest
import torch

from qac.querygen.generate import GenerationStats, QueryGenerator, SamplingSettings, clean_candidates
from qac.querygen.sampling import choose_tokens, filtered_distribution, passage_uniforms, sample_tokens
from base_settings import sampling_settings

PASSAGES = [(f"doc{i}#0", "Protein folding in yeast cells depends on chaperones. " * (1 + i % 4) + f"Case {i}.")
            for i in range(9)]


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


def tiny_t5(seed: int = 0):
    """A 1-layer, 32-wide random T5 over MiniLM's vocabulary ([PAD]=0 starts, [SEP]=102 ends)."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
                      num_heads=4, pad_token_id=0, eos_token_id=102, decoder_start_token_id=0)
    torch.manual_seed(seed)
    return T5ForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def t5():
    torch.set_num_threads(1)
    return tiny_t5()


def settings(**overrides) -> SamplingSettings:
    return sampling_settings(**{**dict(queries_per_passage=3, max_new_tokens=8, max_source_len=48, seed=7),
                                **overrides})


# -- the sampling decision -------------------------------------------------

def test_filtered_distribution_equals_huggingface_top_k_then_top_p():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(3)
    logits = torch.randn(6, 300) * 3
    for top_k, top_p in [(25, 0.95), (10, 0.5), (0, 0.8), (300, 1.0)]:
        reference = logits.clone()
        if top_k:
            reference = TopKLogitsWarper(top_k)(None, reference)
        reference = torch.softmax(TopPLogitsWarper(top_p)(None, reference), dim=-1).double()
        dist = filtered_distribution(logits, top_k, top_p)
        ours = torch.zeros_like(reference).scatter(1, dist.token_ids, dist.probs)
        ours = ours / ours.sum(-1, keepdim=True)
        assert torch.allclose(ours, reference, atol=1e-6), (top_k, top_p)


def test_inverse_cdf_choice_by_hand():
    # probabilities 0.5, 0.3, 0.2 for tokens 0, 1, 2
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(5, 1)
    u = torch.tensor([0.10, 0.49, 0.51, 0.79, 0.81], dtype=torch.float64)
    tokens, fragile = sample_tokens(logits, u, top_k=0, top_p=1.0)
    assert tokens.tolist() == [0, 0, 1, 1, 2]
    assert not fragile.any()
    # top_p = 0.7 keeps tokens 0 and 1 (mass below token 2 is 0.2 <= 0.3): renormalised 0.625 / 0.375
    tokens, _ = sample_tokens(logits[:2], torch.tensor([0.62, 0.63], dtype=torch.float64), top_k=0, top_p=0.7)
    assert tokens.tolist() == [0, 1]
    # top_k = 1 is greedy whatever the draw
    tokens, _ = sample_tokens(logits[:2], torch.tensor([0.0, 0.999], dtype=torch.float64), top_k=1, top_p=0.95)
    assert tokens.tolist() == [0, 0]


def test_decisions_on_an_edge_are_flagged_fragile():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(3, 1)
    _, fragile = sample_tokens(logits, torch.tensor([0.5, 0.8 - 2e-6, 0.3], dtype=torch.float64), top_k=0, top_p=1.0)
    assert fragile.tolist() == [True, True, False]
    # 2nd and 3rd logits tied at the top-k boundary (k = 2)
    tied = torch.tensor([[2.0, 1.0, 1.0 - 1e-5]])
    _, fragile = sample_tokens(tied, torch.tensor([0.1], dtype=torch.float64), top_k=2, top_p=1.0)
    assert fragile.tolist() == [True]


def test_near_ties_inside_the_nucleus_cannot_swap_tokens():
    """Inverse CDF in token-id order: two tied tokens trading ranks keep their intervals."""
    a = torch.tensor([[2.0, 1.0, 1.0 + 1e-6, 0.5]]).repeat(50, 1)
    b = torch.tensor([[2.0, 1.0 + 1e-6, 1.0, 0.5]]).repeat(50, 1)
    u = torch.linspace(0.001, 0.999, 50, dtype=torch.float64)
    tokens_a, fragile_a = sample_tokens(a, u, top_k=0, top_p=1.0)
    tokens_b, _ = sample_tokens(b, u, top_k=0, top_p=1.0)
    assert torch.equal(tokens_a[~fragile_a], tokens_b[~fragile_a])
    assert fragile_a.sum() <= 1


def test_decisions_not_flagged_fragile_survive_noise_within_the_bound():
    """The margins' promise: moving every logit by less than the bound never changes a robust decision."""
    generator = torch.Generator().manual_seed(5)
    relative = 2e-4   # large, so that edges are hit often (about 8% of the rows)
    logits = torch.randn(4000, 120, generator=generator) * 2
    u = torch.rand(4000, generator=generator, dtype=torch.float64)
    tokens, fragile = sample_tokens(logits, u, top_k=25, top_p=0.9, logit_noise=relative)
    bound = relative * logits.abs().amax(-1, keepdim=True)
    noisy = logits + (torch.rand(logits.shape, generator=generator) * 2 - 1) * bound
    noisy_tokens, _ = sample_tokens(noisy, u, top_k=25, top_p=0.9, logit_noise=relative)
    assert 0 < fragile.sum() < 4000 * 0.2
    assert torch.equal(tokens[~fragile], noisy_tokens[~fragile])
    assert not torch.equal(tokens[fragile], noisy_tokens[fragile])   # the flagged ones do flip sometimes


def test_masked_tokens_neither_make_decisions_fragile_nor_change_them():
    """A constrained decoder masks tokens with -inf: the noise bound comes from the finite logits."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(200, 60, generator=generator) * 2
    u = torch.rand(200, generator=generator, dtype=torch.float64)
    masked = logits.clone()
    masked[:, 40:] = float("-inf")            # tokens no row may pick
    tokens, fragile = sample_tokens(masked, u, top_k=25, top_p=0.95)
    reference, reference_fragile = sample_tokens(logits[:, :40], u, top_k=25, top_p=0.95)
    assert torch.equal(tokens, reference) and torch.equal(fragile, reference_fragile)
    assert fragile.sum() < 200 * 0.2


def test_a_tie_across_the_nucleus_cut_is_fragile():
    # probabilities about 0.6, 0.2, 0.2 - 1e-6: top_p = 0.75 keeps ranks 1-2, the 2nd/3rd tie decides which
    logits = torch.log(torch.tensor([[0.6, 0.2, 0.2 * (1 - 1e-6)]], dtype=torch.float64)).float()
    _, fragile = sample_tokens(logits, torch.tensor([0.3], dtype=torch.float64), top_k=0, top_p=0.75)
    assert fragile.tolist() == [True]


def test_candidate_streams_do_not_depend_on_the_number_of_candidates():
    five = passage_uniforms(42, "doc1#3", 5, 16)
    twenty = passage_uniforms(42, "doc1#3", 20, 16)
    assert torch.equal(five, twenty[:5])
    assert not torch.equal(five, passage_uniforms(42, "doc1#4", 5, 16))
    assert not torch.equal(five, passage_uniforms(43, "doc1#3", 5, 16))


def test_clean_candidates_counts_what_it_drops():
    kept, stats = clean_candidates(["what is a cell", "  ", "what  is a cell", "", "why", "why"],
                                   drop_duplicates=True, drop_empty=True)
    assert kept == ["what is a cell", "why"]
    assert (stats.candidates, stats.empty, stats.duplicates, stats.queries) == (6, 2, 2, 2)
    assert (stats.dropped_empty, stats.dropped_duplicates) == (2, 2)
    kept, stats = clean_candidates(["a", "", "a"], drop_duplicates=False, drop_empty=False)
    assert kept == ["a", "", "a"] and (stats.empty, stats.duplicates) == (1, 1)
    assert stats.dropped_empty == stats.dropped_duplicates == 0
    summary = GenerationStats(candidates=10, empty=2, duplicates=2, queries=6, query_words=18, passages=2).summary()
    assert summary["unique_ratio"] == pytest.approx(6 / 8) and summary["mean_query_words"] == 3


# -- the decoding loop -----------------------------------------------------

@pytest.mark.parametrize("batch_invariant, sync_every", [(True, 1), (False, 1), (False, 3)])
def test_greedy_decoding_equals_huggingface_generate(t5, tokenizer, batch_invariant, sync_every):
    """With top_k = 1 the loop (cache, pruning of finished rows) must reproduce greedy ``generate``; also
    without batch invariance, where the tokens are chosen on the device and finished rows leave the batch
    only every ``sync_every`` steps."""
    generator = QueryGenerator(t5, tokenizer, settings(top_k=1, queries_per_passage=1, max_new_tokens=10),
                               batch_invariant=batch_invariant, sync_every=sync_every)
    ours, _ = generator.generate_candidates(PASSAGES, batch_size=4)
    for (_, text), candidates in zip(PASSAGES, ours):
        inputs = tokenizer(text, truncation=True, max_length=48, return_tensors="pt", return_token_type_ids=False)
        with torch.no_grad():
            reference = t5.generate(**inputs, do_sample=False, max_new_tokens=10, num_beams=1)
        assert candidates == [tokenizer.decode(reference[0], skip_special_tokens=True)]


def test_choose_tokens_takes_the_decisions_of_sample_tokens():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn((64, 500), generator=generator) * 3
    logits[:8, 100:] = float("-inf")                     # rows with masked tokens
    uniforms = torch.rand(64, generator=generator, dtype=torch.float64)
    for top_k, top_p in ((0, 1.0), (25, 0.95), (1, 0.5), (600, 0.3)):
        expected, _ = sample_tokens(logits, uniforms, top_k, top_p)
        assert torch.equal(choose_tokens(logits, uniforms, top_k, top_p), expected)


def test_one_row_decodes_the_same_whatever_the_sync_schedule(t5, tokenizer):
    """A lone row never shares its batch, so reading the device every 5 steps instead of every step changes
    nothing but when its end is noticed: the same candidate, tokens and decisions."""
    results = []
    # end of sequence made likely (about one step in five), so candidates end at different steps
    hook = t5.get_output_embeddings().register_forward_hook(lambda _, __, out: out.index_add(
        -1, torch.tensor([102]), torch.full((*out.shape[:-1], 1), 9.0)))
    try:
        for sync_every in (1, 5):
            generator = QueryGenerator(t5, tokenizer, settings(queries_per_passage=1, max_new_tokens=12, top_k=0,
                                                               top_p=1.0), batch_invariant=False, sync_every=sync_every)
            for pid, text in PASSAGES:
                candidates, stats = generator.generate_candidates([(pid, text)], batch_size=1)
                results.append((sync_every, pid, candidates, stats.tokens, stats.decisions))
    finally:
        hook.remove()
    half = len(results) // 2
    assert [r[1:] for r in results[:half]] == [r[1:] for r in results[half:]]
    assert len({r[3] for r in results}) > 1 and min(r[3] for r in results) < 12   # ends at different steps


def test_the_decode_loop_reads_the_device_every_sync_every_steps(t5, tokenizer, monkeypatch):
    reads = []
    original = QueryGenerator._finished_rows
    monkeypatch.setattr(QueryGenerator, "_finished_rows", staticmethod(lambda alive: reads.append(1) or
                                                                       original(alive)))
    sampling = settings(max_new_tokens=12, top_k=0, top_p=1.0, min_new_tokens=11)    # every row runs 12 steps
    QueryGenerator(t5, tokenizer, sampling, batch_invariant=False, sync_every=4).generate_candidates(PASSAGES[:2], 2)
    assert len(reads) == 3                                  # steps 4, 8 and 12
    reads.clear()
    QueryGenerator(t5, tokenizer, sampling, batch_invariant=False, sync_every=1).generate_candidates(PASSAGES[:2], 2)
    assert len(reads) == 12
    reads.clear()
    QueryGenerator(t5, tokenizer, sampling, batch_invariant=True, sync_every=4).generate_candidates(PASSAGES[:2], 2)
    assert len(reads) == 12                                 # batch invariance decides on the host every step
    with pytest.raises(ValueError, match="sync_every"):
        QueryGenerator(t5, tokenizer, sampling, batch_invariant=False, sync_every=0)


def test_queries_do_not_depend_on_batch_size_or_neighbours(t5, tokenizer):
    generator = QueryGenerator(t5, tokenizer, settings())
    reference, stats = generator.generate(PASSAGES, batch_size=len(PASSAGES))
    assert stats.recomputed > 0   # the tiny random model has near-ties: the canonical path was exercised
    for batch_size in (1, 4):
        assert generator.generate(PASSAGES, batch_size=batch_size)[0] == reference
    alone, _ = generator.generate(PASSAGES[4:5], batch_size=1)
    assert alone[0] == reference[4]


class SubtractRepeats:
    """An independent oracle for ``repeat_penalty``: a Hugging Face logits processor."""

    def __init__(self, penalty: float, start: int):
        self.penalty, self.start = penalty, start

    def __call__(self, input_ids, scores):
        emitted = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, input_ids[:, 1:], True)
        return scores - self.penalty * emitted


def test_repeat_penalty_equals_a_huggingface_logits_processor_and_stays_batch_invariant(t5, tokenizer):
    from transformers import LogitsProcessorList

    greedy = settings(top_k=1, queries_per_passage=1, max_new_tokens=10, repeat_penalty=3.0)
    ours, _ = QueryGenerator(t5, tokenizer, greedy).generate_candidates(PASSAGES, batch_size=4)
    repeats = 0
    for (_, text), candidates in zip(PASSAGES, ours):
        inputs = tokenizer(text, truncation=True, max_length=48, return_tensors="pt", return_token_type_ids=False)
        with torch.no_grad():
            plain = t5.generate(**inputs, do_sample=False, max_new_tokens=10, num_beams=1)
            reference = t5.generate(**inputs, do_sample=False, max_new_tokens=10, num_beams=1,
                                    logits_processor=LogitsProcessorList([SubtractRepeats(3.0, 0)]))
        repeats += len(set(plain[0, 1:].tolist())) < len(plain[0, 1:])
        assert candidates == [tokenizer.decode(reference[0], skip_special_tokens=True)]
    assert repeats > 0        # without the penalty the tiny model loops: the penalty changed something
    sampled = QueryGenerator(t5, tokenizer, settings(repeat_penalty=3.0))
    reference, stats = sampled.generate(PASSAGES, batch_size=len(PASSAGES))
    assert stats.recomputed > 0 and sampled.generate(PASSAGES, batch_size=1)[0] == reference
    assert reference != QueryGenerator(t5, tokenizer, settings()).generate(PASSAGES, batch_size=len(PASSAGES))[0]


def test_temperature_divides_the_penalised_logits_as_huggingface_does(t5, tokenizer):
    from transformers.generation.logits_process import TemperatureLogitsWarper

    from qac.querygen.generate import adjust_logits

    torch.manual_seed(5)
    logits, emitted = torch.randn(4, 300) * 2, torch.randint(0, 300, (4, 3))
    oracle = TemperatureLogitsWarper(0.6)(None, SubtractRepeats(3.0, 0)(torch.cat([emitted[:, :1], emitted], 1), logits))
    assert torch.allclose(adjust_logits(logits, emitted, settings(repeat_penalty=3.0, temperature=0.6), 102), oracle,
                          rtol=0, atol=1e-6 * float(logits.abs().max()))
    # A cold temperature leaves only the most likely token: sampling becomes greedy decoding.
    greedy, _ = QueryGenerator(t5, tokenizer, settings(top_k=1, queries_per_passage=1)).generate(PASSAGES, 4)
    cold, _ = QueryGenerator(t5, tokenizer, settings(temperature=1e-4, queries_per_passage=2)).generate(PASSAGES, 4)
    assert cold == greedy
    warm = QueryGenerator(t5, tokenizer, settings(temperature=0.7))
    reference, stats = warm.generate(PASSAGES, batch_size=len(PASSAGES))
    assert warm.generate(PASSAGES, batch_size=1)[0] == reference
    assert reference != QueryGenerator(t5, tokenizer, settings()).generate(PASSAGES, batch_size=len(PASSAGES))[0]


def test_min_new_tokens_rules_out_the_end_as_huggingface_does_and_stays_batch_invariant(t5, tokenizer):
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

    from qac.querygen.generate import adjust_logits

    torch.manual_seed(6)
    logits = torch.randn(4, 300) * 2
    for emitted_count in (0, 2, 3, 5):
        emitted = torch.randint(0, 300, (4, emitted_count))
        ids = torch.cat([torch.zeros(4, 1, dtype=torch.long), emitted], 1)      # HF counts the start token
        oracle = MinNewTokensLengthLogitsProcessor(1, 3, 102)(ids, logits.clone())
        assert torch.equal(adjust_logits(logits, emitted, settings(min_new_tokens=3), 102), oracle)
    # min_new_tokens >= max_new_tokens is the schema's to refuse (test_bad_settings_are_rejected_by_the_schema)
    # A random T5 pushed toward [SEP] ends most candidates early: 3 tokens at least is a change it has to show
    eager = tiny_t5(seed=1)
    eager.lm_head.register_forward_hook(lambda module, inputs, output: output.index_add(
        -1, torch.tensor([102]), torch.full((*output.shape[:-1], 1), 4.0)))
    free_stats = QueryGenerator(eager, tokenizer, settings(repeat_penalty=3.0)).generate(PASSAGES, 4)[1]
    held = QueryGenerator(eager, tokenizer, settings(repeat_penalty=3.0, min_new_tokens=3))
    reference, stats = held.generate(PASSAGES, batch_size=len(PASSAGES))
    assert free_stats.empty > 0 and stats.empty == 0 and stats.tokens >= 3 * stats.candidates
    assert held.generate(PASSAGES, batch_size=1)[0] == reference


def test_queries_change_with_seed_and_passage_id(t5, tokenizer):
    base, _ = QueryGenerator(t5, tokenizer, settings()).generate(PASSAGES[:3], 3)
    reseeded, _ = QueryGenerator(t5, tokenizer, settings(seed=8)).generate(PASSAGES[:3], 3)
    renamed, _ = QueryGenerator(t5, tokenizer, settings()).generate([("other#0", PASSAGES[0][1])], 1)
    assert base != reseeded
    assert renamed[0] != base[0]


def test_greedy_candidates_are_duplicates_and_are_dropped(t5, tokenizer):
    n, c = len(PASSAGES), 4
    queries, stats = QueryGenerator(t5, tokenizer, settings(top_k=1, queries_per_passage=c)).generate(PASSAGES, 5)
    assert all(len(q) == 1 for q in queries)
    assert stats.duplicates == stats.dropped_duplicates == n * (c - 1) and stats.queries == n
    kept, stats = QueryGenerator(t5, tokenizer, settings(top_k=1, queries_per_passage=c, drop_duplicates=False)
                                 ).generate(PASSAGES, 5)
    assert all(len(q) == c and len(set(q)) == 1 for q in kept) and stats.dropped_duplicates == 0


def test_empty_candidates_are_counted_and_dropped(tokenizer):
    model = tiny_t5()
    # A head that always prefers [SEP] (the end of sequence) first: every candidate is empty.
    head = torch.nn.Linear(32, 30522, bias=True)
    torch.nn.init.zeros_(head.weight)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[102] = 50.0
    model.lm_head = head
    c = 3
    queries, stats = QueryGenerator(model, tokenizer, settings(queries_per_passage=c)).generate(PASSAGES[:4], 2)
    assert queries == [[], [], [], []]
    assert (stats.empty, stats.dropped_empty, stats.queries) == (4 * c, 4 * c, 0)
    kept, stats = QueryGenerator(model, tokenizer, settings(queries_per_passage=c, drop_empty=False)).generate(PASSAGES[:4], 2)
    assert kept == [[""] * c] * 4 and stats.dropped_empty == 0


def test_bert2bert_generator_runs_through_the_same_loop(tokenizer, tiny_bert_dir):
    from transformers import EncoderDecoderModel

    model = EncoderDecoderModel.from_encoder_decoder_pretrained(str(tiny_bert_dir), str(tiny_bert_dir)).eval()
    for config in (model.config, model.generation_config):
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 101, 0, 102
    generator = QueryGenerator(model, tokenizer, settings(top_k=1, queries_per_passage=1, max_new_tokens=6))
    ours, _ = generator.generate_candidates(PASSAGES[:3], 2)
    for (_, text), candidates in zip(PASSAGES[:3], ours):
        inputs = tokenizer(text, truncation=True, max_length=48, return_tensors="pt", return_token_type_ids=False)
        with torch.no_grad():
            reference = model.generate(**inputs, do_sample=False, max_new_tokens=6, num_beams=1)
        assert candidates == [tokenizer.decode(reference[0], skip_special_tokens=True)]


@pytest.mark.parametrize("key, value, message", [
    ("top_p", 0.0, "must be > 0"), ("queries_per_passage", 0, "must be >= 1"), ("repeat_penalty", -1.0, "must be >= 0"),
    ("temperature", 0.0, "must be > 0"), ("max_source_len", 1, "must be >= 2"),
    ("min_new_tokens", 64, "must be below querygen.max_new_tokens"),
    ("decode", "graph", "'auto', 'cache' or 'static'"),
])
def test_bad_settings_are_rejected_by_the_schema(key, value, message):
    from qac.config import render_profile
    from qac.params import ParamsError, validate_params

    params = render_profile("smoke")
    params["querygen"].update({key: value, "max_new_tokens": 64})
    with pytest.raises(ParamsError, match=f"parameter querygen.{key}: .*{message}"):
        validate_params(params)


def test_static_decoding_with_batch_invariance_on_is_refused_by_the_schema():
    from qac.config import render_profile
    from qac.params import ParamsError, validate_params

    params = render_profile("smoke")
    params["querygen"].update({"decode": "static", "batch_invariant": True})
    with pytest.raises(ParamsError, match="parameter querygen.decode: static decoding samples on the device"):
        validate_params(params)
    params["querygen"]["batch_invariant"] = "auto"      # decided on the device: the stage checks it there
    validate_params(params)


def test_the_base_profile_samples_as_the_paper():
    from qac.config import render_profile

    querygen = render_profile("paper")["querygen"]
    assert math.isclose(querygen["top_p"], 0.95) and querygen["top_k"] == 25
