"""The bi-encoder: pooling, InfoNCE with in-batch and hard negatives, shared weights, save/load."""

from __future__ import annotations

import math

import pytest
import torch

from qac.train.biencoder import BiEncoder, infonce_loss, pool


def test_infonce_equals_hand_computed_cross_entropy():
    # 2 queries, groups of 2 passages: [q0 pos, q0 neg, q1 pos, q1 neg].
    queries = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    passages = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
    # scores q0: [1, 0, 1, 0.5], target 0; q1: [2, 2, 0, 1], target 2.
    q0 = -1 + math.log(math.exp(1) + math.exp(0) + math.exp(1) + math.exp(0.5))
    q1 = -0 + math.log(math.exp(2) + math.exp(2) + math.exp(0) + math.exp(1))
    assert infonce_loss(queries, passages).item() == pytest.approx((q0 + q1) / 2, abs=1e-6)


def test_infonce_temperature_divides_scores():
    queries = torch.tensor([[1.0, 0.0]])
    passages = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    expected = -1.0 + math.log(math.exp(1.0) + 1.0)  # scores 2, 0 divided by 2
    assert infonce_loss(queries, passages, temperature=2.0).item() == pytest.approx(expected, abs=1e-6)


def test_infonce_rejects_passages_that_do_not_form_groups():
    with pytest.raises(ValueError, match="groups"):
        infonce_loss(torch.zeros(2, 4), torch.zeros(3, 4))


def test_pooling_cls_takes_first_token_and_mean_ignores_padding():
    hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "cls").tolist() == [[1.0]]
    assert pool(hidden, mask, "mean").tolist() == [[2.0]]
    with pytest.raises(ValueError, match="pooling"):
        pool(hidden, mask, "max")


def test_query_and_passage_share_one_encoder(tiny_bert_dir):
    from transformers import AutoTokenizer

    model = BiEncoder.from_pretrained(tiny_bert_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    batch = dict(tokenizer(["the same text"], return_tensors="pt"))
    with torch.no_grad():
        assert torch.equal(model.encode_query(batch), model.encode_passage(batch))
        hidden = model.encoder(**batch).last_hidden_state
    assert torch.equal(model.encode_query(batch), hidden[:, 0])
    assert model.encoder.pooler is None  # unused by the retriever, dropped for DDP


def test_loss_gradient_reaches_the_encoder_and_save_load_round_trips(tiny_bert_dir, tmp_path):
    from transformers import AutoTokenizer

    model = BiEncoder.from_pretrained(tiny_bert_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    queries = dict(tokenizer(["q one", "q two"], return_tensors="pt", padding=True))
    passages = dict(tokenizer(["p1", "n1", "p2", "n2"], return_tensors="pt", padding=True))
    loss = model(queries, passages)
    loss.backward()
    grad = model.encoder.embeddings.word_embeddings.weight.grad
    assert loss.item() > 0 and grad is not None and grad.abs().sum() > 0

    model.eval().save(tmp_path / "enc", tokenizer)
    reloaded = BiEncoder.from_pretrained(tmp_path / "enc").eval()
    with torch.no_grad():
        assert torch.allclose(model.encode_passage(passages), reloaded.encode_passage(passages), atol=1e-6)
