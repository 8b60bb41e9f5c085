"""One stage lifecycle (qac.tracking.lifecycle): parent, inputs, outputs, record, resume links, rank 0."""

import ast
from pathlib import Path

import mlflow
import pytest

from qac.io import path_md5
from qac.params import validate_params
from qac.tracking import read_run_record, study_run_id
from qac.tracking.lifecycle import Upstream, reopened_stage, tracked_stage

PARAMS = validate_params({"profile": "smoke", "mlflow": {"experiment": "qac-test", "system_metrics": False}},
                         complete=False)
PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"


def test_a_stage_run_nests_under_its_upstream_and_records_its_output(tmp_path, mlflow_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "data" / "smoke"
    passages = tmp_path / "passages.arrow"
    passages.write_bytes(b"passages")
    upstream_out, out = root / "pretrain" / "x", root / "finetune" / "x"
    with tracked_stage(PARAMS, "pretrain@x", "pretrain · x", kind="pretrain", inputs={"passages": passages},
                       output=upstream_out, root=root) as pretrain:
        (tmp_path / "staging").mkdir()
        (tmp_path / "staging" / "weights.bin").write_bytes(b"weights")
        pretrain.hash_outputs({"encoder": (tmp_path / "staging", upstream_out / "encoder"),
                               "absent": (tmp_path / "nowhere", upstream_out / "absent")})
        pretrain.describe(variant="x")
    record = read_run_record(root, upstream_out)
    assert record["run_id"] == pretrain.run_id and record["variant"] == "x"
    assert record["encoder_md5"] == path_md5(tmp_path / "staging") and "absent_md5" not in record

    with tracked_stage(PARAMS, "finetune@x", "r1 · x", kind="finetune", output=out / "r1", root=root,
                       parent=Upstream(root, upstream_out, "pretrain@x")) as finetune:
        finetune.log_metrics({"scifact/test/nDCG@10": 0.5}, step=1)

    client = mlflow.MlflowClient()
    first, second = client.get_run(pretrain.run_id), client.get_run(finetune.run_id)
    assert first.data.tags["qac.input_md5.passages"] == path_md5(passages)
    assert first.data.tags["qac.encoder_md5"] == record["encoder_md5"]
    assert first.data.tags["qac.encoder"] == str(upstream_out / "encoder")
    assert first.data.tags["mlflow.parentRunId"] == study_run_id(PARAMS)
    assert second.data.tags["mlflow.parentRunId"] == pretrain.run_id
    assert second.data.metrics["scifact/test/nDCG_at_10"] == 0.5
    assert read_run_record(root, out / "r1")["run_id"] == finetune.run_id


def test_a_failed_stage_leaves_no_record_and_an_unlinked_upstream_falls_back_to_the_study(
        tmp_path, mlflow_store, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "data" / "smoke"
    with pytest.raises(RuntimeError):
        with tracked_stage(PARAMS, "finetune@x", "r1 · x", kind="finetune", output=root / "out", root=root,
                           parent=Upstream(root, root / "pretrain" / "x", "pretrain@x")) as tracking:
            raise RuntimeError("the work failed")
    assert read_run_record(root, root / "out") is None
    assert "no run record for pretrain@x" in capsys.readouterr().err
    run = mlflow.MlflowClient().get_run(tracking.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["mlflow.parentRunId"] == study_run_id(PARAMS)


def test_off_the_main_process_nothing_is_tracked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")    # not made yet
    root = tmp_path / "data" / "smoke"
    with tracked_stage(PARAMS, "finetune@x", "r1 · x", kind="finetune", output=root / "out", root=root,
                       main=False, log_models=True) as tracking:
        assert not tracking.active and tracking.run_id is None
        tracking.log_metrics({"loss": 1.0}, step=1)
        tracking.set_tags({"qac.x": "y"})
        tracking.hash_outputs({"encoder": (tmp_path, root / "encoder")})
        tracking.log_model(tmp_path, "encoder")
        tracking.resumes("some-run", resumed=True, from_step=3)
    assert read_run_record(root, root / "out") is None
    assert not (tmp_path / "mlflow.db").exists()   # not even a store was created


def test_resume_links_and_a_reopened_run_keeps_its_end_time(tmp_path, mlflow_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with tracked_stage(PARAMS, "pretrain@x", "pretrain · x", kind="pretrain") as killed:
        pass
    client = mlflow.MlflowClient()
    client.set_terminated(killed.run_id, status="KILLED")
    with tracked_stage(PARAMS, "pretrain@x", "pretrain · x", kind="pretrain") as again:
        again.resumes(killed.run_id, resumed=True, from_step=7)
    tags = client.get_run(again.run_id).data.tags
    assert tags["qac.resume.from_step"] == "7" and tags["qac.resumes_run"] == killed.run_id
    assert "qac.replaces_run" not in tags     # resumed, not replaced
    assert client.get_run(killed.run_id).data.tags["qac.continued_by"] == again.run_id

    ended = client.get_run(again.run_id).info.end_time
    with reopened_stage(PARAMS, again.run_id) as tracking:
        tracking.log_metrics({"eval/seconds": 2.0})
    run = client.get_run(again.run_id)
    assert run.info.end_time == ended and run.data.metrics["eval/seconds"] == 2.0


def test_no_stage_script_talks_to_mlflow_itself():
    for script in sorted(PIPELINES.glob("*.py")):
        tree = ast.parse(script.read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(name == "mlflow" or name.startswith("mlflow.") for name in imported), script.name
        # Runs open through qac.tracking.lifecycle only: not through the lower-level helpers.
        assert "qac.tracking" not in imported and "qac.tracking.record" not in imported, script.name
