"""Texts tokenised once: stored ids, the tokenizer stamp, and collation of integer arrays.

The collator over stored ids must give exactly the batches of the collator that
tokenised texts itself (same input_ids, masks and labels for the same seed), on
real SciFact text; masks come from per-sequence generators that the batch
computes without NumPy's slow seeding, which must not change a single draw.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qac.data.arrowstore import PASSAGES_SCHEMA, QUERIES_SCHEMA, iter_records, write_passages, write_queries
from qac.data.errors import DataFormatError
from qac.data.masking import MaskingVocab, seeded_generators, whole_word_mask, whole_word_mask_batch
from qac.data.context_pairs import PairCollator, PairSampler, TextPairCollator, load_pair_corpus
from qac.data.tokens import SpecialTokens, TextEncoder, TokenizerStamp, with_special_tokens
from qac.models.loading import load_tokenizer
from qac.train.pretrain import StepBatches, step_loader


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("minilm")


def test_seeded_generators_draw_what_default_rng_draws():
    keys = [(42, 2, step, index, side) for step in (0, 1, 99_999) for index in range(40) for side in (0, 1)]
    keys += [(0, 0, 0, 0, 0), (2**32 - 1, 3, 5, 7, 11)]
    for key, generator in zip(keys, seeded_generators(keys)):
        reference = np.random.default_rng(list(key))
        assert np.array_equal(generator.permutation(57), reference.permutation(57)), key
        assert np.array_equal(generator.random(9), reference.random(9)), key
        assert np.array_equal(generator.integers(0, 30522, size=9), reference.integers(0, 30522, size=9)), key


@pytest.mark.parametrize("keys", [[(1, 2), (3, 4, 5)], [(2**32, 1)], [(2**40 + 3, 7), (1, 1)], []],
                         ids=["mixed-widths", "word-too-large", "large-first", "no-keys"])
def test_seeded_generators_take_every_key_default_rng_takes(keys):
    """Keys off the array fast path (different lengths, values past 32 bits) still give default_rng's streams."""
    drawn = [generator.random(5) for generator in seeded_generators(keys)]
    assert len(drawn) == len(keys)
    for key, values in zip(keys, drawn):
        assert np.array_equal(values, np.random.default_rng(list(key)).random(5)), key


def test_batch_masking_equals_masking_each_sequence(tokenizer):
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    rng = np.random.default_rng(0)
    continuation = np.flatnonzero(vocab.is_continuation)
    special = sorted(vocab.special_ids)
    sequences = []
    for length in [0, 1, 2, 5, 30, 144, 7, 3] * 4:
        ids = rng.integers(1000, len(vocab.is_continuation), size=length)
        pieces = rng.random(length) < 0.4                      # many multi-piece words
        ids[pieces] = rng.choice(continuation, size=int(pieces.sum()))
        inner = rng.random(length) < 0.05                      # specials inside, too
        ids[inner] = rng.choice(special, size=int(inner.sum()))
        sequences.append(np.concatenate([[tokenizer.cls_token_id], ids, [tokenizer.sep_token_id]]).astype(np.int64))
    keys = [(7, 2, 3, index, 1) for index in range(len(sequences))]
    for probability in (0.15, 0.3, 0.45, 0.9):
        inputs, labels = whole_word_mask_batch(np.concatenate(sequences), [len(s) for s in sequences], keys,
                                               vocab, probability)
        start = 0
        for sequence, key in zip(sequences, keys):
            expected = whole_word_mask(sequence.tolist(), vocab, probability, np.random.default_rng(list(key)))
            end = start + len(sequence)
            assert inputs[start:end].tolist() == expected[0] and labels[start:end].tolist() == expected[1]
            start = end


def test_special_tokens_wrap_as_the_tokenizer_truncates(tokenizer):
    special = SpecialTokens.of(tokenizer)
    assert special.prefix == (tokenizer.cls_token_id,) and special.suffix == (tokenizer.sep_token_id,)
    text = "Whole-word masking of pre-tokenised passages works on integer arrays alone."
    [ids] = TextEncoder(tokenizer)([text])
    for limit in (3, 8, len(ids) + 2, 144):
        expected = tokenizer(text, truncation=True, max_length=limit)["input_ids"]
        assert with_special_tokens(ids, limit, special).tolist() == expected


def _scifact_corpus(shared_data, directory, tokenizer, documents=40):
    """passages.arrow and queries.arrow from real SciFact abstracts and claims, with token ids."""
    abstracts = [json.loads(line) for _, line in zip(range(documents), open(shared_data / "scifact" / "corpus.jsonl"))]
    claims = [json.loads(line)["text"] for line in open(shared_data / "scifact" / "queries.jsonl")]
    passages, queries = [], []
    for number, abstract in enumerate(abstracts):
        words = (abstract["title"] + " " + abstract["text"]).split()
        texts = [" ".join(words[i:i + 90]) for i in range(0, len(words), 90)][:4]
        pids = [f"{abstract['_id']}#{k}" for k in range(len(texts))]
        for k, text in enumerate(texts):
            passages.append({"pid": pids[k], "doc_id": abstract["_id"], "position": k, "text": text,
                             "n_tokens": 0, "contexts": {
                                 "nearby": [pids[j] for j in (k - 1, k + 1) if 0 <= j < len(pids)],
                                 "random_sampled": [p for p in pids if p != pids[k]],
                                 "overlap": texts[k + 1] if k + 1 < len(texts) else ""}})
            queries.append({"pid": pids[k], "queries": [claims[(number * 4 + k + c) % len(claims)] for c in range(3)]})
    write_passages(directory / "passages.arrow", passages, tokenizer=tokenizer, tokenizer_name="minilm")
    write_queries(directory / "queries.arrow", queries, tokenizer=tokenizer, tokenizer_name="minilm")
    return directory / "passages.arrow", directory / "queries.arrow"


@pytest.mark.parametrize("context_type,passage_context,ratios", [
    ("mixed", "random_sampled", (0.15, 0.15)),      # coCondenser
    ("query", "random_sampled", (0.30, 0.45)),      # CoT-MAE, paper decoder
    ("passage", "overlap", (0.30, 0.0)),            # CoT-MAE, release decoder (context unmasked)
])
def test_stored_ids_collate_to_the_batches_of_tokenising_collation(tmp_path, shared_data, tokenizer,
                                                                   context_type, passage_context, ratios):
    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer)
    from qac.data.arrowstore import PASSAGES_TOKENS_SCHEMA

    record = next(iter_records(passages, PASSAGES_TOKENS_SCHEMA))
    assert record["input_ids"] == TextEncoder(tokenizer)([record["text"]])[0]
    corpus = load_pair_corpus(passages, queries, context_type, passage_context=passage_context, query_count=3,
                              tokenizer=tokenizer, tokenizer_name="minilm")
    sampler = PairSampler(corpus, context_type, seed=5)
    stored = PairCollator(tokenizer, 128, 24, *ratios, seed=5)
    tokenising = TextPairCollator(tokenizer, 128, 24, *ratios, seed=5)
    for step in range(3):
        pairs = sampler.batch(step, 16)
        assert all(pair.anchor_ids is not None and pair.context_ids is not None for pair in pairs)
        expected, actual = tokenising(pairs, step), stored(pairs, step)
        for side in ("anchor", "context"):
            for name in ("input_ids", "attention_mask", "labels"):
                assert torch.equal(actual[side][name], expected[side][name]), (step, side, name)
        assert (expected["anchor"]["labels"] != -100).any()


def test_ids_of_another_tokenizer_stop_the_reader(tmp_path, shared_data, tokenizer):
    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer, documents=3)
    other = load_tokenizer("minilm")
    other.add_tokens(["qacnewpiece"])                   # one more piece: another vocabulary
    with pytest.raises(DataFormatError, match="made by tokenizer 'minilm'.*differ") as error:
        load_pair_corpus(passages, queries, "query", tokenizer=other, tokenizer_name="other-tokenizer")
    assert "other-tokenizer" in str(error.value) and "\n" not in str(error.value)
    assert TokenizerStamp.of(tokenizer).hash == TokenizerStamp.of(load_tokenizer("minilm")).hash

    write_passages(tmp_path / "bare.arrow", iter_records(passages, PASSAGES_SCHEMA))      # texts only
    with pytest.raises(DataFormatError, match="holds no token ids"):
        load_pair_corpus(tmp_path / "bare.arrow", None, "passage", tokenizer=tokenizer)


def test_batches_are_the_same_with_any_number_of_loader_workers(tmp_path, shared_data, tokenizer):
    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer, documents=12)
    corpus = load_pair_corpus(passages, queries, "mixed", query_count=3, tokenizer=tokenizer)
    collator = PairCollator(tokenizer, 128, 24, 0.15, 0.15, seed=1)
    runs = {}
    for workers in (0, 2):
        batches = StepBatches(PairSampler(corpus, "mixed", seed=1), collator, batch_size=8, accumulation=2,
                              rank=0, world=1, first_step=3, steps=9)
        runs[workers] = list(step_loader(batches, workers, prefetch=2, device=torch.device("cpu")))
    assert [step for step, _ in runs[0]] == list(range(3, 9)) == [step for step, _ in runs[2]]
    for (_, micro_a), (_, micro_b) in zip(runs[0], runs[2]):
        assert len(micro_a) == len(micro_b) == 2
        for a, b in zip(micro_a, micro_b):
            for side in ("anchor", "context"):
                for name in a[side]:
                    assert torch.equal(a[side][name], b[side][name])


def _master_inputs(directory, passages, tokenizer):
    """MASTER's word frequencies and continuations (some empty, some with outer blanks) beside a SciFact corpus."""
    from qac.data.master import WordWeights, count_word_frequencies

    (directory / "word_frequencies.json").write_text(json.dumps(count_word_frequencies(passages, tokenizer)))
    records = list(iter_records(passages, PASSAGES_SCHEMA))
    texts = ["" if row % 5 == 0 else (" " if row % 7 == 0 else "") + record["text"][::-1][:200] + "  "
             for row, record in enumerate(records)]
    write_queries(directory / "continuations.arrow", [{"pid": record["pid"], "queries": [text]}
                                                       for record, text in zip(records, texts)],
                  tokenizer=tokenizer, tokenizer_name="minilm")
    return WordWeights.load(directory / "word_frequencies.json"), directory / "continuations.arrow"


def _master_sampler(corpus, context_type, queries, continuations, tokenizer, dor_queries=2):
    from qac.data.master import MasterSampler, MasterSources

    sources = MasterSources(queries, continuations, dor_queries=dor_queries, tokenizer=tokenizer,
                            tokenizer_name="minilm")
    return MasterSampler(PairSampler(corpus, context_type, seed=5), sources)


@pytest.mark.parametrize("context_type,passage_context,max_len,npr_mask,release", [
    ("passage", "next", 128, "uniform", False),      # NPR: the next span
    ("query", "random_sampled", 40, "uniform", False),  # NPR: a generated query; DOR joined queries cut at max_len
    ("passage", "next", 128, "keyword", False),      # NPR's words drawn by TF-IDF weight, as MKP's
    ("query", "random_sampled", 40, "uniform", True),   # the release's DOR window and GOR's anchor for no continuation
])
def test_master_stored_ids_collate_to_the_batches_of_tokenising_collation(tmp_path, shared_data, tokenizer,
                                                                          context_type, passage_context, max_len,
                                                                          npr_mask, release):
    from qac.data.master import MasterCollator, TextMasterCollator

    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer)
    weights, continuations = _master_inputs(tmp_path, passages, tokenizer)
    corpus = load_pair_corpus(passages, queries, context_type, passage_context=passage_context, query_count=3,
                              tokenizer=tokenizer, tokenizer_name="minilm")
    sampler = _master_sampler(corpus, context_type, queries, continuations, tokenizer)
    details = {"dor_crop": "window", "empty_continuation": "anchor"} if release else {}
    stored = MasterCollator(tokenizer, max_len, 24, 0.3, 0.5, seed=5, word_weights=weights, npr_mask=npr_mask,
                            **details)
    tokenising = TextMasterCollator(tokenizer, max_len, 24, 0.3, 0.5, seed=5, word_weights=weights,
                                    npr_mask=npr_mask, **details)
    for step in range(3):
        pairs = sampler.batch(step, 16)
        assert all(pair.anchor_ids is not None and pair.context_ids is not None and pair.query_ids is not None
                   and pair.continuation_ids is not None for pair in pairs)
        assert any(not pair.continuation for pair in pairs) and any(pair.continuation for pair in pairs)
        expected, actual = tokenising(pairs, step), stored(pairs, step)
        assert set(actual) == set(expected) == {"anchor", "mkp", "cmp", "npr", "dor", "gor"}
        for side in expected:
            for name in ("input_ids", "attention_mask", "labels"):
                assert torch.equal(actual[side][name], expected[side][name]), (step, side, name)
            assert (expected[side]["labels"] != -100).any(), side


def test_master_batches_are_the_same_with_any_number_of_loader_workers(tmp_path, shared_data, tokenizer):
    from qac.data.master import MasterCollator

    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer, documents=12)
    weights, continuations = _master_inputs(tmp_path, passages, tokenizer)
    corpus = load_pair_corpus(passages, queries, "passage", passage_context="next", tokenizer=tokenizer)
    collator = MasterCollator(tokenizer, 128, 24, 0.3, 0.5, seed=1, word_weights=weights)
    runs = {}
    for workers in (0, 2):
        batches = StepBatches(_master_sampler(corpus, "passage", queries, continuations, tokenizer), collator,
                              batch_size=8, accumulation=2, rank=0, world=1, first_step=3, steps=9)
        runs[workers] = list(step_loader(batches, workers, prefetch=2, device=torch.device("cpu")))
    assert [step for step, _ in runs[0]] == list(range(3, 9)) == [step for step, _ in runs[2]]
    for (_, micro_a), (_, micro_b) in zip(runs[0], runs[2]):
        assert len(micro_a) == len(micro_b) == 2
        for a, b in zip(micro_a, micro_b):
            assert set(a) == set(b) == {"anchor", "mkp", "cmp", "npr", "dor", "gor"}
            for side in a:
                for name in a[side]:
                    assert torch.equal(a[side][name], b[side][name])


def test_master_continuations_of_another_tokenizer_stop_the_reader(tmp_path, shared_data, tokenizer):
    from qac.data.master import MasterSources

    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer, documents=3)
    _, continuations = _master_inputs(tmp_path, passages, tokenizer)
    other = load_tokenizer("minilm")
    other.add_tokens(["qacnewpiece"])
    with pytest.raises(DataFormatError, match="continuations.arrow.*made by tokenizer 'minilm'.*differ") as error:
        MasterSources(None, continuations, tokenizer=other, tokenizer_name="other-tokenizer")
    assert "other-tokenizer" in str(error.value) and "\n" not in str(error.value)
    write_queries(tmp_path / "bare.arrow", iter_records(continuations, QUERIES_SCHEMA))      # texts only
    with pytest.raises(DataFormatError, match="bare.arrow.*holds no token ids"):
        MasterSources(None, tmp_path / "bare.arrow", tokenizer=tokenizer)
    with pytest.raises(DataFormatError, match="made by tokenizer 'minilm'"):
        MasterSources(queries, None, tokenizer=other)


def test_master_crops_overflowing_passages_as_the_pair_collator(tmp_path, shared_data, tokenizer):
    """split.spans: overflow: MASTER's anchor and NPR passage are the windows PairCollator draws, and MKP reads
    the anchor's window."""
    from qac.data.master import MasterCollator

    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer, documents=12)
    weights, continuations = _master_inputs(tmp_path, passages, tokenizer)
    corpus = load_pair_corpus(passages, queries, "passage", passage_context="next", tokenizer=tokenizer)
    pairs = _master_sampler(corpus, "passage", queries, continuations, tokenizer).batch(2, 16)
    master = MasterCollator(tokenizer, 40, 24, 0.3, 0.5, seed=3, word_weights=weights, crop=True)(pairs, 2)
    plain = PairCollator(tokenizer, 40, 24, 0.3, 0.5, seed=3, crop=True)(pairs, 2)
    heads = PairCollator(tokenizer, 40, 24, 0.3, 0.5, seed=3)(pairs, 2)
    assert not torch.equal(plain["anchor"]["labels"], heads["anchor"]["labels"])       # windows, not heads
    for ours, theirs in (("anchor", "anchor"), ("npr", "context")):
        for name in ("input_ids", "attention_mask", "labels"):
            assert torch.equal(master[ours][name], plain[theirs][name]), (ours, name)
    anchor = plain["anchor"]
    original = torch.where(anchor["labels"] != -100, anchor["labels"], anchor["input_ids"])
    chosen = master["mkp"]["labels"] != -100
    assert chosen.any() and torch.equal(master["mkp"]["labels"][chosen], original[chosen])
