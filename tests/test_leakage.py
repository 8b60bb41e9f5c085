"""No test query or test judgement ever reaches fine-tuning or hard-negative mining.

The tiny study's test queries have their own ids (``test-*``), a word no
training query has, and relevant documents judged only in the test split.
The finetune stage runs with the group sampler and the miner instrumented;
every query text, query id and positive that training or mining saw is checked.
"""

from __future__ import annotations

import pytest

from test_finetune_stage import HELDOUT_MARK, load_stage, make_study, tiny_datasets

from qac.train.groups import GroupSampler, training_queries


def test_training_queries_come_from_the_train_split_only():
    dataset, _ = tiny_datasets()
    queries = training_queries(dataset.queries, dataset.qrels["train"], {})
    test_ids = set(dataset.qrels["test"])
    assert {q.qid for q in queries} == set(dataset.qrels["train"])
    assert not {q.qid for q in queries} & test_ids
    assert all(HELDOUT_MARK not in q.text for q in queries)


def test_a_negatives_file_naming_a_test_query_is_refused():
    dataset, _ = tiny_datasets()
    with pytest.raises(ValueError, match="outside the training split"):
        training_queries(dataset.queries, dataset.qrels["train"], {"test-0": ["d1"]})


@pytest.fixture()
def study(tmp_path, tiny_bert_dir, mlflow_store, monkeypatch):
    root = tmp_path / "study"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("QAC_PARAMS", str(root / "params.yaml"))
    return root, make_study(root, tiny_bert_dir)


def test_the_finetune_stage_never_trains_or_mines_on_test_queries(study, monkeypatch):
    from qac.train import mining

    seen_groups = []
    original_epoch = GroupSampler.epoch

    def recording_epoch(self, epoch):
        groups = original_epoch(self, epoch)
        seen_groups.extend(groups)
        return groups

    mined_queries = []
    original_mine = mining.mine_with_retriever

    def recording_mine(model, tokenizer, queries, *args, **kwargs):
        mined_queries.extend(queries)
        return original_mine(model, tokenizer, queries, *args, **kwargs)

    monkeypatch.setattr(GroupSampler, "epoch", recording_epoch)
    monkeypatch.setattr(mining, "mine_with_retriever", recording_mine)
    load_stage("finetune").main(["--variant", "none"])

    dataset, _ = tiny_datasets()
    test_qids = set(dataset.qrels["test"])
    test_positives = {doc for judged in dataset.qrels["test"].values() for doc in judged}
    assert len(seen_groups) == 2 * 16  # r1 and r2, one epoch of the 16 training queries each
    assert not {group.qid for group in seen_groups} & test_qids
    assert all(HELDOUT_MARK not in group.query for group in seen_groups)
    assert not {group.positive for group in seen_groups} & test_positives
    assert {q.qid for q in mined_queries} == set(dataset.qrels["train"])
    assert all(HELDOUT_MARK not in q.text for q in mined_queries)
