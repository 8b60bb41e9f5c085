"""The fine-tuning loop of a bi-encoder retriever (Tevatron style).

One optimizer step takes ``batch_size`` training groups (the *global* batch);
under ``torchrun`` each of the W processes encodes a contiguous 1/W of them,
and :meth:`BiEncoder.compute_loss` gathers the representations so the loss is
the one a single process would compute on the whole batch. The order of the
groups comes from :class:`GroupSampler`, identical on every process.

Texts are tokenised once per run (every query and every passage the epochs'
groups use, without special tokens); a ``torch.utils.data.DataLoader``
(``loader_workers`` processes, pinned memory) slices, wraps and pads the ids of
each step ahead of the step: the batches equal the tokenizer's own padded
batches, for any number of workers.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from qac.data.streams import is_stream, to_device, token_stream
from qac.errors import UserError
from qac.models.biencoder import BiEncoder
from qac.train.finite import check_step, suspects_of
from qac.train.groups import GroupSampler, TrainingGroup, TrainingQuery
from qac.train.optim import build_optimizer
from qac.console import progress
from qac.data.masking import round_up
from qac.data.tokens import SpecialTokens, TextEncoder, cut_texts, with_special_tokens
from qac.distributed import autocast_dtype
from qac.models.backbone import encoder_mask
from qac.models.losses import all_reduce_sum
from qac.retrieval.encode import pad_ids
from qac.train.checkpoint import DamagedCheckpoint, load_checkpoint, read_state, save_checkpoint
from qac.train.step_log import THROUGHPUT


@dataclass(frozen=True)
class FinetuneSettings:
    query_max_len: int
    passage_max_len: int
    corpus_max_len: int | None  # corpus encoding and retriever 1's passages; None: passage_max_len
    pad_to_multiple_of: int  # training batches padded to their longest rounded up to a multiple of this
    unpadded: bool  # training batches as token streams (qac.data.streams): no compute on padding
    train_n_passages: int  # per query: 1 positive + (n - 1) hard negatives
    batch_size: int  # queries per optimizer step, over all processes
    lr: float
    epochs: int
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float  # Tevatron trains with the HF Trainer, which clips at 1.0
    temperature: float
    pooling: str
    similarity: str  # dot | cosine (unit-length representations; the zero-shot recipe's MNRL)
    dtype: str  # autocast dtype on GPU; CPU always runs fp32
    seed: int
    log_every: int
    incomplete_batch: str  # queries that do not fill a last whole batch: error | drop (counted)
    loader_workers: int  # DataLoader processes padding steps ahead (0: in the loop; params: 2)
    prefetch_batches: int  # steps each loader process prepares ahead

    @classmethod
    def from_params(cls, section: Mapping[str, Any], seed: int) -> "FinetuneSettings":
        """Settings from the checked ``finetune`` params section (the stage's other keys, mining depths and
        the query cap, are read by the stage)."""
        return cls(**{field.name: section[field.name] for field in fields(cls) if field.name != "seed"}, seed=seed)

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
    queries = tokenizer(cut_texts([group.query for group in groups], settings.query_max_len),
                        max_length=settings.query_max_len, truncation=True, padding=True, return_tensors="pt")
    passages = tokenizer(cut_texts([passage_text[doc_id] for group in groups for doc_id in group.passages],
                                   settings.passage_max_len),
                         max_length=settings.passage_max_len, truncation=True, padding=True,
                         return_tensors="pt")
    return (widen(dict(queries), settings.pad_to_multiple_of, tokenizer.pad_token_id),
            widen(dict(passages), settings.pad_to_multiple_of, tokenizer.pad_token_id))


def widen(tensors: dict[str, torch.Tensor], multiple: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``[rows, L]`` tensors widened to a multiple of ``multiple`` (the tokenizer's own
    ``pad_to_multiple_of`` refuses a truncation length that is not one)."""
    extra = round_up(tensors["input_ids"].shape[1], multiple) - tensors["input_ids"].shape[1]
    if not extra:
        return tensors
    return {name: torch.nn.functional.pad(tensor, (0, extra), value=pad_id if name == "input_ids" else 0)
            for name, tensor in tensors.items()}


class FinetuneBatches(torch.utils.data.Dataset):
    """Item ``k``: ``(queries, passages)`` of global step ``k`` for process ``rank``, padded from stored ids.

    ``epochs`` are the sampler's group orders, one per epoch; ``query_ids`` maps a
    query text and ``passage_ids`` a document id to its ids without special tokens.
    The tensors equal :func:`collate`'s (same ``input_ids``, ``attention_mask`` and,
    where the tokenizer gives them, zero ``token_type_ids``).
    """

    def __init__(self, epochs: Sequence[Sequence[TrainingGroup]], per_epoch: int, world_size: int, rank: int,
                 query_ids: Mapping[str, Any], passage_ids: Mapping[str, Any], special, type_ids: bool,
                 settings: FinetuneSettings):
        self.epochs, self.per_epoch, self.rank = epochs, per_epoch, rank
        self.global_batch, self.local = settings.batch_size, settings.batch_size // world_size
        self.query_ids, self.passage_ids, self.special, self.type_ids = query_ids, passage_ids, special, type_ids
        self.query_max_len, self.passage_max_len = settings.query_max_len, settings.passage_max_len
        self.multiple = settings.pad_to_multiple_of
        self.unpadded = settings.unpadded

    def __len__(self) -> int:
        return self.per_epoch * len(self.epochs)

    def groups(self, step: int) -> Sequence[TrainingGroup]:
        epoch, index = divmod(step, self.per_epoch)
        start = index * self.global_batch + self.rank * self.local
        return self.epochs[epoch][start:start + self.local]

    def __getitem__(self, step: int):
        groups = self.groups(step)
        queries = [with_special_tokens(self.query_ids[group.query], self.query_max_len, self.special)
                   for group in groups]
        passages = [with_special_tokens(self.passage_ids[doc_id], self.passage_max_len, self.special)
                    for group in groups for doc_id in group.passages]
        return self._tensors(queries), self._tensors(passages)

    def _tensors(self, sequences) -> dict[str, torch.Tensor]:
        padded = pad_ids(sequences, self.special.pad_id, self.multiple)
        tensors = {"input_ids": torch.from_numpy(padded["input_ids"])}
        if self.type_ids:
            tensors["token_type_ids"] = torch.zeros_like(tensors["input_ids"])
        tensors["attention_mask"] = torch.from_numpy(padded["attention_mask"])
        if self.unpadded:
            return token_stream(tensors, self.multiple)
        return tensors


def step_batches(sampler: GroupSampler, passage_text: Mapping[str, str], tokenizer, settings: FinetuneSettings,
                 per_epoch: int, rank: int, world_size: int) -> FinetuneBatches:
    """The run's batches: every epoch's groups drawn, the texts they use tokenised once."""
    epochs = [sampler.epoch(epoch) for epoch in range(settings.epochs)]
    used = [groups[:per_epoch * settings.batch_size] for groups in epochs]
    query_texts = list(dict.fromkeys(group.query for groups in used for group in groups))
    doc_ids = list(dict.fromkeys(doc_id for groups in used for group in groups for doc_id in group.passages))
    encoder = TextEncoder(tokenizer)
    # Cut before tokenising: only the first max_len tokens are used (qac.data.tokens.CHARS_PER_TOKEN).
    query_ids = dict(zip(query_texts, encoder(cut_texts(query_texts, settings.query_max_len))))
    passage_ids = dict(zip(doc_ids, encoder(cut_texts([passage_text[doc_id] for doc_id in doc_ids],
                                                      settings.passage_max_len))))
    type_ids = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
    return FinetuneBatches(epochs, per_epoch, world_size, rank, query_ids, passage_ids, SpecialTokens.of(tokenizer),
                           type_ids, settings)


def step_loader(batches: FinetuneBatches, workers: int, prefetch: int, device: torch.device):
    """A DataLoader yielding ``batches`` in step order (``workers`` processes, pinned memory on CUDA)."""
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False, num_workers=workers,
                                       pin_memory=device.type == "cuda",
                                       prefetch_factor=prefetch if workers > 0 else None,
                                       persistent_workers=False, generator=torch.Generator())


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


def setting_key(section: str, field: str) -> str:
    """The params key of a :class:`FinetuneSettings` field read from ``section`` (``finetune``, or
    ``beir_retriever``, whose scale is the inverse temperature)."""
    if section == "beir_retriever" and field == "temperature":
        return "beir_retriever.scale (1 / temperature)"
    return f"{section}.{field}"


@dataclass(frozen=True)
class WorkCheckpoint:
    """Where a retriever's training keeps its work checkpoint (qac.train.checkpoint), how often it saves it,
    and the fingerprint of the settings and inputs a checkpoint must carry to be resumed."""

    directory: Path
    every: int          # optimizer steps between saves (0: no checkpoints)
    fingerprint: str
    run_id: str | None = None        # the tracking run saving it, linked from the run that resumes it
    on_resume: Callable[[dict[str, Any]], None] | None = None     # {"from_step", "previous_run_id"}, main only


def resume_state(checkpoint: WorkCheckpoint | None, rank: int) -> dict | None:
    """The checkpoint's ``state.json`` when it can be resumed; otherwise None (a stale or damaged one is said
    on the main process, and the run's first save replaces it)."""
    if checkpoint is None:
        return None
    state = read_state(checkpoint.directory)
    if state is None:
        return None
    if "damaged" not in state and not (isinstance(state.get("step"), int) and isinstance(state.get("losses"), list)
                                       and isinstance(state.get("history"), list)):
        state = {"damaged": f"{checkpoint.directory / 'state.json'} lacks its step, losses or logged steps"}
    if "damaged" not in state and state.get("fingerprint") == checkpoint.fingerprint:
        return state
    if rank == 0:
        why = f"it is damaged: {state['damaged']}" if "damaged" in state else "settings or inputs changed"
        print(f"fine-tune: discarding the work checkpoint in {checkpoint.directory}: {why}", file=sys.stderr)
    return None


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
    checkpoint: WorkCheckpoint | None = None,
    section_key: str = "finetune",
) -> list[float]:
    """Fine-tune ``model`` in place; returns the global loss of every step.

    ``on_step(step, {"loss", "lr", "epoch"})`` is called after each logged step
    (every ``log_every``) on every process; callers log on rank 0 only.
    ``checkpoint``: the work checkpoint is saved every ``checkpoint.every`` steps
    (model, optimizer, schedule, loss scale, every process's generator state,
    the losses so far); a run that finds one of its own fingerprint continues
    from it, first replaying its logged steps to ``on_step``, and computes what
    the uninterrupted run would have (the batches are a function of the step). ``section_key``: the params
    section the settings come from (``finetune``, ``beir_retriever``), named when a step is not finite.
    """
    if settings.batch_size % world_size:
        raise ValueError(f"batch_size {settings.batch_size} is not divisible by {world_size} processes")
    if sampler.n_negatives != settings.n_negatives:
        raise ValueError(f"sampler draws {sampler.n_negatives} negatives, settings ask for {settings.n_negatives}")

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
    # Scales fp16 losses; disabled (every call a no-op) otherwise, and kept in checkpoints either way.
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    # looked up when called: tests stand in for it
    from qac.train.throughput import ThroughputWindow, peak_flops

    losses: list[float] = []
    history: list[list] = []       # [step, logged values without throughput] of every logged step
    start = 0
    state = resume_state(checkpoint, rank)
    if state is not None:
        try:
            state = load_checkpoint(checkpoint.directory, model=model, optimizer=optimizer, scheduler=scheduler,
                                    scaler=scaler, device=device, rank=rank)
            start, losses, history = state["step"], list(state["losses"]), list(state["history"])
        except DamagedCheckpoint as damaged:      # every file is read before any state is set: start over
            if rank == 0:
                print(f"fine-tune: discarding the work checkpoint in {checkpoint.directory}: it is damaged "
                      f"({damaged})", file=sys.stderr)
            state, start, losses, history = None, 0, [], []
    if state is not None:
        if rank == 0:
            print(f"fine-tune: resuming from step {start} of {total_steps} ({checkpoint.directory})", file=sys.stderr)
            if checkpoint.on_resume is not None:
                checkpoint.on_resume({"from_step": start, "previous_run_id": state.get("mlflow_run_id")})
        if on_step is not None:
            for logged_step, values in history:
                on_step(logged_step, dict(values))

    batches = step_batches(sampler, passage_text, tokenizer, settings, per_epoch, rank, world_size)
    remaining = torch.utils.data.Subset(batches, range(start, total_steps))
    loader = iter(step_loader(remaining, settings.loader_workers, settings.prefetch_batches, device))
    _, peak = peak_flops(device)
    window = ThroughputWindow(peak)
    step = start
    stage, suspects = "fine-tune", suspects_of(settings, lambda field: setting_key(section_key, field))
    bar = progress(total=total_steps, initial=start, desc="fine-tune", unit="step", rank=rank)
    for epoch, index in (divmod(done, per_epoch) for done in range(start, total_steps)):
        waited = time.perf_counter()
        queries, passages = next(loader)
        window.waiting += time.perf_counter() - waited
        if window.flops_per_token is None:       # the run's first step: count a step's FLOPs once
            window.count_flops(model, {"queries": queries, "passages": passages}, local_step_flops)
        window.add_batch({"queries": queries, "passages": passages})
        queries, passages = to_device(queries, device), to_device(passages, device)
        autocast = (torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype
                    else contextlib.nullcontext())
        with autocast:
            loss = trained(queries, passages)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        # The step's one read of the device: a NaN or infinite loss or gradient stops the run before the
        # update; the fp16 scaler's infinite gradients are its own signal to skip a step.
        step_loss = check_step(stage, step + 1, loss, None if scaler.is_enabled() else model.parameters(), suspects)
        if settings.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        lr = scheduler.get_last_lr()[0]
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        window.steps += 1
        window.pairs += settings.batch_size
        losses.append(step_loss / world_size)       # compute_loss scales by W for DDP's averaging
        bar.update(1)
        if step % settings.log_every == 0 or step == total_steps:
            global_loss = losses[-1]
            bar.set_postfix(loss=f"{global_loss:.3f}", refresh=False)
            counts = all_reduce_sum(torch.tensor(window.counts(), dtype=torch.float64, device=device)).tolist()
            values = {"loss": global_loss, "lr": lr, "epoch": epoch + (index + 1) / per_epoch,
                      **window.report(*counts)}
            history.append([step, {key: value for key, value in values.items() if key not in THROUGHPUT}])
            if on_step is not None:
                on_step(step, values)
        if checkpoint is not None and checkpoint.every and step % checkpoint.every == 0 and step < total_steps:
            paused = time.perf_counter()
            save_checkpoint(checkpoint.directory, model=model, optimizer=optimizer, scheduler=scheduler,
                            scaler=scaler, step=step, data_position=step * settings.batch_size,
                            fingerprint=checkpoint.fingerprint, device=device, rank=rank,
                            extra={"losses": losses, "history": history, "mlflow_run_id": checkpoint.run_id})
            window.pause(time.perf_counter() - paused)     # throughput leaves checkpoint writing out
    bar.close()
    model.eval()
    return losses


def local_step_flops(replica, batch) -> None:
    """What one process's training step computes (its encoders forward and backward, its scores), for
    counting (qac.train.flops): the loss's gathering across processes moves vectors, no FLOPs to speak of.
    The encoder gets a 4-D mask: given the 2-D one it reads the mask's values, which meta tensors lack;
    pooling costs no products."""
    def vectors(side):
        if is_stream(side):
            return replica.encode(side)
        mask = encoder_mask(replica.encoder, side["attention_mask"])
        return replica.encoder(input_ids=side["input_ids"], attention_mask=mask).last_hidden_state[:, 0]

    scores = replica.compute_similarity(vectors(batch["queries"]), vectors(batch["passages"]))
    torch.nn.functional.cross_entropy(scores, torch.zeros(scores.shape[0], dtype=torch.long,
                                                          device=scores.device)).backward()


def start_retriever(start: str | Path, settings: FinetuneSettings) -> tuple[BiEncoder, Any]:
    """``(BiEncoder, tokenizer)`` of the encoder at ``start``, set up as ``settings`` train it (pooling,
    temperature, unit-length vectors for cosine similarity)."""
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(start))
    model = BiEncoder.from_pretrained(start, pooling=settings.pooling, temperature=settings.temperature,
                                      normalize=settings.similarity == "cosine")
    return model, tokenizer


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
    model, tokenizer = start_retriever(start, settings)
    sampler = GroupSampler(queries, corpus_ids, settings.n_negatives, settings.seed)
    losses = train_biencoder(model, tokenizer, sampler, passage_text, settings, **train_options)
    return model, tokenizer, losses
