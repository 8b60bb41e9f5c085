"""Fine-tuning groups: training queries only, negatives without positives, deterministic epochs."""

from __future__ import annotations

import pytest

from qac.train.groups import (GroupSampler, TrainingQuery, merge_negatives, negative_pool_stats,
                              read_negatives, retriever1_queries, training_queries)

QUERIES = {"q1": "first", "q2": "second", "q3": "third", "t1": "a test query"}
TRAIN_QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 1, "d9": 0}, "q3": {"d4": 0}}


def test_training_queries_keep_train_judged_queries_with_a_relevant_document():
    selected = training_queries(QUERIES, TRAIN_QRELS, {"q1": ["d5", "d1", "d6"]})
    assert [q.qid for q in selected] == ["q1", "q2"]  # q3 has no relevant document, t1 is not in train
    assert selected[0] == TrainingQuery("q1", "first", ("d1",), ("d5", "d6"))  # the positive d1 left the pool
    assert selected[1].positives == ("d2", "d3") and selected[1].negatives == ()


def test_retriever1_queries_triples_keeps_only_the_queries_with_a_negative_pool():
    # q1's pool keeps d5; q2 has no entry; q4's only negative is its positive, so its pool is empty too.
    qrels = {**TRAIN_QRELS, "q4": {"d7": 1}}
    judged = training_queries({**QUERIES, "q4": "fourth"}, qrels, {"q1": ["d5", "d1"], "q4": ["d7"]})
    assert [q.qid for q in retriever1_queries(judged, "judged")] == ["q1", "q2", "q4"]
    assert [q.qid for q in retriever1_queries(judged, "triples")] == ["q1"]
    with pytest.raises(ValueError, match="finetune.r1_queries: 'some'"):
        retriever1_queries(judged, "some")


def test_graded_threshold_decides_positives():
    selected = training_queries(QUERIES, {"q1": {"d1": 1, "d2": 2}}, {}, rel_threshold=2)
    assert selected[0].positives == ("d2",)


def test_negatives_for_a_query_outside_the_training_split_are_an_error():
    with pytest.raises(ValueError, match="outside the training split.*t1"):
        training_queries(QUERIES, TRAIN_QRELS, {"t1": ["d1"]})


def test_negatives_missing_from_the_corpus_are_dropped():
    selected = training_queries(QUERIES, {"q1": {"d1": 1}}, {"q1": ["gone", "d5"]}, corpus_ids=["d1", "d5"])
    assert selected[0].negatives == ("d5",)


def test_max_queries_keeps_a_seeded_subset():
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(20)}
    queries = {qid: qid for qid in qrels}
    first = [q.qid for q in training_queries(queries, qrels, {}, max_queries=5, seed=1)]
    again = [q.qid for q in training_queries(queries, qrels, {}, max_queries=5, seed=1)]
    other = [q.qid for q in training_queries(queries, qrels, {}, max_queries=5, seed=2)]
    assert len(first) == 5 and first == again and first != other


def test_read_negatives_names_file_and_line(tmp_path):
    path = tmp_path / "negatives.jsonl"
    path.write_text('{"qid": "q1", "positives": ["d1"], "negatives": ["d2"]}\n{"qid": "q2"}\n')
    with pytest.raises(ValueError, match=r"negatives.jsonl:2: missing field 'negatives'"):
        read_negatives(path)
    path.write_text('{"qid": 7, "positives": [], "negatives": ["d2", 3]}\n')
    assert read_negatives(path) == {"7": ["d2", "3"]}


def test_merge_negatives_keeps_first_source_order_without_repeats():
    assert merge_negatives({"q": ["a", "b"]}, {"q": ["b", "c"], "r": ["x"]}) == {"q": ["a", "b", "c"], "r": ["x"]}


QUERY_SET = [
    TrainingQuery("q1", "one", ("p1",), tuple(f"n{i}" for i in range(10))),
    TrainingQuery("q2", "two", ("p2", "p3"), ("m1", "m2")),
    TrainingQuery("q3", "three", ("p4",), ()),
]
CORPUS = ["p1", "p2", "p3", "p4"] + [f"n{i}" for i in range(10)] + ["m1", "m2", "r1", "r2", "r3"]


def test_groups_have_the_positive_first_and_the_requested_number_of_negatives():
    sampler = GroupSampler(QUERY_SET, CORPUS, n_negatives=3, seed=0)
    groups = {group.qid: group for group in sampler.epoch(0)}
    assert {len(group.passages) for group in groups.values()} == {4}
    assert groups["q1"].positive == "p1" and set(groups["q1"].negatives) <= set(QUERY_SET[0].negatives)
    assert len(set(groups["q1"].negatives)) == 3  # a long pool is sampled without repetition
    assert groups["q2"].positive in ("p2", "p3")
    assert set(groups["q2"].negatives) == {"m1", "m2"}  # a short pool is used whole, then repeated
    # no negatives at all: random corpus documents, never the query's positive
    assert "p4" not in groups["q3"].negatives and len(set(groups["q3"].negatives)) == 3


def test_epochs_are_deterministic_and_differ_from_each_other():
    a = GroupSampler(QUERY_SET, CORPUS, n_negatives=3, seed=5)
    b = GroupSampler(list(QUERY_SET), list(CORPUS), n_negatives=3, seed=5)
    assert a.epoch(0) == b.epoch(0) and a.epoch(1) == b.epoch(1)
    epochs = [a.epoch(epoch) for epoch in range(6)]
    assert len({tuple(group.negatives for group in epoch if group.qid == "q1") for epoch in epochs}) > 1
    assert len({tuple(group.qid for group in epoch) for epoch in epochs}) > 1  # the order is reshuffled


def test_pool_statistics():
    assert negative_pool_stats(QUERY_SET, 3) == {"queries": 3, "full_pool": 1, "short_pool": 1,
                                                  "corpus_negatives": 1}


def test_a_sampler_without_queries_or_with_a_tiny_corpus_fails_clearly():
    with pytest.raises(ValueError, match="no training queries"):
        GroupSampler([], CORPUS, 3, 0)
    with pytest.raises(ValueError, match="too small"):
        GroupSampler([QUERY_SET[2]], ["p4", "x"], 3, 0).epoch(0)
