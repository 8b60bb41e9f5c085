"""A trial trains retriever 1 as the fine-tuning stage does: the same document text, the same inputs."""

from __future__ import annotations

import pytest

from qac.config import render_profile, write_params
from qac.params import load_params
from test_finetune_stage import load_stage, shared_mlflow_store, study_dir  # noqa: F401  (fixture)


class Stop(Exception):
    """Raised where training would start: what it was handed is all a test needs."""


def test_a_trial_trains_on_the_documents_the_fine_tuning_stage_trains_on(tmp_path, tiny_bert_dir,
                                                                         shared_mlflow_store, monkeypatch):  # noqa: F811
    """With finetune.title_join: sep the stage reads ``title[SEP]text``; a trial used to join with a space."""
    from qac.hpo.trial_job import run_trial
    from qac.train import finetune

    handed: list[dict] = []

    def capture(model, tokenizer, sampler, passage_text, settings, **options):
        handed.append(dict(passage_text))
        raise Stop

    monkeypatch.setattr(finetune, "train_biencoder", capture)
    root = tmp_path / "study"
    with study_dir(root, tiny_bert_dir) as params:
        params["finetune"]["title_join"] = "sep"
        write_params(params, root / "params.yaml")
        with pytest.raises(Stop):
            load_stage("finetune").main(["--variant", "none"])
        with pytest.raises(Stop):
            run_trial(load_params(root / "params.yaml"), tmp_path / "trial")
    stage_texts, trial_texts = handed
    assert stage_texts["d0"] == "Apple[SEP]A passage on apple orchard harvest."   # title, [SEP], body
    assert stage_texts["x0"] == "Another note mentioning orchard briefly."       # no title: the body alone
    assert trial_texts == stage_texts


def test_a_master_trial_checks_the_inputs_master_pre_training_reads(tmp_path, capsys):
    """A MASTER ``hpo.variant`` used to pass the input check and stop later, in ``master_batches``."""
    from qac.cli import main

    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["hpo"]["variant"] = "master-passage"
    write_params(params, tmp_path / "params.yaml")
    assert main(["hpo", "--params", str(tmp_path / "params.yaml")]) == 2
    out = capsys.readouterr().out
    root = tmp_path / "data" / "smoke"
    for path, stage in ((root / "continuations.arrow", "generate_continuations"),
                        (root / "word_frequencies.json", "word_frequencies"),
                        (root / "passages.arrow", "split_passages")):
        assert f"  {path}: missing (written by the DVC stage {stage}" in out
