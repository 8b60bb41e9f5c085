"""The release's choices that are switches of the params: mining keeps a sample of the top's non-positives.

``finetune.mine_sample``: the release's ``build_train_hn.py --depth 200 --n_sample 128`` keeps 128 of the
non-positive passages in retriever 1's top 200, drawn once per query; null keeps all of them (qac's own
recipe, and the smoke and default profiles'). ``beir_retriever.without_negatives: drop``: train_msmarco_v3.py
leaves out a training query its hard-negatives file gives none.
"""

from __future__ import annotations

from qac.retrieval.mining import negatives_records, sample_negatives
from qac.train.groups import TrainingQuery, retriever1_queries

RANKED = {"q1": [f"d{i}" for i in range(10)], "q2": ["d3", "d1", "d7"]}


def test_a_sample_is_drawn_once_per_query_and_kept_in_rank_order():
    kept = sample_negatives(RANKED, 4, seed=7)
    assert len(kept["q1"]) == 4 and set(kept["q1"]) <= set(RANKED["q1"])
    assert kept["q1"] == [doc for doc in RANKED["q1"] if doc in kept["q1"]]       # rank order
    assert kept["q2"] == RANKED["q2"]                                             # fewer than the sample: all
    assert sample_negatives(RANKED, 4, seed=7) == kept                            # the same draw every time
    assert sample_negatives({"q1": RANKED["q1"]}, 4, seed=7)["q1"] == kept["q1"]  # whatever else was mined
    assert {tuple(sample_negatives(RANKED, 4, seed=s)["q1"]) for s in range(8)} != {tuple(kept["q1"])}
    assert sample_negatives(RANKED, None, seed=7) == RANKED


def test_mined_records_sample_the_non_positives_of_the_top_depth():
    run = {"q1": {f"d{i}": 10.0 - i for i in range(12)}}
    qrels = {"q1": {"d2": 1}}
    (record,) = negatives_records(run, qrels, depth=8, sample=3, seed=1)
    assert record["positives"] == ["d2"] and len(record["negatives"]) == 3
    assert set(record["negatives"]) <= {f"d{i}" for i in range(8)} - {"d2"}
    (everything,) = negatives_records(run, qrels, depth=8)
    assert everything["negatives"] == [f"d{i}" for i in range(8) if i != 2]


def test_a_zero_shot_query_without_hard_negatives_is_dropped_as_the_release_drops_it():
    queries = [TrainingQuery("q1", "sun", ("d0",), ("d1",)), TrainingQuery("q2", "moon", ("d2",), ())]
    # drop: the queries with negatives ("triples", the same rule as the release's stage-1 set)
    assert [q.qid for q in retriever1_queries(queries, "triples")] == ["q1"]
    assert [q.qid for q in retriever1_queries(queries, "judged")] == ["q1", "q2"]   # corpus_negatives
