"""A real study: 4 trials, 2 workers, tiny models pre-trained and fine-tuned for a few steps each.

The inputs of the trial job (a prepared dataset, passages, their queries, BM25
negatives) are built here from 100 SciFact abstracts of the data mirror. The
task is known-item search: the query is an abstract's title, the abstract's
body its only relevant document. A random tiny encoder already finds many of
them (query and document share words), and fine-tuning with a learning rate
of 0.5 wrecks that, which gives the pruner a trial that is clearly worse
whatever the noise of tiny models. The pre-training "queries" of a passage
are stand-ins (8-word windows of the passage) in the format the
generate_queries stage writes, since no query generator runs here.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from qac.config import render_profile, write_params
from qac.io import write_jsonl

REPO = Path(__file__).resolve().parent.parent
N_QUERIES, N_OTHER_DOCS, PASSAGE_WORDS = 40, 60, 40


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def build_trial_inputs(shared_data: Path, root: Path) -> None:
    """data/smoke/{datasets/scifact, passages.arrow, queries.arrow, bm25/negatives.jsonl} under ``root``."""
    from qac.data.arrowstore import write_passages, write_queries
    from qac.data.beir import read_corpus_jsonl
    from qac.data.dataset import Dataset, Document
    from qac.data.prepared import write_prepared

    source = read_corpus_jsonl(shared_data / "scifact" / "corpus.jsonl")
    titled = [doc for doc in source.values() if doc.title and doc.text][:N_QUERIES + N_OTHER_DOCS]
    corpus = {doc.doc_id: Document(doc.doc_id, "", doc.text) for doc in titled}
    queries = {f"q{doc.doc_id}": doc.title for doc in titled[:N_QUERIES]}
    qrels = {f"q{doc.doc_id}": {doc.doc_id: 1} for doc in titled[:N_QUERIES]}
    dataset = Dataset("scifact", corpus, queries, {"train": qrels}, meta={"rel_threshold": {"train": 1}})
    write_prepared(dataset, root / "datasets" / "scifact")

    passages, pretrain_queries = [], []
    for doc_id, doc in corpus.items():
        words = doc.full_text.split()
        spans = [" ".join(words[i:i + PASSAGE_WORDS]) for i in range(0, len(words), PASSAGE_WORDS)]
        pids = [f"{doc_id}#{k}" for k in range(len(spans))]
        for k, text in enumerate(spans):
            neighbours = [pids[j] for j in (k - 1, k + 1) if 0 <= j < len(spans)]
            passages.append({"pid": pids[k], "doc_id": doc_id, "position": k, "text": text,
                             "n_tokens": len(text.split()),
                             "contexts": {"nearby": neighbours, "random_sampled": [p for p in pids if p != pids[k]],
                                          "overlap": ""}})
            span_words = text.split()
            pretrain_queries.append({"pid": pids[k], "queries": [" ".join(span_words[i:i + 8])
                                                                 for i in range(0, 32, 8) if span_words[i:i + 8]]})
    from qac.models.loading import load_tokenizer

    tokenizer = load_tokenizer("minilm")      # the smoke profile's split.tokenizer
    write_passages(root / "passages.arrow", passages, tokenizer=tokenizer, tokenizer_name="minilm")
    write_queries(root / "queries.arrow", pretrain_queries, tokenizer=tokenizer, tokenizer_name="minilm")

    # Negatives: the documents sharing the most words with the query, positives removed.
    doc_words = {doc_id: set(_words(doc.full_text)) for doc_id, doc in corpus.items()}
    records = []
    for qid, text in queries.items():
        query_words = set(_words(text))
        ranked = sorted(corpus, key=lambda doc_id: (-len(query_words & doc_words[doc_id]), doc_id))
        positives = sorted(qrels[qid])
        records.append({"qid": qid, "positives": positives,
                        "negatives": [doc for doc in ranked if doc not in positives][:10]})
    write_jsonl(root / "bm25" / "negatives.jsonl", records)


def smoke_params(tmp_path: Path) -> dict:
    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["mlflow"]["system_metrics"] = False
    params["finetune"].update({"batch_size": 8, "train_n_passages": 2, "max_train_queries": None})
    params["evaluate"]["metrics"] = ["RR@10", "nDCG@10"]
    params["tables"]["in_domain_columns"] = [{"label": "RR@10", "dataset": None, "split": "test", "measure": "RR@10",
                                              "paper": "mrr@10"}]
    params["hpo"].update({
        "study_name": "smoke-test", "n_trials": 4, "dev": {**params["hpo"]["dev"], "queries": 8}, "pretrain_steps": 3,
        "finetune_epochs": 1, "eval_every": 2, "report_dir": str(tmp_path / "reports"),
        "space": {"pretrain.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
                  "finetune.lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True}},
    })
    return params


@pytest.fixture()
def trial_inputs(shared_data, tmp_path) -> dict:
    params = smoke_params(tmp_path)
    build_trial_inputs(shared_data, tmp_path / "data" / "smoke")
    return params


def _job_env() -> dict:
    # One thread per job: two jobs share two cores, and equal settings give equal numbers.
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _run_job(params: dict, out: Path) -> tuple[list[dict], subprocess.CompletedProcess]:
    from qac.hpo.trial_job import parse_event

    out.mkdir(parents=True, exist_ok=True)
    write_params(params, out / "params.yaml")
    done = subprocess.run([sys.executable, "-m", "qac.cli.hpo_trial_command", "--params", str(out / "params.yaml"),
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=170,
                          env=_job_env())
    events = [parse_event(line) for line in done.stdout.splitlines()]
    return [event for event in events if event], done


@pytest.mark.slow
def test_a_trial_job_reports_dev_metrics_while_fine_tuning(trial_inputs, tmp_path):
    from qac.hpo.space import apply_values

    # as a trial writes its value: into the variant and its seed copies
    from qac.params import validate_params, with_values

    inputs = validate_params(trial_inputs)
    params = with_values(apply_values(inputs, {"pretrain.lr": 1e-3}, inputs.hpo.variant), {"hpo.finetune_epochs": 2})
    events, done = _run_job(params, tmp_path / "trial")
    assert done.returncode == 0, done.stderr[-3000:]
    # 40 queries - 8 dev = 32 training queries, batch 8: 4 steps per epoch, 2 epochs; evaluated every 2 steps.
    assert [(e["kind"], e.get("step")) for e in events] == [("intermediate", 2), ("intermediate", 4),
                                                           ("intermediate", 6), ("intermediate", 8),
                                                           ("result", None)]
    result = events[-1]
    assert result["value"] == events[-2]["value"] == result["metrics"]["nDCG@10"]
    assert set(result["metrics"]) == {"nDCG@10", "RR@10"}
    assert result["finetune_steps"] == 8 and result["dev_queries"] == 8
    dev = json.loads((tmp_path / "trial" / "dev_queries.json").read_text())
    assert len(dev) == 8 and len(set(dev)) == 8
    # Known-item search: the dev metric is the rank of each title's abstract; 1/8 per query found first.
    assert 0.0 <= result["metrics"]["RR@10"] <= 1.0


GOOD = {"pretrain.lr": 1e-3, "finetune.lr": 2e-5}
BAD = {"pretrain.lr": 1e-3, "finetune.lr": 0.5}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_four_trial_two_worker_study_prunes_the_clearly_worse_trial(trial_inputs, tmp_path, mlflow_store):
    from optuna.storages.journal import JournalFileBackend

    params = trial_inputs
    params_path = tmp_path / "params.yaml"
    write_params(params, params_path)
    journal = tmp_path / "data" / "smoke" / "hpo" / "smoke-test" / "journal.log"
    journal.parent.mkdir(parents=True)
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    # Trials 0 and 1 run side by side; the first worker free takes trial 2, so when trial 2
    # reports, at least one good trial is complete and the median pruner compares against it.
    study = optuna.create_study(study_name="smoke-test", storage=storage, direction="maximize")
    for values in (GOOD, GOOD, BAD, GOOD):
        study.enqueue_trial(values)

    driver = subprocess.run([sys.executable, "-m", "qac.cli", "hpo", "--params", str(params_path), "--workers", "2"],
                            cwd=tmp_path, env=_job_env(), capture_output=True, text=True, timeout=230)
    assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:]
    # The command's own lines only: no Optuna "[I ...] Trial 0 finished", MLflow INFO (system metrics) or warnings.
    output = driver.stdout + driver.stderr
    for noise in ("[I ", "INFO mlflow", "Warning:", "warnings.warn"):
        assert noise not in output, output[-3000:]

    trials = optuna.load_study(study_name="smoke-test", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED,
                                         TrialState.COMPLETE]
    good = [trials[0], trials[1], trials[3]]
    assert {t.value for t in good} == {good[0].value}, "equal settings, equal results"
    assert all(sorted(t.intermediate_values) == [2, 4] for t in good)
    # The pruned job was stopped at its first report: it never reached step 4.
    assert list(trials[2].intermediate_values) == [2]
    assert trials[2].intermediate_values[2] < good[0].intermediate_values[2]
    assert "finetune step 4" not in (journal.parent / "trials" / "0002" / "job.log").read_text()
    assert not any((journal.parent / "trials").glob("*/work")), "trial models are removed"

    report = tmp_path / "reports" / "smoke-test"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["states"]["complete"] == 3 and summary["states"]["pruned"] == 1
    assert summary["best"]["number"] in (0, 1, 3) and summary["best"]["value"] == good[0].value
    assert summary["figures"]["optimization_history"] == "written"
    assert summary["figures"]["intermediate_values"] == "written"
    assert summary["figures"]["param_importances"] == ("needs 3 complete trials whose parameters vary and whose "
                                                       "values differ; has 3 complete, parameters all equal, "
                                                       "values all tie")
    # The three equal trials tie: the report names the others beside the one Optuna keeps.
    assert sorted([summary["best"]["number"], *summary["best"]["tied_with"]]) == [t.number for t in good]
    assert (report / "optimization_history.png").stat().st_size > 0
    assert not (report / "param_importances.png").exists()

    import mlflow

    client = mlflow.MlflowClient(mlflow_store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parent = next(run for run in runs if run.info.run_name == "hpo/smoke-test")
    children = {int(run.data.tags["qac.trial"]): run for run in runs
                if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert {n: run.data.tags["qac.trial_state"] for n, run in children.items()} == {
        0: "complete", 1: "complete", 2: "pruned", 3: "complete"}
    assert children[2].data.params["finetune.lr"] == "0.5"
    assert [m.step for m in client.get_metric_history(children[2].info.run_id, "dev/nDCG_at_10")] == [2]
    assert children[0].data.metrics["objective"] == pytest.approx(good[0].value)
    assert parent.data.metrics["trials/pruned"] == 1
