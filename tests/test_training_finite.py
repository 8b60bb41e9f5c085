"""A training step whose loss or gradient is not a finite number stops the training before the update.

Each loop (pre-training of every method, the gradient-cached one included; fine-tuning; the query
generator's training) is run on a tiny model with a NaN planted from a chosen optimizer step on: in the
embeddings' output (so the loss is NaN) or in one weight's gradient (the loss stays finite). The run must
stop with :class:`NonFiniteTraining` at exactly that step, leave no finished model, keep its earlier work
checkpoints finite, and, as a stage, end its MLflow run FAILED with one paragraph and exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from base_settings import finetune_settings, generator_training_settings, pretrain_values
from qac.train.finite import NonFiniteTraining, check_step
from test_pretrain_corpus import write_corpus

NAN = float("nan")


@contextlib.contextmanager
def poisoned(what: str, from_step: int):
    """Yield ``plant(model)``: from optimizer step ``from_step`` (1-based) on, ``model``'s embeddings give NaN
    (``what="loss"``) or its first weight's gradient is NaN (``what="gradient"``)."""
    done = [0]
    counter = register_optimizer_step_post_hook(
        lambda optimizer, args, kwargs: done.__setitem__(0, done[0] + 1))
    handles = []

    def active() -> bool:
        return done[0] + 1 >= from_step

    def plant(model):
        if what == "loss":
            embeddings = next(module for name, module in model.named_modules()
                              if type(module).__name__.endswith("Embeddings"))
            handles.append(embeddings.register_forward_hook(
                lambda module, inputs, output: output * NAN if active() else None))
        else:
            handles.append(next(model.parameters()).register_hook(lambda grad: grad * NAN if active() else None))
        return model
    try:
        yield plant
    finally:
        counter.remove()
        for handle in handles:
            handle.remove()


def test_check_step_reads_the_loss_and_stops_on_a_nan_loss_or_gradient():
    weight = torch.nn.Parameter(torch.ones(3))
    (weight * 2).sum().backward()
    assert check_step("pretrain", 4, torch.tensor([1.5, 0.25]), [weight], {}) == 1.75
    for loss in (NAN, math.inf, -math.inf):
        with pytest.raises(NonFiniteTraining, match="the loss at step 4 is not a finite number"):
            check_step("pretrain", 4, torch.tensor(loss), [weight], {"pretrain.common.lr": 1e-4})
    weight.grad[1] = math.inf
    with pytest.raises(NonFiniteTraining, match="the gradient at step 7") as caught:
        check_step("fine-tune", 7, torch.tensor(0.5), [weight], {"finetune.temperature": 0.01})
    assert "finetune.temperature = 0.01" in str(caught.value) and "\n" not in str(caught.value)
    # Where an fp16 loss scaler owns the gradients, an infinite one is its signal to skip a step.
    assert check_step("fine-tune", 7, torch.tensor(0.5), None, {}) == 0.5


PRETRAIN = pretrain_values(method="cocondenser", seed=1, init="tiny:minilm", context_type="query", query_count=2,
                           max_len=24, query_max_len=8, steps=5, batch_size=4, grad_accumulation=1, skip_from=1,
                           n_head_layers=1, lr=1e-3, checkpoint_every=2, log_every=1, dtype="fp32")
CASES = {
    "cocondenser": PRETRAIN,
    "cocondenser-gradcache": {**PRETRAIN, "grad_cache_chunk": 2},
    "cocondenser-accumulated": {**PRETRAIN, "grad_accumulation": 2},
    "cotmae": {**PRETRAIN, "method": "cotmae"},
}


@pytest.mark.parametrize("case, what", [("cocondenser", "loss"), ("cocondenser", "gradient"),
                                        ("cocondenser-gradcache", "loss"), ("cocondenser-gradcache", "gradient"),
                                        ("cocondenser-accumulated", "loss"), ("cotmae", "gradient")])
def test_pretraining_stops_at_the_first_non_finite_step_and_writes_no_model(tmp_path, monkeypatch, case, what):
    import qac.models.factory
    from qac.train.pretrain import PretrainSettings, pretrain

    data = tmp_path / "data"
    write_corpus(data, documents=3, spans=2, queries=2)
    build = qac.models.factory.build_pretraining_model
    with poisoned(what, from_step=4) as plant:
        monkeypatch.setattr(qac.models.factory, "build_pretraining_model",
                            lambda *args, **kwargs: plant(build(*args, **kwargs)))
        with pytest.raises(NonFiniteTraining) as caught:
            pretrain(PretrainSettings.from_mapping(CASES[case]), passages=data / "passages.arrow",
                     queries=data / "queries.arrow", work_dir=tmp_path / "work", out_dir=tmp_path / "out")
    error = caught.value
    assert error.step == 4 and error.what == f"the {what}"
    assert f"pretrain: the {what} at step 4 is not a finite number" in str(error)
    assert "pretrain.common.temperature = 1.0, pretrain.common.lr = 0.001" in str(error)
    assert "(or the variant's own value, where it sets one)" in str(error)
    assert not (tmp_path / "out").exists()              # no finished encoder or checkpoint
    # The work checkpoint is the last finite one (step 2), which a corrected rerun may resume.
    checkpoint = tmp_path / "work" / "checkpoint"
    assert json.loads((checkpoint / "state.json").read_text())["step"] == 2
    weights = torch.load(checkpoint / "model.pt", weights_only=True)
    assert all(torch.isfinite(value).all() for value in weights.values() if value.is_floating_point())


def test_a_temperature_whose_inverse_is_infinite_stops_pretraining_at_step_one(tmp_path):
    from qac.train.pretrain import PretrainSettings, pretrain

    data = tmp_path / "data"
    write_corpus(data, documents=3, spans=2, queries=2)
    with pytest.raises(NonFiniteTraining) as caught:      # the schema refuses it; the loop stops it too
        pretrain(PretrainSettings.from_mapping({**PRETRAIN, "temperature": 1e-320}), passages=data / "passages.arrow",
                 queries=data / "queries.arrow", work_dir=tmp_path / "work", out_dir=tmp_path / "out")
    assert caught.value.step == 1 and "pretrain.common.temperature = 1e-320" in str(caught.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "work" / "checkpoint" / "state.json").exists()


def _finetune(tiny_bert_dir, plant, tmp_path=None, **overrides):
    from transformers import AutoTokenizer

    from qac.models.biencoder import BiEncoder
    from qac.train.finetune import WorkCheckpoint, train_biencoder
    from qac.train.groups import GroupSampler, TrainingQuery

    topics = ["apple", "river", "violin", "glacier"]
    queries = [TrainingQuery(f"q{i}", f"about {t}", (f"d{i}",), (f"n{i}",)) for i, t in enumerate(topics)]
    passage_text = {f"d{i}": f"{t} {t} facts" for i, t in enumerate(topics)}
    passage_text.update({f"n{i}": f"unrelated filler number {i}" for i in range(4)})
    settings = finetune_settings(**{"log_every": 1, "loader_workers": 0, "query_max_len": 8, "passage_max_len": 8,
                                    "train_n_passages": 2, "batch_size": 2, "epochs": 3, "lr": 1e-3,
                                    "max_grad_norm": 1.0, "seed": 0, **overrides})
    checkpoint = (WorkCheckpoint(tmp_path / "work", every=2, fingerprint="f") if tmp_path is not None else None)
    model = plant(BiEncoder.from_pretrained(tiny_bert_dir))
    return train_biencoder(model, AutoTokenizer.from_pretrained(tiny_bert_dir),
                           GroupSampler(queries, sorted(passage_text), 1, seed=0), passage_text, settings,
                           checkpoint=checkpoint)


@pytest.mark.parametrize("what", ["loss", "gradient"])
def test_fine_tuning_stops_at_the_first_non_finite_step(tiny_bert_dir, tmp_path, what):
    with poisoned(what, from_step=3) as plant:
        with pytest.raises(NonFiniteTraining) as caught:
            _finetune(tiny_bert_dir, plant, tmp_path)
    assert caught.value.step == 3 and f"fine-tune: the {what} at step 3" in str(caught.value)
    assert "finetune.lr = 0.001" in str(caught.value)
    assert json.loads((tmp_path / "work" / "state.json").read_text())["step"] == 2


def test_fine_tuning_logs_the_losses_it_checked(tiny_bert_dir):
    with poisoned("loss", from_step=10 ** 6) as plant:          # never planted
        losses = _finetune(tiny_bert_dir, plant)
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses)


def test_the_zero_shot_recipe_names_its_scale():
    from qac.train.finetune import setting_key

    assert setting_key("beir_retriever", "temperature") == "beir_retriever.scale (1 / temperature)"
    assert setting_key("beir_retriever", "lr") == "beir_retriever.lr"


@pytest.mark.parametrize("what", ["loss", "gradient"])
def test_the_query_generator_training_stops_at_the_first_non_finite_step(what):
    from qac.querygen.generator_pairs import Pair
    from qac.querygen.train_generator import build_generator, train_generator

    model, tokenizer = build_generator("prefix_lm", "tiny:minilm", seed=0)
    pairs = [Pair(f"passage number {i} about rivers", f"river {i}", "query", f"q{i}", f"d{i}") for i in range(8)]
    settings = generator_training_settings(batch_size=2, epochs=2, max_source_len=12, max_target_len=6,
                                           eval_every=0, log_every=1, lr=1e-3)
    with poisoned(what, from_step=2) as plant:
        with pytest.raises(NonFiniteTraining) as caught:
            train_generator(plant(model), tokenizer, pairs, settings, torch.device("cpu"))
    assert caught.value.step == 2 and f"query generator: the {what} at step 2" in str(caught.value)
    assert "query_generator.lr = 0.001" in str(caught.value)


def test_a_non_finite_pretrain_stage_ends_failed_in_one_paragraph(tmp_path, monkeypatch, mlflow_store, capsys):
    import mlflow

    import qac.models.factory
    from qac.config import render_profile, write_params
    from qac.console import call_main
    from stages import load_stage

    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["mlflow"]["system_metrics"] = False
    params["pretrain"]["common"].update(steps=3, batch_size=4, checkpoint_every=1, log_every=1, max_len=32)
    write_corpus(tmp_path / "data" / "smoke", documents=4, spans=3, queries=4)
    write_params(params, tmp_path / "params.yaml")
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))
    monkeypatch.delenv("QAC_VERBOSE", raising=False)
    build = qac.models.factory.build_pretraining_model
    with poisoned("loss", from_step=2) as plant:
        monkeypatch.setattr(qac.models.factory, "build_pretraining_model",
                            lambda *args, **kwargs: plant(build(*args, **kwargs)))
        status = call_main(load_stage("pretrain").main, ["--variant", "cotmae-query-q4"], "pretrain")
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert "the loss at step 2 is not a finite number" in err
    root = tmp_path / "data" / "smoke"
    assert not (root / "pretrain" / "cotmae-query-q4").exists()
    assert not (root / ".runs" / "pretrain" / "cotmae-query-q4").exists()
    mlflow.set_tracking_uri(mlflow_store)
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string="tags.`qac.stage` = 'pretrain@cotmae-query-q4'")
    assert [run.info.status for run in runs] == ["FAILED"]
