"""The bi-encoder: pooling, InfoNCE with in-batch and hard negatives, shared weights, save/load."""

from __future__ import annotations

import math

import pytest
import torch

from qac.models.biencoder import BiEncoder, infonce_loss, pool
from base_settings import finetune_settings


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

    model.eval().save(tmp_path / "enc", tokenizer, query_max_len=8, passage_max_len=16)
    reloaded = BiEncoder.from_pretrained(tmp_path / "enc").eval()
    with torch.no_grad():
        assert torch.allclose(model.encode_passage(passages), reloaded.encode_passage(passages), atol=1e-6)


def _toy_training(tiny_bert_dir, **overrides):
    from transformers import AutoTokenizer

    from qac.train.finetune import FinetuneSettings, train_biencoder
    from qac.train.groups import GroupSampler, TrainingQuery

    topics = ["apple", "river", "violin", "glacier", "solar", "chess", "coffee", "volcano"]
    queries = [TrainingQuery(f"q{i}", f"about {t}", (f"d{i}",), (f"n{i}",)) for i, t in enumerate(topics)]
    passage_text = {f"d{i}": f"{t} {t} facts" for i, t in enumerate(topics)}
    passage_text.update({f"n{i}": f"unrelated filler number {i}" for i in range(8)})
    settings = finetune_settings(**{"log_every": 1, "loader_workers": 0, "query_max_len": 8, "passage_max_len": 8, "train_n_passages": 2, "batch_size": 8,
                                   "epochs": 10, "lr": 1e-3, "warmup_ratio": 0.2, "seed": 0, **overrides})
    logged = []
    model = BiEncoder.from_pretrained(tiny_bert_dir)
    losses = train_biencoder(model, AutoTokenizer.from_pretrained(tiny_bert_dir),
                             GroupSampler(queries, sorted(passage_text), 1, seed=0), passage_text, settings,
                             on_step=lambda step, values: logged.append((step, values)))
    return losses, logged


def test_training_lowers_the_loss_and_follows_the_linear_schedule(tiny_bert_dir):
    losses, logged = _toy_training(tiny_bert_dir, epochs=20, warmup_ratio=0.1)
    assert len(losses) == 20  # 8 queries, global batch 8, 20 epochs
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3
    # 2 warm-up steps (0.1 x 20), then linear decay to 0; the lr logged is the one the step used.
    expected = [0.0, 0.5] + [(20 - s) / 18 for s in range(2, 20)]
    assert [step for step, _ in logged] == list(range(1, 21))
    assert [values["lr"] for _, values in logged] == pytest.approx([1e-3 * f for f in expected])
    assert [values["loss"] for _, values in logged] == losses


def test_fewer_training_queries_than_one_batch_is_an_error(tiny_bert_dir):
    with pytest.raises(ValueError, match="fewer than one batch"):
        _toy_training(tiny_bert_dir, batch_size=16)


def _realistic_groups(tiny_bert_dir, unpadded: bool = False):
    """Queries and passages of different lengths (some cut at the maximum), 3 epochs of groups."""
    from transformers import AutoTokenizer

    from qac.train.finetune import FinetuneSettings
    from qac.train.groups import GroupSampler, TrainingQuery

    words = "protein cell membrane signalling pathway receptor binding affinity assay cohort".split()
    passage_text = {f"d{i}": " ".join(words[j % len(words)] for j in range(i * 3 + 1)) for i in range(24)}
    queries = [TrainingQuery(f"q{i}", " ".join(words[: 1 + i % 9]) + f" number {i}?", (f"d{i}",), (f"d{23 - i}",))
               for i in range(12)]
    settings = finetune_settings(log_every=1, loader_workers=0, query_max_len=6, passage_max_len=20,
                                 train_n_passages=3, batch_size=4, epochs=3, seed=3, unpadded=unpadded)
    return AutoTokenizer.from_pretrained(tiny_bert_dir), GroupSampler(queries, sorted(passage_text), 2, seed=3), \
        passage_text, settings


@pytest.mark.parametrize("unpadded", [False, True], ids=["padded", "streams"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_loader_batches_equal_the_tokenizer_batches_at_any_worker_count(tiny_bert_dir, world_size, unpadded):
    """Padded, the tokenizer's batches; unpadded, those batches as token streams."""
    from qac.data.streams import token_stream
    from qac.train.finetune import collate, step_batches, step_loader, steps_per_epoch

    tokenizer, sampler, passage_text, settings = _realistic_groups(tiny_bert_dir, unpadded)

    def tokenized(groups):
        sides = collate(groups, passage_text, tokenizer, settings)
        return tuple(token_stream(side, settings.pad_to_multiple_of) for side in sides) if unpadded else sides

    per_epoch = steps_per_epoch(len(sampler), settings.batch_size)
    local = settings.batch_size // world_size
    for rank in range(world_size):
        batches = step_batches(sampler, passage_text, tokenizer, settings, per_epoch, rank, world_size)
        assert len(batches) == per_epoch * settings.epochs
        expected = []
        for epoch in range(settings.epochs):
            groups = sampler.epoch(epoch)
            for index in range(per_epoch):
                start = index * settings.batch_size + rank * local
                expected.append(tokenized(groups[start:start + local]))
        for workers in (0, 2):
            got = list(step_loader(batches, workers, 2, torch.device("cpu")))
            assert len(got) == len(expected)
            for (queries, passages), (want_queries, want_passages) in zip(got, expected):
                for side, want in ((queries, want_queries), (passages, want_passages)):
                    assert sorted(side) == sorted(want)
                    for key in want:
                        if isinstance(want[key], torch.Tensor):
                            assert torch.equal(side[key], want[key]), key
                        else:       # a stream's host layout and longest sequence
                            assert side[key] == want[key], key
    # the cut at the maximum length is exercised
    assert max(len(tokenizer(text)["input_ids"]) for text in passage_text.values()) > settings.passage_max_len


def test_training_with_loader_workers_gives_the_same_losses_and_logs_speed(tiny_bert_dir):
    losses, logged = _toy_training(tiny_bert_dir, epochs=3)
    workers, logged_workers = _toy_training(tiny_bert_dir, epochs=3, loader_workers=2, prefetch_batches=2)
    assert workers == losses
    for _, values in logged_workers:
        assert 0 < values["padding_efficiency"] <= 1 and values["tokens_per_second"] > 0
        assert 0 <= values["data_wait_share"] <= 1


class Killed(Exception):
    """Stands for a kill between two steps."""


def _checkpointed_training(tiny_bert_dir, checkpoint, kill_at=None, **overrides):
    """The toy training with a work checkpoint; ``kill_at``: stop right after that step is logged."""
    from transformers import AutoTokenizer

    from qac.train.finetune import train_biencoder
    from qac.train.groups import GroupSampler, TrainingQuery

    topics = ["apple", "river", "violin", "glacier", "solar", "chess", "coffee", "volcano"]
    queries = [TrainingQuery(f"q{i}", f"about {t}", (f"d{i}",), (f"n{i}",)) for i, t in enumerate(topics)]
    passage_text = {f"d{i}": f"{t} {t} facts" for i, t in enumerate(topics)}
    passage_text.update({f"n{i}": f"unrelated filler number {i}" for i in range(8)})
    settings = finetune_settings(**{"log_every": 1, "loader_workers": 0, "query_max_len": 8, "passage_max_len": 8,
                                    "train_n_passages": 2, "batch_size": 4, "epochs": 4, "lr": 1e-3,
                                    "warmup_ratio": 0.2, "seed": 0, **overrides})
    logged = []

    def on_step(step, values):
        logged.append((step, values["loss"], values["lr"]))
        if step == kill_at:
            raise Killed(step)

    model = BiEncoder.from_pretrained(tiny_bert_dir)          # dropout on: the generator state matters
    losses = train_biencoder(model, AutoTokenizer.from_pretrained(tiny_bert_dir),
                             GroupSampler(queries, sorted(passage_text), 1, seed=0), passage_text, settings,
                             on_step=on_step, checkpoint=checkpoint)
    return losses, logged, model


def test_a_killed_training_resumes_from_its_checkpoint_to_the_uninterrupted_losses_and_weights(tiny_bert_dir,
                                                                                              tmp_path, capsys):
    from qac.train.finetune import WorkCheckpoint

    losses, logged, model = _checkpointed_training(tiny_bert_dir, None)
    assert len(losses) == 8 and model.encoder.config.hidden_dropout_prob > 0

    checkpoint = WorkCheckpoint(tmp_path / "checkpoint", every=3, fingerprint="f1")
    with pytest.raises(Killed):
        _checkpointed_training(tiny_bert_dir, checkpoint, kill_at=5)        # the checkpoint of step 3 survives
    resumed, resumed_logged, resumed_model = _checkpointed_training(tiny_bert_dir, checkpoint, loader_workers=2)
    assert "resuming from step 3 of 8" in capsys.readouterr().err
    assert resumed == losses                         # the whole run's losses, the first three from the checkpoint
    assert resumed_logged == logged                  # steps 1-3 replayed, then 4-8 trained again
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, resumed_model.state_dict()[name]), name

    # a checkpoint of other settings or inputs is not resumed: the run starts over and says why
    other = WorkCheckpoint(tmp_path / "checkpoint", every=3, fingerprint="f2")
    again, _, _ = _checkpointed_training(tiny_bert_dir, other)
    assert again == losses and "settings or inputs changed" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated weights", "state without its losses"])
def test_a_damaged_work_checkpoint_is_discarded_and_training_starts_over(tiny_bert_dir, tmp_path, capsys, damage):
    import json

    from qac.train.finetune import WorkCheckpoint

    losses, _, _ = _checkpointed_training(tiny_bert_dir, None)
    checkpoint = WorkCheckpoint(tmp_path / "checkpoint", every=3, fingerprint="f1")
    with pytest.raises(Killed):
        _checkpointed_training(tiny_bert_dir, checkpoint, kill_at=5)
    if damage == "truncated weights":
        weights = checkpoint.directory / "model.pt"
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        state_file = checkpoint.directory / "state.json"
        state = json.loads(state_file.read_text())
        del state["losses"]
        state_file.write_text(json.dumps(state))
    capsys.readouterr()
    again, logged, _ = _checkpointed_training(tiny_bert_dir, checkpoint)
    err = capsys.readouterr().err
    assert "discarding the work checkpoint" in err and "damaged" in err and "resuming" not in err
    assert again == losses and [step for step, _, _ in logged] == list(range(1, 9))
