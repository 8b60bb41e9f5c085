"""The BERT encoder with its MLM head, shared by coCondenser and CoT-MAE.

A pre-training model owns ``bert`` (a ``BertModel``, the part that is exported
and fine-tuned) and ``lm_head`` (BERT's MLM head, tied to the word
embeddings), plus its method's extra modules. :class:`PretrainingModel` is the
interface the training loop sees: ``forward(batch)`` returns a
:class:`PretrainOutput`, ``mask_ratios`` says how the collator masks the two
sides of a pair, and ``save_encoder`` writes the Hugging Face folder that
fine-tuning starts from (heads and decoders are dropped).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import torch
from torch import nn

from qac.io import atomic_path


@dataclass
class PretrainOutput:
    loss: torch.Tensor                 # what this process back-propagates (see qac.models.losses)
    parts: dict[str, torch.Tensor]     # global value of the total and of each term, detached


def load_backbone(spec: str, seed: int = 0, dropout: float | None = None) -> tuple[nn.Module, nn.Module]:
    """``(BertModel, MLM head)`` from a model spec (``qac.models.loading``).

    The encoder keeps the checkpoint's pooler so the exported folder loads
    without newly initialised weights; the pooler takes no part in
    pre-training and is frozen. The MLM head comes from the checkpoint when it
    has one (bert-base-uncased, Luyu/condenser) and is initialised with
    ``seed`` otherwise (sentence-transformers checkpoints ship no head); its
    output projection is tied to the word embeddings, as in BERT. ``dropout``
    replaces the checkpoint's dropout probabilities (0 makes a run
    deterministic across process layouts, which the tests need).
    """
    from transformers import BertForMaskedLM, BertModel

    # here, not at the top: it loads safetensors
    from qac.models.loading import load_model

    overrides = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        bert = load_model(spec, BertModel, seed=seed, **overrides)
        lm_head = load_model(spec, BertForMaskedLM, seed=seed, **overrides).cls
    if bert.config.model_type != "bert":
        raise ValueError(f"{spec}: pre-training needs a BERT encoder, got model_type {bert.config.model_type!r}")
    lm_head.predictions.decoder.weight = bert.embeddings.word_embeddings.weight
    if bert.pooler is not None:
        bert.pooler.requires_grad_(False)
    return bert, lm_head


def new_layers(config, count: int, seed: int, attn_implementation: str | None = "sdpa",
               init: str = "bert") -> nn.ModuleList:
    """``count`` freshly initialised BERT layers (condenser head, CoT-MAE decoder).

    Attention runs through PyTorch's scaled_dot_product_attention (fused
    kernels on a GPU) with the boolean masks of :func:`padding_mask` and
    ``qac.models.cotmae.windowed_causal_mask``; ``"eager"`` runs the same
    mathematics as explicit products (tests compare the two).
    """
    from transformers import BertModel
    from transformers.models.bert.modeling_bert import BertLayer

    config = copy.deepcopy(config)
    if attn_implementation:
        config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = nn.ModuleList([BertLayer(config) for _ in range(count)])
        if init == "bert":      # normal(0, initializer_range) weights, zero biases: BERT's own start
            initializer = BertModel(config, add_pooling_layer=False)
            layers.apply(initializer._init_weights)
        elif init != "torch":   # torch: the modules' own defaults (Kaiming-uniform Linear), MASTER's release
            raise ValueError(f"decoder init must be bert or torch, got {init!r}")
    return layers


def run_layers(layers: nn.ModuleList, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``hidden`` through ``layers``; ``mask`` is a boolean "may attend" mask (True: attend)."""
    if mask is not None and mask.dtype == torch.bool:
        mask = layer_mask(layers, mask, hidden.dtype if hidden.is_floating_point() else torch.float32)
    for layer in layers:
        output = layer(hidden, mask)
        hidden = output[0] if isinstance(output, tuple) else output
    return hidden


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``[B, 1, Q, K]`` boolean "may attend" mask as the additive float mask eager attention adds."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, 1, 1, K]`` boolean mask: every position may attend to the non-padding keys (True)."""
    return attention_mask[:, None, None, :].bool()


def encoder_mask(bert: nn.Module, attention_mask: torch.Tensor) -> torch.Tensor:
    """The 4-D mask to give ``bert`` for a ``[B, L]`` padding mask: boolean for SDPA, additive for eager.

    Given the 2-D mask, transformers asks the device whether it has any padding
    (to drop the mask where it has none), a host-device sync in every forward
    and a graph break under ``torch.compile``; a 4-D mask is used as it is.
    """
    allowed = padding_mask(attention_mask)
    implementation = getattr(bert.config, "_attn_implementation", "sdpa")
    if implementation == "eager":
        return additive_mask(allowed, bert.embeddings.word_embeddings.weight.dtype)
    return allowed if implementation == "sdpa" else attention_mask


def encoder_with_layer(bert: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``bert``'s last hidden states and the states after layer ``layer`` (0: the embeddings).

    What ``bert(..., output_hidden_states=True)`` gives, without the pooler
    (pre-training never reads it); transformers collects hidden states with
    hooks installed under a lock, which ``torch.compile`` cannot trace (a
    graph break per call), so the layers are run here one after the other.
    """
    hidden = bert.embeddings(input_ids=input_ids)
    mask = encoder_mask(bert, attention_mask)
    kept = hidden
    for index, block in enumerate(bert.encoder.layer, start=1):
        output = block(hidden, mask)
        hidden = output[0] if isinstance(output, tuple) else output
        if index == layer:
            kept = hidden
    return hidden, kept


def layer_mask(layers: nn.ModuleList, allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The mask ``layers`` take: boolean for SDPA, additive in ``dtype`` for eager attention."""
    if layers and layers[0].attention.self.config._attn_implementation == "eager":
        return additive_mask(allowed, dtype)
    return allowed


class PretrainingModel(nn.Module):
    """Interface of a pre-training model; subclasses define ``forward`` and ``mask_ratios``."""

    bert: nn.Module
    lm_head: nn.Module
    supports_grad_cache = False

    @property
    def mask_ratios(self) -> tuple[float, float]:
        """MLM mask ratio of the anchor and of the context side of a pair."""
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        """Settings of this model worth recording with a run."""
        return {}

    def save_encoder(self, path: str | os.PathLike, tokenizer=None) -> None:
        """Write the encoder alone as a Hugging Face ``BertModel`` folder (safetensors), atomically."""
        with atomic_path(path, directory=True) as tmp:
            self.bert.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
