"""coCondenser: encoder MLM + condenser-head MLM + contrastive loss over pairs.

For each side of a pair the encoder (BERT) runs with whole-word-masked input.
Its last layer feeds the shared MLM head ("late MLM"). The condenser head, a
few fresh BERT layers, reads the last layer's [CLS] vector followed by the
token states of layer ``skip_from``: to predict the masked tokens it must get
the sequence's information through [CLS], which trains [CLS] as a bottleneck.
The [CLS] vectors of both sides enter the in-batch contrastive loss.

    loss = w * MLM + w * head MLM + contrastive

Both MLM terms average over the masked tokens of both sides of the global
batch; the contrastive term over its 2N sequences (qac.models.losses). The
MLM weight ``w`` is the one recipe difference of the loss
(``pretrain.common.cocondenser_loss_weights``): the paper's Eq. 7 weighs the
three terms 1:1:1 (``paper``, w = 1); the released gradient-cache code scales
each chunk's MLM losses by chunk / per-device batch while summing them over
chunks of both sides, so the released runs optimised 2:2:1 (``release``, w = 2;
see qac/deviations.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qac.data.streams import is_stream
from qac.models import unpadded
from qac.models.backbone import (PretrainingModel, PretrainOutput, encoder_with_layer, load_backbone, new_layers,
                                 padding_mask, run_layers)
from qac.models.losses import LossTerm, PairContrastiveLoss, masked_lm_sum, mean_over_processes

# pretrain.common.cocondenser_loss_weights -> weight of each MLM term (the contrastive term's is 1)
LOSS_WEIGHTS = {"paper": 1.0, "release": 2.0}


def mlm_weight(loss_weights: str) -> float:
    """The MLM terms' weight of a named recipe (``paper``: Eq. 7's 1:1:1, ``release``: 2:2:1)."""
    if loss_weights not in LOSS_WEIGHTS:
        raise ValueError(f"cocondenser_loss_weights must be one of {', '.join(LOSS_WEIGHTS)}, got {loss_weights!r}")
    return LOSS_WEIGHTS[loss_weights]


@dataclass
class SideOutput:
    cls: torch.Tensor           # [n, hidden] [CLS] vectors of the last layer
    mlm_sum: torch.Tensor       # summed MLM cross-entropy of the encoder
    head_mlm_sum: torch.Tensor  # summed MLM cross-entropy of the condenser head
    masked: torch.Tensor        # number of masked tokens


class CoCondenser(PretrainingModel):
    supports_grad_cache = True

    def __init__(self, bert, lm_head, *, n_head_layers: int = 2, skip_from: int = 6,
                 temperature: float = 1.0, mlm_probability: float = 0.15,
                 full_vocab_logits: bool = False, loss_weights: str = "paper", seed: int = 0):
        super().__init__()
        self.loss_weights = loss_weights
        self.mlm_weight = mlm_weight(loss_weights)
        n_layers = bert.config.num_hidden_layers
        if not 0 <= skip_from <= n_layers:
            raise ValueError(f"skip_from={skip_from} is not a layer of a {n_layers}-layer encoder")
        if n_head_layers < 1:
            raise ValueError(f"n_head_layers must be at least 1, got {n_head_layers}")
        self.bert = bert
        self.lm_head = lm_head
        self.head = new_layers(bert.config, n_head_layers, seed)
        self.contrastive = PairContrastiveLoss(temperature)
        self.skip_from = skip_from
        self.mlm_probability = mlm_probability
        self.full_vocab_logits = full_vocab_logits

    @classmethod
    def from_spec(cls, spec: str, seed: int = 0, dropout: float | None = None, **options) -> "CoCondenser":
        bert, lm_head = load_backbone(spec, seed, dropout)
        return cls(bert, lm_head, seed=seed, **options)

    @property
    def mask_ratios(self) -> tuple[float, float]:
        return self.mlm_probability, self.mlm_probability

    def describe(self) -> dict[str, object]:
        return {"n_head_layers": len(self.head), "skip_from": self.skip_from, "loss_weights": self.loss_weights,
                "temperature": self.contrastive.temperature, "mlm_probability": self.mlm_probability}

    def encode_side(self, side: dict[str, torch.Tensor]) -> SideOutput:
        """Encoder and condenser head over one side (or a chunk of it), padded or a token stream."""
        if is_stream(side):
            return self.encode_stream(side)
        last, skipped = encoder_with_layer(self.bert, side["input_ids"], side["attention_mask"], self.skip_from)
        mlm_sum, masked = masked_lm_sum(self.lm_head, last, side, self.full_vocab_logits)
        head_input = torch.cat([last[:, :1], skipped[:, 1:]], dim=1)
        head_output = run_layers(self.head, head_input, padding_mask(side["attention_mask"]))
        head_sum, _ = masked_lm_sum(self.lm_head, head_output, side, self.full_vocab_logits)
        return SideOutput(cls=last[:, 0], mlm_sum=mlm_sum, head_mlm_sum=head_sum, masked=masked)

    def encode_stream(self, side: dict) -> SideOutput:
        """:meth:`encode_side` on a token stream: ``[T, H]`` states, each sequence's [CLS] at its start."""
        last, skipped = unpadded.encode(self.bert, side, self.skip_from)
        mlm_sum, masked = masked_lm_sum(self.lm_head, last, side, self.full_vocab_logits)
        head_input = torch.where((side["position_ids"] == 0)[:, None], last, skipped)
        head_output = unpadded.run_bert_layers(self.head, head_input, unpadded.Stream.of(side))
        head_sum, _ = masked_lm_sum(self.lm_head, head_output, side, self.full_vocab_logits)
        return SideOutput(cls=unpadded.cls_vectors(last, side), mlm_sum=mlm_sum, head_mlm_sum=head_sum,
                          masked=masked)

    def represent(self, side: dict[str, torch.Tensor]) -> torch.Tensor:
        """The [CLS] vectors of a side alone: what the contrastive loss reads (gradient caching's first pass).

        The encoder draws its dropout masks first in :meth:`encode_side` too, so
        from the same generator state both give the same vectors.
        """
        if is_stream(side):
            return unpadded.cls_vectors(unpadded.encode(self.bert, side)[0], side)
        last, _ = encoder_with_layer(self.bert, side["input_ids"], side["attention_mask"], self.skip_from)
        return last[:, 0]

    def pair_loss(self, anchor: SideOutput, context: SideOutput) -> PretrainOutput:
        """The loss of a batch of pairs from the outputs of its two sides."""
        masked = anchor.masked + context.masked
        return self.combine(mean_over_processes(anchor.mlm_sum + context.mlm_sum, masked),
                            mean_over_processes(anchor.head_mlm_sum + context.head_mlm_sum, masked),
                            self.contrastive(anchor.cls, context.cls))

    def combine(self, mlm: LossTerm, head_mlm: LossTerm, contrastive: LossTerm) -> PretrainOutput:
        weight = self.mlm_weight
        loss = weight * (mlm.backward + head_mlm.backward) + contrastive.backward
        parts = {"loss": weight * (mlm.value + head_mlm.value) + contrastive.value, "mlm": mlm.value,
                 "head_mlm": head_mlm.value, "contrastive": contrastive.value}
        return PretrainOutput(loss=loss, parts=parts)

    def forward(self, batch: dict, mode: str = "loss"):
        """``mode="loss"``: the full loss of a batch of pairs. ``mode="side"``: :meth:`encode_side`.

        The side mode exists for gradient caching under DDP, which synchronises
        gradients only for computations that went through the wrapped
        module's ``forward``.
        """
        if mode == "side":
            return self.encode_side(batch)
        return self.pair_loss(self.encode_side(batch["anchor"]), self.encode_side(batch["context"]))
