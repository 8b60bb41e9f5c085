"""Pair sampling, whole-word masking and the collator (qac.data.context_pairs, qac.data.masking)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from qac.data.arrowstore import PASSAGES_SCHEMA, QUERIES_SCHEMA, iter_records, write_passages, write_queries
from qac.data.errors import DataFormatError
from qac.data.masking import IGNORE_INDEX, MaskingVocab, whole_word_mask, word_spans
from qac.data.context_pairs import Pair, PairCollator, PairSampler, load_pair_corpus, shard
from test_pretrain_corpus import write_corpus


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return MaskingVocab.from_tokenizer(tokenizer)


# --- whole-word masking -----------------------------------------------------

def test_word_spans_join_continuations_and_skip_special_tokens(tokenizer, vocab):
    ids = tokenizer("unbelievably hyper works")["input_ids"]
    # [CLS] un ##bel ##ie ##va ##bly hyper works [SEP]
    assert tokenizer.convert_ids_to_tokens(ids)[1:6] == ["un", "##bel", "##ie", "##va", "##bly"]
    assert word_spans(ids, vocab) == [(1, 6), (6, 7), (7, 8)]


def test_masking_takes_whole_words_within_budget_and_never_special_tokens(tokenizer, vocab):
    ids = tokenizer("unbelievably hyperparameterization works " * 8)["input_ids"]
    spans = word_spans(ids, vocab)
    maskable = sum(end - start for start, end in spans)
    for seed in range(20):
        inputs, labels = whole_word_mask(ids, vocab, 0.15, np.random.default_rng(seed))
        chosen = {i for i, label in enumerate(labels) if label != IGNORE_INDEX}
        assert 0 < len(chosen) <= round(0.15 * maskable)
        assert labels[0] == IGNORE_INDEX and labels[-1] == IGNORE_INDEX
        for start, end in spans:
            covered = chosen & set(range(start, end))
            assert not covered or covered == set(range(start, end)), "a word was split"
        assert all(labels[i] == ids[i] for i in chosen)
        assert all(inputs[i] == ids[i] for i in range(len(ids)) if i not in chosen)


def test_masked_tokens_are_80_percent_mask_10_random_10_kept(tokenizer, vocab):
    ids = tokenizer(" ".join(f"word{i}" for i in range(400)))["input_ids"]
    outcome = Counter()
    for seed in range(30):
        inputs, labels = whole_word_mask(ids, vocab, 0.15, np.random.default_rng(seed))
        for i, label in enumerate(labels):
            if label == IGNORE_INDEX:
                continue
            outcome["mask" if inputs[i] == vocab.mask_id else "kept" if inputs[i] == label else "random"] += 1
    total = sum(outcome.values())
    assert total > 5000
    assert abs(outcome["mask"] / total - 0.8) < 0.02
    assert abs(outcome["random"] / total - 0.1) < 0.02
    assert abs(outcome["kept"] / total - 0.1) < 0.02


def test_masking_is_a_function_of_the_generator_seed(tokenizer, vocab):
    ids = tokenizer("the protein binds the receptor of the cell membrane")["input_ids"]
    first = whole_word_mask(ids, vocab, 0.3, np.random.default_rng([1, 2, 3]))
    assert whole_word_mask(ids, vocab, 0.3, np.random.default_rng([1, 2, 3])) == first
    assert whole_word_mask(ids, vocab, 0.0, np.random.default_rng(0)) == (ids, [IGNORE_INDEX] * len(ids))


# --- corpus -------------------------------------------------------------------

def _texts(passages) -> dict[str, str]:
    return {record["pid"]: record["text"] for record in iter_records(passages, PASSAGES_SCHEMA)}


def _index(corpus, pid: str) -> int:
    return [corpus.pid(i) for i in range(len(corpus))].index(pid)


def test_passage_context_skips_and_counts_passages_without_one(tmp_path):
    passages, queries = write_corpus(tmp_path, documents=3, spans=2, single_span_documents=2)
    corpus = load_pair_corpus(passages, None, "passage", passage_context="random_sampled")
    assert corpus.stats() == {"anchors": 6, "passages": 8, "skipped_no_passage_context": 2, "skipped_no_query": 0}
    texts = _texts(passages)
    # d0#0's random_sampled context is d0#1
    assert corpus.passage_contexts(_index(corpus, "d0#0")) == [texts["d0#1"]]
    nearby = load_pair_corpus(passages, None, "passage", passage_context="nearby")
    assert nearby.passage_contexts(_index(nearby, "d1#1")) == [texts["d1#0"]]


def test_the_corpus_keeps_row_numbers_not_texts(tmp_path):
    passages, queries = write_corpus(tmp_path, documents=3, spans=2, single_span_documents=1)
    corpus = load_pair_corpus(passages, queries, "query")
    # Every field of the corpus is either the mapped tables or an integer index of anchors.
    assert corpus.anchors.dtype == np.int64 and corpus.anchors.tolist() == list(range(7))
    assert corpus.text(3) == _texts(passages)[corpus.pid(3)]


def test_the_scan_does_not_depend_on_how_the_files_are_batched(tmp_path, monkeypatch):
    passages, queries = write_corpus(tmp_path, documents=5, spans=3, single_span_documents=2)
    records = list(iter_records(queries, QUERIES_SCHEMA))
    records[4]["queries"] = ["", ""] + records[4]["queries"][2:]      # d1#1: no query among the first 2
    write_queries(queries, records)
    whole = load_pair_corpus(passages, queries, "mixed", query_count=2)
    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 3)
    write_passages(tmp_path / "p3.arrow", iter_records(passages, PASSAGES_SCHEMA))
    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 5)
    write_queries(tmp_path / "q5.arrow", records[:-3])                 # the last passages have no queries
    monkeypatch.setattr("qac.data.context_pairs._SCAN_ROWS", 4)
    sliced = load_pair_corpus(tmp_path / "p3.arrow", tmp_path / "q5.arrow", "mixed", query_count=2)
    assert whole.anchors.tolist() == [i for i in range(15) if i != 4]  # 5 x 3 spans; single spans have no context
    assert sliced.anchors.tolist() == [i for i in range(14) if i != 4]  # row 14 (d4#2) lost its queries
    assert sliced.stats() == {"anchors": 13, "passages": 17, "skipped_no_passage_context": 2, "skipped_no_query": 2}


def test_query_count_keeps_the_first_c_queries(tmp_path):
    passages, queries = write_corpus(tmp_path, documents=2, spans=2, queries=5)
    first = next(iter_records(queries, QUERIES_SCHEMA))
    corpus = load_pair_corpus(passages, queries, "query", query_count=2)
    assert corpus.queries_of(0) == first["queries"][:2]
    assert len(corpus) == 5 and corpus.skipped_no_query == 0   # single-span passages have queries


def test_blank_queries_do_not_count_and_passages_beyond_the_queries_file_have_none(tmp_path):
    passages, _ = write_corpus(tmp_path, documents=2, spans=2, single_span_documents=0)
    queries = tmp_path / "partial.arrow"
    write_queries(queries, [{"pid": "d0#0", "queries": [" ", "real query"]},
                            {"pid": "d0#1", "queries": ["  ", "later"]}])
    corpus = load_pair_corpus(passages, queries, "query", query_count=2)
    assert [corpus.pid(i) for i in range(len(corpus))] == ["d0#0", "d0#1"]
    assert corpus.queries_of(0) == ["real query"]
    with pytest.raises(ValueError, match="no passage has a query context"):
        load_pair_corpus(passages, queries, "query", query_count=1)    # only blank first queries


def test_mixed_needs_both_kinds(tmp_path):
    passages, queries = write_corpus(tmp_path, documents=2, spans=2, single_span_documents=1)
    corpus = load_pair_corpus(passages, queries, "mixed", query_count=3)
    assert len(corpus) == 4 and corpus.skipped_no_passage_context == 1


def test_bad_files_name_file_row_and_field(tmp_path):
    passages, queries = write_corpus(tmp_path, documents=1, spans=2, single_span_documents=0)
    records = list(iter_records(passages, PASSAGES_SCHEMA))
    del records[1]["text"]
    with pytest.raises(DataFormatError, match=r"passages.arrow:2: field 'text': missing"):
        write_passages(passages, records)
    write_queries(queries, [{"pid": "d0#1", "queries": ["q"]}])
    with pytest.raises(DataFormatError, match=r"queries.arrow:1: field 'pid': 'd0#1' is not the passage"):
        load_pair_corpus(passages, queries, "query")
    with pytest.raises(DataFormatError, match=r"passages.arrow: field 'queries': column missing"):
        load_pair_corpus(passages, passages, "query")           # a passages file given as queries
    with pytest.raises(ValueError, match="context_type"):
        load_pair_corpus(passages, queries, "document")


def test_a_context_outside_the_anchors_document_is_an_error(tmp_path):
    passages, _ = write_corpus(tmp_path, documents=2, spans=2, single_span_documents=0)
    records = list(iter_records(passages, PASSAGES_SCHEMA))
    records[0]["contexts"]["random_sampled"] = ["d1#0"]
    records[3]["position"] = 3                # d1#1 stored at position 3: its context d1#0 is not found
    write_passages(passages, records)
    corpus = load_pair_corpus(passages, None, "passage")
    with pytest.raises(DataFormatError, match=r"passages.arrow:1: field 'contexts.random_sampled': 'd1#0' is not a "
                                              r"passage of document 'd0'"):
        corpus.passage_contexts(0)
    with pytest.raises(DataFormatError, match=r"passages.arrow:4: field 'contexts.random_sampled': 'd1#0'"):
        corpus.passage_contexts(3)


# --- sampling -------------------------------------------------------------------

@pytest.fixture()
def query_corpus(tmp_path):
    passages, queries = write_corpus(tmp_path, documents=4, spans=3, queries=6, single_span_documents=0)
    return load_pair_corpus(passages, queries, "query", query_count=3), load_pair_corpus(
        passages, queries, "mixed", query_count=3)


def test_batches_are_a_function_of_seed_and_step(query_corpus):
    corpus, _ = query_corpus
    sampler = PairSampler(corpus, "query", seed=7)
    fresh = PairSampler(corpus, "query", seed=7)
    assert fresh.batch(5, 4) == sampler.batch(5, 4)             # no hidden state: resume reproduces
    assert sampler.batch(5, 4) != sampler.batch(6, 4)
    assert PairSampler(corpus, "query", seed=8).batch(5, 4) != sampler.batch(5, 4)


def test_each_epoch_visits_every_anchor_once(query_corpus):
    corpus, _ = query_corpus
    sampler = PairSampler(corpus, "query", seed=0)
    n = len(corpus)                     # 12 anchors, 3 steps of 4 per epoch
    epoch = [i for step in range(3) for i in sampler.anchors(step, 4)]
    assert sorted(epoch) == list(range(n))
    second = [i for step in range(3, 6) for i in sampler.anchors(step, 4)]
    assert sorted(second) == list(range(n)) and second != epoch


def test_query_context_is_drawn_among_the_first_c(query_corpus):
    corpus, _ = query_corpus
    sampler = PairSampler(corpus, "query", seed=0)
    seen = Counter()
    for step in range(60):
        for pair in sampler.batch(step, 4):
            anchor = [corpus.text(i) for i in range(len(corpus))].index(pair.anchor)
            seen[corpus.queries_of(anchor).index(pair.context)] += 1
            assert pair.context_kind == "query"
    assert set(seen) == {0, 1, 2} and min(seen.values()) > 40


def test_mixed_draws_query_contexts_with_the_given_probability(query_corpus):
    _, corpus = query_corpus
    kinds = Counter(pair.context_kind for step in range(200)
                    for pair in PairSampler(corpus, "mixed", seed=0, mixed_query_prob=0.25).batch(step, 8))
    assert abs(kinds["query"] / 1600 - 0.25) < 0.04


def test_shard_splits_the_global_batch_in_rank_order():
    assert shard(list(range(8)), 1, 2) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="does not split"):
        shard(list(range(6)), 0, 4)


# --- collator -------------------------------------------------------------------

def _pairs():
    return [Pair(0, "the protein binds the receptor " * 6, "what binds the receptor", "query"),
            Pair(1, "short passage", "the cell membrane " * 20, "passage"),
            Pair(2, "insulin and glucose in the liver", "glucose liver", "query")]


def test_dynamic_padding_and_per_kind_truncation(tokenizer):
    collator = PairCollator(tokenizer, max_len=24, query_max_len=5, anchor_mask_ratio=0.15,
                            context_mask_ratio=0.15, seed=0)
    batch = collator(_pairs(), step=0)
    anchor, context = batch["anchor"], batch["context"]
    assert anchor["input_ids"].shape == (3, 24)                    # first anchor is truncated to max_len
    lengths = context["attention_mask"].sum(1).tolist()
    assert lengths[0] == 5 and lengths[1] == 24 and lengths[2] == 4   # queries cut at 5, passages at 24
    assert context["input_ids"].shape[1] == 24
    assert (anchor["labels"][anchor["attention_mask"] == 0] == IGNORE_INDEX).all()
    static = PairCollator(tokenizer, 24, 5, 0.15, 0.15, seed=0, pad_to=32)(_pairs(), step=0)
    assert static["anchor"]["input_ids"].shape == (3, 32) and static["context"]["input_ids"].shape == (3, 32)
    assert torch.equal(static["anchor"]["labels"][:, :24], anchor["labels"])


def test_masks_do_not_depend_on_how_the_batch_is_split(tokenizer):
    collator = PairCollator(tokenizer, 32, 8, 0.3, 0.45, seed=3)
    whole = collator(_pairs(), step=4)
    part = collator(_pairs()[1:], step=4)
    for side in ("anchor", "context"):
        width = part[side]["input_ids"].shape[1]
        assert torch.equal(whole[side]["input_ids"][1:, :width], part[side]["input_ids"])
        assert torch.equal(whole[side]["labels"][1:, :width], part[side]["labels"])
    assert not torch.equal(collator(_pairs(), step=5)["anchor"]["labels"], whole["anchor"]["labels"])


def test_zero_context_mask_ratio_leaves_the_context_intact(tokenizer):
    batch = PairCollator(tokenizer, 32, 8, 0.3, 0.0, seed=0)(_pairs(), step=0)
    assert (batch["context"]["labels"] == IGNORE_INDEX).all()
    expected = tokenizer("glucose liver")["input_ids"]
    assert batch["context"]["input_ids"][2, :len(expected)].tolist() == expected


def test_a_passage_context_drawn_once_is_the_anchors_partner_for_the_whole_run(tmp_path):
    """The release stores one context per anchor (make_contextual_splits.py); ``step`` draws one at every step."""
    passages, _ = write_corpus(tmp_path, documents=2, spans=6, single_span_documents=0)
    corpus = load_pair_corpus(passages, None, "passage", passage_context="nearby")   # a middle span: 2 neighbours
    middle = {corpus.text(i) for i in range(len(corpus)) if len(corpus.passage_contexts(i)) == 2}

    def partners(draw: str) -> dict[str, set[str]]:
        sampler, seen = PairSampler(corpus, "passage", seed=3, passage_draw=draw), {}
        for step in range(30):                      # 30 epochs of the 12 anchors
            for pair in sampler.batch(step, len(corpus)):
                seen.setdefault(pair.anchor, set()).add(pair.context)
        return seen

    once, every_step = partners("once"), partners("step")
    assert len(once) == len(corpus) and all(len(contexts) == 1 for contexts in once.values())
    assert len(middle) == 8 and all(len(every_step[anchor]) == 2 for anchor in middle)   # 30 draws of 2
    # A fixed partner is one of the anchor's candidates, and the seed chooses it.
    for anchor, (context,) in once.items():
        row = [corpus.text(i) for i in range(len(corpus))].index(anchor)
        assert context in corpus.passage_contexts(row)
    others = [{pair.anchor: {pair.context} for pair in PairSampler(corpus, "passage", seed=seed,
                                                                     passage_draw="once").batch(0, len(corpus))}
              for seed in range(4, 8)]
    assert any(other != once for other in others)


# --- a mix of passage-context kinds (the release's data_type mixed / cotmae) ---------------------------------

def _mixed_kind_corpus(directory):
    """One document of three spans with every kind, one of two spans whose first has no overlap text."""
    text = {f"d0#{k}": f"alpha {k} beta gamma. delta epsilon {k}." for k in range(3)}
    text.update({f"d1#{k}": f"zeta {k} eta theta. iota kappa {k}." for k in range(2)})
    records = []
    for pid, body in text.items():
        doc, position = pid.split("#")
        siblings = [other for other in text if other.startswith(doc + "#") and other != pid]
        nearby = [other for other in siblings if abs(int(other.split("#")[1]) - int(position)) == 1]
        overlap = "" if pid == "d1#0" else f"overlap of {pid}"
        records.append({"pid": pid, "doc_id": doc, "position": int(position), "text": body,
                        "n_tokens": len(body.split()),
                        "contexts": {"nearby": nearby, "random_sampled": siblings[-1:], "overlap": overlap}})
    path = directory / "passages.arrow"
    write_passages(path, records)
    return path, text


def test_a_mix_of_passage_contexts_draws_each_kind_uniformly_per_pair(tmp_path):
    passages, text = _mixed_kind_corpus(tmp_path)
    corpus = load_pair_corpus(passages, None, "passage", passage_context=["random_sampled", "nearby", "overlap"])
    assert len(corpus) == 5 and corpus.passage_kinds == ("random_sampled", "nearby", "overlap")
    anchor = _index(corpus, "d0#1")
    # d0#1: random_sampled [d0#2], nearby [d0#0, d0#2], its overlap text: every kind's candidates.
    assert corpus.passage_contexts(anchor) == [text["d0#2"], text["d0#0"], text["d0#2"], "overlap of d0#1"]
    sampler, drawn = PairSampler(corpus, "passage", seed=5), Counter()
    steps = 3000
    for step in range(steps):
        for pair in sampler.batch(step, len(corpus)):
            if pair.anchor == text["d0#1"]:
                drawn[pair.context] += 1
    # A kind in three, then a candidate of it: d0#2 is random_sampled's one and half of nearby's.
    expected = {text["d0#2"]: 1 / 3 + 1 / 6, text["d0#0"]: 1 / 6, "overlap of d0#1": 1 / 3}
    assert set(drawn) == set(expected) and sum(drawn.values()) == steps
    for context, share in expected.items():
        bound = 5 * (share * (1 - share) / steps) ** 0.5        # five binomial standard errors
        assert abs(drawn[context] / steps - share) < bound, (context, drawn[context] / steps)


def test_a_mix_draws_among_the_kinds_its_anchor_has_and_skips_an_anchor_with_none(tmp_path):
    passages, text = _mixed_kind_corpus(tmp_path)
    corpus = load_pair_corpus(passages, None, "passage", passage_context=["overlap", "nearby"])
    assert len(corpus) == 5
    # d1#0 has no overlap text: its one kind is nearby, so its context is d1#1 at every step.
    sampler = PairSampler(corpus, "passage", seed=1)
    contexts = {pair.context for step in range(50) for pair in sampler.batch(step, len(corpus))
                if pair.anchor == text["d1#0"]}
    assert contexts == {text["d1#1"]}
    only_overlap = load_pair_corpus(passages, None, "passage", passage_context=["overlap"])
    assert only_overlap.stats()["skipped_no_passage_context"] == 1 and len(only_overlap) == 4


def test_a_mix_drawn_once_keeps_one_kind_and_partner_per_anchor(tmp_path):
    passages, text = _mixed_kind_corpus(tmp_path)
    corpus = load_pair_corpus(passages, None, "passage", passage_context=["random_sampled", "nearby", "overlap"])
    sampler, seen = PairSampler(corpus, "passage", seed=2, passage_draw="once"), {}
    for step in range(40):
        for pair in sampler.batch(step, len(corpus)):
            seen.setdefault(pair.anchor, set()).add(pair.context)
    assert len(seen) == 5 and all(len(partners) == 1 for partners in seen.values())
    kinds_met = set()
    for seed in range(30):      # across seeds the fixed partner comes from every kind
        for pair in PairSampler(corpus, "passage", seed=seed, passage_draw="once").batch(0, len(corpus)):
            if pair.anchor == text["d0#1"]:
                kinds_met.add("overlap" if pair.context.startswith("overlap") else pair.context)
    assert kinds_met == {"overlap", text["d0#0"], text["d0#2"]}


@pytest.mark.parametrize("mix", [[], ["nearby", "nearby"], ["nearby", "next"], ["spans"]])
def test_a_bad_mix_of_passage_contexts_is_refused(tmp_path, mix):
    passages, _ = _mixed_kind_corpus(tmp_path)
    with pytest.raises(ValueError, match="passage"):
        load_pair_corpus(passages, None, "passage", passage_context=mix)


@pytest.mark.parametrize("mix, message", [
    (["nearby", "nearby"], "parameter pretrain.variants.bad.passage_context: a mix names each kind once"),
    ([], "parameter pretrain.variants.bad.passage_context: a mix names each kind once"),
    (["nearby", "next"], "parameter pretrain.variants.bad.passage_context"),
])
def test_a_bad_mix_is_refused_by_the_schema_with_its_key(mix, message):
    import re

    from qac.config import render_profile
    from qac.params import ParamsError, validate_params

    params = render_profile("smoke")
    params["pretrain"]["variants"]["bad"] = {"method": "cotmae", "context_type": "passage", "passage_context": mix}
    with pytest.raises(ParamsError, match=re.escape(message)):
        validate_params(params)
