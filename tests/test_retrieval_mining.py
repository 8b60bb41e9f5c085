"""Hard-negative mining from a ranked run."""

from __future__ import annotations

import pytest

from qac.retrieval.mining import mine_hard_negatives, negatives_records

RUN = {"q1": {"p": 9.0, "a": 8.0, "b": 7.0, "n0": 6.0, "c": 5.0, "d": 4.0}}
QRELS = {"q1": {"p": 1, "n0": 0}}


def test_negatives_are_the_top_depth_without_positives_in_rank_order():
    assert mine_hard_negatives(RUN, QRELS, depth=4) == {"q1": ["a", "b", "n0"]}


def test_skip_top_skips_ranks_before_removing_positives():
    assert mine_hard_negatives(RUN, QRELS, depth=5, skip_top=2) == {"q1": ["b", "n0", "c"]}


def test_exclude_overrides_positives():
    assert mine_hard_negatives(RUN, QRELS, depth=3, exclude={"q1": ["a"]}) == {"q1": ["p", "b"]}


def test_ties_follow_trec_eval_order():
    assert mine_hard_negatives({"q": {"x": 1.0, "y": 1.0}}, {}, depth=2) == {"q": ["y", "x"]}


def test_records_cover_queries_with_positives_only():
    qrels = {"q1": {"p": 1}, "q2": {"z": 0}, "q3": {"r": 2}}
    records = negatives_records(RUN, qrels, depth=3)
    assert records == [{"qid": "q1", "positives": ["p"], "negatives": ["a", "b"]},
                       {"qid": "q3", "positives": ["r"], "negatives": []}]


def test_found_positive_only_keeps_the_queries_whose_positive_is_within_depth():
    """The official triples' rule (finetune.r1_queries: triples): a query whose positive the ranking misses
    within ``depth`` has no record; ranks count before positives are removed."""
    run = {**RUN, "q2": {"a": 3.0, "z": 2.0, "r": 1.0}}
    qrels = {"q1": {"p": 1}, "q2": {"r": 1}, "q3": {"r": 2}}
    assert [r["qid"] for r in negatives_records(run, qrels, depth=3)] == ["q1", "q2", "q3"]
    assert negatives_records(run, qrels, depth=3, found_positive_only=True) == [
        {"qid": "q1", "positives": ["p"], "negatives": ["a", "b"]},
        {"qid": "q2", "positives": ["r"], "negatives": ["a", "z"]}]
    # q2's positive is third: at depth 2 it is not found.
    assert [r["qid"] for r in negatives_records(run, qrels, depth=2, found_positive_only=True)] == ["q1"]


def test_bad_depth_is_rejected():
    with pytest.raises(ValueError, match="depth"):
        mine_hard_negatives(RUN, QRELS, depth=2, skip_top=2)
