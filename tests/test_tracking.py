"""Stage runs: names, tags, nesting, input hashes; SQLite store and a real tracking server."""


import mlflow
import pytest
from mlflow_stores import tracking_server

from qac.io import path_md5
from qac.params import validate_params
from qac.tracking import (log_metrics, measure_from_key, metric_key, read_run_record, stage_run,
                          study_run_id, write_run_record)

PARAMS = validate_params({"profile": "smoke", "mlflow": {"experiment": "qac-test", "system_metrics": False}},
                         complete=False)


def test_metric_key_mangles_what_mlflow_rejects():
    assert metric_key("scifact", "test", "nDCG@10") == "scifact/test/nDCG_at_10"
    assert measure_from_key("scifact/test/nDCG_at_10") == "nDCG@10"


def _exercise_store(tmp_path):
    data = tmp_path / "passages.jsonl"
    data.write_text('{"pid": "d1#0"}\n')
    with stage_run(PARAMS, "pretrain@x", "pretrain/cocondenser/query/q5", kind="pretrain",
                   stage_params={"lr": 1e-4, "nested": {"steps": 10}},
                   inputs={"passages": data}, tags={"qac.variant": "x"}) as run:
        log_metrics({"loss/total": 1.5}, step=1)
        log_metrics({"scifact/test/nDCG@10": 0.25})
        parent_id = run.info.run_id
    write_run_record(tmp_path, tmp_path / "out", parent_id)
    record = read_run_record(tmp_path, "out")
    with stage_run(PARAMS, "finetune@x", "finetune/r1/x", kind="finetune",
                   parent_run_id=record["run_id"]) as child:
        child_id = child.info.run_id

    client = mlflow.MlflowClient()
    parent = client.get_run(parent_id)
    assert parent.info.run_name == "pretrain/cocondenser/query/q5"
    assert parent.data.tags["qac.stage"] == "pretrain@x"
    assert parent.data.tags["qac.kind"] == "pretrain"
    assert parent.data.tags["qac.input_md5.passages"] == path_md5(data)
    assert parent.data.tags["mlflow.parentRunId"] == study_run_id(PARAMS)
    assert parent.data.params["nested.steps"] == "10"
    assert parent.data.metrics["scifact/test/nDCG_at_10"] == 0.25
    assert client.get_run(child_id).data.tags["mlflow.parentRunId"] == parent_id
    # One study run per profile and commit, however many stages ask for it.
    assert study_run_id(PARAMS) == study_run_id(PARAMS)


def test_stage_runs_in_sqlite_store(tmp_path, mlflow_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _exercise_store(tmp_path)
    assert (tmp_path / "mlflow.db").exists()


@pytest.fixture()
def mlflow_server(tmp_path):
    with tracking_server(tmp_path) as url:
        yield url


def test_stage_runs_against_a_tracking_server(tmp_path, mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.chdir(tmp_path)
    _exercise_store(tmp_path)
    assert not (tmp_path / "mlflow.db").exists()
