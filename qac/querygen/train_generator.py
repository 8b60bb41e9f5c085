"""A query generator for the scaled-down profiles, fine-tuned on offline pairs.

The paper uses doc2query T5 (``doc2query/all-with_prefix-t5-base-v1``), which
needs the hub; mode ``pretrained`` saves such a model unchanged. Mode
``train`` fine-tunes on :mod:`qac.querygen.generator_pairs` one of two architectures
built from the encoder named by ``query_generator.model``
(``query_generator.architecture``):

- ``prefix_lm``: the encoder itself as a prefix language model
  (:mod:`qac.querygen.prefix_lm`), every weight pretrained, with a copy bias;
- ``bert2bert``: an ``EncoderDecoderModel`` warm-started on both sides (the
  decoder gains randomly initialised cross-attention).

Training can stop early: every ``eval_every`` steps the mean loss on
validation pairs (never the pairs of the quality report) is measured, the
best weights are kept, and training ends after ``patience`` evaluations
without improvement. Every result is a folder that
:func:`qac.querygen.generate.load_generator` loads.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from qac.distributed import autocast_context
from qac.params.vocabulary import GENERATOR_ARCHITECTURES
from qac.querygen.generator_pairs import Pair
from qac.train.finite import check_step, suspects_of
from qac.console import progress
from qac.querygen.generate import load_generator
from qac.querygen.prefix_lm import build_prefix_lm


@dataclass(frozen=True)
class TrainSettings:
    prefix: str
    # (pair kind, input prefix): a pair of a listed kind reads its own prefix instead of ``prefix``, as
    # doc2query's all-with_prefix model tells its tasks apart ("text2query: ", "abstract2title: ", ...)
    kind_prefixes: tuple[tuple[str, str], ...]
    max_source_len: int
    max_target_len: int
    epochs: int
    batch_size: int
    lr: float
    warmup_ratio: float
    weight_decay: float
    log_every: int
    eval_every: int  # steps between validation losses (0: no validation, no early stopping)
    patience: int  # evaluations without improvement before stopping (0: never stop early)
    max_steps: int | None  # cap on optimizer steps (the schedule decays to zero at the cap)
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "TrainSettings":
        section = params["query_generator"]
        values = {field.name: section[field.name] for field in fields(cls) if field.name != "seed"}
        return cls(**{**values, "kind_prefixes": tuple(sorted(section["kind_prefixes"].items())),
                      "max_steps": section["max_steps"] or None}, seed=params["seed"])

    def source_prefix(self, kind: str) -> str:
        """The input prefix of a pair of ``kind``."""
        return dict(self.kind_prefixes).get(kind, self.prefix)


def build_generator(architecture: str, spec: str, seed: int = 0, copy_bias: bool = True,
                    dropout: float | None = None):
    """A trainable generator and its tokenizer (see the module docstring for the architectures).

    ``dropout`` replaces the checkpoint's dropout probabilities (None keeps them).
    """
    if architecture == "prefix_lm":
        model, tokenizer = build_prefix_lm(spec, seed=seed, copy_bias=copy_bias)
    elif architecture == "bert2bert":
        model, tokenizer = build_bert2bert(spec, seed=seed)
    else:
        raise ValueError(f"query_generator.architecture must be one of {', '.join(GENERATOR_ARCHITECTURES)}, "
                         f"got {architecture!r}")
    if dropout is not None:
        set_dropout(model, dropout)
    return model, tokenizer


def set_dropout(model: torch.nn.Module, probability: float) -> None:
    """Every dropout layer of ``model`` drops ``probability``; BERT configurations record it."""
    if not 0.0 <= probability < 1.0:
        raise ValueError(f"query_generator.dropout must be in [0, 1), got {probability}")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = probability
    for config in (model.config, getattr(model.config, "encoder", None), getattr(model.config, "decoder", None)):
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if config is not None and hasattr(config, field):
                setattr(config, field, probability)


def build_bert2bert(spec: str, seed: int = 0):
    """A bert2bert ``EncoderDecoderModel`` and tokenizer from a model spec, special tokens set.

    Hub names and folders warm-start both sides from the checkpoint;
    ``tiny:``/``scratch:`` specs build both sides from the configuration.
    """
    from transformers import AutoModel, AutoModelForCausalLM, EncoderDecoderModel

    # here, not at the top: it loads safetensors
    from qac.models.loading import ModelSpec, load_model, load_tokenizer

    parsed = ModelSpec.parse(spec)
    tokenizer = load_tokenizer(spec)
    if parsed.init == "pretrained":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)   # the decoder's new cross-attention weights
            model = EncoderDecoderModel.from_encoder_decoder_pretrained(
                parsed.source, parsed.source, encoder_revision=parsed.revision, decoder_revision=parsed.revision)
    else:
        encoder = load_model(spec, AutoModel, seed=seed)
        decoder = load_model(spec, AutoModelForCausalLM, seed=seed + 1, is_decoder=True, add_cross_attention=True)
        model = EncoderDecoderModel(encoder=encoder, decoder=decoder)
    set_special_tokens(model, tokenizer)
    return model, tokenizer


def set_special_tokens(model, tokenizer) -> None:
    """Decoding starts at [CLS] and ends at [SEP]; [PAD] pads (BERT's tokens, as doc2query-style bert2bert)."""
    ids = {"decoder_start_token_id": tokenizer.cls_token_id, "bos_token_id": tokenizer.cls_token_id,
           "eos_token_id": tokenizer.sep_token_id, "pad_token_id": tokenizer.pad_token_id}
    if None in ids.values():
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} lacks [CLS]/[SEP]/[PAD] tokens needed by bert2bert")
    for config in (model.config, model.generation_config):
        for key, value in ids.items():
            setattr(config, key, value)
    model.config.vocab_size = model.config.decoder.vocab_size


def encode_pairs(tokenizer, pairs: Sequence[Pair], settings: TrainSettings) -> dict[str, torch.Tensor]:
    """Padded source ids and labels (target tokens + [SEP], padding as -100)."""
    # here, not at the top: it loads numpy
    from qac.data.tokens import cut_texts

    sources = tokenizer(cut_texts([settings.source_prefix(p.kind) + p.source for p in pairs], settings.max_source_len),
                        truncation=True, max_length=settings.max_source_len, padding=True, return_tensors="pt",
                        return_token_type_ids=False)
    targets = tokenizer(cut_texts([p.target for p in pairs], settings.max_target_len), add_special_tokens=False,
                        truncation=True, max_length=settings.max_target_len - 1)["input_ids"]
    width = max(len(t) for t in targets) + 1
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    for row, ids in enumerate(targets):
        labels[row, :len(ids) + 1] = torch.tensor(ids + [tokenizer.sep_token_id])
    return {"input_ids": sources["input_ids"], "attention_mask": sources["attention_mask"], "labels": labels}


def validation_loss(model, tokenizer, pairs: Sequence[Pair], settings: TrainSettings, device,
                    autocast_dtype: torch.dtype | None = None) -> float:
    """Mean per-token cross-entropy of ``pairs`` (model in eval mode, no gradient)."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad(), autocast_context(device, autocast_dtype):
        for start in range(0, len(pairs), settings.batch_size):
            batch = encode_pairs(tokenizer, pairs[start:start + settings.batch_size], settings)
            batch = {key: value.to(device) for key, value in batch.items()}
            count = int((batch["labels"] != -100).sum())
            total += float(model(**batch).loss) * count
            tokens += count
    model.train(was_training)
    return total / tokens if tokens else float("nan")


def train_generator(model, tokenizer, pairs: Sequence[Pair], settings: TrainSettings, device,
                    autocast_dtype: torch.dtype | None = None,
                    log: Callable[[dict[str, float], int], None] | None = None,
                    validation: Sequence[Pair] = ()) -> dict[str, float]:
    """Fine-tune ``model`` on ``pairs`` (cross-entropy of the target given the source); the final figures.

    With ``validation`` pairs and ``settings.eval_every``, the weights with the
    lowest validation loss are the ones left in ``model``.
    """
    from transformers import get_linear_schedule_with_warmup

    model.to(device).train()
    steps_per_epoch = math.ceil(len(pairs) / settings.batch_size)
    total_steps = steps_per_epoch * settings.epochs
    if settings.max_steps:
        total_steps = min(total_steps, settings.max_steps)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=settings.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(settings.warmup_ratio * total_steps), total_steps)
    evaluate = bool(validation) and settings.eval_every > 0
    suspects = suspects_of(settings, lambda field: f"query_generator.{field}")
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)    # dropout
    step, recent, best, best_step, stale, best_state = 0, [], float("inf"), 0, 0, None
    bar = progress(total=total_steps, unit="step", desc="query generator")
    stop = False
    for epoch in range(settings.epochs):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        for start in range(0, len(order), settings.batch_size):
            batch = encode_pairs(tokenizer, [pairs[i] for i in order[start:start + settings.batch_size]], settings)
            batch = {key: value.to(device) for key, value in batch.items()}
            with autocast_context(device, autocast_dtype):
                # labels alone: the model shifts them right behind decoder_start_token_id
                loss = model(**batch).loss
            loss.backward()
            # The step's one read of the device (the logged loss): a NaN or infinite loss or gradient stops
            # the training before the update.
            recent.append(check_step("query generator", step + 1, loss, model.parameters(), suspects))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{recent[-1]:.3f}", refresh=False)
            if log and (step % settings.log_every == 0 or step == total_steps):
                log({"train/loss": sum(recent) / len(recent), "train/lr": scheduler.get_last_lr()[0],
                     "train/epoch": epoch + start / len(order)}, step)
                recent = []
            if evaluate and (step % settings.eval_every == 0 or step == total_steps):
                current = validation_loss(model, tokenizer, validation, settings, device, autocast_dtype)
                if log:
                    log({"validation/loss": current}, step)
                if current < best:
                    best, best_step, stale = current, step, 0
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                else:
                    stale += 1
                    stop = settings.patience > 0 and stale >= settings.patience
            if stop or step >= total_steps:
                stop = True
                break
        if stop:
            break
    bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    figures = {"train/steps": step}
    if evaluate:
        figures.update({"validation/best_loss": best, "validation/best_step": best_step})
    return figures


def load_pretrained_generator(name: str):
    """A hub or local seq2seq generator (mode ``pretrained``), unchanged."""
    return load_generator(name)


def save_generator(model, tokenizer, directory: str | Path) -> None:
    """Save model, tokenizer and generation config as one Hugging Face folder."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
