"""Baselines at their published strength: the untuned start encoder is evaluated the way its model was trained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qac.config import render_profile
from qac.params import validate_params
from qac.retrieval.dense import baseline_settings, start_encoder

REPO = Path(__file__).resolve().parent.parent


def test_the_default_profiles_start_encoder_is_evaluated_as_its_model_card_runs_it():
    params = validate_params(render_profile("default", REPO / "profiles"))
    assert start_encoder(params) == "minilm"
    settings = baseline_settings(params, "minilm")
    assert (settings["pooling"], settings["normalize"], settings["query_max_len"], settings["passage_max_len"]) == \
        ("mean", True, 256, 256)
    assert [(f["dataset"], f["split"], f["measure"], f["value"]) for f in settings["published"]] == \
        [("scifact", "test", "nDCG@10", 0.6451)]
    # The fine-tuned rows keep the profile's fine-tuning pooling: the methods pre-train the [CLS] bottleneck.
    assert params.finetune.pooling == "cls"


def test_a_model_the_params_do_not_describe_is_evaluated_as_fine_tuned():
    params = validate_params(render_profile("paper", REPO / "profiles"))
    assert start_encoder(params).partition("@")[0] == "bert-base-uncased"
    settings = baseline_settings(params, start_encoder(params))
    assert (settings["pooling"], settings["normalize"], settings["published"]) == ("cls", False, [])
    assert (settings["query_max_len"], settings["passage_max_len"]) == (32, 130)   # the release's corpus length


def test_normalised_encodings_have_unit_length_and_keep_their_direction(tiny_bert_dir):
    from transformers import AutoModel, AutoTokenizer

    from qac.retrieval.encode import encode_texts

    model, tokenizer = AutoModel.from_pretrained(tiny_bert_dir), AutoTokenizer.from_pretrained(tiny_bert_dir)
    texts = ["a short text", "a somewhat longer text about proteins and cells", "x"]
    raw = encode_texts(model, tokenizer, texts, max_length=16, pooling="mean")
    unit = encode_texts(model, tokenizer, texts, max_length=16, pooling="mean", normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_table1_shows_the_published_figure_beside_the_untuned_row(tmp_path):
    from dvc_study import RAW_PARAMS, study_params, write_study

    from qac.reporting.lineage import load_study
    from qac.reporting.render import cell_text, to_csv
    from qac.reporting.table_set import build_tables

    params = study_params(
        evaluate={"untuned_baseline": True}, finetune={"pooling": "cls", "query_max_len": 16, "passage_max_len": 64},
        pretrain={**RAW_PARAMS["pretrain"], "common": {**RAW_PARAMS["pretrain"]["common"], "init": "minilm"}},
        encoders={"minilm": {"pooling": "mean", "normalize": True, "query_max_len": 256, "passage_max_len": 256,
                             "published": [{"dataset": "scifact", "split": "test", "measure": "RR@10",
                                            "value": 0.8, "source": "a model card"}]}})
    root = write_study(tmp_path)
    table = build_tables(load_study(params, root), params)[0]
    row = "start encoder, not fine-tuned"
    cells = {column: table.cell(row, column) for column in table.columns}
    with_figure = [cell for cell in cells.values() if cell.published is not None]
    assert [cell.published for cell in with_figure] == [pytest.approx(80.0)]
    assert all(cell.paper is None for cell in cells.values())
    assert table.paper_rows[row] == "published: a model card"
    column = next(column for column, cell in cells.items() if cell.published is not None)
    assert cell_text(table, column, cells[column]).endswith("/ 80.0 published")
    assert "mean pooling, normalised, 256/256 tokens" in " ".join(table.notes)
    assert ",80.0," in to_csv(table)
