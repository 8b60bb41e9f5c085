"""A hub model pinned as ``name@<commit>`` loads that commit, whatever the hub's main branch holds now.

A small Hugging Face cache holds two commits of one model name, ``refs/main`` pointing at the newer one;
a spec pinned to the older one must load the older weights and tokenizer, an unpinned spec the newer.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel

from qac.model_specs import spec_problem, split_revision, unpinned_problem
from qac.models.loading import ModelSpec, load_model, load_tokenizer

OLD, NEW = "1" * 40, "2" * 40
NAME = "example-org/tiny-encoder"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub cache with commits OLD (hidden size 16) and NEW (hidden size 32) of NAME, main at NEW."""
    cache = tmp_path / "hub"
    repo = cache / ("models--" + NAME.replace("/", "--"))
    tokenizer = load_tokenizer("minilm")
    for revision, width in ((OLD, 16), (NEW, 32)):
        folder = repo / "snapshots" / revision
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=width, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=2 * width)).save_pretrained(folder)
        tokenizer.model_max_length = width      # tells the two tokenizers apart
        tokenizer.save_pretrained(folder)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(NEW)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_pinned_spec_loads_its_commit_and_an_unpinned_one_main(hub):
    assert load_model(f"{NAME}@{OLD}").config.hidden_size == 16
    assert load_tokenizer(f"{NAME}@{OLD}").model_max_length == 16
    assert load_model(NAME).config.hidden_size == 32
    assert load_model(f"{NAME}@{NEW}").config.hidden_size == 32


def test_the_spec_grammar_parts_name_and_revision():
    assert split_revision(f"{NAME}@{OLD}") == (NAME, OLD)
    assert split_revision("bert-base-uncased") == ("bert-base-uncased", None)
    assert ModelSpec.parse(f"tiny:bert-base-uncased@{OLD}") == ModelSpec("bert-base-uncased", "tiny", OLD)
    assert spec_problem(f"{NAME}@{OLD}") is None
    assert "names no revision" in spec_problem(f"{NAME}@")
    assert "only a hub model has a revision" in spec_problem(f"minilm@{OLD}")


def test_only_a_commit_pins_a_hub_model(tmp_path):
    assert unpinned_problem(f"{NAME}@{OLD}") is None
    assert "without a revision" in unpinned_problem(NAME)
    assert "not a commit" in unpinned_problem(f"{NAME}@main")
    for unserved in ("minilm", str(tmp_path), "tiny-llama:minilm"):     # nothing a hub serves: nothing to pin
        assert unpinned_problem(unserved) is None


def test_the_commit_each_hub_model_came_from_is_noted(hub):
    from qac.model_specs import loaded_models, loads_noted

    start = loads_noted()
    load_model(f"{NAME}@{OLD}")
    load_tokenizer(NAME)
    load_model("minilm")                     # a packaged folder: no hub model
    assert loaded_models(start) == [{"model": NAME, "revision": OLD, "commit": OLD},
                                    {"model": NAME, "revision": None, "commit": NEW}]


def test_a_stage_run_records_the_hub_models_its_work_loaded(hub, tmp_path, mlflow_store, monkeypatch):
    import json

    import mlflow

    from qac.params import validate_params
    from qac.tracking import record_path
    from qac.tracking.lifecycle import tracked_stage

    params = validate_params({"profile": "smoke", "mlflow": {"experiment": "qac-test", "system_metrics": False}},
                             complete=False)
    monkeypatch.chdir(tmp_path)
    root, output = tmp_path / "data" / "smoke", tmp_path / "data" / "smoke" / "reference"
    with tracked_stage(params, "reference", "reference · x", kind="baseline", output=output, root=root) as tracking:
        load_model(f"{NAME}@{OLD}")
        output.mkdir(parents=True)
    loaded = [{"commit": OLD, "model": NAME, "revision": OLD}]
    assert json.loads(mlflow.MlflowClient().get_run(tracking.run_id).data.tags["qac.loaded_models"]) == loaded
    assert json.loads(record_path(root, output).read_text())["loaded_models"] == loaded
