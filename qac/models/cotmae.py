"""CoT-MAE: masked auto-encoding of a passage whose [CLS] must help decode its context.

The encoder (BERT) reads the anchor passage with ``mask_ratio`` (0.30) of its
words masked and pays an MLM loss. A shallow decoder, discarded after
pre-training, reads the encoder's [CLS] vector in position 0 followed by the
context's token embeddings (the encoder's embedding layer) and must
reconstruct the context, so the [CLS] vector learns what the passage shares
with its context. Two decoders, chosen by ``decoder``:

- ``paper``: the decoder the paper describes. Bidirectional BERT layers over
  the [CLS] vector and the *masked* context (``decoder_mask_ratio`` of its
  words, 0.45 in the CoT-MAE paper); MLM loss on the context's masked tokens.
- ``release``: the decoder of the authors' code. transformers' ``GPT2Block``
  (pre-layer-norm) over the [CLS] vector and the *unmasked* context, with
  GPT-2's input dropout, final LayerNorm (``ln_f``) and initialisation, and a
  ``GPT2Config`` cast from the encoder's BERT config (:func:`gpt2_config`);
  position t predicts the context token at t + 1 (next-token loss over the
  whole context, [SEP] included). Each position attends to [CLS] and to the
  ``attention_window`` most recent positions including itself (window 3:
  itself and the two before it), never to padding.

    loss = encoder MLM + decoder_weight * decoder loss

Both decoders share the encoder's MLM head for their vocabulary projection.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from qac.data.masking import IGNORE_INDEX
from qac.data.streams import is_stream
from qac.models import unpadded
from qac.models.backbone import (PretrainingModel, PretrainOutput, additive_mask, encoder_mask, load_backbone,
                                 new_layers, padding_mask, run_layers)
from qac.models.losses import dense_lm_sum, masked_lm_sum, mean_over_processes
from qac.params.vocabulary import RECIPES


def windowed_causal_mask(attention_mask: torch.Tensor, window: int) -> torch.Tensor:
    """Boolean ``[B, 1, L, L]`` mask: query t sees key 0 ([CLS]) and keys t-window+1 .. t, never padding."""
    length = attention_mask.shape[1]
    query = torch.arange(length, device=attention_mask.device)[:, None]
    key = torch.arange(length, device=attention_mask.device)[None, :]
    allowed = (key == 0) | ((key <= query) & (key > query - window))
    return allowed[None, None] & attention_mask[:, None, None, :].bool()


def next_token_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Label of position t = token at t + 1; ``-100`` where t + 1 is padding or past the end."""
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, IGNORE_INDEX)
    return labels


def gpt2_config(bert_config, layers: int, attn_implementation: str = "sdpa"):
    """The ``GPT2Config`` of the release decoder, cast field by field from the encoder's BERT config."""
    from transformers import GPT2Config

    config = GPT2Config(
        vocab_size=bert_config.vocab_size, n_positions=bert_config.max_position_embeddings,
        n_embd=bert_config.hidden_size, n_layer=layers, n_head=bert_config.num_attention_heads,
        activation_function=bert_config.hidden_act, resid_pdrop=bert_config.hidden_dropout_prob,
        embd_pdrop=bert_config.hidden_dropout_prob, attn_pdrop=bert_config.attention_probs_dropout_prob,
        layer_norm_epsilon=bert_config.layer_norm_eps, initializer_range=bert_config.initializer_range,
        bos_token_id=None, eos_token_id=None)   # GPT-2's 50256 lies outside BERT's vocabulary; no block reads them
    config._attn_implementation = attn_implementation
    return config


class ReleaseDecoder(nn.Module):
    """Input dropout, ``GPT2Block`` s and a final LayerNorm, initialised as GPT-2 is.

    ``attn_implementation`` is ``"sdpa"`` (PyTorch's fused attention, a boolean
    mask) or ``"eager"`` (explicit products, the same mask made additive); the
    two compute the same function (a test compares them). Either way the blocks
    see only the mask given to :meth:`forward`: with a mask, transformers'
    attention adds no causal mask of its own.
    """

    def __init__(self, bert_config, layers: int, seed: int, attn_implementation: str = "sdpa"):
        super().__init__()
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block, GPT2PreTrainedModel

        if attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation must be sdpa or eager, got {attn_implementation!r}")
        self.config = gpt2_config(bert_config, layers, attn_implementation)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.drop = nn.Dropout(self.config.embd_pdrop)
            self.h = nn.ModuleList([GPT2Block(self.config, layer_idx=index) for index in range(layers)])
            self.ln_f = nn.LayerNorm(self.config.n_embd, eps=self.config.layer_norm_epsilon)
            # GPT-2's own initialisation: Conv1D/Linear weights N(0, initializer_range), biases 0,
            # LayerNorm 1/0, every c_proj weight N(0, initializer_range / sqrt(2 * n_layer)).
            initializer = GPT2PreTrainedModel(copy.deepcopy(self.config))
            self.apply(initializer._init_weights)

    def __len__(self) -> int:
        return len(self.h)

    def forward(self, hidden: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[B, L, H]`` under ``allowed``, a boolean ``[B, 1, L, L]`` "may attend" mask."""
        if self.config._attn_implementation == "eager":
            allowed = additive_mask(allowed, hidden.dtype)
        hidden = self.drop(hidden)
        for block in self.h:
            output = block(hidden, attention_mask=allowed)
            hidden = output[0] if isinstance(output, tuple) else output
        return self.ln_f(hidden)


class CoTMAE(PretrainingModel):
    def __init__(self, bert, lm_head, *, decoder: str = "paper", decoder_layers: int = 1,
                 decoder_weight: float = 1.0, attention_window: int = 3, mask_ratio: float = 0.30,
                 decoder_mask_ratio: float = 0.45, full_vocab_logits: bool = False, seed: int = 0,
                 attn_implementation: str = "sdpa"):
        super().__init__()
        if decoder not in RECIPES:
            raise ValueError(f"cotmae_decoder must be one of {RECIPES}, got {decoder!r}")
        if decoder_layers < 1:
            raise ValueError(f"cotmae_decoder_layers must be at least 1, got {decoder_layers}")
        if attention_window < 1:
            raise ValueError(f"cotmae_attention_window must be at least 1, got {attention_window}")
        self.bert = bert
        self.lm_head = lm_head
        self.decoder_kind = decoder
        if decoder == "paper":
            self.decoder = new_layers(bert.config, decoder_layers, seed, attn_implementation)
        else:
            self.decoder = ReleaseDecoder(bert.config, decoder_layers, seed, attn_implementation)
        self.decoder_weight = decoder_weight
        self.attention_window = attention_window
        self.mask_ratio = mask_ratio
        self.decoder_mask_ratio = decoder_mask_ratio
        self.full_vocab_logits = full_vocab_logits

    @classmethod
    def from_spec(cls, spec: str, seed: int = 0, dropout: float | None = None, **options) -> "CoTMAE":
        bert, lm_head = load_backbone(spec, seed, dropout)
        return cls(bert, lm_head, seed=seed, **options)

    @property
    def mask_ratios(self) -> tuple[float, float]:
        # The release decoder reads the context unmasked.
        return self.mask_ratio, (self.decoder_mask_ratio if self.decoder_kind == "paper" else 0.0)

    def describe(self) -> dict[str, object]:
        return {"cotmae_decoder": self.decoder_kind, "decoder_layers": len(self.decoder),
                "decoder_weight": self.decoder_weight, "attention_window": self.attention_window,
                "mask_ratio": self.mask_ratio, "decoder_mask_ratio": self.decoder_mask_ratio}

    def decode(self, cls_vector: torch.Tensor, context: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed decoder loss over the context and the number of predicted tokens."""
        hidden, labels = self.decoder_states(cls_vector, context)
        if self.decoder_kind == "paper":
            return masked_lm_sum(self.lm_head, hidden, context, self.full_vocab_logits)
        # Every position but the last real one predicts a token: the head runs over all of them.
        return dense_lm_sum(self.lm_head, hidden, labels)

    def decoder_states(self, cls_vector: torch.Tensor,
                       context: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder output states over ``[CLS] + context`` and the label of each position."""
        if is_stream(context):
            return self.stream_decoder_states(cls_vector, context)
        embeddings = self.bert.embeddings(input_ids=context["input_ids"])
        hidden = torch.cat([cls_vector[:, None, :].to(embeddings.dtype), embeddings[:, 1:]], dim=1)
        if self.decoder_kind == "paper":
            return run_layers(self.decoder, hidden, padding_mask(context["attention_mask"])), context["labels"]
        mask = windowed_causal_mask(context["attention_mask"], self.attention_window)
        labels = next_token_labels(context["input_ids"], context["attention_mask"])
        return self.decoder(hidden, mask), labels

    def stream_decoder_states(self, cls_vector: torch.Tensor, context: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`decoder_states` on a token stream: each context's start holds its anchor's [CLS] vector."""
        hidden = unpadded.with_cls(unpadded.embed(self.bert, context), context, cls_vector)
        stream = unpadded.Stream.of(context)
        if self.decoder_kind == "paper":
            return unpadded.run_bert_layers(self.decoder, hidden, stream), context["labels"]
        decoder = self.decoder
        hidden = decoder.drop(hidden)
        for block in decoder.h:
            hidden = unpadded.gpt2_block(block, hidden, stream, self.attention_window)
        return decoder.ln_f(hidden), unpadded.next_token_labels(context)

    def encode_anchor(self, anchor: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's last states of the anchor side and its [CLS] vectors."""
        if is_stream(anchor):
            encoded = unpadded.encode(self.bert, anchor)[0]
            return encoded, unpadded.cls_vectors(encoded, anchor)
        encoded = self.bert(input_ids=anchor["input_ids"],
                            attention_mask=encoder_mask(self.bert, anchor["attention_mask"])).last_hidden_state
        return encoded, encoded[:, 0]

    def forward(self, batch: dict) -> PretrainOutput:
        anchor = batch["anchor"]
        encoded, cls_vector = self.encode_anchor(anchor)
        mlm = mean_over_processes(*masked_lm_sum(self.lm_head, encoded, anchor, self.full_vocab_logits))
        decoder = mean_over_processes(*self.decode(cls_vector, batch["context"]))
        loss = mlm.backward + self.decoder_weight * decoder.backward
        parts = {"loss": mlm.value + self.decoder_weight * decoder.value, "mlm": mlm.value, "decoder": decoder.value}
        return PretrainOutput(loss=loss, parts=parts)
