"""The models' layers on a token stream (qac.data.streams): ``[T, H]`` states, variable-length attention.

The Hugging Face modules (BERT's embeddings and layers, GPT-2's blocks) hold
the weights and compute everything that acts token by token (products,
LayerNorm, GELU, dropout), which does not care whether tokens are laid out
``[B, L]`` or ``[T]``; only attention must keep each sequence to itself. It
runs by one of three kernels, the same mathematics:

- ``varlen``: FlashAttention over ``cu_seqlens`` (``torch.nn.attention.varlen``,
  CUDA; no dropout, so used where attention dropout is 0), also what a FLOP
  count on the meta device runs;
- ``jagged``: SDPA on a nested (jagged) tensor, one sequence per component
  (CUDA's fused kernels with dropout; the CPU's path: on the default
  profile's shapes a MiniLM coCondenser step costs what the padded one does);
- ``mask``: SDPA over the whole stream with a block-diagonal "same sequence"
  mask, ``[T, T]``: the reference the other kernels are tested against (its
  memory and time grow with ``T^2``: 4-5x the padded step on the CPU at 16
  pairs of up to 128 tokens).

The release decoder's window (each token sees its sequence's ``[CLS]`` and
itself with the ``window - 1`` tokens before it) runs apart, on any device:
each token's ``window + 1`` candidate keys gathered, ``[T, window + 1]``
scores, the ones outside the sequence masked; linear in ``T``.

``ATTENTION`` chooses (``auto``: varlen on CUDA without attention dropout,
jagged on CUDA with it and on the CPU, varlen on the meta device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
# Imported here, not where it is called: importing it registers its FLOP formulas with
# torch.utils.flop_counter, and a FlopCounterMode made before that import would count its attention as 0.
from torch.nn.attention.varlen import varlen_attn

from qac.data.masking import IGNORE_INDEX

KERNELS = ("auto", "varlen", "jagged", "mask")
ATTENTION = "auto"


@dataclass
class Stream:
    """The device tensors attention needs of a stream, and a bound on its longest sequence (a host int)."""

    sequence_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int

    @classmethod
    def of(cls, side: Mapping[str, Any]) -> "Stream":
        return cls(side["sequence_ids"], side["position_ids"], side["cu_seqlens"], side["max_seqlen"])

    def kernel(self, device: torch.device, dropout: float) -> str:
        if ATTENTION != "auto":
            return ATTENTION
        if device.type == "meta":
            return "varlen"
        if device.type == "cuda" and not dropout:
            return "varlen"
        return "jagged"

    def allowed(self) -> torch.Tensor:
        """``[T, T]`` "may attend": the same sequence."""
        return self.sequence_ids[:, None] == self.sequence_ids[None, :]

    def windowed(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float, scale: float,
                 window: int) -> torch.Tensor:
        """Attention of each token to its sequence's [CLS] and to itself and the ``window - 1`` tokens before
        it (the release decoder's mask, ``qac.models.cotmae.windowed_causal_mask``), ``[T, heads, D]``."""
        index = torch.arange(query.shape[0], device=query.device)
        start = self.cu_seqlens.long().index_select(0, self.sequence_ids)           # each token's [CLS]
        recent = index[:, None] - torch.arange(window, device=query.device)[None, :]   # t, t - 1, ...
        # [CLS] has a slot of its own: a recent key at the start (or before it) is left out
        valid = torch.cat([torch.ones_like(start[:, None], dtype=torch.bool), recent > start[:, None]], dim=1)
        keys = torch.cat([start[:, None], recent.clamp(min=0)], dim=1)               # [T, window + 1]
        scores = torch.einsum("thd,twhd->thw", query, key[keys]) * scale
        probabilities = scores.masked_fill(~valid[:, None, :], float("-inf")).softmax(dim=-1)
        probabilities = F.dropout(probabilities, dropout, training=dropout > 0)
        return torch.einsum("thw,twhd->thd", probabilities, value[keys])

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float, scale: float,
               window: int | None = None) -> torch.Tensor:
        """Attention of ``[T, heads, D]`` queries, keys and values within each sequence; ``[T, heads, D]``."""
        if window is not None:
            return self.windowed(query, key, value, dropout, scale, window)
        kernel = self.kernel(query.device, dropout)
        if kernel == "varlen":
            return varlen_attn(query, key, value, self.cu_seqlens, self.cu_seqlens, self.max_seqlen,
                               self.max_seqlen, scale=scale)
        if kernel == "jagged":
            def nested(tensor):
                return torch.nested.nested_tensor_from_jagged(tensor, offsets=self.cu_seqlens.long(),
                                                              max_seqlen=self.max_seqlen).transpose(1, 2)

            output = F.scaled_dot_product_attention(nested(query), nested(key), nested(value), dropout_p=dropout,
                                                    scale=scale)
            return output.transpose(1, 2).values()
        output = F.scaled_dot_product_attention(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
                                                attn_mask=self.allowed()[None], dropout_p=dropout, scale=scale)
        return output.transpose(0, 1)


def embed(bert, side: Mapping[str, Any]) -> torch.Tensor:
    """BERT's embeddings of a stream's tokens at their own positions, ``[T, H]``."""
    ids = side["input_ids"][None]
    types = side.get("token_type_ids")
    return bert.embeddings(input_ids=ids, position_ids=side["position_ids"][None],
                           token_type_ids=torch.zeros_like(ids) if types is None else types[None])[0]


def bert_layer(layer, hidden: torch.Tensor, stream: Stream) -> torch.Tensor:
    """A Hugging Face ``BertLayer`` (post-LayerNorm) on ``[T, H]`` states."""
    attention = layer.attention.self
    shape = (hidden.shape[0], attention.num_attention_heads, attention.attention_head_size)
    query, key, value = (project(hidden).view(shape) for project in (attention.query, attention.key, attention.value))
    dropout = attention.dropout.p if attention.training else 0.0
    context = stream.attend(query, key, value, dropout, attention.scaling)
    hidden = layer.attention.output(context.flatten(1), hidden)
    return layer.output(layer.intermediate(hidden), hidden)


def run_bert_layers(layers, hidden: torch.Tensor, stream: Stream) -> torch.Tensor:
    for layer in layers:
        hidden = bert_layer(layer, hidden, stream)
    return hidden


def encode(bert, side: Mapping[str, Any], keep_layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``bert``'s last states of a stream and those after layer ``keep_layer`` (0: the embeddings), ``[T, H]``."""
    if bert.config.model_type != "bert":
        raise ValueError(f"unpadded training runs a BERT encoder, got model_type {bert.config.model_type!r}")
    stream = Stream.of(side)
    hidden = embed(bert, side)
    kept = hidden
    for index, layer in enumerate(bert.encoder.layer, start=1):
        hidden = bert_layer(layer, hidden, stream)
        if index == keep_layer:
            kept = hidden
    return hidden, kept


def cls_vectors(hidden: torch.Tensor, side: Mapping[str, Any]) -> torch.Tensor:
    """``[B, H]``: each sequence's state at its start ([CLS])."""
    return hidden.index_select(0, side["cls_positions"])


def with_cls(hidden: torch.Tensor, side: Mapping[str, Any], vectors: torch.Tensor) -> torch.Tensor:
    """``hidden`` with each sequence's first state replaced by its row of ``vectors`` (a decoder's input)."""
    return hidden.index_copy(0, side["cls_positions"], vectors.to(hidden.dtype))


def gpt2_block(block, hidden: torch.Tensor, stream: Stream, window: int) -> torch.Tensor:
    """A Hugging Face ``GPT2Block`` (pre-LayerNorm) on ``[T, H]`` states under the release decoder's window."""
    attention = block.attn
    shape = (hidden.shape[0], attention.num_heads, attention.head_dim)
    query, key, value = (part.reshape(shape) for part in
                         attention.c_attn(block.ln_1(hidden)).split(attention.split_size, dim=-1))
    dropout = attention.attn_dropout.p if attention.training else 0.0
    context = stream.attend(query, key, value, dropout, getattr(attention, "scaling", attention.head_dim ** -0.5),
                            window=window)
    hidden = hidden + attention.resid_dropout(attention.c_proj(context.flatten(1)))
    return hidden + block.mlp(block.ln_2(hidden))


def next_token_labels(side: Mapping[str, Any]) -> torch.Tensor:
    """``[T]``: the next token of the same sequence, ``-100`` at each sequence's last token."""
    ids, sequence = side["input_ids"], side["sequence_ids"]
    following = torch.cat([ids[1:], ids[:1]])
    same = torch.cat([sequence[1:] == sequence[:-1], sequence[:1] != sequence[:1]])
    return torch.where(same, following, torch.full_like(ids, IGNORE_INDEX))


def pool(hidden: torch.Tensor, side: Mapping[str, Any], mode: str) -> torch.Tensor:
    """A retriever's vector per sequence: [CLS] (``cls``) or the mean of its tokens (``mean``)."""
    if mode == "cls":
        return cls_vectors(hidden, side)
    if mode != "mean":
        raise ValueError(f"unknown pooling {mode!r}")
    offsets = side["cu_seqlens"]
    lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(hidden.dtype)
    total = hidden.new_zeros(len(lengths), hidden.shape[1]).index_add(0, side["sequence_ids"], hidden)
    return total / lengths[:, None]
