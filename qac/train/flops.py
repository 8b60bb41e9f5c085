"""FLOPs of one training step, counted once per run with PyTorch's FLOP counter on a copy that holds no data.

A run counts them where its device's peak is known, for MFU and HFU (qac.train.throughput).

``6 x parameters x tokens`` is the usual estimate of a transformer step, and it
is wrong for these models in both directions: the word embeddings (a fifth of
BERT-base) cost nothing where they are looked up and the MLM heads project only
the masked rows, while a condenser head, CoT-MAE's or MASTER's decoders add
layers whose parameters are few for the work they do on every token. Counted
with ``torch.utils.flop_counter.FlopCounterMode`` (every matrix product and
attention, forward and backward), a step's FLOPs are what the device computes.

The count runs the step on a copy of the model whose parameters live on
PyTorch's meta device (shapes without data): it takes no device memory or time,
draws nothing from the generators, and does not depend on ``torch.compile``.
A token costs differently on each side of a batch (a passage through twelve
encoder layers, a query through a one-layer decoder), so the run's first step
is counted once whole and once with each side cut to one token: what the step
loses is that side's share, and its FLOPs per padded token scale that side in
every later step (qac.train.throughput). Products are linear in the tokens;
attention, a few percent of the work at these lengths, nearly so.
"""

from __future__ import annotations

import copy
from typing import Callable, Mapping

import torch

from qac.data.streams import StreamLayout, flat_targets, is_stream
from qac.data.masking import masked_targets

META = torch.device("meta")


def meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every parameter and buffer on the meta device (tied weights stay tied)."""
    memo: dict[int, object] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = torch.nn.Parameter(torch.empty_like(parameter, device=META),
                                                 requires_grad=parameter.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device=META)
    return copy.deepcopy(model, memo)


def on_meta(batch):
    """A (nested) dict of tensors moved to the meta device."""
    if isinstance(batch, Mapping):
        return {name: on_meta(value) for name, value in batch.items()}
    return batch.to(META) if isinstance(batch, torch.Tensor) else batch     # a stream's host layout as it is


def counted_flops(model: torch.nn.Module, batch, run: Callable[[torch.nn.Module, object], object]) -> float:
    """FLOPs of ``run(meta copy of model, batch on the meta device)``: forward and backward products."""
    from torch.utils.flop_counter import FlopCounterMode

    replica, meta_batch = meta_copy(model), on_meta(batch)
    with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
        run(replica, meta_batch)
    return float(counter.get_total_flops())


def padded_tokens(batch) -> int:
    """Positions of every sequence of a (nested) batch, padding included: what the device computes over."""
    if isinstance(batch, Mapping) and "attention_mask" in batch:
        return batch["attention_mask"].numel()
    if isinstance(batch, Mapping) and is_stream(batch):
        return batch["input_ids"].numel()
    return sum(padded_tokens(side) for side in batch.values())


def side_widths(batch) -> dict[str, int]:
    """Positions per sequence of each side: a padded side's width; a stream's tokens (its sequences cut to
    one token each is what :func:`cut_to_one_token` leaves, so its width is tokens / sequences)."""
    return {name: side["attention_mask"].shape[1] if "attention_mask" in side else
            side["input_ids"].numel() / max(1, side["cls_positions"].numel()) for name, side in batch.items()}


def side_tokens(side) -> int:
    return side["attention_mask"].numel() if "attention_mask" in side else side["input_ids"].numel()


def cut_to_one_token(side: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch side cut to its first position ([CLS]), its masked-position lists rebuilt to match."""
    if is_stream(side):
        return stream_of_first_tokens(side)
    width = side["attention_mask"].shape[1]
    cut = {name: tensor[:, :1] if tensor.dim() == 2 and tensor.shape[1] == width else tensor
           for name, tensor in side.items() if not name.startswith("mlm_")}
    if "labels" in cut:
        cut.update(masked_targets(cut["labels"]))
    return cut


def flops_per_side_token(model: torch.nn.Module, batch, run: Callable[[torch.nn.Module, object], object]
                         ) -> dict[str, float]:
    """Each side's FLOPs per padded token in the step ``run`` makes of ``batch``; the sides' shares add up to
    the step's count (what no side accounts for, such as the in-batch scores, spread over them pro rata)."""
    total = counted_flops(model, batch, run)
    share = {}
    for name, width in side_widths(batch).items():
        if width < 2:
            share[name] = 0.0
            continue
        lost = total - counted_flops(model, {**batch, name: cut_to_one_token(batch[name])}, run)
        share[name] = max(lost, 0.0) * width / (width - 1)       # the one token left costs about as much
    explained = sum(share.values())
    scale = total / explained if explained else 0.0
    return {name: share[name] * scale / max(1, side_tokens(batch[name])) for name in share}


def stream_of_first_tokens(side: Mapping) -> dict:
    """A stream cut to each sequence's [CLS]: as many one-token sequences (:func:`cut_to_one_token`)."""
    rows = side["cls_positions"].shape[0]
    device = side["input_ids"].device
    ones = torch.arange(rows + 1, dtype=torch.int32, device=device)
    cut = {"input_ids": side["input_ids"].index_select(0, side["cls_positions"]), "position_ids": torch.zeros(rows, dtype=torch.long, device=device),
           "sequence_ids": torch.arange(rows, device=device), "cu_seqlens": ones,
           "cls_positions": ones[:-1].long(), "max_seqlen": 1,
           "layout": StreamLayout((1,) * rows, (0,) * rows)}
    if "token_type_ids" in side:
        cut["token_type_ids"] = side["token_type_ids"].index_select(0, side["cls_positions"])
    if "labels" in side:
        cut["labels"] = torch.full((rows,), -100, dtype=torch.long, device=device)
        cut.update({name: value.to(device) for name, value in flat_targets(torch.full((rows,), -100)).items()})
    return cut
