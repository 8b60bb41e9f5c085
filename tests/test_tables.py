"""Tables 1-5 from a synthetic study logged to a real MLflow store: every expected cell is set here."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from qac.tracking import metric_key

PROFILE = "smoke"
SEED = 3
PARAMS = {
    "profile": PROFILE,
    "seed": SEED,
    "train_dataset": "scifact",
    "pretrain_corpus": "scifact",
    "zero_shot": ["nfcorpus", "cranfield"],
    "datasets": {"scifact": {"format": "beir", "splits": ["train", "test"]},
                 "nfcorpus": {"format": "beir", "splits": ["test"]},
                 "cranfield": {"format": "beir", "splits": ["test"]}},
    "pretrain": {"common": {"init": "tiny:minilm", "steps": 6, "batch_size": 8, "cotmae_decoder": "paper"}},
    "tables": {
        "permutations": 4000,
        "in_domain_columns": [
            {"label": "SciFact test RR@10", "dataset": "scifact", "split": "test", "measure": "RR@10", "paper": "mrr@10"},
            {"label": "SciFact test R@50 (hit rate)", "dataset": "scifact", "split": "test", "measure": "Hit@50",
             "paper": "r@50"},
            {"label": "TREC DL20 nDCG@10", "missing": "TREC DL 2020: not in the smoke profile", "paper": "ndcg@10_dl20"},
        ],
    },
}
RR = "SciFact test RR@10 [paper: MS MARCO dev MRR@10]"
HIT50 = "SciFact test R@50 (hit rate) [paper: MS MARCO dev R@50 (hit rate)]"
DL20 = "TREC DL20 nDCG@10 [paper: TREC DL20 nDCG@10]"

# variant -> (method, context, C); the none variant has no pre-training run tags beyond its name.
VARIANTS = {
    "none": ("none", None, None),
    "cocondenser-passage": ("cocondenser", "passage", 4),
    "cocondenser-query-q1": ("cocondenser", "query", 1),
    "cocondenser-query-q4": ("cocondenser", "query", 4),
    "cocondenser-mixed": ("cocondenser", "mixed", 4),
    "cotmae-passage": ("cotmae", "passage", 4),
    "cotmae-query-q4": ("cotmae", "query", 4),
}
# (variant, retriever) -> (RR@10 per query of q1..q4, Hit@50 per query); means are what the tables show.
IN_DOMAIN = {
    ("none", "r1"): ([0.1, 0.1, 0.1, 0.1], [0.5, 0.5, 0.5, 0.5]),
    ("none", "r2"): ([0.2, 0.2, 0.2, 0.2], [0.5, 0.5, 0.5, 0.5]),
    ("cocondenser-passage", "r1"): ([0.2, 0.3, 0.4, 0.3], [1, 0, 1, 0]),
    ("cocondenser-query-q1", "r1"): ([0.3, 0.3, 0.3, 0.3], [1, 1, 0, 0]),
    # +0.1 on every query: the exact two-sided sign-flip p-value is 2 / 2**4 = 0.125.
    ("cocondenser-query-q4", "r1"): ([0.3, 0.4, 0.5, 0.4], [1, 1, 1, 0]),
    ("cocondenser-mixed", "r1"): ([0.25, 0.35, 0.45, 0.35], [1, 1, 1, 1]),
    ("cocondenser-passage", "r2"): ([0.5, 0.5, 0.5, 0.5], [1, 1, 1, 1]),
    ("cocondenser-query-q4", "r2"): ([0.6, 0.4, 0.6, 0.4], [1, 1, 1, 1]),
    ("cocondenser-mixed", "r2"): ([0.5, 0.5, 0.5, 0.5], [1, 1, 1, 1]),
    ("cotmae-passage", "r1"): ([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]),
    ("cotmae-query-q4", "r1"): ([0.2, 0.2, 0.3, 0.3], [0, 1, 1, 1]),
    ("cotmae-passage", "r2"): ([0.4, 0.4, 0.4, 0.4], [1, 1, 1, 1]),
    # ("cotmae-query-q4", "r2") is deliberately missing: its cells must say so.
}
# zero-shot nDCG@10 per query (3 queries) for retriever 1
ZERO_SHOT = {
    "cocondenser-passage": {"nfcorpus": [0.3, 0.3, 0.3], "cranfield": [0.2, 0.1, 0.3]},
    "cocondenser-query-q4": {"nfcorpus": [0.4, 0.5, 0.6], "cranfield": [0.2, 0.2, 0.2]},
    "cotmae-passage": {"nfcorpus": [0.1, 0.1, 0.1], "cranfield": [0.1, 0.1, 0.1]},
    "cotmae-query-q4": {"nfcorpus": [0.2, 0.2, 0.2], "cranfield": [0.3, 0.3, 0.3]},
}
BM25 = ([0.25, 0.25, 0.25, 0.25], [1, 1, 0, 0])


def mean(values):
    return sum(values) / len(values)


class StudyLogger:
    """Logs runs shaped like the pipeline's: tags, metrics, per-query artifacts, a tree of parents."""

    def __init__(self, client, experiment_id: str):
        self.client = client
        self.experiment_id = experiment_id
        self.ids: dict[str, str] = {}
        self.clock = 1_700_000_000_000   # runs start one second apart, in the order they are logged

    def run(self, name: str, tags: dict, metrics: dict | None = None, per_query: dict | None = None,
            parent: str | None = None, history: dict | None = None, profile: str = PROFILE) -> str:
        from mlflow.entities import Metric

        all_tags = {"qac.profile": profile, "qac.git_commit": "0123456789abcdef", "qac.git_dirty": "false", **tags}
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        self.clock += 1000
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags, start_time=self.clock)
        run_id = run.info.run_id
        points = [Metric(key, float(value), 0, 0) for key, value in (metrics or {}).items()]
        for key, values in (history or {}).items():
            points += [Metric(key, float(value), 0, step) for step, value in enumerate(values)]
        if points:
            self.client.log_batch(run_id, metrics=points)
        for (dataset, split), measures in (per_query or {}).items():
            self.client.log_text(run_id, json.dumps(measures), f"per_query/{dataset}/{split}.json")
        self.client.set_terminated(run_id)
        self.ids[name] = run_id
        return run_id


def evaluation(dataset_values: dict) -> tuple[dict, dict]:
    """Metrics and per-query artifacts for ``{(dataset, split, measure): [per-query values]}``."""
    metrics, per_query = {}, {}
    for (dataset, split, measure), values in dataset_values.items():
        metrics[metric_key(dataset, split, measure)] = mean(values)
        per_query.setdefault((dataset, split), {})[measure] = {f"q{i + 1}": v for i, v in enumerate(values)}
    return metrics, per_query


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A smoke-profile study in a fresh SQLite store; yields (tracking URI, run ids by name)."""
    import mlflow

    root = tmp_path_factory.mktemp("study")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        mlflow.set_tracking_uri(uri)
        experiment_id = mlflow.create_experiment(f"qac-{PROFILE}", artifact_location=(root / "artifacts").as_uri())
        client = mlflow.MlflowClient(uri)
        log = StudyLogger(client, experiment_id)
        study_id = log.run(f"study/{PROFILE}", {"qac.role": "study"})
        metrics, per_query = evaluation({("scifact", "test", "RR@10"): BM25[0], ("scifact", "test", "Hit@50"): BM25[1]})
        log.run("baseline/bm25", {"qac.kind": "baseline", "qac.retriever": "bm25"}, metrics, per_query, study_id)
        metrics, per_query = evaluation({("scifact", "test", "RR@10"): [0.05] * 4})
        log.run("eval/untuned/none", {"qac.kind": "eval", "qac.retriever": "untuned"}, metrics, per_query, study_id)
        for variant, (method, context, count) in VARIANTS.items():
            name = "pretrain/none" if method == "none" else f"pretrain/{method}/{context}/q{count}"
            tags = {"qac.kind": "pretrain", "qac.variant": variant, "qac.method": method}
            if method != "none":
                tags.update({"qac.context_type": context, "qac.query_count": str(count)})
            history = {"loss/total": [5.0, 4.0, 3.5]} if method != "none" else None
            pretrain_id = log.run(name, tags, parent=study_id, history=history)
            for retriever in ("r1", "r2"):
                if (variant, retriever) not in IN_DOMAIN:
                    continue
                rr, hit = IN_DOMAIN[(variant, retriever)]
                values = {("scifact", "test", "RR@10"): rr, ("scifact", "test", "Hit@50"): hit}
                if retriever == "r1" and variant in ZERO_SHOT:
                    for dataset, ndcg in ZERO_SHOT[variant].items():
                        values[(dataset, "test", "nDCG@10")] = ndcg
                metrics, per_query = evaluation(values)
                if variant == "cocondenser-passage" and retriever == "r1":
                    # An earlier, superseded run of the same stage: the tables must use the later one.
                    stale, _ = evaluation({("scifact", "test", "RR@10"): [0.9] * 4})
                    log.run(f"finetune/r1/{variant}#stale", {"qac.kind": "finetune", "qac.retriever": "r1",
                                                            "qac.variant": variant}, stale, None, pretrain_id)
                log.run(f"finetune/{retriever}/{variant}", {"qac.kind": "finetune", "qac.retriever": retriever,
                                                           "qac.variant": variant}, metrics, per_query, pretrain_id)
        # A run of another profile in the same experiment is ignored.
        other, _ = evaluation({("scifact", "test", "RR@10"): [1.0] * 4})
        log.run("baseline/bm25#other-profile", {"qac.kind": "baseline", "qac.retriever": "bm25"}, other,
                profile="default")
        labels = "item,doc_id,kind,pid,context_id,score,judge_label,human_label,votes,label,label_source\n" + "".join(
            f"A{i}{k},d{i},{kind},d{i}#0,x,0.5,{lab},,,{lab},judge\n"
            for i, pair in enumerate([("high", "high"), ("low", "high"), ("low", "high"), ("low", "low")])
            for k, (kind, lab) in enumerate(zip(("passage-passage", "passage-query"), pair)))
        annotation_id = log.run("annotation/table5", {"qac.kind": "annotation",
                                                      "qac.annotation.labels": "automatic judge: test labels"},
                                {"high_correlation/passage-passage": 0.25, "high_correlation/passage-query": 0.75,
                                 "pairs/passage-passage": 4, "pairs/passage-query": 4}, None, study_id)
        client.log_text(annotation_id, labels, "labels.csv")
        yield uri, log.ids


@pytest.fixture(scope="module")
def tables(study):
    from qac.reporting.report import load_study
    from qac.reporting.tables import build_tables

    uri, _ = study
    return {table.key: table for table in build_tables(load_study(PARAMS, uri), PARAMS)}


def test_table1_cells_hold_our_value_the_papers_and_the_run(study, tables):
    _, ids = study
    table = tables["table1"]
    cell = table.cell("coCondenser+QaC (C=4), retriever 1", RR)
    assert cell.value == pytest.approx(40.0)           # mean RR@10 0.40, in percent
    assert cell.paper == 37.4                          # paper: coCondenser+QaC 120k retriever1, MRR@10
    assert cell.run_id == ids["finetune/r1/cocondenser-query-q4"]
    assert table.paper_rows["coCondenser+QaC (C=4), retriever 1"] == "coCondenser+QaC 120k retriever1"
    bm25 = table.cell("BM25", HIT50)
    assert (bm25.value, bm25.paper, bm25.run_id) == (pytest.approx(50.0), 59.2, ids["baseline/bm25"])
    assert table.cell("start encoder, not fine-tuned", RR).value == pytest.approx(5.0)
    assert table.cell("no pre-training, retriever 2", RR).value == pytest.approx(20.0)


def test_table1_uses_the_latest_rerun_and_the_largest_query_count(study, tables):
    _, ids = study
    passage = tables["table1"].cell("coCondenser passage context, retriever 1", RR)
    assert passage.value == pytest.approx(30.0) and passage.run_id == ids["finetune/r1/cocondenser-passage"]
    assert not any(row.startswith("coCondenser+QaC (C=1)") for row in tables["table1"].rows)


def test_table1_difference_has_the_randomization_p_value(study, tables):
    _, ids = study
    cell = tables["table1"].cell("Δ coCondenser query − passage context, retriever 1", RR)
    assert cell.difference
    assert cell.value == pytest.approx(10.0)
    assert cell.paper == pytest.approx(37.4 - 37.0)
    assert cell.run_id == ids["finetune/r1/cocondenser-query-q4"]
    assert cell.compared_run_id == ids["finetune/r1/cocondenser-passage"]
    assert cell.n_queries == 4
    # Every query gains 0.1: only 2 of the 16 sign assignments reach |mean| 0.1, exact p = 0.125.
    assert cell.p_value == pytest.approx(0.125, abs=0.02)
    r2 = tables["table1"].cell("Δ coCondenser query − passage context, retriever 2", RR)
    # Differences +0.1, -0.1, +0.1, -0.1 average 0: every assignment reaches it, p = 1.
    assert r2.value == pytest.approx(0.0, abs=1e-9) and r2.p_value == pytest.approx(1.0)


def test_cells_that_cannot_be_produced_say_why(tables):
    table = tables["table1"]
    missing_column = table.cell("BM25", DL20)
    assert missing_column.value is None and missing_column.note == "TREC DL 2020: not in the smoke profile"
    assert missing_column.paper == 47.7
    missing_run = table.cell("CoT-MAE+QaC (C=4), retriever 2", RR)
    assert missing_run.value is None and "no run" in missing_run.note
    diff = table.cell("Δ CoT-MAE query − passage context, retriever 2", RR)
    assert diff.value is None and "missing" in diff.note


def test_other_profiles_runs_are_ignored(tables):
    assert tables["table1"].cell("BM25", RR).value == pytest.approx(25.0)


def test_table2_zero_shot_without_and_with_query_context(study, tables):
    _, ids = study
    table = tables["table2"]
    with_query = table.cell("nfcorpus", "coCondenser w/ (query)")
    assert with_query.value == pytest.approx(0.5) and with_query.paper == 0.330
    assert with_query.run_id == ids["finetune/r1/cocondenser-query-q4"]
    assert table.cell("cranfield", "CoT-MAE w/o (passage)").paper is None
    assert "not in the paper" in table.cell("cranfield", "CoT-MAE w/o (passage)").note
    diff = table.cell("nfcorpus", "coCondenser Δ")
    assert diff.value == pytest.approx(0.2) and diff.p_value is not None
    assert diff.paper == pytest.approx(0.330 - 0.333)
    average = table.cell("average", "CoT-MAE w/ (query)")
    assert average.value == pytest.approx((0.2 + 0.3) / 2) and average.paper == 0.456


def test_table3_query_counts(study, tables):
    _, ids = study
    table = tables["table3"]
    assert [row for row in table.rows] == ["coCondenser C=1", "coCondenser C=4", "CoT-MAE C=4"]
    c1 = table.cell("coCondenser C=1", RR)
    assert c1.value == pytest.approx(30.0) and c1.paper == 37.7
    assert c1.run_id == ids["finetune/r1/cocondenser-query-q1"]
    assert table.cell("coCondenser C=4", HIT50).value == pytest.approx(75.0)
    assert table.cell("coCondenser C=4", HIT50).paper is None          # the paper has C = 1, 5, 10, 20
    delta = table.cell("coCondenser C=1", "Δ SciFact test R@50 (hit rate) vs passage context")
    assert delta.value == pytest.approx(0.0) and delta.p_value == pytest.approx(1.0)


def test_table4_mixed_context(study, tables):
    _, ids = study
    table = tables["table4"]
    mixed = table.cell("coCondenser mixed context (C=4)", f"retriever 1 {RR}")
    assert mixed.value == pytest.approx(35.0) and mixed.paper == 37.4
    assert mixed.run_id == ids["finetune/r1/cocondenser-mixed"]
    passage = table.cell("coCondenser passage context", f"retriever 2 {RR}")
    assert passage.paper == 38.8                       # borrowed from the paper's Table 1 reproduction
    diff = table.cell("Δ coCondenser mixed − query context", f"retriever 1 {RR}")
    assert diff.value == pytest.approx(-5.0) and diff.paper == pytest.approx(0.0)
    assert diff.p_value == pytest.approx(0.125, abs=0.02)
    assert not any(row.startswith("CoT-MAE mixed") for row in table.rows)


def test_table5_annotation(study, tables):
    _, ids = study
    table = tables["table5"]
    pp, pq = table.cell("passage-passage", "high correlation %"), table.cell("passage-query", "high correlation %")
    assert (pp.value, pp.paper) == (pytest.approx(25.0), 35.5)
    assert (pq.value, pq.paper) == (pytest.approx(75.0), 56.6)
    assert pp.run_id == ids["annotation/table5"]
    assert table.cell("passage-query", "labels").text == "automatic judge: test labels"
    diff = table.cell("Δ passage-query − passage-passage", "high correlation %")
    # Per document (pq - pp): 0, 1, 1, 0 -> sign flips of the two 1s: |mean| 0.5 reached by 2 of 4, p = 0.5.
    assert diff.value == pytest.approx(50.0) and diff.p_value == pytest.approx(0.5, abs=0.03)


def test_p_values_are_the_evaluation_packages_randomization_test(study, tables):
    from qac.evaluation.significance import randomization_test

    with_query = {f"q{i + 1}": v for i, v in enumerate(ZERO_SHOT["cotmae-query-q4"]["cranfield"])}
    without = {f"q{i + 1}": v for i, v in enumerate(ZERO_SHOT["cotmae-passage"]["cranfield"])}
    cell = tables["table2"].cell("cranfield", "CoT-MAE Δ")
    assert cell.p_value == randomization_test(with_query, without, trials=PARAMS["tables"]["permutations"], seed=SEED)


def test_queries_of_one_system_only_are_left_out_of_the_test():
    from qac.reporting.tables import paired_p_value

    p, n, note = paired_p_value({"a": 1.0, "b": 1.0, "c": 0.0}, {"a": 0.0, "b": 0.0}, permutations=200)
    assert n == 2 and "1 queries" in note
    # Both shared queries gain 1: 2 of the 4 sign assignments reach |mean| 1, p about 0.5.
    assert p == pytest.approx(0.5, abs=0.1)


def test_report_files_are_traceable(study, tmp_path):
    import mlflow

    from qac.reporting.report import write_report

    uri, ids = study
    report = write_report(PARAMS, tmp_path / "reports", uri)
    folder = tmp_path / "reports" / PROFILE
    assert report.directory == folder
    text = (folder / "tables.md").read_text(encoding="utf-8")
    for line in ("**Profile**: smoke (SCALED DOWN", "**Data**", "**Models**", "**Git commits of the runs**: 0123456789ab",
                 "**Tables generated**", "### Table 1", "### Table 5", "TREC DL 2020: not in the smoke profile"):
        assert line in text
    assert "40.0 / 37.4" in text                               # ours / paper
    assert "+10.0 (p=0.1" in text                             # difference with its p-value
    for key in ("table1", "table2", "table3", "table4", "table5"):
        assert (folder / f"{key}.csv").is_file()
        assert "\\begin{tabular}" in (folder / f"{key}.tex").read_text(encoding="utf-8")
    for figure in ("query_count.png", "zero_shot.png", "pretrain_loss.png"):
        assert (folder / "figures" / figure).stat().st_size > 1000
    client = mlflow.MlflowClient(uri)
    rows = list(csv.DictReader(io.StringIO((folder / "table1.csv").read_text(encoding="utf-8"))))
    values = [row for row in rows if row["kind"] == "value" and row["ours"]]
    assert values
    for row in values:   # every number goes back to the run and metric it names
        logged = client.get_run(row["run_id"]).data.metrics[row["metric"]]
        assert float(row["ours"]) == pytest.approx(100 * logged)
    diffs = [row for row in rows if row["kind"] == "difference" and row["p_value"]]
    assert diffs and all(row["compared_run_id"] in ids.values() for row in diffs)


def test_failed_report_leaves_the_previous_one(study, tmp_path, monkeypatch):
    from qac.reporting import render
    from qac.reporting.report import write_report

    uri, _ = study
    write_report(PARAMS, tmp_path, uri)
    before = (tmp_path / PROFILE / "tables.md").read_text(encoding="utf-8")

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(render, "to_latex", broken)
    with pytest.raises(RuntimeError):
        write_report(PARAMS, tmp_path, uri)
    assert (tmp_path / PROFILE / "tables.md").read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [PROFILE]


def test_bad_column_spec_is_named():
    from qac.reporting.tables import columns_from_params

    with pytest.raises(ValueError, match=r"in_domain_columns\[0\]"):
        columns_from_params({"profile": "smoke", "tables": {"in_domain_columns": [{"label": "x"}]}})


def test_qac_tables_command_and_stage_write_the_report(study, tmp_path, monkeypatch, capsys):
    import importlib.util

    import yaml

    from qac.cli import main

    uri, _ = study
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump({**PARAMS, "tables": {**PARAMS["tables"], "out_dir": "out"}}),
                           encoding="utf-8")
    assert main(["tables", "--params", str(params_path), "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    assert (tmp_path / "cli" / PROFILE / "table3.csv").is_file()
    assert "wrote" in capsys.readouterr().out

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QAC_PARAMS", str(params_path))
    path = Path(__file__).resolve().parent.parent / "pipelines" / "tables.py"
    spec = importlib.util.spec_from_file_location("tables_stage", path)
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    assert stage.main() == 0
    assert (tmp_path / "out" / PROFILE / "tables.md").is_file()


def test_missing_per_query_artifact_means_no_test(study):
    from qac.reporting.report import load_study

    uri, ids = study
    runs = load_study(PARAMS, uri)
    stale = runs.get(ids["finetune/r1/cocondenser-passage#stale"])
    assert runs.per_query(stale, "scifact", "test", "RR@10") is None
    fresh = runs.get(ids["finetune/r1/cocondenser-passage"])
    assert runs.per_query(fresh, "scifact", "test", "RR@10") == {"q1": 0.2, "q2": 0.3, "q3": 0.4, "q4": 0.3}
    assert runs.per_query(fresh, "scifact", "test", "AP") is None


def test_qac_tables_without_runs_says_so(mlflow_store, tmp_path, capsys):
    import yaml

    from qac.cli import main

    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(PARAMS), encoding="utf-8")
    assert main(["tables", "--params", str(params_path), "--out", str(tmp_path / "out")]) == 1
    assert "no MLflow experiment 'qac-smoke'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
