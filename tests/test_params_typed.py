"""The checked parameters flow as they are: typed, frozen, with defaults in one place."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
from pathlib import Path

import pydantic
import pytest

from qac.params import ParamsError, base_params, load_params, read_yaml, with_values
from qac.params.sections import Params, PretrainVariant

REPO = Path(__file__).resolve().parent.parent
SETTINGS_CLASSES = {
    "qac.train.pretrain": "PretrainSettings", "qac.train.finetune": "FinetuneSettings",
    "qac.querygen.generate": "SamplingSettings", "qac.querygen.train_generator": "TrainSettings",
    "qac.querygen.continuation": "ContinuationSettings", "qac.retrieval.bm25": "BM25Settings",
    "qac.retrieval.dense": "DenseSettings", "qac.data.splitting": "SplitSettings", "qac.hpo.study": "HpoSettings",
    "qac.llm_queries.causal_lm": "CausalSettings", "qac.llm_queries.filtering": "FilterSettings",
}


@pytest.mark.parametrize("profile", ["smoke", "default", "paper"])
def test_a_profile_loads_as_typed_parameters_that_read_back_as_its_file(profile):
    path = REPO / "profiles" / profile / "params.yaml"
    params = load_params(path, running=False)
    assert isinstance(params, Params)
    # The mapping view is the file: same keys in the same order, same values of the same types.
    written = read_yaml(path.read_text(encoding="utf-8"))
    assert json.dumps(params.to_dict()) == json.dumps(written)
    assert dict(params.finetune) == written["finetune"]
    assert isinstance(params.pretrain.common.lr, float) and params.profile == profile


def test_the_parameters_are_frozen():
    params = load_params(REPO / "profiles" / "smoke" / "params.yaml")
    with pytest.raises(pydantic.ValidationError):
        params.finetune.lr = 1.0
    with pytest.raises(TypeError):
        params.finetune["lr"] = 1.0      # a mapping view, not a dict


def test_a_variant_reads_its_own_keys_and_the_schema_defaults():
    params = load_params(REPO / "profiles" / "smoke" / "params.yaml")
    name, variant = next((name, spec) for name, spec in params.pretrain.variants.items() if spec.method == "none")
    # Only what the file set merges over pretrain.common; unset keys read as the schema's defaults.
    assert "lr" not in variant and variant.get("lr", "absent") == "absent"
    assert variant.context_type == PretrainVariant.model_fields["context_type"].default
    assert {**params.pretrain.common, **variant}["lr"] == params.pretrain.common.lr


def test_with_values_makes_a_new_checked_set_and_leaves_the_old_one():
    params = load_params(REPO / "profiles" / "smoke" / "params.yaml")
    changed = with_values(params, {"finetune.lr": 5e-5})
    assert changed.finetune.lr == 5e-5 and params.finetune.lr != 5e-5
    with pytest.raises(ParamsError, match="finetune.lr"):
        with_values(params, {"finetune.lr": -1.0})
    with pytest.raises(ParamsError, match="finetune.nope"):
        with_values(params, {"finetune.nope": 1})
    with pytest.raises(ParamsError, match="nothere"):
        with_values(params, {"nothere.lr": 1})


def test_a_partial_file_reads_as_the_base_with_its_keys_over_it(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: small\nseed: 7\nfinetune:\n  lr: 3.0e-5\n", encoding="utf-8")
    params = load_params(path)
    assert params.seed == 7 and params.finetune.lr == 3e-5
    assert params.finetune.epochs == base_params().finetune.epochs


@pytest.mark.parametrize("module, name", SETTINGS_CLASSES.items())
def test_no_settings_class_holds_a_default_of_its_own(module, name):
    cls = getattr(importlib.import_module(module), name)
    with_defaults = [field.name for field in dataclasses.fields(cls)
                     if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING]
    assert with_defaults == [], f"{name} restates defaults the schema holds: {with_defaults}"


def test_every_settings_class_is_in_the_check():
    """A new *Settings dataclass in the library joins the check above."""
    found = set()
    for path in (REPO / "qac").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if (isinstance(node, ast.ClassDef) and node.name.endswith("Settings")
                    and any(getattr(d, "id", getattr(getattr(d, "func", None), "id", None)) == "dataclass"
                            for d in node.decorator_list)):
                module = ".".join(path.relative_to(REPO).with_suffix("").parts)
                found.add((module, node.name))
            made = isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "attr", getattr(node.value.func, "id", None)) == "make_dataclass"
            if made and node.targets[0].id.endswith("Settings"):        # fields read from the schema
                found.add((".".join(path.relative_to(REPO).with_suffix("").parts), node.targets[0].id))
    assert found == set(SETTINGS_CLASSES.items())


def test_settings_from_the_base_equal_a_rendered_profile_where_it_keeps_the_base():
    from qac.querygen.generate import SamplingSettings

    base = base_params()
    smoke = load_params(REPO / "profiles" / "smoke" / "params.yaml")
    fields = [field.name for field in dataclasses.fields(SamplingSettings) if field.name != "seed"]
    from_smoke = SamplingSettings.from_params(smoke)
    for name in fields:
        if name not in read_yaml((REPO / "profiles" / "smoke.yaml").read_text(encoding="utf-8")).get("querygen", {}):
            assert getattr(from_smoke, name) == getattr(base.querygen, name)
