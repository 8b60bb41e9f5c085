"""Values that cannot train are refused by the schema, naming the key and the reason."""

from __future__ import annotations

import pytest

from test_params_schema import edited, refused, smoke  # noqa: F401  (smoke is a fixture)


@pytest.mark.parametrize("edit, key, reason", [
    (lambda p: p["pretrain"]["common"].update(temperature=1e-320), "pretrain.common.temperature",
     "a temperature of at least 0.0001"),
    (lambda p: p["pretrain"]["variants"]["cocondenser-query-q1"].update(temperature=5e-5),
     "pretrain.variants.cocondenser-query-q1.temperature", "a temperature of at least 0.0001"),
    (lambda p: p["finetune"].update(temperature=1e-9), "finetune.temperature", "a temperature of at least 0.0001"),
    (lambda p: p["querygen"].update(temperature=1e-300), "querygen.temperature", "a temperature of at least"),
    (lambda p: p["beir_retriever"].update(scale=1e300), "beir_retriever.scale", "a scale of at most 10000"),
    (lambda p: p["pretrain"]["common"].update(lr=1e308), "pretrain.common.lr", "a learning rate of at most 1"),
    (lambda p: p["finetune"].update(lr=3.0), "finetune.lr", "a learning rate of at most 1"),
    (lambda p: p["query_generator"].update(lr=1e10), "query_generator.lr", "a learning rate of at most 1"),
    (lambda p: p["beir_retriever"].update(lr=2.0), "beir_retriever.lr", "a learning rate of at most 1"),
])
def test_a_temperature_or_learning_rate_that_cannot_train_is_refused_naming_the_key(tmp_path, smoke, edit, key,
                                                                                  reason):
    message = str(refused(edited(tmp_path, smoke, edit)))
    assert f"parameter {key}: expected {reason}" in message
    assert "float range" in message or "AdamW" in message      # the reason, not only the bound


@pytest.mark.parametrize("edit", [
    lambda p: p["pretrain"]["common"].update(temperature=1e-4),
    lambda p: p["finetune"].update(temperature=0.05, lr=1.0),
    lambda p: p["beir_retriever"].update(scale=1e4),
])
def test_the_bounds_themselves_are_allowed(tmp_path, smoke, edit):
    from qac.params import load_params

    load_params(edited(tmp_path, smoke, edit))


@pytest.mark.parametrize("edit, key", [
    (lambda p: p["pretrain"]["common"].update(max_len=1), "pretrain.common.max_len"),
    (lambda p: p["pretrain"]["common"].update(query_max_len=2), "pretrain.common.query_max_len"),
    (lambda p: p["pretrain"]["variants"]["cocondenser-query-q1"].update(query_max_len=2),
     "pretrain.variants.cocondenser-query-q1.query_max_len"),
    (lambda p: p["finetune"].update(passage_max_len=2), "finetune.passage_max_len"),
    (lambda p: p["finetune"].update(corpus_max_len=1), "finetune.corpus_max_len"),
    (lambda p: p["beir_retriever"].update(query_max_len=2), "beir_retriever.query_max_len"),
])
def test_a_length_that_holds_no_token_of_text_is_refused_naming_the_key(tmp_path, smoke, edit, key):
    message = str(refused(edited(tmp_path, smoke, edit)))
    assert f"parameter {key}: expected a length of at least 3 tokens" in message
    assert "[CLS] and [SEP]" in message         # the reason, not only the bound


def test_a_length_of_cls_one_token_and_sep_is_allowed(tmp_path, smoke):
    from qac.params import load_params

    load_params(edited(tmp_path, smoke, lambda p: (p["pretrain"]["common"].update(query_max_len=3),
                                                   p["finetune"].update(query_max_len=3))))
