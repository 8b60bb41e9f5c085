"""The query_generator stage: training pairs without test queries, a prefix-LM generator whose cached
decoding equals its training-time computation, a loadable folder, quality metrics in MLflow."""

from __future__ import annotations

import contextlib

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from qac.data.punkt import prepare_punkt
from qac.errors import UserError
from qac.querygen.generator_pairs import Pair, build_pairs, cap_training_pairs, split_heldout
from qac.querygen.quality import (JudgeAnchor, SelfRetrieval, candidate_shares, judge_anchors, judge_shares,
                                  random_sentence, rouge_l)
from base_settings import generator_training_settings, sampling_settings

DOCS = {
    "d1": ("Yeast chaperones", "Chaperones help proteins fold in yeast cells. Heat shock raises their levels."),
    "d2": ("River deltas", "Deltas grow where rivers deposit sediment. Tides rework the deposits."),
    "d3": ("Coral bleaching", "Warm water makes corals expel their algae. Reefs turn white."),
    "d4": ("Spike timing", "Neurons fire in precise sequences. Timing carries information."),
    "d5": ("", "A document without a title about tax policy and revenue."),
    "d6": ("Glacier retreat", "Glaciers shrink as summers warm. Meltwater raises sea level."),
}
QUERIES = {
    "q1": "how do chaperones help folding", "q2": "why do deltas grow", "q3": "what causes coral bleaching",
    "q4": "do neurons encode timing", "t1": "what makes glaciers retreat", "t2": "how do deltas grow",
    "t3": "Why do deltas grow",  # the text of training query q2: must not be trained on either
}
TRAIN_QRELS = [("q1", "d1", 1), ("q2", "d2", 1), ("q3", "d3", 1), ("q4", "d4", 1), ("q4", "d5", 0)]
TEST_QRELS = [("t1", "d6", 1), ("t2", "d2", 1), ("t3", "d2", 1)]


def write_dataset(root: Path, name: str = "tinyset") -> Path:
    folder = root / name
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as handle:
        for doc_id, (title, text) in DOCS.items():
            handle.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    with open(folder / "queries.jsonl", "w") as handle:
        for qid, text in QUERIES.items():
            handle.write(json.dumps({"_id": qid, "text": text}) + "\n")
    for split, rows in (("train", TRAIN_QRELS), ("test", TEST_QRELS)):
        lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, d, s in rows]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    (folder / "dataset.json").write_text(json.dumps({"name": name, "splits": ["train", "test"],
                                                     "rel_threshold": {"train": 1, "test": 1}}))
    return folder


def test_pairs_hold_training_queries_and_titles_but_no_test_query(tmp_path):
    write_dataset(tmp_path)
    pairs = build_pairs(tmp_path, "tinyset", ["tinyset"], use_titles=True)
    query_pairs = [(p.target, p.doc_id) for p in pairs if p.kind == "query"]
    # q2's text equals test query t3 (ignoring case): dropped; q4 -> d5 has score 0: not relevant
    assert query_pairs == [(QUERIES["q1"], "d1"), (QUERIES["q3"], "d3"), (QUERIES["q4"], "d4")]
    assert next(p for p in pairs if p.doc_id == "d1" and p.kind == "query").source == \
        "Yeast chaperones " + DOCS["d1"][1]
    titles = sorted(p.target for p in pairs if p.kind == "title")
    assert titles == sorted(t for t, _ in DOCS.values() if t)        # d5 has no title
    test_texts = {QUERIES[q].lower() for q, _, _ in TEST_QRELS}
    assert not any(p.target.lower() in test_texts for p in pairs)
    assert not build_pairs(tmp_path, "tinyset", ["tinyset"], use_titles=False)[0].kind == "title"


def word_count(texts):
    return [len(text.split()) for text in texts]


def test_evidence_window_is_the_run_of_sentences_within_budget_holding_most_query_words():
    from qac.querygen.generator_pairs import evidence_window

    title, text = "Yeast stress", "Cells grow. Heat shock proteins fold. Chaperones bind misfolded proteins. The end came."
    # units (words): title 2, 2, 4, 4, 3; budget 8 words. "chaperones ... misfolded" sits in units 3-4.
    assert evidence_window(title, text, "Chaperones bind misfolded proteins", word_count, 8) == \
        "Heat shock proteins fold. Chaperones bind misfolded proteins."
    # a query sharing no word with the document keeps its start
    assert evidence_window(title, text, "unrelated words", word_count, 8) == "Yeast stress Cells grow. Heat shock proteins fold."
    assert evidence_window(title, text, "The end came", word_count, 8).endswith("The end came.")
    # a sentence longer than the budget stands alone; stop words do not count as shared words
    assert evidence_window("", "A b c d e f g h i j. Of the and.", "the and of", word_count, 3) == "A b c d e f g h i j."


def test_evidence_windows_resource_query_pairs_only():
    from qac.querygen.generator_pairs import with_evidence_windows

    documents = {("x", "1"): ("T", "Alpha beta. Gamma delta. Epsilon zeta.")}
    pairs = [Pair("T Alpha beta. Gamma delta. Epsilon zeta.", "zeta epsilon", "query", "x", "1"),
             Pair("Alpha beta. Gamma delta. Epsilon zeta.", "T", "title", "x", "1")]
    windowed = with_evidence_windows(pairs, documents, word_count, 4)
    assert windowed[0].source == "Gamma delta. Epsilon zeta." and windowed[0].target == "zeta epsilon"
    assert windowed[1] == pairs[1]


def test_heldout_split_is_seeded_disjoint_and_capped():
    pairs = [Pair(f"s{i}", f"t{i}", "query", "x", str(i)) for i in range(50)]
    train, heldout = split_heldout(pairs, 0.2, 7, seed=1)
    assert len(heldout) == 7 and len(train) == 43 and not set(train) & set(heldout)
    assert split_heldout(pairs, 0.2, 7, seed=1) == (train, heldout)
    assert len(split_heldout(pairs, 0.1, 100, seed=1)[1]) == 5


def test_training_pair_cap_keeps_queries_before_titles():
    pairs = [Pair(f"s{i}", f"t{i}", "title" if i % 3 else "query", "x", str(i)) for i in range(30)]
    capped = cap_training_pairs(pairs, 12, seed=0)
    assert len(capped) == 12 and sum(p.kind == "query" for p in capped) == 10   # all 10 queries, 2 titles
    assert capped == [p for p in pairs if p in capped]                          # original order
    assert cap_training_pairs(pairs, None, seed=0) == pairs
    assert len([p for p in cap_training_pairs(pairs, 4, seed=0) if p.kind == "title"]) == 0


def test_rouge_l_and_self_retrieval_by_hand():
    # LCS("cell growth in yeast", "yeast cell growth rate") = "cell growth": P = R = 2/4
    assert rouge_l(["cell growth in yeast"], ["yeast cell growth rate"]) == pytest.approx(0.5)
    texts = ["cats purr softly", "dogs bark loudly", "fish swim quietly", "dogs and cats play together outside"]
    index = SelfRetrieval(["a", "b", "c", "d"], texts)
    # "dogs bark" ranks b first; "the" (a stop word) scores nothing: a miss at any depth;
    # "cats" ranks a and d (a first: the shorter document); asked for d it is found at depth 10 but not first
    queries, expected = ["dogs bark", "the", "cats", "cats"], ["b", "a", "a", "d"]
    assert index.hit_rates(queries, expected, depth=10) == pytest.approx((2 / 4, 3 / 4))
    assert index.first_rate(queries, expected) == pytest.approx(2 / 4)
    text = "First claim here. Second claim there! Third?"
    assert random_sentence(text, random.Random(0)) in {"First claim here.", "Second claim there!", "Third?"}


def test_standard_error_of_the_mean_by_hand():
    from qac.querygen.quality import standard_error

    assert standard_error([1.0, 2.0, 3.0]) == pytest.approx(1.0 / math.sqrt(3))   # sample sd 1
    assert standard_error([0.5]) == 0.0


def test_candidate_shares_count_empty_and_repeated_candidates():
    # passage 1: one empty, one repeat (spacing ignored); passage 2: the same text again is no repeat there
    shares = candidate_shares([["a b", "", "a  b", "c"], ["a b", "d"]])
    assert shares == {"candidates": 6, "empty_share": pytest.approx(1 / 6), "duplicate_share": pytest.approx(1 / 6)}


class WordOverlapJudge:
    """A judge with EncoderCosineJudge's interface: the Jaccard overlap of the two texts' words."""

    def scores(self, pairs):
        return [len(set(a.lower().split()) & set(b.lower().split())) / len(set(a.lower().split()) |
                                                                           set(b.lower().split())) for a, b in pairs]


def passages_of(doc_id, *texts):
    return [{"pid": f"{doc_id}#{k}", "text": text} for k, text in enumerate(texts)]


def test_judge_anchors_pair_two_passages_of_one_document_as_table5_draws_them():
    documents = {"x/1": passages_of("x/1", "Chaperones fold proteins.", "Heat raises them.", "Cells adapt."),
                 "x/2": passages_of("x/2", "A single passage only."),
                 "x/3": passages_of("x/3", "Rivers deposit sediment.", "Tides move it.")}
    anchors = judge_anchors(documents, maximum=5, seed=0)
    assert [a.key for a in anchors] == ["x/1", "x/3"]          # a one-passage document has no passage pair
    texts = {key: [p["text"] for p in passages] for key, passages in documents.items()}
    for a in anchors:
        assert a.anchor in texts[a.key] and a.passage in texts[a.key] and a.anchor != a.passage
    assert judge_anchors(documents, maximum=5, seed=0) == anchors
    assert len(judge_anchors(documents, maximum=1, seed=0)) == 1
    # the anchor is a random passage, not always the first: over seeds both passages of x/3 lead
    assert {judge_anchors(documents, 5, seed)[1].anchor for seed in range(20)} == set(texts["x/3"])


def test_judge_shares_count_high_pairs_and_test_the_difference_by_document():
    anchors = [JudgeAnchor("x/1", "Yeast Chaperones fold proteins. Heat raises them.", "Cells adapt."),
               JudgeAnchor("x/3", "Rivers deposit sediment.", "Tides move it.")]
    # overlaps: anchor 1's first query 4/7, its second 0/9; anchor 2's only query is empty (low, scored 0
    # whatever the judge says); passages: 0/8 and 0/5. The Table 5 share reads first queries only.
    shares = judge_shares(WordOverlapJudge(), 0.2, anchors, [["heat raises yeast chaperones", "cells grow"], [""]],
                          permutations=100, seed=0)
    assert shares["judge/high_share/passage-query"] == pytest.approx(1 / 2)
    assert shares["judge/high_share/passage-passage"] == 0.0
    assert shares["judge/high_share/passage-query/all_candidates"] == pytest.approx(1 / 3)
    assert shares["judge/mean_score/passage-query/all_candidates"] == pytest.approx((4 / 7 + 0 + 0) / 3)
    assert shares["judge/mean_score/passage-passage"] == 0.0
    assert shares["judge/anchors"] == 2
    # per-document differences (1, 0): every sign flip is as extreme as the observed mean 0.5, so p = 1;
    # MDE = (z_0.975 + z_0.8) * sd / sqrt(2) with sd = sqrt(1/2)
    assert shares["judge/difference"] == pytest.approx(1 / 2)
    assert shares["judge/difference/p_value"] == 1.0
    assert shares["judge/difference/mde"] == pytest.approx((1.959963984540054 + 0.8416212335729143) / 2)
    # an anchor without candidates is one low pair; lists must match the anchors
    assert judge_shares(WordOverlapJudge(), 0.2, anchors, [[], ["rivers deposit"]])[
        "judge/high_share/passage-query/all_candidates"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="1 candidate lists for 2 anchors"):
        judge_shares(WordOverlapJudge(), 0.2, anchors, [["heat"]])
    # every pair high on both sides: the test runs (p = 1) but the differences have no spread, so no MDE
    level = judge_shares(WordOverlapJudge(), 0.0, anchors, [["heat"], ["rivers"]], permutations=100)
    assert level["judge/difference"] == 0.0 and level["judge/difference/p_value"] == 1.0
    assert "judge/difference/mde" not in level
    # one anchor: shares, no test
    assert "judge/difference/p_value" not in judge_shares(WordOverlapJudge(), 0.2, anchors[:1], [["heat"]])


@pytest.fixture(scope="module")
def prefix_lm():
    import torch

    from qac.querygen.prefix_lm import build_prefix_lm

    torch.set_num_threads(1)
    model, tokenizer = build_prefix_lm("tiny:minilm", seed=0)
    assert model.copy_bonus() == pytest.approx(4.0)     # COPY_INIT
    return model.eval(), tokenizer


@contextlib.contextmanager
def piece_constraint(model, on: bool):
    """Generation's word-piece constraint switched ``on`` or off for the block."""
    saved = model.config.prefix_lm_piece_constraint
    model.config.prefix_lm_piece_constraint = on
    try:
        yield
    finally:
        model.config.prefix_lm_piece_constraint = saved


def test_prefix_lm_cached_decoding_equals_the_training_computation(prefix_lm):
    import torch

    from qac.querygen.prefix_lm import PrefixCache

    model, tokenizer = prefix_lm
    # The same logits with and without labels: the generation-only piece constraint is off here.
    stack = contextlib.ExitStack()
    stack.enter_context(piece_constraint(model, False))
    source = tokenizer(["chaperones help proteins fold in yeast", "deltas grow"], padding=True, return_tensors="pt")
    labels = torch.tensor([[2000, 2001, 2002, 102], [2003, 102, -100, -100]])
    with torch.no_grad():
        full = model(input_ids=source.input_ids, attention_mask=source.attention_mask, labels=labels)
        packed = model.get_encoder()(input_ids=source.input_ids, attention_mask=source.attention_mask)
        decoder_ids, cache, steps = model.shift_labels(labels), PrefixCache(), []
        for t in range(decoder_ids.shape[1]):
            out = model(encoder_outputs=packed, attention_mask=source.attention_mask,
                        decoder_input_ids=decoder_ids[:, t:t + 1], past_key_values=cache)
            cache = out.past_key_values
            steps.append(out.logits)
        alone = tokenizer(["deltas grow"], return_tensors="pt")
        unpadded = model(input_ids=alone.input_ids, attention_mask=alone.attention_mask,
                         decoder_input_ids=decoder_ids[1:2, :2]).logits
    scale = full.logits.abs().max().item()
    eps = torch.finfo(torch.float32).eps
    assert torch.allclose(torch.cat(steps, dim=1), full.logits, atol=64 * eps * scale, rtol=0)
    # the padding of a shorter passage changes nothing for its real tokens
    assert torch.allclose(unpadded[0], full.logits[1, :2], atol=64 * eps * scale, rtol=0)
    # the loss is the mean cross-entropy over the 6 real label tokens
    log_probs = torch.log_softmax(full.logits, dim=-1)
    picked = [log_probs[r, c, labels[r, c]] for r in range(2) for c in range(4) if labels[r, c] != -100]
    assert float(full.loss) == pytest.approx(-float(sum(picked)) / 6, rel=1e-5)
    stack.close()


def test_prefix_lm_generates_word_pieces_only_as_the_passage_spells_them(prefix_lm):
    import torch

    model, tokenizer = prefix_lm
    text = "chaperones help proteins fold"
    source = tokenizer([text], return_tensors="pt")
    tokens = tokenizer([text], add_special_tokens=False)["input_ids"][0]
    follows = {(a, b) for a, b in zip(tokens, tokens[1:]) if tokenizer.convert_ids_to_tokens(b).startswith("##")}
    assert follows                                   # the passage has words of several pieces
    pieces = model.word_pieces.nonzero().flatten().tolist()
    decoder_ids = torch.tensor([[tokenizer.cls_token_id, *tokens]])
    with torch.no_grad():
        free = model(input_ids=source.input_ids, attention_mask=source.attention_mask,
                     decoder_input_ids=decoder_ids, labels=None).logits[0]
        with piece_constraint(model, False):
            unconstrained = model(input_ids=source.input_ids, attention_mask=source.attention_mask,
                                  decoder_input_ids=decoder_ids).logits[0]
    for position, token in enumerate(decoder_ids[0].tolist()):
        allowed = {b for a, b in follows if a == token}
        finite = {piece for piece in pieces if torch.isfinite(free[position, piece])}
        assert finite == allowed, (position, tokenizer.convert_ids_to_tokens(token))
        # word-initial tokens keep their logits
        starts = ~model.word_pieces
        assert torch.equal(free[position][starts], unconstrained[position][starts])
    # training (labels given) is never constrained: every piece keeps a finite logit
    labels = torch.tensor([[*tokens[:3], tokenizer.sep_token_id]])
    with torch.no_grad():
        trained = model(input_ids=source.input_ids, attention_mask=source.attention_mask, labels=labels)
    assert torch.isfinite(trained.logits).all() and torch.isfinite(trained.loss)


def test_prefix_lm_copy_bias_raises_the_passage_tokens_not_yet_emitted(prefix_lm):
    import torch

    model, tokenizer = prefix_lm
    source = tokenizer(["chaperones help proteins"], return_tensors="pt")
    words = tokenizer(["chaperones help proteins"], add_special_tokens=False)["input_ids"][0]
    emitted = tokenizer.convert_tokens_to_ids("help")
    decoder_ids = torch.tensor([[tokenizer.cls_token_id, emitted]])

    def logits():
        with torch.no_grad(), piece_constraint(model, False):   # the copy bias alone
            return model(input_ids=source.input_ids, attention_mask=source.attention_mask,
                         decoder_input_ids=decoder_ids).logits[0]

    with_copy = logits()
    bonuses = {token: model.copy_bonus(pieces=tokenizer.convert_ids_to_tokens(token).startswith("##"))
               for token in words}
    saved = {name: p.detach().clone() for name, p in model.named_parameters() if "copy_weight" in name}
    with torch.no_grad():
        model.copy_weight.zero_()
        model.piece_copy_weight.zero_()
    without = logits()
    with torch.no_grad():
        model.copy_weight.copy_(saved["copy_weight"])
        model.piece_copy_weight.copy_(saved["piece_copy_weight"])
    assert any(tokenizer.convert_ids_to_tokens(t).startswith("##") for t in words)   # both kinds are present
    difference = with_copy - without
    # position 0: every passage token gets its bonus (word start or ## piece); position 1: "help" was emitted
    assert set(difference[0].nonzero().flatten().tolist()) == set(words)
    assert set(difference[1].nonzero().flatten().tolist()) == set(words) - {emitted}
    for token, bonus in bonuses.items():
        assert difference[0, token].item() == pytest.approx(bonus, rel=1e-5)
    assert bonuses[emitted] == pytest.approx(4.0) and min(bonuses.values()) == pytest.approx(1.0)


def test_kind_prefixes_mark_each_pair_kind_in_the_source():
    from qac.querygen.train_generator import TrainSettings, build_generator, encode_pairs

    from qac.config import render_profile

    params = render_profile("smoke")
    params["query_generator"].update({"prefix": "text: ", "kind_prefixes": {"title": "title: ", "query": "query: "},
                                      "max_source_len": 16, "max_target_len": 6})
    settings = TrainSettings.from_params(params)
    assert settings.source_prefix("query") == "query: " and settings.source_prefix("other") == "text: "
    _, tokenizer = build_generator("prefix_lm", "tiny:minilm", seed=0)
    pairs = [Pair("deltas grow", "why", kind, "x", "d2") for kind in ("query", "title", "other")]
    sources = tokenizer.batch_decode(encode_pairs(tokenizer, pairs, settings)["input_ids"], skip_special_tokens=True)
    assert sources == ["query : deltas grow", "title : deltas grow", "text : deltas grow"]


def test_prefix_lm_folder_loads_and_generates_the_same_queries_at_any_batch_size(prefix_lm, tmp_path):
    import torch

    from qac.querygen.generate import QueryGenerator, SamplingSettings, load_generator
    from qac.querygen.prefix_lm import PrefixLM
    from qac.querygen.train_generator import save_generator

    model, tokenizer = prefix_lm
    save_generator(model, tokenizer, tmp_path / "generator")
    loaded, loaded_tokenizer = load_generator(str(tmp_path / "generator"))
    assert isinstance(loaded, PrefixLM)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    passages = [(f"d{i}#0", text) for i, (_, text) in enumerate(DOCS.values())]
    settings = sampling_settings(queries_per_passage=3, max_new_tokens=6, max_source_len=24, seed=3)
    one, stats = QueryGenerator(loaded, loaded_tokenizer, settings).generate_candidates(passages, 1)
    four, _ = QueryGenerator(loaded, loaded_tokenizer, settings).generate_candidates(passages, 4)
    assert one == four and len(one) == len(DOCS) and all(len(c) == 3 for c in one)
    assert stats.decisions > 0


@pytest.mark.parametrize("architecture", ["prefix_lm", "bert2bert"])
def test_training_lowers_the_loss_and_keeps_the_best_validated_weights(architecture):
    import torch

    from qac.querygen.train_generator import TrainSettings, build_generator, train_generator, validation_loss

    torch.set_num_threads(1)
    model, tokenizer = build_generator(architecture, "tiny:minilm", seed=0)
    pairs = [Pair(text, title, "title", "x", d) for d, (title, text) in DOCS.items() if title]
    settings = generator_training_settings(seed=42, max_source_len=24, max_target_len=6, epochs=12, batch_size=5, lr=5e-3, warmup_ratio=0.0,
                             eval_every=3)
    before = validation_loss(model, tokenizer, pairs, settings, "cpu")
    figures = train_generator(model, tokenizer, pairs, settings, "cpu", validation=pairs)
    after = validation_loss(model, tokenizer, pairs, settings, "cpu")
    assert after < 0.8 * before   # 10.4 -> ~6.7 when measured
    assert after == pytest.approx(figures["validation/best_loss"], rel=1e-6)    # the best weights were kept
    assert figures["train/steps"] == 12 and figures["validation/best_step"] % 3 == 0


def test_patience_stops_training_early():
    import torch

    from qac.querygen.train_generator import TrainSettings, build_generator, train_generator

    torch.set_num_threads(1)
    model, tokenizer = build_generator("prefix_lm", "tiny:minilm", seed=0)
    pairs = [Pair(text, title, "title", "x", d) for d, (title, text) in DOCS.items() if title]
    # validation targets unrelated to training: the validation loss rises as training fits the titles
    unrelated = [Pair(text, "zebra quantum harbour", "title", "x", d) for d, (_, text) in DOCS.items()]
    settings = generator_training_settings(seed=42, max_source_len=24, max_target_len=6, epochs=20, batch_size=5, lr=5e-3, warmup_ratio=0.0,
                             eval_every=1, patience=2)
    figures = train_generator(model, tokenizer, pairs, settings, "cpu", validation=unrelated)
    assert figures["train/steps"] == figures["validation/best_step"] + 2 < 20


def load_stage():
    """pipelines/train_query_generator.py as a module."""
    import stages

    return stages.load_stage("train_query_generator")


def test_stage_saves_a_generator_folder_and_logs_quality(tmp_path, monkeypatch, mlflow_store):
    import mlflow
    import torch

    import qac.querygen.train_generator as train_module
    from qac.config import render_profile
    from qac.querygen.generate import QueryGenerator, SamplingSettings, load_generator
    from qac.querygen.prefix_lm import PrefixLM

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    params = render_profile("smoke")
    params.update(data_dir=str(tmp_path / "data"), train_dataset="tinyset", pretrain_corpus="tinyset")
    params["datasets"]["tinyset"] = {"format": "beir", "splits": ["train", "test"]}
    params["query_generator"].update(model="tiny:minilm", architecture="prefix_lm", max_source_len=24,
                                     max_target_len=6, batch_size=2, heldout_fraction=0.5, max_heldout=3, log_every=1,
                                     validation_pairs=1, eval_every=1, quality_candidates=2, judge_anchors=5,
                                     judge_calibration_pairs=3, evidence_windows=True)
    params["annotation"].update(judge_model="tiny:minilm")
    params["split"].update(max_len=12)   # two passages or more per tiny document
    write_dataset(tmp_path / "data" / "smoke" / "datasets")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))
    with pytest.raises(UserError, match=r"smoke/punkt: the sentence splitter of the split_passages stage"):
        load_stage().main()
    # the split stage's Punkt model, which cuts the held-out documents of the Table 5 judge into passages
    prepare_punkt("trained", tmp_path / "data" / "smoke" / "punkt",
                  lambda: [f"{title} {text}" for title, text in DOCS.values()], "tinyset")

    trained_on = []
    original = train_module.encode_pairs
    monkeypatch.setattr(train_module, "encode_pairs",
                        lambda tok, pairs, s: trained_on.extend(pairs) or original(tok, pairs, s))
    assert load_stage().main() == 0

    assert trained_on and not any(p.target.lower() in {QUERIES[q].lower() for q, _, _ in TEST_QRELS}
                                  for p in trained_on)
    # evidence windows: a query pair reads a run of its document's sentences (here, short documents: all of it)
    for pair in trained_on:
        if pair.kind == "query":
            title, text = DOCS[pair.doc_id]
            assert pair.source and pair.source in f"{title} {text}".strip()
    folder = tmp_path / "data" / "smoke" / "generator"
    model, tokenizer = load_generator(str(folder))
    assert isinstance(model, PrefixLM)
    assert (model.config.decoder_start_token_id, model.config.eos_token_id, model.config.pad_token_id) == (101, 102, 0)
    queries, _ = QueryGenerator(model, tokenizer, sampling_settings(queries_per_passage=2, max_new_tokens=4, seed=42)
                                ).generate([("d1#0", DOCS["d1"][1])], 1)
    assert len(queries) == 1

    metrics = json.loads((tmp_path / "data" / "smoke" / "metrics" / "query_generator.json").read_text())
    record = json.loads((tmp_path / "data" / "smoke" / ".runs" / "generator" / "mlflow_run.json").read_text())
    assert "mlflow_run_id" not in metrics and not (folder / "mlflow_run.json").exists()
    assert record["model"] and metrics["architecture"] == "prefix_lm"
    mlflow.set_tracking_uri(mlflow_store)
    run = mlflow.get_run(record["run_id"])
    assert run.info.run_name == "query_generator" and run.data.tags["qac.kind"] == "query_generator"
    for key in ("rougeL", "self_retrieval/generated/top10", "self_retrieval/generated/top1",
                "self_retrieval/random_sentence/top10", "self_retrieval/reference/top10", "empty_share", "duplicate_share",
                "judge/high_share/passage-query", "judge/high_share/passage-passage", "judge/difference",
                "judge/difference/p_value", "pairs/train",
                "pairs/heldout", "pairs/validation", "train/loss", "validation/loss"):
        assert key in run.data.metrics, key
    assert run.data.metrics["pairs/heldout"] == 3   # min(max_heldout 3, 0.5 * 8 pairs)
    assert run.data.metrics["candidates"] == 3 * 2
    assert 0.0 <= run.data.metrics["rougeL"] <= 1.0 and run.data.metrics["rougeL_se"] >= 0.0
    # What the training cost is the run's (qac.tracking.cost), in no output of the stage.
    assert run.data.metrics["cost/device_seconds"] > 0 and run.data.metrics["cost/peak_rss_mb"] > 0
    assert run.data.tags["qac.cost.device"] == "cpu" and "qac.cost.energy" in run.data.tags
    outputs = [folder, tmp_path / "data" / "smoke" / "metrics", tmp_path / "reports"]
    assert not [path for where in outputs for path in where.rglob("*")
                if path.suffix in (".json", ".md", ".csv") and "cost/" in path.read_text(errors="replace")]
    report = (tmp_path / "reports" / "query_generator" / "smoke.md").read_text()
    assert "| BM25 self-retrieval @10, generated queries |" in report


def test_stage_refuses_a_generation_prefix_the_generator_never_learned(tmp_path, monkeypatch):
    from qac.config import render_profile

    params = render_profile("smoke")
    params["query_generator"].update(kind_prefixes={"query": "query: ", "title": "title: "})
    params["querygen"]["prefix"] = "title: "
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))
    stage = load_stage()
    with pytest.raises(ValueError, match=r"params\.yaml:\d+: parameter querygen\.prefix: 'title: ' differs .*'query: '"):
        stage.main()


def test_prefix_lm_copy_bias_and_its_gradient_count_each_passage_token_once(prefix_lm):
    """The copy term against its dense definition: bonus x (token in the passage) x (not fed yet)."""
    import torch

    model, tokenizer = prefix_lm
    # "proteins" three times in the first passage, twice among the labels; padding in the second row
    source = tokenizer(["proteins fold proteins in yeast proteins", "deltas grow"], padding=True, return_tensors="pt")
    proteins, deltas = tokenizer.convert_tokens_to_ids(["proteins", "deltas"])
    labels = torch.tensor([[proteins, 2001, proteins, 102], [deltas, 102, -100, -100]])
    decoder_ids = model.shift_labels(labels)
    vocab = model.config.vocab_size

    def loss_and_gradients(logits_of):
        model.zero_grad()
        logits = logits_of()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss.backward()
        return logits.detach(), model.copy_weight.grad.clone(), model.piece_copy_weight.grad.clone()

    def dense():
        saved = model.copy_weight
        model.copy_weight = None                         # the model without its copy term
        try:
            plain = model(input_ids=source.input_ids, attention_mask=source.attention_mask,
                          decoder_input_ids=decoder_ids).logits
        finally:
            model.copy_weight = saved
        special = torch.tensor(model.config.prefix_lm_special_ids)
        present = torch.zeros(2, vocab)
        present.scatter_(1, source.input_ids * source.attention_mask, 1.0)
        present[:, special] = 0.0
        fed = torch.zeros(2, decoder_ids.shape[1], vocab).scatter_(2, decoder_ids[..., None], 1.0).cummax(1).values
        bonus = 100.0 * torch.where(model.word_pieces, model.piece_copy_weight, model.copy_weight)
        return plain + bonus * present[:, None] * (1 - fed)

    with piece_constraint(model, False):
        model.train(False)
        fast = loss_and_gradients(lambda: model(input_ids=source.input_ids, attention_mask=source.attention_mask,
                                                decoder_input_ids=decoder_ids).logits)
        reference = loss_and_gradients(dense)
    model.zero_grad()
    scale = reference[0].abs().max().item()
    eps = torch.finfo(torch.float32).eps
    assert torch.allclose(fast[0], reference[0], atol=16 * eps * scale, rtol=0)
    for got, expected in zip(fast[1:], reference[1:]):
        assert got.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    assert reference[1].abs().item() > 1e-4            # the word bonus gets a gradient at all


def test_generator_dropout_setting_replaces_the_checkpoints():
    import torch

    from qac.querygen.train_generator import build_generator

    kept, _ = build_generator("prefix_lm", "tiny:minilm", seed=0)
    none, tokenizer = build_generator("prefix_lm", "tiny:minilm", seed=0, dropout=0.0)
    assert {m.p for m in kept.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
    assert {m.p for m in none.modules() if isinstance(m, torch.nn.Dropout)} == {0.0}
    assert none.config.hidden_dropout_prob == none.config.attention_probs_dropout_prob == 0.0
    source = tokenizer(["chaperones help proteins fold"], return_tensors="pt")
    labels = torch.tensor([[2000, 2001, 102]])

    def two_losses(model):
        model.train()
        return [float(model(input_ids=source.input_ids, attention_mask=source.attention_mask, labels=labels).loss)
                for _ in range(2)]

    first, second = two_losses(kept)
    assert first != second                      # dropout draws differ between passes
    first, second = two_losses(none)
    assert first == second
    with pytest.raises(ValueError, match="dropout"):
        build_generator("prefix_lm", "tiny:minilm", seed=0, dropout=1.0)
