"""The search space of `qac hpo`: typed, bounded, checked against params.yaml with errors naming the key."""

import optuna
import pytest

from qac.config import render_profile
from qac.hpo.space import (Dimension, SpaceError, apply_values, check_space_against_params, parse_space,
                           suggest_values)


def test_each_type_becomes_a_dimension_and_null_entries_are_dropped():
    dims = parse_space({
        "pretrain.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
        "pretrain.query_count": {"type": "int", "low": 1, "high": 4},
        "pretrain.cotmae_decoder": {"type": "categorical", "choices": ["paper", "release"]},
        "pretrain.warmup_ratio": None,
    })
    assert dims == [
        Dimension("pretrain.lr", "float", 1e-5, 1e-3, log=True),
        Dimension("pretrain.query_count", "int", 1, 4),
        Dimension("pretrain.cotmae_decoder", "categorical", choices=("paper", "release")),
    ]


@pytest.mark.parametrize("entry, message", [
    ({"type": "float", "low": 0.1, "high": 0.01}, "'low' (0.1) is above 'high' (0.01)"),
    ({"type": "float", "low": 0.0, "high": 1.0, "log": True}, "log-scaled range needs 'low' > 0"),
    ({"type": "int", "low": 1.5, "high": 4}, "'low' must be an integer"),
    ({"type": "float", "low": "a", "high": 1.0}, "'low' must be a number"),
    ({"type": "float", "high": 1.0}, "'low' is required"),
    ({"type": "real", "low": 0, "high": 1}, "'type' must be one of float, int, categorical"),
    ({"type": "categorical", "choices": []}, "'choices' must be a non-empty list"),
    ({"type": "categorical", "choices": ["a", "a"]}, "lists a value twice"),
    ({"type": "float", "low": 0.0, "high": 1.0, "bounds": 2}, "unknown field(s) bounds"),
    ({"type": "float", "low": 1e-4, "high": 1.0, "log": True, "step": 0.1}, "'step' and 'log' cannot be combined"),
    ([1, 2], "expected a mapping"),
])
def test_a_bad_entry_is_rejected_with_its_key(entry, message):
    with pytest.raises(SpaceError) as error:
        parse_space({"pretrain.lr": entry})
    assert "hpo.space.pretrain.lr" in str(error.value)
    assert message in str(error.value)


def test_an_empty_space_is_an_error():
    with pytest.raises(SpaceError, match="empty"):
        parse_space({})
    with pytest.raises(SpaceError, match="every entry is null"):
        parse_space({"pretrain.lr": None})


def test_keys_must_name_existing_settings():
    params = render_profile("smoke")
    variant = params["hpo"]["variant"]
    good = parse_space({"pretrain.lr": {"type": "float", "low": 1e-5, "high": 1e-3},
                        "finetune.lr": {"type": "float", "low": 1e-5, "high": 1e-3}})
    check_space_against_params(good, params, variant)
    for key, message in [("pretrain.lrate", "not a pre-training setting"),
                         ("finetune.learning_rate", "no such parameter"),
                         ("finetune", "names a section, not a single setting"),
                         ("pretrain", "not a pre-training setting")]:
        dims = [Dimension(key, "float", 0.1, 0.2)]
        with pytest.raises(SpaceError, match=message) as error:
            check_space_against_params(dims, params, variant)
        assert f"hpo.space.{key}" in str(error.value)
    with pytest.raises(SpaceError, match="not a pre-training variant"):
        check_space_against_params(good, params, "no-such-variant")


def test_query_count_cannot_exceed_the_generated_queries():
    params = render_profile("smoke")  # 4 queries per passage
    dims = [Dimension("pretrain.query_count", "int", 1, 5)]
    with pytest.raises(SpaceError, match=r"'high' \(5\) exceeds querygen.queries_per_passage \(4\)"):
        check_space_against_params(dims, params, params["hpo"]["variant"])


def test_values_go_into_the_variant_and_other_sections_without_touching_the_input():
    from qac.params import validate_params

    params = validate_params(render_profile("smoke"))
    variant = params["hpo"]["variant"]
    trial_params = apply_values(params, {"pretrain.lr": 3e-4, "finetune.lr": 5e-5}, variant)
    assert trial_params["pretrain"]["variants"][variant]["lr"] == 3e-4
    assert trial_params["pretrain"]["common"]["lr"] == params["pretrain"]["common"]["lr"]
    assert trial_params["finetune"]["lr"] == 5e-5
    assert "lr" not in params["pretrain"]["variants"][variant] and params["finetune"]["lr"] == 2e-5


def test_suggested_values_stay_in_bounds_and_respect_types():
    dims = parse_space({
        "a": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
        "b": {"type": "int", "low": 2, "high": 8, "step": 2},
        "c": {"type": "categorical", "choices": ["x", "y"]},
    })
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        values = suggest_values(trial, dims)
        assert 1e-5 <= values["a"] <= 1e-3
        assert values["b"] in (2, 4, 6, 8)
        assert values["c"] in ("x", "y")
        study.tell(trial, 0.0)


def test_a_trial_value_reaches_the_seed_copies_of_its_variant_so_the_trial_params_stay_valid():
    from qac.params import validate_params

    params = validate_params(render_profile("smoke"))
    variant = params["hpo"]["variant"]
    copies = [name for name, v in params["pretrain"]["variants"].items() if v.get("seed_of") == variant]
    assert copies, "the smoke profile's tuned variant has a seed copy"
    trial_params = apply_values(params, {"pretrain.lr": 3e-4}, variant)
    assert all(trial_params["pretrain"]["variants"][name]["lr"] == 3e-4 for name in [variant, *copies])
    validate_params(trial_params)
