"""Stage bm25 end to end on two tiny prepared datasets, with a real SQLite MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qac.data.textfile import iter_jsonl
from stages import load_stage

METRICS = ["RR@10", "nDCG@10", "R@2"]


def write_dataset(root: Path, name: str, corpus: dict, queries: dict, qrels: dict, titles: dict | None = None,
                  **info) -> None:
    folder = root / "data" / "test" / "datasets" / name
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as handle:
        for doc_id, text in corpus.items():
            title = (titles or {}).get(doc_id, "")
            handle.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    with open(folder / "queries.jsonl", "w") as handle:
        for qid, text in queries.items():
            handle.write(json.dumps({"_id": qid, "text": text}) + "\n")
    for split, rows in qrels.items():
        lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q, d, r in rows]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    (folder / "dataset.json").write_text(json.dumps({"name": name, "splits": list(qrels), **info}))


@pytest.fixture()
def project(tmp_path, monkeypatch, mlflow_store):
    write_dataset(
        tmp_path, "tinytrain",
        corpus={"d1": "apple orchard harvest", "d2": "apple pie recipe", "d3": "banana bread recipe",
                "d4": "orchard tractor", "d5": "stock market"},
        queries={"t1": "apple orchard", "s1": "banana recipe", "s2": "tractor"},
        qrels={"train": [("t1", "d1", 1)], "test": [("s1", "d3", 1), ("s2", "d5", 1)]},
        rel_threshold={"train": 1, "test": 1}, ignore_identical_ids=False,
    )
    write_dataset(
        tmp_path, "tinyzs",
        corpus={"z1": "red car", "z2": "red car fast", "z3": "blue boat"},
        queries={"z1": "red car", "zq": "car"},
        qrels={"test": [("z1", "z2", 2), ("zq", "z1", 1)]},
        rel_threshold={"test": 2}, ignore_identical_ids=True,
    )
    params = {"profile": "test", "data_dir": "data", "mlflow": {"experiment": None, "system_metrics": False},
              "train_dataset": "tinytrain", "zero_shot": ["tinyzs"],
              "finetune": {"bm25_depth": 3}, "evaluate": {"depth": 10, "metrics": METRICS}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))
    return tmp_path


def run_stage():
    load_stage("bm25").main()


def test_stage_writes_negatives_runs_and_logs_the_baseline(project):
    import mlflow

    run_stage()
    out = project / "data" / "test" / "bm25"
    # t1 "apple orchard": d1 matches both words; d4 (shorter) beats d2 on one word each.
    assert list(iter_jsonl(out / "negatives.jsonl")) == [{"qid": "t1", "positives": ["d1"], "negatives": ["d4", "d2"]}]
    assert sorted(p.relative_to(out).as_posix() for p in (out / "runs").rglob("*.trec")) == [
        "runs/tinytrain/test.trec", "runs/tinyzs/test.trec"]
    assert "z1 Q0 z1 1" in (out / "runs" / "tinyzs" / "test.trec").read_text()  # kept in the run file

    assert not (out / "mlflow_run.json").exists()   # bookkeeping stays out of the DVC output
    record = json.loads((out.parent / ".runs" / "bm25" / "mlflow_run.json").read_text())
    run = mlflow.get_run(record["run_id"])
    assert run.info.run_name == "bm25 · baseline" and run.data.tags["qac.stage"] == "bm25"
    assert (run.data.params["method"], run.data.params["retriever"]) == ("bm25", "bm25")
    assert run.data.tags["qac.kind"] == "baseline" and run.data.tags["qac.retriever"] == "bm25"
    metrics = run.data.metrics
    # tinytrain: s1 finds d3 first, s2 never finds d5.
    assert metrics["tinytrain/test/RR_at_10"] == pytest.approx(0.5)
    # tinyzs: z1's own document is ignored so z2 is first; zq's only judgement (grade 1) is below
    # the threshold 2, so it scores 0 on RR but not on nDCG, which uses graded gains.
    assert metrics["tinyzs/test/RR_at_10"] == pytest.approx(0.5)
    per_query = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/per_query/tinyzs/test.json")
    assert per_query["RR@10"] == {"z1": 1.0, "zq": 0.0}
    assert per_query["nDCG@10"]["zq"] == pytest.approx(1.0)
    assert json.loads((out / "metrics.json").read_text())["tinyzs"]["test"]["RR@10"] == pytest.approx(0.5)
    assert json.loads((out / "runs" / "tinyzs" / "test.per_query.json").read_text()) == per_query


@pytest.mark.parametrize("in_domain_title", [True, False])
def test_in_domain_titles_are_indexed_only_when_asked_and_zero_shot_titles_always(project, in_domain_title):
    """bm25.in_domain_title false reads train_dataset as Anserini's title-less MS MARCO collection."""
    write_dataset(project, "titled",
                  corpus={"d1": "apple orchard harvest", "d2": "apple pie recipe", "d3": "banana bread"},
                  titles={"d3": "tractor manual"}, queries={"t1": "apple orchard", "s1": "tractor"},
                  qrels={"train": [("t1", "d1", 1)], "test": [("s1", "d3", 1)]},
                  rel_threshold={"train": 1, "test": 1}, ignore_identical_ids=False)
    write_dataset(project, "titledzs", corpus={"z1": "red car", "z2": "blue boat"}, titles={"z2": "tractor"},
                  queries={"zq": "tractor"}, qrels={"test": [("zq", "z2", 1)]}, rel_threshold={"test": 1},
                  ignore_identical_ids=False)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(train_dataset="titled", zero_shot=["titledzs"],
                  bm25={"k1": 0.82, "b": 0.68, "in_domain_title": in_domain_title, "tokenizer": "lucene",
                        "stopwords": "lucene", "stemmer": "porter"})
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    run_stage()
    runs = project / "data" / "test" / "bm25" / "runs"
    assert ("s1 Q0 d3 1" in (runs / "titled" / "test.trec").read_text()) == in_domain_title
    assert "zq Q0 z2 1" in (runs / "titledzs" / "test.trec").read_text()


@pytest.mark.parametrize("r1_queries", ["judged", "triples"])
def test_triples_queries_are_those_whose_positive_bm25_finds(project, r1_queries):
    """finetune.r1_queries: triples with our BM25: as the official triples, a training query whose positive
    is not in BM25's top bm25_depth gets no negatives record (retriever 1 then leaves it out)."""
    write_dataset(project, "twotrain",
                  corpus={"d1": "apple orchard harvest", "d2": "apple pie recipe", "d3": "banana bread recipe",
                          "d4": "orchard tractor", "d5": "stock market"},
                  queries={"t1": "apple orchard", "t2": "market", "s1": "banana"},
                  qrels={"train": [("t1", "d1", 1), ("t2", "d3", 1)], "test": [("s1", "d3", 1)]},
                  rel_threshold={"train": 1, "test": 1}, ignore_identical_ids=False)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(train_dataset="twotrain", finetune={"bm25_depth": 3, "r1_queries": r1_queries})
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    run_stage()
    records = list(iter_jsonl(project / "data" / "test" / "bm25" / "negatives.jsonl"))
    # t2 "market" finds only d5, never its positive d3.
    assert [record["qid"] for record in records] == (["t1"] if r1_queries == "triples" else ["t1", "t2"])


def test_failed_stage_leaves_no_output(project):
    (project / "data" / "test" / "datasets" / "tinyzs" / "dataset.json").unlink()
    with pytest.raises(Exception, match="dataset.json"):
        run_stage()
    assert not (project / "data" / "test" / "bm25").exists()


def test_the_paper_profiles_bm25_and_triples_queries_run_on_the_smoke_profiles_data(tmp_path, monkeypatch,
                                                                                   mlflow_store, shared_data):
    """The smoke profile's prepare and bm25 stages on its SciFact and Cranfield subsets, with the paper
    profile's BM25 (Anserini's k1 and b, title-less, the Lucene analyzer) and retriever 1 on the triples'
    rule: only the training queries whose positive BM25 finds within bm25_depth get negatives."""
    from qac.config import render_profile, write_params

    smoke = render_profile("smoke")
    paper = render_profile("paper")
    counts = {}
    for name, (bm25, r1_queries) in {"smoke": (smoke["bm25"], "judged"),
                                     "paper": (paper["bm25"], "triples")}.items():
        root = tmp_path / name
        root.mkdir()
        params = {**smoke, "data_dir": str(root / "data"), "bm25": bm25,
                  "finetune": {**smoke["finetune"], "r1_queries": r1_queries}}
        write_params(params, root / "params.yaml")
        monkeypatch.chdir(root)
        monkeypatch.setenv("QAC_PARAMS", str(root / "params.yaml"))
        monkeypatch.setenv("QAC_DATA_MIRROR", str(shared_data))
        for dataset in params["datasets"]:
            load_stage("prepare").main(["--dataset", dataset])
        run_stage()
        out = root / "data" / "smoke" / "bm25"
        records = list(iter_jsonl(out / "negatives.jsonl"))
        assert all(record["negatives"] for record in records)
        counts[name] = {record["qid"] for record in records}
        metrics = json.loads((out / "metrics.json").read_text())
        assert 0 < metrics["scifact"]["test"]["nDCG@10"] < 1 and 0 < metrics["cranfield"]["test"]["nDCG@10"] < 1
    # The triples' rule keeps a proper subset: the queries whose positive BM25 finds.
    assert counts["paper"] < counts["smoke"] and len(counts["paper"]) > len(counts["smoke"]) // 2
