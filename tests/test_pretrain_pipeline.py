"""The pretrain stage end to end on a tiny corpus: outputs, MLflow run, baseline export."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from qac.config import render_profile, write_params
from qac.io import path_md5
from test_pretrain_corpus import write_corpus

REPO = Path(__file__).resolve().parent.parent


def main(argv):
    """``pipelines/pretrain.py``'s entry point (the pipelines folder is not a package)."""
    spec = importlib.util.spec_from_file_location("pipeline_pretrain", REPO / "pipelines" / "pretrain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)


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
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "encoder", "mlflow_run.json"]
    assert AutoModel.from_pretrained(out / "encoder").config.model_type == "bert"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3
    assert not (tmp_path / "data" / "smoke" / ".work" / "pretrain" / "cotmae-query-q4").exists()

    record = json.loads((out / "mlflow_run.json").read_text())
    mlflow.set_tracking_uri(mlflow_store)
    run = mlflow.get_run(record["run_id"])
    assert run.info.run_name == "cotmae · query · C=4 · pretrain"
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
    run = mlflow.get_run(json.loads((out / "mlflow_run.json").read_text())["run_id"])
    assert run.info.run_name == "none · pretrain" and run.data.tags["qac.method"] == "none"


def test_unknown_variant_and_unknown_key_are_rejected(smoke_params):
    from qac.train.pretrain import PretrainSettings

    with pytest.raises(ValueError, match="no pretrain.variants.nope"):
        PretrainSettings.from_params(smoke_params, "nope")
    smoke_params["pretrain"]["variants"]["typo"] = {"method": "cocondenser", "lerning_rate": 1}
    with pytest.raises(ValueError, match="pretrain.variants.typo: unknown pre-training key.*lerning_rate"):
        PretrainSettings.from_params(smoke_params, "typo")
