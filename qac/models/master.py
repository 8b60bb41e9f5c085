"""MASTER: one bottlenecked encoder, several shallow decoders that each rebuild a masked text from its [CLS].

Zhou et al., "MASTER: Multi-task Pre-trained Bottlenecked Masked Autoencoders
are Better Dense Retrievers" (ECML-PKDD 2023). The encoder (BERT) reads the
anchor passage with ``mask_ratio`` (0.30) of its words masked and pays an MLM
loss. Each enabled decoder is ``decoder_layers`` (2) fresh bidirectional BERT
layers, discarded after pre-training, whose input is the encoder's last-layer
[CLS] vector in position 0 followed by the token embeddings (the encoder's
embedding layer) of its own aggressively masked text; it pays an MLM loss on
that text's masked tokens through the encoder's MLM head. The decoders share
the embeddings and the head, nothing else, and see nothing of the encoder but
its [CLS] vector, so each task's gradient reaches the encoder only through
that vector (and through the shared embeddings and head). The tasks
(:mod:`qac.data.master` builds their inputs):

- ``mkp`` masked keywords prediction: the anchor, words masked with TF-IDF weights;
- ``cmp`` complementary masked prediction: the anchor, exactly the words the encoder saw masked;
- ``npr`` next passage recovering: the pair's context (the next span, or a generated query);
- ``dor`` doc2query outputs recovering: k generated queries of the anchor, concatenated;
- ``gor`` GPT-2 outputs recovering: a causal LM's continuation of the anchor.

    loss = encoder MLM + sum over enabled decoders of weight[task] * decoder MLM

Each term is the mean over its masked tokens in the global batch
(qac.models.losses). The paper weights every term 1.
"""

from __future__ import annotations

import torch
from torch import nn

from qac.data.streams import is_stream
from qac.models import unpadded
from qac.models.backbone import PretrainingModel, PretrainOutput, encoder_mask, load_backbone, new_layers, run_layers
from qac.models.losses import masked_lm_sum, mean_over_processes
from qac.params.vocabulary import MASTER_TASKS


def bool_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, 1, 1, L]`` boolean "may attend" mask over the non-padding keys (what SDPA takes in any dtype)."""
    return attention_mask[:, None, None, :].bool()


class Master(PretrainingModel):
    def __init__(self, bert, lm_head, *, decoders=MASTER_TASKS, decoder_layers: int = 2,
                 weights: dict[str, float] | None = None, mask_ratio: float = 0.30,
                 decoder_mask_ratio: float = 0.50, full_vocab_logits: bool = False, seed: int = 0,
                 decoder_init: str = "bert"):
        super().__init__()
        decoders = tuple(decoders)
        unknown = [task for task in decoders if task not in MASTER_TASKS]
        if unknown or len(set(decoders)) != len(decoders):
            raise ValueError(f"master_decoders must be distinct names among {MASTER_TASKS}, got {list(decoders)}")
        if decoder_layers < 1:
            raise ValueError(f"master_decoder_layers must be at least 1, got {decoder_layers}")
        weights = {task: 1.0 for task in MASTER_TASKS} | dict(weights or {})
        if set(weights) - set(MASTER_TASKS):
            raise ValueError(f"master_weights: unknown task(s) {sorted(set(weights) - set(MASTER_TASKS))}")
        self.bert = bert
        self.lm_head = lm_head
        # In the fixed order of MASTER_TASKS, each decoder seeded by its task, so that turning one decoder
        # off leaves the others' initial weights as they were.
        self.tasks = tuple(task for task in MASTER_TASKS if task in decoders)
        self.decoders = nn.ModuleDict({
            task: new_layers(bert.config, decoder_layers, seed + 1 + MASTER_TASKS.index(task), attn_implementation="sdpa",
                             init=decoder_init)
            for task in self.tasks})
        self.decoder_init = decoder_init
        self.weights = {task: float(weights[task]) for task in self.tasks}
        self.decoder_layers = decoder_layers
        self.mask_ratio = mask_ratio
        self.decoder_mask_ratio = decoder_mask_ratio
        self.full_vocab_logits = full_vocab_logits

    @classmethod
    def from_spec(cls, spec: str, seed: int = 0, dropout: float | None = None, **options) -> "Master":
        bert, lm_head = load_backbone(spec, seed, dropout)
        if hasattr(bert, "set_attn_implementation"):
            bert.set_attn_implementation("sdpa")
        return cls(bert, lm_head, seed=seed, **options)

    @property
    def mask_ratios(self) -> tuple[float, float]:
        return self.mask_ratio, self.decoder_mask_ratio

    def describe(self) -> dict[str, object]:
        return {"master_decoders": ",".join(self.tasks), "decoder_layers": self.decoder_layers,
                "weights": dict(self.weights), "mask_ratio": self.mask_ratio,
                "decoder_mask_ratio": self.decoder_mask_ratio,
                # named where it is not BERT's, so a record of a run before the switch reads as it did
                **({"decoder_init": self.decoder_init} if self.decoder_init != "bert" else {})}

    def decoder_states(self, task: str, cls_vector: torch.Tensor, side: dict[str, torch.Tensor]) -> torch.Tensor:
        """Decoder ``task``'s output states over ``[encoder CLS] + its masked text``."""
        if is_stream(side):
            hidden = unpadded.with_cls(unpadded.embed(self.bert, side), side, cls_vector)
            return unpadded.run_bert_layers(self.decoders[task], hidden, unpadded.Stream.of(side))
        embeddings = self.bert.embeddings(input_ids=side["input_ids"])
        hidden = torch.cat([cls_vector[:, None, :].to(embeddings.dtype), embeddings[:, 1:]], dim=1)
        return run_layers(self.decoders[task], hidden, bool_padding_mask(side["attention_mask"]))

    def decode(self, task: str, cls_vector: torch.Tensor, side: dict[str, torch.Tensor]):
        """Summed MLM loss of decoder ``task`` and its number of masked tokens."""
        hidden = self.decoder_states(task, cls_vector, side)
        return masked_lm_sum(self.lm_head, hidden, side, self.full_vocab_logits)

    def forward(self, batch: dict) -> PretrainOutput:
        anchor = batch["anchor"]
        if is_stream(anchor):
            encoded = unpadded.encode(self.bert, anchor)[0]
            cls_vector = unpadded.cls_vectors(encoded, anchor)
        else:
            encoded = self.bert(input_ids=anchor["input_ids"],
                                attention_mask=encoder_mask(self.bert, anchor["attention_mask"])).last_hidden_state
            cls_vector = encoded[:, 0]
        mlm = mean_over_processes(*masked_lm_sum(self.lm_head, encoded, anchor, self.full_vocab_logits))
        loss, total = mlm.backward, mlm.value
        parts = {"mlm": mlm.value}
        for task in self.tasks:
            term = mean_over_processes(*self.decode(task, cls_vector, batch[task]))
            loss = loss + self.weights[task] * term.backward
            total = total + self.weights[task] * term.value
            parts[task] = term.value
        return PretrainOutput(loss=loss, parts={"loss": total, **parts})
