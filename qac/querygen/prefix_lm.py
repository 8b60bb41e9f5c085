"""A prefix-LM query generator on one BERT encoder: every weight starts pretrained.

A bert2bert model warm-started from a sentence encoder gains randomly
initialised cross-attention and needs far more training than the default
profile can afford. Here the encoder itself generates (UniLM's seq-to-seq
language model): the sequence is ``[CLS] passage [SEP]`` followed by
``[CLS] query [SEP]``; passage tokens attend to each other in both directions
(segment 0), query tokens attend to the whole passage and to the query tokens
before them (segment 1, positions continuing after the passage), and the next
token is read off the last layer through the word embeddings (tied output
layer). Two small additions are trained from a neutral start:

- a transform of the last hidden state before the tied projection (linear,
  initialised to the identity, then LayerNorm), as BERT's MLM head has one;
- a copy bias: a learned bonus added to the logit of every token that occurs
  in the passage and has not been emitted yet in this query, a cheap pointer
  toward the passage's words (queries that retrieve their passage share its
  rare words). Word-initial tokens and ``##`` word pieces have separate
  bonuses: a piece only fits after the right word start, and a bonus on every
  piece of the passage turns samples into made-up words. Emitted tokens lose
  the bonus so that it does not feed repetitions. The word bonus starts at
  ``COPY_INIT``: the untrained model's logits have a spread of about 1 (the
  input token itself aside), so +4 puts the passage's words at the top from
  the first step; the piece bonus starts at ``PIECE_COPY_INIT``.

When generating (no ``labels``), a ``##`` word piece may only follow the
token it follows somewhere in the passage (``config.prefix_lm_piece_constraint``):
a word the query builds from pieces is then a word of the passage, never a
made-up one such as ``cy##pha##pha``. Training is unconstrained, so the loss
remains the model's own likelihood of real queries, whose words need not be
in the passage.

Because passage tokens never attend to query tokens, the passage can be run
once on its own (:meth:`PrefixLM.encode`) and the query decoded token by token
against the passage's keys and values plus a cache of the query's own. To fit
the seq2seq interface :class:`qac.querygen.generate.QueryGenerator` drives
(``get_encoder()``, then ``model(encoder_outputs=..., attention_mask=...,
decoder_input_ids=..., past_key_values=...)``), the "encoder output" is the
passage's per-layer keys and values packed along the feature axis together
with its token ids; batch operations on it (repeat, select, pad) are
row operations, so the generator treats it like any encoder's hidden states.

Saved as a Hugging Face style folder: ``config.json`` (the BERT configuration,
``architectures: [QacPrefixLM]``), ``model.safetensors`` and the tokenizer;
:func:`is_prefix_lm_folder` tells :func:`qac.querygen.generate.load_generator`
which class to load.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

ARCHITECTURE = "QacPrefixLM"
COPY_INIT = 4.0
PIECE_COPY_INIT = 1.0
# Adam moves a parameter by about lr per step whatever its gradient: a bias stored as value / COPY_SCALE
# moves COPY_SCALE times faster, so a few hundred steps can retune it (a plain scalar would move by ~0.05).
COPY_SCALE = 100.0
WEIGHTS_FILE = "model.safetensors"
SOURCE_SEGMENT, TARGET_SEGMENT = 0, 1


class PrefixCache:
    """Keys and values of the query tokens decoded so far, per layer; rows can be dropped."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.emitted: torch.Tensor | None = None    # (B, vocab) bool: tokens fed as decoder input so far

    def __len__(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.keys):
            self.keys.append(keys)
            self.values.append(values)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], keys], dim=2)
            self.values[layer] = torch.cat([self.values[layer], values], dim=2)
        return self.keys[layer], self.values[layer]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each row ``repeats`` times (the generator's first step runs once per passage, then this)."""
        self.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]
        if self.emitted is not None:
            self.emitted = self.emitted.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (the generator prunes finished rows this way)."""
        self.keys = [k[indices] for k in self.keys]
        self.values = [v[indices] for v in self.values]
        if self.emitted is not None:
            self.emitted = self.emitted[indices]


class _SourceEncoder(nn.Module):
    """``get_encoder()`` of the generator interface: the passage's packed keys, values and ids."""

    def __init__(self, owner: "PrefixLM"):
        super().__init__()
        self._owner = [owner]     # a list, so the owner is not registered as a submodule (no cycle)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=self._owner[0].encode(input_ids, attention_mask))


class PrefixLM(nn.Module):
    """BERT as a prefix language model: ``P(query | passage)``; see the module docstring."""

    def __init__(self, bert, copy_bias: bool = True):
        super().__init__()
        bert.pooler = None           # the pooler plays no part in generation
        self.bert = bert
        self.config = bert.config
        self.config.architectures = [ARCHITECTURE]
        self.config.prefix_lm_copy_bias = bool(copy_bias)
        if not hasattr(self.config, "prefix_lm_piece_constraint"):
            self.config.prefix_lm_piece_constraint = True
        hidden, vocab = self.config.hidden_size, self.config.vocab_size
        self.transform = nn.Linear(hidden, hidden)
        self.transform_norm = nn.LayerNorm(hidden, eps=self.config.layer_norm_eps)
        with torch.no_grad():
            self.transform.weight.copy_(torch.eye(hidden))
            self.transform.bias.zero_()
        self.output_bias = nn.Parameter(torch.zeros(vocab))
        self.copy_weight = nn.Parameter(torch.tensor(COPY_INIT / COPY_SCALE)) if copy_bias else None
        self.piece_copy_weight = nn.Parameter(torch.tensor(PIECE_COPY_INIT / COPY_SCALE)) if copy_bias else None
        # 1 for "##" word pieces (set from the tokenizer; saved with the weights)
        self.register_buffer("word_pieces", torch.zeros(vocab, dtype=torch.bool))
        self.generation_config = SimpleNamespace()
        self._encoder = _SourceEncoder(self)

    # -- special tokens ---------------------------------------------------
    def set_special_tokens(self, tokenizer) -> None:
        """The query starts at [CLS] and ends at [SEP]; [PAD] pads (the ids bert2bert uses too)."""
        ids = {"decoder_start_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id,
               "pad_token_id": tokenizer.pad_token_id}
        if None in ids.values():
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} lacks [CLS]/[SEP]/[PAD] tokens")
        for key, value in ids.items():
            setattr(self.config, key, value)
        pieces = [i for token, i in tokenizer.get_vocab().items() if token.startswith("##") and i < len(self.word_pieces)]
        self.word_pieces.zero_()
        self.word_pieces[pieces] = True
        self.config.prefix_lm_special_ids = sorted({tokenizer.cls_token_id, tokenizer.sep_token_id,
                                                     tokenizer.pad_token_id, tokenizer.unk_token_id or 0,
                                                     tokenizer.mask_token_id or 0})

    # -- the generator interface ---------------------------------------------
    def get_encoder(self) -> nn.Module:
        return self._encoder

    def get_output_embeddings(self):
        return None      # the tied projection is a function of the word embeddings, not a module

    def forward(self, encoder_outputs=None, attention_mask=None, decoder_input_ids=None, past_key_values=None,
                use_cache: bool = True, input_ids=None, labels=None, **_):
        """Logits of the next query token at each position of ``decoder_input_ids``.

        Pass ``input_ids``/``attention_mask`` (the passage) or a packed
        ``encoder_outputs`` from :meth:`get_encoder`. With ``labels`` (query
        tokens then [SEP], -100 for padding) and no ``decoder_input_ids``, the
        decoder input is ``[CLS]`` + labels shifted right and the loss is the
        mean cross-entropy, as in Hugging Face seq2seq models.
        """
        if encoder_outputs is None:
            # Straight from the passage (training): packing the states for the generator interface would
            # cost a copy forward and a full-width gradient per slice backward.
            keys, values = self.source_states(input_ids, attention_mask)
            source_ids = input_ids
        else:
            keys, values, source_ids = self._unpack(encoder_outputs.last_hidden_state)
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("PrefixLM needs decoder_input_ids or labels")
            decoder_input_ids = self.shift_labels(labels)
        cache = past_key_values if past_key_values is not None else PrefixCache()
        logits = self.decode(keys, values, source_ids, attention_mask, decoder_input_ids, cache)
        if labels is None and getattr(self.config, "prefix_lm_piece_constraint", False):
            logits = self.constrain_pieces(logits, source_ids, attention_mask.bool(), decoder_input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        return SimpleNamespace(logits=logits, past_key_values=cache if use_cache else None, loss=loss)

    def shift_labels(self, labels: torch.Tensor) -> torch.Tensor:
        start = labels.new_full((labels.shape[0], 1), self.config.decoder_start_token_id)
        shifted = torch.cat([start, labels[:, :-1]], dim=1)
        return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

    # -- computation ----------------------------------------------------------
    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        heads = self.config.num_attention_heads
        return x.view(batch, length, heads, -1).transpose(1, 2)

    def _layer(self, layer, hidden, prefix_keys, prefix_values, mask, cache: PrefixCache | None, index: int):
        """One BERT layer over ``hidden``, attending to ``prefix`` keys/values (and cached ones) as ``mask`` says."""
        attention = layer.attention.self
        query, key, value = (self._heads(attention.query(hidden)), self._heads(attention.key(hidden)),
                             self._heads(attention.value(hidden)))
        own_keys, own_values = key, value
        if cache is not None:
            key, value = cache.update(index, key, value)
        if prefix_keys is not None and not self.training:
            context = split_attention(query, (prefix_keys, key), (prefix_values, value), mask)
        else:
            if prefix_keys is not None:
                key, value = torch.cat([prefix_keys, key], dim=2), torch.cat([prefix_values, value], dim=2)
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                     dropout_p=attention.dropout.p if self.training else 0.0)
        context = context.transpose(1, 2).flatten(2)
        hidden = layer.attention.output(context, hidden)
        return layer.output(layer.intermediate(hidden), hidden), own_keys, own_values

    def source_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """The passage, bidirectionally: per layer, its keys and values ``(B, heads, L, head size)``."""
        embeddings = self.bert.embeddings(input_ids=input_ids, token_type_ids=torch.full_like(input_ids, SOURCE_SEGMENT))
        mask = attention_mask.bool()[:, None, None, :]        # every valid passage token sees every other
        hidden, all_keys, all_values = embeddings, [], []
        for layer in self.bert.encoder.layer:
            hidden, keys, values = self._layer(layer, hidden, None, None, mask, None, 0)
            all_keys.append(keys)
            all_values.append(values)
        return all_keys, all_values

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The passage packed for the generator: ``(B, L, 2 * layers * hidden + 1)`` keys, values, token ids."""
        packed = []
        for keys, values in zip(*self.source_states(input_ids, attention_mask)):
            packed += [keys.transpose(1, 2).flatten(2), values.transpose(1, 2).flatten(2)]
        packed.append(input_ids[..., None])
        return torch.cat([p.float() for p in packed], dim=-1)

    def _unpack(self, packed: torch.Tensor):
        width = self.config.hidden_size
        layers = len(self.bert.encoder.layer)
        states = [self._heads(packed[..., i * width:(i + 1) * width]) for i in range(2 * layers)]
        return states[0::2], states[1::2], packed[..., -1].long()

    def decode(self, keys: list[torch.Tensor], values: list[torch.Tensor], source_ids: torch.Tensor,
               attention_mask: torch.Tensor, decoder_input_ids: torch.Tensor, cache: PrefixCache) -> torch.Tensor:
        """Logits ``(B, T, vocab)`` for query tokens ``decoder_input_ids`` following those in ``cache``."""
        batch, steps = decoder_input_ids.shape
        device = decoder_input_ids.device
        past = len(cache)
        source_mask = attention_mask.bool()
        positions = source_mask.sum(-1, keepdim=True) + past + torch.arange(steps, device=device)
        embeddings = self.bert.embeddings(input_ids=decoder_input_ids, position_ids=positions,
                                          token_type_ids=torch.full_like(decoder_input_ids, TARGET_SEGMENT))
        causal = torch.ones(steps, past + steps, dtype=torch.bool, device=device).tril(past)
        mask = torch.cat([source_mask[:, None, :].expand(batch, steps, -1), causal.expand(batch, -1, -1)], dim=-1)
        hidden = embeddings
        dtype = embeddings.dtype if not torch.is_autocast_enabled() else torch.get_autocast_dtype(device.type)
        for index, layer in enumerate(self.bert.encoder.layer):
            hidden, _, _ = self._layer(layer, hidden, keys[index].to(dtype), values[index].to(dtype),
                                       mask[:, None], cache, index)
        hidden = self.transform_norm(self.transform(hidden))
        logits = hidden @ self.bert.embeddings.word_embeddings.weight.t() + self.output_bias
        if self.copy_weight is not None:
            logits = logits + self.copy_logits(source_ids, source_mask, decoder_input_ids, cache, logits.shape[-1])
        return logits

    def copy_logits(self, source_ids: torch.Tensor, source_mask: torch.Tensor, decoder_input_ids: torch.Tensor,
                    cache: PrefixCache, vocab: int) -> torch.Tensor:
        """``(B, T, vocab)``: the copy bonus of each passage token not fed at or before each position, else 0.

        Worked out per passage position ``(B, T, L)`` and scattered once, each
        token from its first position alone (so that its bonus, and the bonus's
        gradient, counts once): a dense ``(B, T, vocab)`` running maximum of the
        fed tokens cost more than the rest of the copy bias.
        """
        batch, steps = decoder_input_ids.shape
        length = source_ids.shape[1]
        earlier = torch.ones(length, length, dtype=torch.bool, device=source_ids.device).tril(-1)
        repeated = ((source_ids[:, :, None] == source_ids[:, None, :]) & earlier).any(-1)          # (B, L)
        first = source_mask & ~self.special_tokens(source_ids) & ~repeated
        ids = torch.where(first, source_ids, self.config.pad_token_id)     # the others write 0 at [PAD]
        bonus = COPY_SCALE * torch.where(self.word_pieces[ids], self.piece_copy_weight, self.copy_weight)
        fed = (decoder_input_ids[:, :, None] == ids[:, None, :]).to(torch.uint8)                  # (B, T, L)
        fed = fed.cummax(dim=1).values.bool() if steps > 1 else fed.bool()
        if cache.emitted is not None:
            fed |= cache.emitted.gather(1, ids)[:, None]
        emitted = torch.zeros(batch, vocab, dtype=torch.bool, device=ids.device).scatter_(1, decoder_input_ids, True)
        cache.emitted = emitted if cache.emitted is None else cache.emitted | emitted
        values = bonus[:, None] * (first[:, None] & ~fed)
        copy = torch.zeros(batch, steps, vocab, dtype=values.dtype, device=ids.device)
        return copy.scatter(2, ids[:, None].expand(-1, steps, -1), values)

    def constrain_pieces(self, logits: torch.Tensor, source_ids: torch.Tensor, source_mask: torch.Tensor,
                         decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """``logits`` with every ``##`` piece masked unless the passage has it right after the input token."""
        vocab = logits.shape[-1]
        pieces = self.word_pieces[:vocab]
        follows_piece = pieces[source_ids[:, 1:]] & source_mask[:, 1:] & source_mask[:, :-1]      # (B, L-1)
        # (B, T, L-1): passage position i holds this step's input token and i+1 a piece
        match = (source_ids[:, None, :-1] == decoder_input_ids[..., None]) & follows_piece[:, None]
        allowed = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
        allowed.scatter_(2, source_ids[:, None, 1:].expand_as(match) * match, match)   # misses write False at 0
        blocked = pieces & ~allowed
        return logits.masked_fill(blocked, float("-inf"))

    def copy_bonus(self, pieces: bool = False) -> float:
        """The logit bonus of the passage's word-initial tokens (``pieces``: of its ``##`` pieces); 0 without."""
        weight = self.piece_copy_weight if pieces else self.copy_weight
        return COPY_SCALE * float(weight.detach()) if weight is not None else 0.0

    def special_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``token_ids``' shape, bool: [CLS], [SEP], [PAD] and the like, which get no copy bonus."""
        special = torch.tensor(getattr(self.config, "prefix_lm_special_ids", [0]), device=token_ids.device)
        return torch.isin(token_ids, special)

    # -- saving ---------------------------------------------------------------
    def save_pretrained(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(directory)
        save_file({name: tensor.detach().contiguous().cpu() for name, tensor in self.state_dict().items()},
                  directory / WEIGHTS_FILE)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "PrefixLM":
        from safetensors.torch import load_file
        from transformers import BertConfig, BertModel

        directory = Path(directory)
        config = BertConfig.from_pretrained(directory)
        model = cls(BertModel(config, add_pooling_layer=False),
                    copy_bias=bool(getattr(config, "prefix_lm_copy_bias", True)))
        state = load_file(directory / WEIGHTS_FILE)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [name for name in missing if not name.endswith("position_ids") and "token_type_ids" not in name]
        if missing or unexpected:
            raise ValueError(f"{directory / WEIGHTS_FILE}: missing weights {missing}, unexpected {unexpected}")
        return model.eval()


def split_attention(query: torch.Tensor, keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...],
                    mask: torch.Tensor) -> torch.Tensor:
    """Attention over key/value blocks laid side by side (``mask`` spans them all), without joining them.

    When decoding, the passage's keys and values (rows x passage length)
    dwarf the query's few tokens; joining them for every token and layer
    copied them all each time.
    """
    scores = torch.cat([query @ block.transpose(-1, -2) for block in keys], dim=-1) * query.shape[-1] ** -0.5
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    context, start = 0, 0
    for block in values:
        context = context + weights[..., start:start + block.shape[-2]] @ block
        start += block.shape[-2]
    return context


def is_prefix_lm_folder(directory: str | Path) -> bool:
    """Whether ``directory`` holds a saved :class:`PrefixLM` (its config names the architecture)."""
    config = Path(directory) / "config.json"
    if not config.is_file():
        return False
    return ARCHITECTURE in (json.loads(config.read_text(encoding="utf-8")).get("architectures") or [])


def build_prefix_lm(spec: str, seed: int = 0, copy_bias: bool = True):
    """A :class:`PrefixLM` and tokenizer from a model spec (pretrained weights, or ``tiny:``/``scratch:``)."""
    from transformers import AutoModel

    # here, not at the top: it loads safetensors
    from qac.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(spec)
    bert = load_model(spec, AutoModel, seed=seed)
    if bert.config.model_type != "bert":
        raise ValueError(f"query_generator.model {spec!r} is a {bert.config.model_type} model; "
                         "architecture prefix_lm needs a BERT encoder")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PrefixLM(bert, copy_bias=copy_bias)
    model.set_special_tokens(tokenizer)
    return model, tokenizer
