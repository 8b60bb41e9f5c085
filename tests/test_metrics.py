"""Metrics: hand-computed cases, then agreement with trec_eval (pytrec_eval) on random data."""

from __future__ import annotations

import math
import random

import pytest

from qac.evaluation.metrics import Measure, evaluate, trec_order

pytrec_eval = pytest.importorskip("pytrec_eval")

LOG2_3 = math.log2(3)


# --- hand-computed examples ------------------------------------------------------------

def test_ranking_is_score_descending_with_ties_broken_by_doc_id_descending():
    assert trec_order({"a": 1.0, "c": 1.0, "b": 2.0, "z": 0.5}) == ["b", "c", "a", "z"]


def test_reciprocal_rank_uses_first_relevant_document_and_cutoff():
    qrels = {"q": {"d3": 1}}
    run = {"q": {"d1": 0.9, "d2": 0.8, "d3": 0.7}}
    result = evaluate(qrels, run, ["RR", "RR@3", "RR@2"])
    assert result.aggregate == {"RR": pytest.approx(1 / 3), "RR@3": pytest.approx(1 / 3), "RR@2": 0.0}


def test_tie_order_decides_rank():
    # d1 and d2 tie; trec_eval puts d2 (larger id) first, so relevant d1 is at rank 2.
    result = evaluate({"q": {"d1": 1}}, {"q": {"d1": 1.0, "d2": 1.0}}, ["RR"])
    assert result.aggregate["RR"] == pytest.approx(0.5)


def test_recall_hit_and_precision_at_k():
    qrels = {"q": {"a": 1, "b": 1, "c": 1, "n": 0}}
    run = {"q": {"a": 5.0, "x": 4.0, "b": 3.0, "n": 2.0, "c": 1.0}}
    result = evaluate(qrels, run, ["R@2", "R@3", "R@5", "Hit@1", "P@2", "P@10"])
    assert result.aggregate == pytest.approx(
        {"R@2": 1 / 3, "R@3": 2 / 3, "R@5": 1.0, "Hit@1": 1.0, "P@2": 0.5, "P@10": 0.3}
    )


def test_average_precision_divides_by_all_relevant_documents():
    # Relevant at ranks 1 and 3; a third relevant document is never retrieved.
    qrels = {"q": {"a": 1, "b": 1, "c": 1}}
    run = {"q": {"a": 3.0, "x": 2.0, "b": 1.0}}
    assert evaluate(qrels, run, ["AP"]).aggregate["AP"] == pytest.approx((1 + 2 / 3) / 3)


def test_ndcg_uses_graded_gains_and_ideal_from_all_judged_documents():
    qrels = {"q": {"a": 2, "b": 1, "c": 3, "n": -1}}
    run = {"q": {"n": 9.0, "b": 3.0, "a": 2.0}}     # gains 0 (negative), 1, 2; c (3) not retrieved
    dcg = 0 + 1 / LOG2_3 + 2 / 2
    ideal_10 = 3 + 2 / LOG2_3 + 1 / 2
    ideal_2 = 3 + 2 / LOG2_3
    result = evaluate(qrels, run, ["nDCG@10", "nDCG@2"])
    assert result.aggregate["nDCG@10"] == pytest.approx(dcg / ideal_10)
    assert result.aggregate["nDCG@2"] == pytest.approx((1 / LOG2_3) / ideal_2)


def test_relevance_threshold_applies_to_binary_measures_only():
    qrels = {"q": {"a": 1, "b": 2}}
    run = {"q": {"a": 2.0, "b": 1.0}}
    at_1 = evaluate(qrels, run, ["RR", "nDCG@10"], rel_threshold=1).aggregate
    at_2 = evaluate(qrels, run, ["RR", "nDCG@10"], rel_threshold=2).aggregate
    assert (at_1["RR"], at_2["RR"]) == (1.0, 0.5)
    assert at_1["nDCG@10"] == at_2["nDCG@10"]


def test_average_is_over_all_judged_queries():
    qrels = {"found": {"a": 1}, "missed": {"a": 1}, "absent": {"a": 1}, "no_relevant": {"a": 0}, "empty": {}}
    run = {"found": {"a": 1.0}, "missed": {"b": 1.0}, "no_relevant": {"a": 1.0}, "not_judged": {"a": 1.0}}
    result = evaluate(qrels, run, ["RR@10"])
    # 'empty' has no judgement at all (no qrels line), 'not_judged' is not in the qrels.
    assert result.query_ids == ["found", "missed", "absent", "no_relevant"]
    assert result.per_query["RR@10"] == {"found": 1.0, "missed": 0.0, "absent": 0.0, "no_relevant": 0.0}
    assert result.aggregate["RR@10"] == 0.25


def test_ignore_identical_ids_drops_the_query_itself():
    qrels = {"q1": {"d": 1}}
    run = {"q1": {"q1": 9.0, "d": 1.0}}
    assert evaluate(qrels, run, ["RR"]).aggregate["RR"] == 0.5
    assert evaluate(qrels, run, ["RR"], ignore_identical_ids=True).aggregate["RR"] == 1.0


@pytest.mark.parametrize("name", ["MRR@10", "R", "Hit", "AP@10", "nDCG@0", "recall.10"])
def test_bad_measure_names_are_rejected(name):
    with pytest.raises(ValueError, match="measure"):
        Measure.parse(name)


def test_nan_scores_are_rejected():
    with pytest.raises(ValueError, match="NaN"):
        evaluate({"q": {"a": 1}}, {"q": {"a": float("nan")}}, ["RR"])


# --- agreement with trec_eval ------------------------------------------------------------

def random_collection(rng: random.Random, n_queries=60, n_docs=40):
    """Random graded qrels and a run with many score ties, missing queries and unjudged documents."""
    docs = [f"d{i}" for i in range(n_docs)]
    qrels, run = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        judged = rng.sample(docs, rng.randint(1, 12))
        # labels -1..3; some queries end up with no relevant document at all
        qrels[qid] = {doc: rng.choice([-1, 0, 0, 1, 1, 2, 3]) for doc in judged}
        if rng.random() < 0.1:
            qrels[qid] = {doc: 0 for doc in judged}
        if rng.random() < 0.1:
            continue                                        # query missing from the run
        retrieved = rng.sample(docs + [qid], rng.randint(1, n_docs))
        # coarse scores so that ties are frequent
        run[qid] = {doc: float(rng.randint(0, 8)) / 4 for doc in retrieved}
    run["unjudged-query"] = {"d1": 1.0}
    return qrels, run


def truncate(run, k):
    """The run cut to its top k under trec_eval ordering (pytrec_eval's recip_rank has no cutoff)."""
    return {qid: {doc: docs[doc] for doc in trec_order(docs)[:k]} for qid, docs in run.items()}


def reference(qrels, run, measure: str, rel_threshold: int):
    """Per-query values from pytrec_eval for one of our measure names."""
    parsed = Measure.parse(measure)
    k = parsed.cutoff
    if parsed.family == "RR":
        name, key, run = "recip_rank", "recip_rank", truncate(run, k) if k else run
    elif parsed.family == "Hit":
        # success.k is trec_eval's hit rate; cross-checked below against truncation
        name, key = f"success.{k}", f"success_{k}"
    else:
        name, key = {
            "R": (f"recall.{k}", f"recall_{k}"),
            "P": (f"P.{k}", f"P_{k}"),
            # pytrec_eval's plain "ndcg" can hang after other evaluators ran in the same
            # process; a cutoff beyond every run's length is the same measure.
            "nDCG": (f"ndcg_cut.{k or 100000}", f"ndcg_cut_{k or 100000}"),
            "AP": ("map", "map"),
        }[parsed.family]
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {name}, relevance_level=rel_threshold)
    return {qid: values[key] for qid, values in evaluator.evaluate(run).items()}


MEASURES = ["RR", "RR@1", "RR@5", "R@5", "R@20", "Hit@1", "Hit@5", "P@5", "nDCG", "nDCG@3", "nDCG@10", "AP"]


@pytest.mark.parametrize("rel_threshold", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_agrees_with_pytrec_eval(seed, rel_threshold):
    qrels, run = random_collection(random.Random(seed))
    ours = evaluate(qrels, run, MEASURES, rel_threshold=rel_threshold)
    for measure in MEASURES:
        expected = reference(qrels, run, measure, rel_threshold)
        assert expected, "pytrec_eval evaluated nothing"
        for qid, value in expected.items():
            assert ours.per_query[measure][qid] == pytest.approx(value, abs=1e-6), (measure, qid)
        # queries pytrec_eval skips (judged but not in the run) count 0 in our mean
        for qid in set(ours.per_query[measure]) - set(expected):
            assert qid not in run and ours.per_query[measure][qid] == 0.0
        assert ours.aggregate[measure] == pytest.approx(sum(expected.values()) / len(ours.query_ids), abs=1e-9)


def test_hit_rate_equals_success_of_the_truncated_run():
    qrels, run = random_collection(random.Random(7))
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"recall.1000"})
    truncated = evaluator.evaluate(truncate(run, 5))
    ours = evaluate(qrels, run, ["Hit@5"]).per_query["Hit@5"]
    for qid, values in truncated.items():
        assert ours[qid] == float(values["recall_1000"] > 0)


def test_ignore_identical_ids_agrees_with_dropping_them_first():
    qrels, run = random_collection(random.Random(11))
    dropped = {qid: {doc: s for doc, s in docs.items() if doc != qid} for qid, docs in run.items()}
    assert any(qid in docs for qid, docs in run.items())
    ours = evaluate(qrels, run, MEASURES, ignore_identical_ids=True)
    for measure in MEASURES:
        for qid, value in reference(qrels, dropped, measure, 1).items():
            assert ours.per_query[measure][qid] == pytest.approx(value, abs=1e-6), (measure, qid)


def test_agrees_with_pytrec_eval_on_distinct_float_scores():
    rng = random.Random(3)
    qrels, run = random_collection(rng, n_queries=30, n_docs=200)
    run = {qid: {doc: rng.random() for doc in docs} for qid, docs in run.items()}
    ours = evaluate(qrels, run, MEASURES)
    for measure in MEASURES:
        for qid, value in reference(qrels, run, measure, 1).items():
            assert ours.per_query[measure][qid] == pytest.approx(value, abs=1e-6), (measure, qid)
