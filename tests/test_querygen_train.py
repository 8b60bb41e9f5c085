"""The query_generator stage: training pairs without test queries, a loadable bert2bert folder,
quality metrics in MLflow."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from qac.querygen.pairs import Pair, build_pairs, cap_training_pairs, split_heldout
from qac.querygen.quality import SelfRetrieval, random_sentence, rouge_l

REPO = Path(__file__).resolve().parent.parent

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
    index = SelfRetrieval(["a", "b", "c"], ["cats purr softly", "dogs bark loudly", "fish swim quietly"])
    # "dogs bark" finds b; "the" (a stop word) scores nothing: a miss; "purr" finds a, not c
    assert index.first_rate(["dogs bark", "the", "purr"], ["b", "a", "c"]) == pytest.approx(1 / 3)
    text = "First claim here. Second claim there! Third?"
    assert random_sentence(text, random.Random(0)) in {"First claim here.", "Second claim there!", "Third?"}


def test_training_lowers_the_loss_on_its_pairs():
    import torch

    from qac.querygen.train_generator import TrainSettings, build_bert2bert, encode_pairs, train_generator

    torch.set_num_threads(1)
    model, tokenizer = build_bert2bert("tiny:minilm", seed=0)
    pairs = [Pair(text, title, "title", "x", d) for d, (title, text) in DOCS.items() if title]
    settings = TrainSettings(max_source_len=24, max_target_len=6, epochs=12, batch_size=5, lr=5e-3, warmup_ratio=0.0)

    def loss():
        with torch.no_grad():
            return float(model.eval()(**encode_pairs(tokenizer, pairs, settings)).loss)

    before = loss()
    train_generator(model, tokenizer, pairs, settings, "cpu")
    assert loss() < 0.8 * before   # 10.4 -> 6.7 when measured


def test_stage_saves_a_seq2seq_folder_and_logs_quality(tmp_path, monkeypatch, mlflow_store):
    import mlflow
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderModel

    import qac.querygen.train_generator as train_module
    from qac.config import render_profile
    from qac.querygen.generate import QueryGenerator, SamplingSettings

    torch.set_num_threads(1)
    params = render_profile("smoke")
    params.update(data_dir=str(tmp_path / "data"), train_dataset="tinyset", pretrain_corpus="tinyset")
    params["query_generator"].update(model="tiny:minilm", max_source_len=24, max_target_len=6, batch_size=2,
                                     heldout_fraction=0.5, max_heldout=3, log_every=1)
    write_dataset(tmp_path / "data" / "smoke" / "datasets")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))

    trained_on = []
    original = train_module.encode_pairs
    monkeypatch.setattr(train_module, "encode_pairs",
                        lambda tok, pairs, s: trained_on.extend(pairs) or original(tok, pairs, s))
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_stage", REPO / "pipelines" / "train_query_generator.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    assert stage.main() == 0

    assert trained_on and not any(p.target.lower() in {QUERIES[q].lower() for q, _, _ in TEST_QRELS}
                                  for p in trained_on)
    folder = tmp_path / "data" / "smoke" / "generator"
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert isinstance(model, EncoderDecoderModel)
    assert (model.config.decoder_start_token_id, model.config.eos_token_id, model.config.pad_token_id) == (101, 102, 0)
    assert model.generation_config.decoder_start_token_id == 101
    queries, _ = QueryGenerator(model, tokenizer, SamplingSettings(queries_per_passage=2, max_new_tokens=4)
                                ).generate([("d1#0", DOCS["d1"][1])], 1)
    assert len(queries) == 1

    metrics = json.loads((tmp_path / "data" / "smoke" / "metrics" / "query_generator.json").read_text())
    record = json.loads((folder / "mlflow_run.json").read_text())
    assert record["run_id"] == metrics["mlflow_run_id"]
    mlflow.set_tracking_uri(mlflow_store)
    run = mlflow.get_run(record["run_id"])
    assert run.info.run_name == "query_generator" and run.data.tags["qac.kind"] == "query_generator"
    for key in ("rougeL", "self_retrieval/generated", "self_retrieval/random_sentence", "self_retrieval/reference",
                "pairs/train", "pairs/heldout", "train/loss"):
        assert key in run.data.metrics, key
    assert run.data.metrics["pairs/heldout"] == 3   # min(max_heldout 3, 0.5 * 8 pairs)
    assert 0.0 <= run.data.metrics["rougeL"] <= 1.0
