"""Distributed pieces of the losses, checked without starting processes (qac.models.losses)."""

from __future__ import annotations

import pytest
import torch

from qac.models import losses


def test_own_rows_go_to_the_global_rank_slot_and_keep_their_gradient(monkeypatch):
    # Process 5 of 8 (two nodes of four processes) has local rank 1; its slot must be 5.
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(losses, "process_group", lambda: (5, 8))

    def fake_all_gather(slots, tensor):
        for rank, slot in enumerate(slots):
            slot.fill_(float(rank))

    monkeypatch.setattr(torch.distributed, "all_gather", fake_all_gather)
    local = torch.full((2, 3), 100.0, requires_grad=True)
    gathered = losses.gather_with_grad(local)
    assert gathered.shape == (16, 3)
    assert gathered[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 100, 100, 6, 6, 7, 7]
    gathered.sum().backward()
    assert torch.equal(local.grad, torch.ones(2, 3))


def test_world_size_scaling_turns_ddp_averaging_into_the_full_gradient(monkeypatch):
    # Two processes, each with one pair; the global loss L is computed on every
    # process with only its own rows carrying gradient. DDP averages the two
    # gradients of (2 * L): the result must be dL/d(all vectors).
    torch.manual_seed(0)
    anchors, contexts = torch.randn(2, 4), torch.randn(2, 4)
    loss_fn = losses.PairContrastiveLoss()
    full_a, full_c = anchors.clone().requires_grad_(), contexts.clone().requires_grad_()
    loss_fn(full_a, full_c).backward.backward()

    gathered_sources = []

    def fake_all_gather(slots, tensor):          # forward gathers anchors first, then contexts
        for slot, rows in zip(slots, gathered_sources.pop(0).split(1)):
            slot.copy_(rows)

    monkeypatch.setattr(torch.distributed, "all_gather", fake_all_gather)
    averaged_a, averaged_c = torch.zeros(2, 4), torch.zeros(2, 4)
    for rank in (0, 1):
        monkeypatch.setattr(losses, "process_group", lambda rank=rank: (rank, 2))
        gathered_sources[:] = [anchors, contexts]
        own_a = anchors[rank:rank + 1].clone().requires_grad_()
        own_c = contexts[rank:rank + 1].clone().requires_grad_()
        term = loss_fn(own_a, own_c)
        assert term.value.item() == pytest.approx(loss_fn.scores_loss(anchors, contexts).item())
        term.backward.backward()
        averaged_a[rank] = own_a.grad[0] / 2       # DDP's average over the two processes
        averaged_c[rank] = own_c.grad[0] / 2
    torch.testing.assert_close(averaged_a, full_a.grad)
    torch.testing.assert_close(averaged_c, full_c.grad)


def test_mean_over_processes_is_the_plain_mean_alone():
    term = losses.mean_over_processes(torch.tensor(6.0, requires_grad=True), torch.tensor(4))
    assert term.value.item() == pytest.approx(1.5) and term.backward.item() == pytest.approx(1.5)


def test_the_padded_vocabulary_gives_the_heads_loss_and_gradients():
    """The MLM head's vocabulary padded to a multiple of 64: the padding's logits are -inf, never a target,
    and the loss and every gradient are the unpadded head's (float64: to a few eps of their scale)."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=250, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)
    torch.manual_seed(0)
    head = BertForMaskedLM(config).cls.double()
    hidden = torch.randn(7, 16, dtype=torch.float64)
    labels = torch.tensor([0, 3, 249, 17, -100, 100, 5])
    logits = losses.vocabulary_logits(head, hidden)
    assert logits.shape == (7, 256) and torch.isneginf(logits[:, 250:]).all()
    eps = torch.finfo(torch.float64).eps
    unpadded = head(hidden)
    # The same products; a BLAS may block a 256-row matrix otherwise than a 250-row one (last bits).
    assert float((logits[:, :250] - unpadded).abs().max()) <= 16 * eps * float(unpadded.abs().max())
    results = []
    for logits_of in (losses.vocabulary_logits, lambda module, states: module(states)):
        head.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits_of(head, hidden), labels, ignore_index=-100, reduction="sum")
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in head.named_parameters()}))
    (padded_loss, padded_grads), (loss, grads) = results
    assert abs(float(padded_loss - loss)) <= 16 * eps * float(loss)
    scale = max(float(g.abs().max()) for g in grads.values())
    assert all(float((padded_grads[name] - grads[name]).abs().max()) <= 16 * eps * scale for name in grads)
