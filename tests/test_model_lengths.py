"""Lengths in tokens are checked against the positions of the model that reads them, before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qac.model_specs import max_positions, positions_of_config
from qac.params import ParamsError, load_params

REPO = Path(__file__).resolve().parent.parent
SMOKE = yaml.safe_load((REPO / "profiles" / "smoke" / "params.yaml").read_text(encoding="utf-8"))
TINY = 512   # the tiny: specs of the smoke profile


def params_with(tmp_path: Path, changes: dict) -> Path:
    params = json.loads(json.dumps(SMOKE))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = params
        for part in parents:
            node = node[part]
        node[leaf] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def refused(tmp_path: Path, changes: dict, key: str) -> str:
    with pytest.raises(ParamsError) as caught:
        load_params(params_with(tmp_path, changes))
    problems = {problem.key: problem.message for problem in caught.value.problems}
    assert key in problems, problems
    return problems[key]


@pytest.mark.parametrize("key, limit", [
    ("finetune.passage_max_len", TINY), ("finetune.query_max_len", TINY), ("finetune.corpus_max_len", TINY),
    ("pretrain.common.max_len", TINY), ("pretrain.common.query_max_len", TINY),
    ("beir_retriever.passage_max_len", TINY), ("annotation.judge_max_len", TINY),
    ("split.max_len", TINY - 2),                      # plus [CLS] and [SEP]
])
def test_a_length_over_the_models_positions_is_named_with_its_limit(tmp_path, key, limit):
    message = refused(tmp_path, {key: limit + 1}, key)
    assert f"at most {limit}" in message and "tiny:minilm" in message
    load_params(params_with(tmp_path, {key: limit}))     # the limit itself is fine


def test_the_reported_case_fails_before_any_model_loads(tmp_path):
    import sys

    before = "transformers" in sys.modules
    message = refused(tmp_path, {"finetune.passage_max_len": 100000}, "finetune.passage_max_len")
    assert "100000" in message and "512 positions" in message
    if not before:
        assert "transformers" not in sys.modules


def test_a_variants_own_length_is_named_by_its_own_key(tmp_path):
    variant = next(name for name, spec in SMOKE["pretrain"]["variants"].items() if spec["method"] != "none")
    changes = {f"pretrain.variants.{variant}": {**SMOKE["pretrain"]["variants"][variant], "max_len": 4096}}
    refused(tmp_path, changes, f"pretrain.variants.{variant}.max_len")


def test_the_generators_source_and_written_tokens_share_a_prefix_lms_positions(tmp_path):
    generator = SMOKE["query_generator"]
    assert generator["architecture"] == "prefix_lm"
    source = TINY - generator["max_target_len"] + 1
    message = refused(tmp_path, {"query_generator.max_source_len": source}, "query_generator.max_source_len")
    assert "query_generator.max_target_len" in message
    refused(tmp_path, {"querygen.max_source_len": TINY, "querygen.max_new_tokens": 8}, "querygen.max_source_len")


def test_the_continuation_lm_reads_its_source_and_samples_within_its_positions(tmp_path):
    refused(tmp_path, {"continuation.max_source_len": 500, "continuation.max_new_tokens": 20},
            "continuation.max_source_len")


def test_a_local_model_folder_is_read_from_its_config(tmp_path):
    folder = tmp_path / "small-encoder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 128}))
    assert max_positions(str(folder)) == 128
    message = refused(tmp_path, {"pretrain.common.init": str(folder), "finetune.passage_max_len": 129},
                      "finetune.passage_max_len")
    assert str(folder) in message and "at most 128" in message


def test_a_hub_model_whose_configuration_is_not_here_is_not_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    max_positions.cache_clear()
    assert max_positions("some-org/unseen-model") is None
    load_params(params_with(tmp_path, {"pretrain.common.init": "some-org/unseen-model",
                                       "finetune.passage_max_len": 100000, "beir_retriever.passage_max_len": 100000,
                                       "split.max_len": 100000}))


@pytest.mark.parametrize("config, positions", [
    ({"model_type": "bert", "max_position_embeddings": 512}, 512),
    ({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}, 512),   # ids start after pad
    ({"model_type": "gpt2", "n_positions": 1024}, 1024),
    ({"model_type": "t5", "n_positions": 512}, None),   # relative positions: no fixed limit
])
def test_positions_of_a_configuration(config, positions):
    assert positions_of_config(config) == positions
