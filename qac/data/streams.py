"""Unpadded batch sides: a side's sequences laid end to end as one token stream.

A padded side is ``[B, L]`` with a padding mask; the models compute over all
``B x L`` positions, padding included (on MS MARCO's lengths about half of
them). A token stream holds only the real tokens, ``T`` of them, so every
product, LayerNorm and attention row is spent on a token:

- ``input_ids``, ``position_ids`` (0 at each sequence's start), ``sequence_ids``
  (which sequence a token belongs to) and ``token_type_ids`` when the padded
  side had them: ``[T]``;
- ``cu_seqlens`` ``[B + 1]`` (int32, the variable-length attention kernels'
  offsets) and ``cls_positions`` ``[B]``, where each sequence's [CLS] sits;
- ``labels`` ``[T]`` and the masked positions as one flat list into the
  stream, ``mlm_positions`` and ``mlm_labels`` ``[M]`` (labelled tokens in
  stream order, then ignored slots up to a multiple);
- ``max_seqlen``: the longest sequence rounded up to the padding multiple, a
  host int (the kernels take it as a bound; rounded, a compiled step sees few
  distinct values of it);
- ``layout``: the sequence lengths and masked counts on the host
  (:class:`StreamLayout`), so that a step can cut a stream into chunks
  without asking the device; the models never read it.

The stream is made from the padded side the collators build, so its tokens,
masks and labels are the padded side's own: the same pairs, the same masked
tokens, only the layout differs (qac.models.unpadded computes on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from qac.data.masking import IGNORE_INDEX, round_up

STREAM_KEY = "cu_seqlens"


@dataclass(frozen=True)
class StreamLayout:
    """What the host knows of a stream: each sequence's length and its count of labelled tokens."""

    lengths: tuple[int, ...]
    masked: tuple[int, ...]
    multiple: int = 1

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths, default=0)


def is_stream(side: Mapping[str, Any]) -> bool:
    return STREAM_KEY in side


def token_stream(side: Mapping[str, torch.Tensor], multiple: int = 1) -> dict[str, Any]:
    """The stream of a padded side (``input_ids``, ``attention_mask`` and optionally ``labels``,
    ``token_type_ids``); ``multiple`` rounds the masked-slot count up as the padded side's."""
    mask = side["attention_mask"].bool()
    rows, width = mask.shape
    lengths = mask.sum(dim=1)
    offsets = torch.zeros(rows + 1, dtype=torch.int32)
    offsets[1:] = lengths.cumsum(0)
    stream = {"input_ids": side["input_ids"][mask],
              "position_ids": torch.arange(width).expand(rows, width)[mask],
              "sequence_ids": torch.arange(rows)[:, None].expand(rows, width)[mask],
              "cu_seqlens": offsets, "cls_positions": offsets[:-1].long()}
    if "token_type_ids" in side:
        stream["token_type_ids"] = side["token_type_ids"][mask]
    masked = [0] * rows
    if "labels" in side:
        labels = side["labels"][mask]
        stream["labels"] = labels
        stream.update(flat_targets(labels, multiple))
        masked = (side["labels"] != IGNORE_INDEX).sum(dim=1).tolist()
    stream["layout"] = StreamLayout(tuple(lengths.tolist()), tuple(masked), multiple)
    stream["max_seqlen"] = round_up(stream["layout"].max_seqlen, multiple)
    return stream


def flat_targets(labels: torch.Tensor, multiple: int = 1) -> dict[str, torch.Tensor]:
    """``mlm_positions`` / ``mlm_labels`` of a stream's ``[T]`` labels: the labelled tokens in order, then
    ignored slots (position 0) up to a multiple of ``multiple`` (at least one slot)."""
    positions = torch.nonzero(labels != IGNORE_INDEX).flatten()
    slots = max(1, round_up(len(positions), multiple))
    padded = torch.zeros(slots, dtype=torch.long)
    padded[:len(positions)] = positions
    targets = torch.full((slots,), IGNORE_INDEX, dtype=labels.dtype)
    targets[:len(positions)] = labels[positions]
    return {"mlm_positions": padded, "mlm_labels": targets}


def stream_slice(side: Mapping[str, Any], first: int, last: int) -> dict[str, Any]:
    """Sequences ``first`` to ``last - 1`` of a stream, as a stream of their own (a gradient-cache chunk).

    The cut points are read from the host layout; on the device only slices
    and offsets, no op that reads the data. The chunk's masked slots are its
    labelled tokens exactly (the side's padding slots carry no loss).
    """
    layout: StreamLayout = side["layout"]
    start, stop = sum(layout.lengths[:first]), sum(layout.lengths[:last])
    masked_start, masked_stop = sum(layout.masked[:first]), sum(layout.masked[:last])
    chunk = {name: side[name][start:stop] for name in ("input_ids", "position_ids", "token_type_ids", "labels")
             if name in side}
    chunk["sequence_ids"] = side["sequence_ids"][start:stop] - first
    chunk["cu_seqlens"] = side["cu_seqlens"][first:last + 1] - start
    chunk["cls_positions"] = side["cls_positions"][first:last] - start
    if "mlm_positions" in side:
        if masked_stop > masked_start:
            chunk["mlm_positions"] = side["mlm_positions"][masked_start:masked_stop] - start
            chunk["mlm_labels"] = side["mlm_labels"][masked_start:masked_stop]
        else:       # one ignored slot, as flat_targets gives a side without labels
            chunk["mlm_positions"] = side["mlm_positions"][:1] * 0
            chunk["mlm_labels"] = torch.full_like(side["mlm_labels"][:1], IGNORE_INDEX)
    chunk["layout"] = StreamLayout(layout.lengths[first:last], layout.masked[first:last], layout.multiple)
    chunk["max_seqlen"] = round_up(chunk["layout"].max_seqlen, layout.multiple)
    return chunk


def stream_chunks(side: Mapping[str, Any], tokens: int) -> list[dict[str, Any]]:
    """A stream cut into the fewest runs of whole sequences that hold at most about ``tokens`` tokens each,
    of about equal size: ``k = ceil(T / tokens)`` runs, each cut where it passes its share ``T / k`` (a run
    can pass that share, and so ``tokens``, by less than one sequence). Equal runs, not full runs and a
    remainder: gradient caching keeps the last run's graph from its first pass, which saves most when
    that run is as large as the others."""
    lengths = side["layout"].lengths
    total = sum(lengths)
    count = max(1, -(-total // max(1, tokens)))
    chunks, first, held = [], 0, 0
    for index, length in enumerate(lengths):
        held += length
        if len(chunks) < count - 1 and held * count >= total * (len(chunks) + 1) and index + 1 < len(lengths):
            chunks.append(stream_slice(side, first, index + 1))
            first = index + 1
    if first < len(lengths):
        chunks.append(stream_slice(side, first, len(lengths)))
    return chunks


def to_device(side: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """A side's tensors moved to ``device`` (non-blocking); a stream's host values stay as they are."""
    return {name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
            for name, value in side.items()}


@dataclass
class UnpaddedCollator:
    """A pair collator whose sides come out as token streams (``pretrain.common.unpadded``)."""

    collator: Any
    multiple: int = 1

    def __call__(self, pairs, step: int) -> dict[str, dict[str, Any]]:
        return {name: token_stream(side, self.multiple) for name, side in self.collator(pairs, step).items()}
