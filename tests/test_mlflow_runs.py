"""MLflow as a researcher reads it: after fine-tuning and evaluation on a tiny study,
the runs pivot on the variant's parameters, keep their durations, and carry their
config, datasets and (when asked) models.
"""

from __future__ import annotations

import json

import pytest
import yaml

from test_finetune_stage import load_stage, shared_mlflow_store, study_dir  # noqa: F401  (fixture)

VARIANT = "cocondenser-query-q2"


@pytest.fixture(scope="module")
def mlflow_store(shared_mlflow_store):  # noqa: F811
    """The SQLite store of ``conftest.mlflow_store``, kept for the module: the stages below run once."""
    return shared_mlflow_store


@pytest.fixture(scope="module")
def evaluated_study(tmp_path_factory, tiny_bert_dir, mlflow_store):
    """finetune + evaluate of a query-context variant (with --log-models) and of ``none`` (without)."""
    import shutil

    import mlflow

    from qac.config import write_params

    root = tmp_path_factory.mktemp("runs") / "study"
    with study_dir(root, tiny_bert_dir) as params:
        # make_study pre-trains nothing; the fine-tuning stage takes the variant's description from params.
        params["pretrain"]["variants"][VARIANT] = {"method": "cocondenser", "context_type": "query", "query_count": 2}
        write_params(params, root / "params.yaml")
        pretrain_dir = root / "data" / "smoke" / "pretrain"
        shutil.copytree(pretrain_dir / "none", pretrain_dir / VARIANT)
        records = root / "data" / "smoke" / ".runs" / "pretrain"
        shutil.copytree(records / "none", records / VARIANT)   # its run record too: the runs nest under it
        load_stage("finetune").main(["--variant", VARIANT, "--log-models"])
        load_stage("finetune").main(["--variant", "none"])
        client = mlflow.MlflowClient(mlflow_store)
        run_ids = {name: json.loads((root / "data/smoke/.runs/finetune" / VARIANT / name / "mlflow_run.json").read_text())
                   ["run_id"] for name in ("r1", "r2")}
        end_times = {name: client.get_run(run_id).info.end_time for name, run_id in run_ids.items()}
        load_stage("evaluate").main(["--variant", VARIANT])
    return root, params, client, run_ids, end_times


def test_search_runs_pivots_fine_tuning_runs_on_the_variant(evaluated_study, mlflow_store):
    import mlflow

    _, _, _, _, _ = evaluated_study
    mlflow.set_tracking_uri(mlflow_store)
    runs = mlflow.search_runs(experiment_names=["qac-smoke"], filter_string="tags.`qac.kind` = 'finetune'")
    assert len(runs) == 4
    table = runs.set_index("tags.mlflow.runName")[
        ["params.method", "params.context_type", "params.query_count", "params.retriever", "tags.qac.stage"]]
    assert table.loc["r1 · C=2 · query · cocondenser"].tolist() == [
        "cocondenser", "query", "2", "r1", f"finetune@{VARIANT}"]
    assert table.loc["r2 · C=2 · query · cocondenser"].tolist() == [
        "cocondenser", "query", "2", "r2", f"finetune@{VARIANT}"]
    # no query count where no query was read: the cell stays empty rather than claiming C
    assert table.loc["r1 · none"].fillna("-").tolist() == ["none", "none", "-", "r1", "finetune@none"]
    # The compare view's question: a metric against the context type, one row per retriever.
    pivot = runs.pivot_table(index="params.context_type", columns="params.retriever",
                             values="metrics.tinyset/test/nDCG_at_10", aggfunc="max")
    assert list(pivot.index) == ["query"]          # only the evaluated variant has metrics
    assert sorted(pivot.columns) == ["r1", "r2"]


def test_evaluation_leaves_the_fine_tuning_durations_alone(evaluated_study):
    _, _, client, run_ids, end_times = evaluated_study
    for name, run_id in run_ids.items():
        run = client.get_run(run_id)
        assert "tinyset/test/nDCG_at_10" in run.data.metrics      # evaluation logged into it...
        assert run.info.end_time == end_times[name]              # ...without extending it
        assert run.info.status == "FINISHED"
        assert run.data.metrics["eval/seconds"] > 0


def test_runs_carry_their_config_and_datasets(evaluated_study):
    import mlflow

    from qac.io import path_md5

    root, params, client, run_ids, _ = evaluated_study
    run = client.get_run(run_ids["r1"])
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="config/params.yaml")
    logged = yaml.safe_load(open(local, encoding="utf-8"))
    assert logged["finetune"] == params["finetune"]
    assert logged["pretrain"]["variants"][VARIANT]["query_count"] == 2

    datasets = root / "data" / "smoke" / "datasets"
    inputs = {(item.dataset.name, tag.value): item.dataset.digest
              for item in run.inputs.dataset_inputs for tag in item.tags if tag.key == "mlflow.data.context"}
    assert inputs[("tinyset/corpus", "training")] == path_md5(datasets / "tinyset" / "corpus.jsonl")
    assert inputs[("tinyset/queries", "training")] == path_md5(datasets / "tinyset" / "queries.jsonl")
    assert inputs[("tinyset/qrels/train", "training")] == path_md5(datasets / "tinyset" / "qrels" / "train.tsv")
    assert inputs[("tinyset/qrels/test", "evaluation")] == path_md5(datasets / "tinyset" / "qrels" / "test.tsv")
    assert inputs[("othertiny/qrels/test", "evaluation")] == path_md5(datasets / "othertiny" / "qrels" / "test.tsv")


def test_encoders_are_logged_only_when_asked(evaluated_study, mlflow_store):
    import mlflow

    _, _, client, run_ids, _ = evaluated_study
    logged = {item.path for item in client.list_artifacts(run_ids["r2"], "encoder")}
    assert "encoder/config.json" in logged and "encoder/model.safetensors" in logged
    mlflow.set_tracking_uri(mlflow_store)
    plain = mlflow.search_runs(experiment_names=["qac-smoke"], output_format="list",
                               filter_string="tags.`qac.stage` = 'finetune@none'")
    assert len(plain) == 2
    for run in plain:
        assert [item.path for item in client.list_artifacts(run.info.run_id)
                if item.path == "encoder"] == []


def test_the_study_run_says_what_it_studies(evaluated_study):
    _, _, client, run_ids, _ = evaluated_study
    pretrain_run = client.get_run(client.get_run(run_ids["r1"]).data.tags["mlflow.parentRunId"])
    study = client.get_run(pretrain_run.data.tags["mlflow.parentRunId"])
    assert study.data.tags["qac.role"] == "study"
    assert study.data.params["profile"] == "smoke"
    assert study.data.params["git_commit"] == study.data.tags["qac.git_commit"]   # "unknown" outside a repository
    assert study.data.params["train_dataset"] == "tinyset"
    assert study.info.run_name.startswith("study · smoke · ")


def test_the_experiment_opens_on_its_training_runs(evaluated_study):
    _, _, client, _, _ = evaluated_study
    experiment = client.get_experiment_by_name("qac-smoke")
    # Without this tag MLflow 3 opens the experiment on its GenAI overview.
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_run_names_lead_with_what_differs():
    from qac.tracking.naming import baseline_description, variant_label, variant_run_name

    query = {"method": "cocondenser", "context_type": "query", "query_count": 5, "cotmae_decoder": "none"}
    passage = {"method": "cotmae", "context_type": "passage", "query_count": 5, "cotmae_decoder": "paper"}
    assert variant_run_name(query, "r1") == "r1 · C=5 · query · cocondenser"
    assert variant_run_name(query, "pretrain") == "C=5 · query · cocondenser · pretrain"
    assert variant_run_name(passage, "pretrain") == "passage · cotmae · pretrain"
    assert variant_label({"method": "none", "context_type": "none"}) == "none"
    assert variant_label({**passage, "context_type": "mixed", "cotmae_decoder": "nearby"}) == (
        "decoder=nearby · C=5 · mixed · cotmae")
    # 24 characters of a runs-table column keep what tells the runs apart
    names = {variant_run_name({**query, "query_count": c}, r)[:14] for c in (1, 5) for r in ("r1", "r2")}
    assert len(names) == 4
    assert baseline_description("bm25")["method"] == "bm25"
