"""The fine-tuning loop of a bi-encoder retriever (Tevatron style).

One optimizer step takes ``batch_size`` training groups (the *global* batch);
under ``torchrun`` each of the W processes encodes a contiguous 1/W of them,
and :meth:`BiEncoder.compute_loss` gathers the representations so the loss is
the one a single process would compute on the whole batch. The order of the
groups comes from :class:`GroupSampler`, identical on every process.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from qac.errors import UserError
from qac.train.biencoder import BiEncoder
from qac.train.groups import GroupSampler, TrainingGroup, TrainingQuery
from qac.train.optim import build_optimizer


@dataclass(frozen=True)
class FinetuneSettings:
    query_max_len: int = 32
    passage_max_len: int = 144
    corpus_max_len: int | None = None   # corpus encoding and retriever 1's passages; None: passage_max_len
    train_n_passages: int = 16      # per query: 1 positive + (n - 1) hard negatives
    batch_size: int = 64            # queries per optimizer step, over all processes
    lr: float = 2e-5
    epochs: int = 3
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0      # Tevatron trains with the HF Trainer, which clips at 1.0
    temperature: float = 1.0
    pooling: str = "cls"
    dtype: str = "auto"             # autocast dtype on GPU; CPU always runs fp32
    seed: int = 42
    log_every: int = 1
    incomplete_batch: str = "error"  # queries that do not fill a last whole batch: error | drop (counted)

    @classmethod
    def from_params(cls, section: Mapping[str, Any], seed: int) -> "FinetuneSettings":
        """Settings from the ``finetune`` params section (the stage's other keys, mining depths and the
        query cap, are read by the stage; the schema has checked every key, qac.params_schema)."""
        known = {field.name for field in fields(cls)}
        values = {key: value for key, value in section.items() if key in known}
        return cls(**{**values, "seed": seed})

    @property
    def corpus_length(self) -> int:
        """Tokens of a corpus passage when it is encoded for mining or evaluation."""
        return self.corpus_max_len or self.passage_max_len

    def for_retriever(self, retriever: str) -> "FinetuneSettings":
        """The settings retriever ``r1`` or ``r2`` trains with: retriever 1's passages are cut at the
        corpus length (the release pre-tokenised its stage-1 file as the corpus), retriever 2's at
        ``passage_max_len``."""
        if retriever == "r1" and self.corpus_max_len:
            return replace(self, passage_max_len=self.corpus_max_len)
        return self

    @property
    def n_negatives(self) -> int:
        return self.train_n_passages - 1


def collate(groups: Sequence[TrainingGroup], passage_text: Mapping[str, str], tokenizer,
            settings: FinetuneSettings) -> tuple[dict, dict]:
    """Tokenize queries and their passage groups (positive first) into padded tensors."""
    queries = tokenizer([group.query for group in groups], max_length=settings.query_max_len,
                        truncation=True, padding=True, return_tensors="pt")
    passages = tokenizer([passage_text[doc_id] for group in groups for doc_id in group.passages],
                         max_length=settings.passage_max_len, truncation=True, padding=True,
                         return_tensors="pt")
    return dict(queries), dict(passages)


class IncompleteBatchError(ValueError, UserError):
    """The training queries do not fill whole batches of ``finetune.batch_size``."""


def steps_per_epoch(n_queries: int, batch_size: int) -> int:
    """Full global batches per epoch; a remainder is left out so every step has the same batch
    (:func:`check_whole_batches` decides beforehand whether that is allowed)."""
    if n_queries < batch_size:
        raise IncompleteBatchError(f"{n_queries} training queries are fewer than one batch of {batch_size} "
                                   "(finetune.batch_size): lower finetune.batch_size")
    return n_queries // batch_size


def check_whole_batches(n_queries: int, settings: "FinetuneSettings", where: str = "fine-tuning") -> int:
    """How many of ``n_queries`` training queries whole batches leave out (0 when they divide).

    Under ``incomplete_batch: error`` a remainder stops the stage before any model is loaded, with the
    counts and the settings to change; under ``drop`` the caller reports the number left out.
    """
    batch = settings.batch_size
    if n_queries < batch:
        raise IncompleteBatchError(f"{where}: {n_queries} training queries are fewer than one batch of {batch} "
                                   "(finetune.batch_size): lower finetune.batch_size")
    left_out = n_queries % batch
    if left_out and settings.incomplete_batch != "drop":
        fitting = n_queries - left_out
        divisors = [d for d in range(batch - 1, 0, -1) if n_queries % d == 0][:1]
        raise IncompleteBatchError(
            f"{where}: {n_queries} training queries do not fill whole batches of {batch} (finetune.batch_size): "
            f"{n_queries // batch} batches would leave {left_out} queries out. Set finetune.batch_size to a divisor "
            f"of {n_queries}{f' (e.g. {divisors[0]})' if divisors else ''}, finetune.max_train_queries to {fitting}, "
            "or finetune.incomplete_batch: drop to leave them out knowingly")
    return left_out


StepCallback = Callable[[int, dict[str, float]], None]


def train_biencoder(
    model: BiEncoder,
    tokenizer,
    sampler: GroupSampler,
    passage_text: Mapping[str, str],
    settings: FinetuneSettings,
    *,
    device: torch.device | str = "cpu",
    rank: int = 0,
    world_size: int = 1,
    on_step: StepCallback | None = None,
) -> list[float]:
    """Fine-tune ``model`` in place; returns the global loss of every step.

    ``on_step(step, {"loss", "lr", "epoch"})`` is called after each logged step
    (every ``log_every``) on every process; callers log on rank 0 only.
    """
    if settings.batch_size % world_size:
        raise ValueError(f"batch_size {settings.batch_size} is not divisible by {world_size} processes")
    if sampler.n_negatives != settings.n_negatives:
        raise ValueError(f"sampler draws {sampler.n_negatives} negatives, settings ask for {settings.n_negatives}")
    from qac.distributed import autocast_dtype

    device = torch.device(device)
    torch.manual_seed(settings.seed)
    model.to(device).train()
    trained = model
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    check_whole_batches(len(sampler), settings)
    per_epoch = steps_per_epoch(len(sampler), settings.batch_size)
    total_steps = per_epoch * settings.epochs
    optimizer, scheduler = build_optimizer(model, lr=settings.lr, weight_decay=settings.weight_decay,
                                           warmup_ratio=settings.warmup_ratio, total_steps=total_steps,
                                           device=device)
    amp_dtype = autocast_dtype(settings.dtype, device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    local = settings.batch_size // world_size

    from qac.console import progress

    losses: list[float] = []
    step = 0
    bar = progress(total=total_steps, desc="fine-tune", unit="step", rank=rank)
    for epoch in range(settings.epochs):
        groups = sampler.epoch(epoch)
        for index in range(per_epoch):
            start = index * settings.batch_size + rank * local
            queries, passages = collate(groups[start:start + local], passage_text, tokenizer, settings)
            queries = {key: value.to(device) for key, value in queries.items()}
            passages = {key: value.to(device) for key, value in passages.items()}
            autocast = (torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype
                        else contextlib.nullcontext())
            with autocast:
                loss = trained(queries, passages)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if settings.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            lr = scheduler.get_last_lr()[0]
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            global_loss = loss.item() / world_size  # compute_loss scales by W for DDP's averaging
            losses.append(global_loss)
            bar.update(1)
            bar.set_postfix(loss=f"{global_loss:.3f}", refresh=False)
            if on_step is not None and (step % settings.log_every == 0 or step == total_steps):
                on_step(step, {"loss": global_loss, "lr": lr, "epoch": epoch + (index + 1) / per_epoch})
    bar.close()
    model.eval()
    return losses


def fine_tune_retriever(
    start: str | Path,
    queries: Sequence[TrainingQuery],
    corpus_ids: Sequence[str],
    passage_text: Mapping[str, str],
    settings: FinetuneSettings,
    **train_options: Any,
) -> tuple[BiEncoder, Any, list[float]]:
    """Load the encoder at ``start`` (folder or model spec), fine-tune it on ``queries``; ``(model, tokenizer, losses)``.

    ``train_options`` go to :func:`train_biencoder` (device, rank, world_size, on_step).
    """
    from qac.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(start))
    model = BiEncoder.from_pretrained(start, pooling=settings.pooling, temperature=settings.temperature)
    sampler = GroupSampler(queries, corpus_ids, settings.n_negatives, settings.seed)
    losses = train_biencoder(model, tokenizer, sampler, passage_text, settings, **train_options)
    return model, tokenizer, losses
