"""The release's splitting switches: overflow spans (closed after the sentence that crosses the
limit, cropped at random in training) and single-span documents paired with themselves."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from qac.data.context_pairs import PairCollator, PairSampler, Pair, crop_rng, crop_span, load_pair_corpus
from qac.data.splitting import SplitSettings, TokenCounter, group_units, split_documents
from base_settings import split_settings


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


class _Sentences:
    """Sentences end at every period (no Punkt model needed for hand-made text)."""

    @staticmethod
    def span_tokenize(text):
        start = 0
        for end in (i + 1 for i, char in enumerate(text) if char == "."):
            yield start, end
            start = end + 1


# --- the splitting rule --------------------------------------------------------

def test_overflow_closes_a_span_after_the_unit_that_crosses_its_target():
    # 50 + 50 = 100 < 128: take the third; 150 crosses 128, so the span closes after it.
    assert group_units([50, 50, 50, 30], itertools.repeat(128), overflow=True) == [(0, 3), (3, 4)]
    # Reaching the target exactly does not close the span: the release closes only once it is crossed.
    assert group_units([64, 64, 10, 130, 5], itertools.repeat(128), overflow=True) == [(0, 3), (3, 4), (4, 5)]
    # bounded (today's rule) keeps every span within the target.
    assert group_units([50, 50, 50, 30], itertools.repeat(128)) == [(0, 2), (2, 4)]


def test_overflow_spans_of_a_hand_worked_document(tokenizer):
    counter = TokenCounter(tokenizer)
    sentence = "one two three."          # 4 tokens
    text = " ".join([sentence] * 7)
    assert counter.lengths([sentence]) == [4]
    common = dict(max_len=9, short_span_prob=0.0, random_sampled_window=100, overlap_sentences=2, seed=42)
    bounded = split_documents([("d", text)], _Sentences, counter, split_settings(**common))[0]
    overflow = split_documents([("d", text)], _Sentences, counter, split_settings(**common, spans="overflow"))[0]
    # bounded: 4 + 4 = 8 <= 9, one more would be 12 > 9. overflow: 8 < 9, so the third sentence joins (12).
    assert [p["n_tokens"] for p in bounded.passages] == [8, 8, 8, 4]
    assert [p["n_tokens"] for p in overflow.passages] == [12, 12, 4]
    assert overflow.passages[0]["text"] == " ".join([sentence] * 3)
    # The overlap context still fits max_len.
    assert all(len(counter.lengths([p["contexts"]["overlap"]])) and counter.lengths([p["contexts"]["overlap"]])[0] <= 9
               for p in overflow.passages if p["contexts"]["overlap"])


def test_overflow_never_cuts_a_long_sentence(tokenizer):
    counter = TokenCounter(tokenizer)
    text = "short one. " + " ".join(["word"] * 30) + ". last one."
    common = dict(max_len=10, short_span_prob=0.0, random_sampled_window=100, overlap_sentences=2, seed=1)
    overflow = split_documents([("d", text)], _Sentences, counter, split_settings(**common, spans="overflow"))[0]
    bounded = split_documents([("d", text)], _Sentences, counter, split_settings(**common))[0]
    assert overflow.long_sentences == bounded.long_sentences == 1
    assert max(p["n_tokens"] for p in bounded.passages) <= 10
    assert len(overflow.passages) == 2 and overflow.passages[0]["n_tokens"] > 30   # "short one." + the long one


def test_random_overlap_counts_keep_one_to_half_of_a_passages_sentences_and_leave_the_spans_alone(tokenizer):
    counter = TokenCounter(tokenizer)
    documents = [(f"d{n}", " ".join(f"w{n} s{i} x{i}." for i in range(40))) for n in range(6)]
    common = dict(max_len=64, short_span_prob=0.0, random_sampled_window=100, seed=3)   # passages of 6+ sentences
    fixed = split_documents(documents, _Sentences, counter, split_settings(**common, overlap_sentences=2))
    drawn = split_documents(documents, _Sentences, counter, split_settings(**common, overlap_sentences="random"))
    again = split_documents(documents, _Sentences, counter, split_settings(**common, overlap_sentences="random"))
    assert [p["text"] for d in drawn for p in d.passages] == [p["text"] for d in fixed for p in d.passages]
    assert [p["contexts"]["overlap"] for d in drawn for p in d.passages] == \
           [p["contexts"]["overlap"] for d in again for p in d.passages]          # a function of (seed, document)
    kept = set()
    for document in drawn:
        for passage in document.passages[:-1]:        # the last passage has nothing after it
            sentences = passage["text"].split(". ")
            overlap = passage["contexts"]["overlap"]
            count = next(k for k in range(1, len(sentences) + 1)
                         if overlap.startswith(". ".join(sentences[-k:]).rstrip(".")))
            assert 1 <= count <= max(1, len(sentences) // 2), (passage["text"], overlap)
            kept.add(count)
    assert len(kept) > 1                                # drawn per passage, not fixed


def test_unknown_span_rule_is_refused_by_the_schema():
    from qac.config import render_profile
    from qac.params import ParamsError, validate_params

    params = render_profile("smoke")
    params["split"]["spans"] = "cropped"
    with pytest.raises(ParamsError, match="parameter split.spans: expected one of 'bounded' or 'overflow'"):
        validate_params(params)


# --- the crop --------------------------------------------------------------------

def test_crop_keeps_a_window_of_the_limit_and_is_a_function_of_its_seed():
    ids = list(range(100, 150))
    windows = [crop_span(ids, 16, crop_rng(7, 3, index, 0)) for index in range(64)]
    for window in windows:
        assert len(window) == 16 and window == ids[window[0] - 100:window[0] - 100 + 16]
    starts = {window[0] - 100 for window in windows}
    assert len(starts) > 10 and min(starts) >= 0 and max(starts) <= 34
    assert crop_span(ids, 16, crop_rng(7, 3, 5, 0)) == windows[5]               # same key, same window
    assert crop_span(np.asarray(ids), 16, crop_rng(7, 3, 5, 0)).tolist() == windows[5]   # id arrays too
    assert crop_span(ids[:10], 16, crop_rng(7, 3, 5, 0)) == ids[:10]             # fits: unchanged
    # Uniform start: every one of the 35 starts is drawn over many keys.
    many = {crop_span(ids, 16, crop_rng(0, step, 0, 0))[0] for step in range(2000)}
    assert many == set(range(100, 135))


def test_collator_crops_an_overflowing_passage_to_max_len(tokenizer):
    long_text = " ".join(f"w{i}" for i in range(80))
    content = tokenizer(long_text, add_special_tokens=False)["input_ids"]
    pairs = [Pair(index=i, anchor=long_text, context=long_text if i % 2 else "a query", context_kind=
                  "passage" if i % 2 else "query") for i in range(6)]
    collator = PairCollator(tokenizer, 32, 8, 0.0, 0.0, seed=11, crop=True)
    batch = collator(pairs, step=4)
    ids = batch["anchor"]["input_ids"]
    assert ids.shape == (6, 32)
    starts = set()
    for row in ids.tolist():
        assert row[0] == tokenizer.cls_token_id and row[-1] == tokenizer.sep_token_id
        window = row[1:-1]
        start = next(s for s in range(len(content)) if content[s:s + 30] == window)
        starts.add(start)
    assert len(starts) > 1                      # random windows, not the head
    # A pair's crop depends on (seed, step, pair index, side) only: the same when the batch is split
    # (processes, DataLoader workers) and on a rerun.
    halves = [collator(pairs[:3], step=4), collator(pairs[3:], step=4)]
    assert (np.concatenate([half["anchor"]["input_ids"].numpy() for half in halves]) == ids.numpy()).all()
    assert (collator(pairs, step=4)["context"]["input_ids"] == batch["context"]["input_ids"]).all()
    # Without crop (bounded spans): the head, as before.
    head = PairCollator(tokenizer, 32, 8, 0.0, 0.0, seed=11)(pairs, step=4)["anchor"]["input_ids"]
    assert head[0, 1:-1].tolist() == content[:30]
    # Passages that fit are identical with and without crop.
    short = [Pair(index=0, anchor="a short passage", context="another one", context_kind="passage")]
    assert (collator(short, 0)["anchor"]["input_ids"] ==
            PairCollator(tokenizer, 32, 8, 0.0, 0.0, seed=11)(short, 0)["anchor"]["input_ids"]).all()


# --- single-span documents ------------------------------------------------------

def test_single_span_documents_paired_with_themselves(tmp_path):
    from test_pretrain_corpus import write_corpus

    passages, queries = write_corpus(tmp_path, documents=3, spans=3, queries=2, single_span_documents=2)
    total = 3 * 3 + 2
    for context in ("random_sampled", "nearby", "overlap", "next"):
        dropped = load_pair_corpus(passages, None, "passage", passage_context=context)
        kept = load_pair_corpus(passages, None, "passage", passage_context=context, single_span="self")
        assert kept.self_paired == 2 and dropped.self_paired == 0
        assert set(kept.anchors.tolist()) == set(dropped.anchors.tolist()) | {9, 10}
        for index in np.flatnonzero(np.isin(kept.anchors, [9, 10])):
            record = kept.rows([index])[0]
            assert kept.passage_candidates(record) == [record["row"]]
            assert kept.passage_contexts(int(index)) == [record["text"]]
    # The three context variants see the same anchor set once single-span documents are kept.
    query = load_pair_corpus(passages, queries, "query")
    passage = load_pair_corpus(passages, queries, "passage", single_span="self")
    mixed = load_pair_corpus(passages, queries, "mixed", single_span="self")
    assert query.anchors.tolist() == passage.anchors.tolist() == mixed.anchors.tolist() == list(range(total))
    assert len(load_pair_corpus(passages, queries, "mixed")) == total - 2
    # A self-paired anchor's context is its own text in the sampled batches.
    sampler = PairSampler(passage, "passage", seed=0)
    seen = [pair for step in range(4) for pair in sampler.batch(step, 11) if pair.row in (9, 10)]
    assert seen and all(pair.context == pair.anchor for pair in seen)
    with pytest.raises(ValueError, match="single_span_documents"):
        load_pair_corpus(passages, None, "passage", single_span="keep")


def test_crops_from_stored_ids_are_the_same_with_any_number_of_loader_workers(tmp_path, shared_data, tokenizer):
    """Passages read as stored token ids (90 words, over the 24-token limit) are cropped at random; the
    batches a DataLoader collates are the same with 0 and 2 worker processes, and equal the text path's."""
    import torch

    from test_tokens import _scifact_corpus
    from qac.train.pretrain import StepBatches, step_loader

    passages, queries = _scifact_corpus(shared_data, tmp_path, tokenizer, documents=6)
    corpus = load_pair_corpus(passages, queries, "mixed", query_count=3, tokenizer=tokenizer, single_span="self")
    collator = PairCollator(tokenizer, 24, 16, 0.15, 0.15, seed=1, crop=True)
    runs = {}
    for workers in (0, 2):
        batches = StepBatches(PairSampler(corpus, "mixed", seed=1), collator, batch_size=8, accumulation=1,
                              rank=0, world=1, first_step=0, steps=3)
        runs[workers] = [micro for _, micros in step_loader(batches, workers, prefetch=2, device=torch.device("cpu"))
                         for micro in micros]
    assert len(runs[0]) == len(runs[2]) == 3
    for a, b in zip(runs[0], runs[2]):
        for side in ("anchor", "context"):
            for name in a[side]:
                assert torch.equal(a[side][name], b[side][name])
    # The same crops when the collator tokenises the texts itself.
    sampler = PairSampler(corpus, "mixed", seed=1)
    pairs = sampler.batch(1, 8)
    from_text = collator([Pair(p.index, p.anchor, p.context, p.context_kind, p.row) for p in pairs], 1)
    assert torch.equal(from_text["anchor"]["input_ids"], collator(pairs, 1)["anchor"]["input_ids"])
    heads = PairCollator(tokenizer, 24, 16, 0.15, 0.15, seed=1)(pairs, 1)["anchor"]["labels"]
    assert runs[0][0]["anchor"]["input_ids"].shape[1] == 24
    assert not torch.equal(collator(pairs, 1)["anchor"]["labels"], heads)
