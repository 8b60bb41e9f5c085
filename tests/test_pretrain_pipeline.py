"""The pretrain stage end to end on a tiny corpus: outputs, MLflow run, baseline export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qac.config import render_profile, write_params
from qac.io import path_md5
from test_pretrain_corpus import write_corpus
from stages import load_stage

REPO = Path(__file__).resolve().parent.parent


def main(argv):
    """``pipelines/pretrain.py``'s entry point (the pipelines folder is not a package)."""
    load_stage("pretrain").main(argv)


@pytest.fixture()
def smoke_params(tmp_path, monkeypatch):
    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["mlflow"]["system_metrics"] = False
    params["pretrain"]["common"].update(steps=3, batch_size=4, checkpoint_every=2, log_every=1, max_len=32)
    write_corpus(tmp_path / "data" / "smoke", documents=4, spans=3, queries=4)
    write_params(params, tmp_path / "params.yaml")
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))
    return params


def test_pretrain_stage_writes_encoder_checkpoint_and_run(smoke_params, mlflow_store, tmp_path):
    import mlflow
    from transformers import AutoModel


    main(["--variant", "cotmae-query-q4"])
    out = tmp_path / "data" / "smoke" / "pretrain" / "cotmae-query-q4"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "encoder", "losses.tsv"]
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert "mlflow_run_id" not in state                 # bookkeeping stays out of the DVC output
    assert all(set(metrics) & {"samples_per_second", "tokens_per_second"} == set() for _, metrics in state["history"])
    assert AutoModel.from_pretrained(out / "encoder").config.model_type == "bert"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3
    assert not (tmp_path / "data" / "smoke" / ".work" / "pretrain" / "cotmae-query-q4").exists()

    record = json.loads((tmp_path / "data" / "smoke" / ".runs" / "pretrain" / "cotmae-query-q4" / "mlflow_run.json")
                        .read_text())
    mlflow.set_tracking_uri(mlflow_store)
    run = mlflow.get_run(record["run_id"])
    assert run.info.run_name == "C=4 · query · cotmae · pretrain"
    assert run.data.tags["qac.stage"] == "pretrain@cotmae-query-q4"
    tags = run.data.tags
    assert (tags["qac.variant"], tags["qac.method"], tags["qac.context_type"], tags["qac.query_count"],
            tags["qac.cotmae_decoder"], tags["qac.kind"]) == ("cotmae-query-q4", "cotmae", "query", "4", "paper",
                                                             "pretrain")
    assert tags["qac.checkpoint_md5"] == path_md5(out / "checkpoint") == record["checkpoint_md5"]
    assert tags["qac.encoder_md5"] == path_md5(out / "encoder")
    assert run.data.params["method"] == "cotmae" and run.data.params["cotmae_decoder"] == "paper"
    client = mlflow.MlflowClient()
    for key in ("loss", "mlm", "decoder", "lr", "samples_per_second", "tokens_per_second"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2, 3], key
    # losses.tsv holds the same per-step losses as MLflow (no throughput: it is not a loss).
    lines = (out / "losses.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["step", "loss", "decoder", "mlm"]
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert {int(line.split("\t")[0]): float(line.split("\t")[1]) for line in lines[1:]} == pytest.approx(logged)
    assert not (tmp_path / "data" / "smoke" / ".work" / "pretrain" / "cotmae-query-q4.losses.jsonl").exists()


def test_method_none_exports_the_init_encoder(smoke_params, mlflow_store, tmp_path):
    import mlflow
    import torch
    from transformers import AutoModel

    from qac.models.loading import load_model

    main(["--variant", "none"])
    out = tmp_path / "data" / "smoke" / "pretrain" / "none"
    exported = AutoModel.from_pretrained(out / "encoder")
    reference = load_model("tiny:minilm", seed=smoke_params["seed"])
    for name, tensor in reference.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name
    mlflow.set_tracking_uri(mlflow_store)
    run = mlflow.get_run(json.loads((tmp_path / "data/smoke/.runs/pretrain/none/mlflow_run.json").read_text())["run_id"])
    assert run.info.run_name == "none · pretrain" and run.data.tags["qac.method"] == "none"
    assert "query_count" not in run.data.params and "qac.query_count" not in run.data.tags


def test_unknown_variant_and_unknown_key_are_rejected(smoke_params):
    from qac.train.pretrain import PretrainSettings

    from qac.params import ParamsError, validate_params

    from qac.errors import UserError

    with pytest.raises(UserError, match=r"unknown variant 'xyzzy': not a key of pretrain.variants .*\(declared: none, "):
        PretrainSettings.from_params(validate_params(smoke_params), "xyzzy")
    with pytest.raises(UserError, match=r"unknown variant 'cotmae-pasage'.*did you mean cotmae-passage\?"):
        PretrainSettings.from_params(validate_params(smoke_params), "cotmae-pasage")
    # an unknown key is the schema's to refuse, before any settings are built

    smoke_params["pretrain"]["variants"]["typo"] = {"method": "cocondenser", "lerning_rate": 1}
    with pytest.raises(ParamsError, match="parameter pretrain.variants.typo.lerning_rate: unknown key"):
        validate_params(smoke_params)


def _longer(params, tmp_path, **pretrain):
    from qac.config import write_params

    params["pretrain"]["common"].update(pretrain)
    write_params(params, tmp_path / "params.yaml")


def test_a_kill_while_publishing_keeps_the_work_checkpoint(smoke_params, mlflow_store, tmp_path, monkeypatch):
    import qac.tracking

    root = tmp_path / "data" / "smoke"
    work = root / ".work" / "pretrain" / "cotmae-query-q4"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the output")
    with monkeypatch.context() as patch:
        patch.setattr(qac.tracking, "write_run_record", killed)
        with pytest.raises(KeyboardInterrupt):
            main(["--variant", "cotmae-query-q4"])
    assert not (root / "pretrain" / "cotmae-query-q4").exists()
    assert json.loads((work / "checkpoint" / "state.json").read_text())["step"] == 3   # nothing trained is lost
    main(["--variant", "cotmae-query-q4"])
    summary_run = json.loads((root / ".runs" / "pretrain" / "cotmae-query-q4" / "mlflow_run.json").read_text())["run_id"]
    import mlflow

    mlflow.set_tracking_uri(mlflow_store)
    assert mlflow.get_run(summary_run).data.tags["qac.resume.from_step"] == "3"
    assert not work.exists()


@pytest.mark.slow
def test_a_killed_stage_ends_as_killed_and_the_resumed_run_has_the_whole_curve(smoke_params, mlflow_store,
                                                                               tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    import mlflow

    steps = 12
    _longer(smoke_params, tmp_path, steps=steps, checkpoint_every=2, log_every=1)
    root = tmp_path / "data" / "smoke"
    state_file = root / ".work" / "pretrain" / "cotmae-query-q4" / "checkpoint" / "state.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, str(REPO / "pipelines" / "pretrain.py"), "--variant",
                                "cotmae-query-q4"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if state_file.exists() and json.loads(state_file.read_text())["step"] >= 2:
            os.kill(process.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the stage ended before it could be killed"
    killed = json.loads(state_file.read_text())
    mlflow.set_tracking_uri(mlflow_store)
    assert mlflow.get_run(killed["mlflow_run_id"]).info.status == "RUNNING"

    main(["--variant", "cotmae-query-q4"])
    resumed = mlflow.get_run(json.loads((root / ".runs" / "pretrain" / "cotmae-query-q4" / "mlflow_run.json")
                                        .read_text())["run_id"])
    earlier = mlflow.get_run(killed["mlflow_run_id"])
    assert earlier.info.status == "KILLED" and "had ended" in earlier.data.tags["qac.swept"]
    assert "qac.replaces_run" not in resumed.data.tags   # it resumed the killed run's work, it did not replace it
    assert earlier.data.tags["qac.continued_by"] == resumed.info.run_id
    assert resumed.data.tags["qac.resumes_run"] == earlier.info.run_id
    assert resumed.data.tags["qac.resume.from_step"] == str(killed["step"])
    history = mlflow.MlflowClient().get_metric_history(resumed.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, steps + 1))
    # losses.tsv, which the tables and plots read, is the same whole curve: the killed
    # process's steps up to its checkpoint, then the resumed ones, each once.
    from qac.reporting.lineage import read_losses

    curve = read_losses(root / "pretrain" / "cotmae-query-q4" / "losses.tsv")
    assert [row["step"] for row in curve] == list(range(1, steps + 1))
    before_kill = {m.step: m.value for m in mlflow.MlflowClient().get_metric_history(earlier.info.run_id, "loss")}
    assert all(row["loss"] == before_kill[row["step"]] for row in curve if row["step"] <= killed["step"])


def test_master_stage_reads_its_inputs_and_logs_every_decoder(smoke_params, mlflow_store, tmp_path):
    import mlflow

    from test_pretrain_corpus import write_master_inputs

    write_master_inputs(tmp_path / "data" / "smoke")
    main(["--variant", "master-passage"])
    out = tmp_path / "data" / "smoke" / "pretrain" / "master-passage"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3
    record = tmp_path / "data" / "smoke" / ".runs" / "pretrain" / "master-passage" / "mlflow_run.json"
    run = mlflow.MlflowClient(mlflow_store).get_run(json.loads(record.read_text())["run_id"])
    assert run.data.tags["qac.method"] == "master"
    assert run.data.tags["qac.master_decoders"] == "mkp,cmp,npr,dor,gor"
    assert run.data.params["master_decoders"] == "mkp,cmp,npr,dor,gor"
    header = (out / "losses.tsv").read_text().splitlines()[0].split("\t")
    assert header[:2] == ["step", "loss"] and set(header[2:]) == {"mlm", "mkp", "cmp", "npr", "dor", "gor"}
