"""Sample C candidate queries per passage with a seq2seq generator.

The paper feeds ``prefix + passage`` to doc2query T5 and samples with
``top_p=0.95, top_k=25``; any Hugging Face seq2seq model works here (T5, a
bert2bert ``EncoderDecoderModel``), and so does the prefix-LM of
:mod:`qac.querygen.prefix_lm`, which offers the same interface. Decoding is our own loop rather than
``generate`` so that every passage draws from its own random stream
(:mod:`qac.querygen.sampling`): the encoder runs once per batch, the decoder
one token per step with its key/value cache, and finished rows leave the
batch as it shrinks. The first decoder step runs once per passage, not once
per candidate: it is the same for all of them, and it is the call that
projects the encoder states to each layer's cross-attention keys and values,
which the cache then repeats to the candidates.

Batch-size invariance. A row's logits depend slightly (about 5e-6 in fp32)
on the shape of the batch it was computed in, and a sampling decision is a
step function of the logits. Two measures make the output a function of the
passage alone, byte-identical for any batch size:

1. Each passage is encoded alone (unpadded); the batch reuses these encoder
   states, so only the decoder sees batch-dependent shapes.
2. A decision that lies within the noise bound of one of its edges
   (:func:`qac.querygen.sampling.sample_tokens` says which) is taken again from
   *canonical* logits: the passage's own encoder states and the row's prefix
   through the decoder alone, without a cache. Every other decision is the
   same under both computations.

With an untrained MiniLM bert2bert (flat distributions, the worst case) about
2% of the decisions are recomputed, and each recomputation costs about as
much as a whole batched decoder step, so generation on 2 CPU cores took about
3.7 times as long as without (see reports/benchmarks.md); trained generators
have fewer near-ties. ``batch_invariant: false`` trades the guarantee for speed. With bf16/fp16 on a GPU the batch noise (about 1e-2) is too
large for this, so invariance is off by default there
(``batch_invariant: auto``): outputs stay exact across shards and resumption
(the chunk is the unit of work and its batches are always the same) but a
different batch size may change rare tokens.

Host reads. Batch-invariant decoding decides fragile tokens on the host, so
it reads the device every step. Without it the tokens are chosen where the
logits are (:func:`qac.querygen.sampling.choose_tokens`: the same decisions
as ``sample_tokens``, without its fragility analysis), the queries grow on
the device, and the host reads it once every ``sync_every`` steps
(``querygen.sync_every``) to stop when every row has ended and to drop
finished rows from the batch; between reads, rows that have ended are carried
along and their tokens ignored. With ``sync_every: 1`` the schedule is the
one batch invariance uses, so a CPU run's queries do not change with it;
above 1 the batch shrinks at other steps, which in bf16 can change rare
tokens as the batch size can (so it is part of the resumption fingerprint).

Static decoding. On a GPU the cache loop above is bound by the host (a few
hundred small kernels a step, the cache grown and pruned by copies). For T5
generators without batch invariance, ``querygen.decode: auto`` runs
:mod:`qac.querygen.static_decode` there instead: fixed-shape steps with the
cross-attention shared by a passage's candidates, sampled on the device and
replayed as a CUDA graph. Same distribution and uniforms; finished rows stay
in the batch to its end, so in bf16 rare tokens can differ from the cache
loop's, as they can with another batch size (the decoding loop is part of the
resumption fingerprint).

Repeat penalty. ``repeat_penalty`` (0 by default: the paper's sampling)
subtracts a constant from the logit of every token the candidate has already
emitted, before top-k/top-p, so a weak generator stops looping on one word
("white white white ..."). It is a function of the row's own tokens, so the
batched and the canonical decisions apply the same one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

import torch

from qac.distributed import autocast_context, autocast_dtype
from qac.querygen.sampling import choose_tokens, filtered_distribution, passage_uniforms, sample_tokens
from qac.querygen.static_decode import T5_MODEL_TYPES, StaticT5Decoder
from qac.errors import UserError
from qac.model_specs import note_loaded, resolve_model_name, split_revision
from qac.querygen.prefix_lm import PrefixLM, is_prefix_lm_folder

# Prune finished rows from the batch once this share of the active rows is done.
_PRUNE_FRACTION = 0.125


@dataclass(frozen=True)
class SamplingSettings:
    """What determines the generated queries (everything but speed knobs)."""

    prefix: str
    queries_per_passage: int
    top_p: float
    top_k: int
    max_new_tokens: int
    max_source_len: int
    drop_duplicates: bool
    drop_empty: bool
    repeat_penalty: float  # subtracted from the logits of tokens already emitted (see the module docstring)
    temperature: float  # logits are divided by it before top-k/top-p (1: the paper's sampling)
    min_new_tokens: int  # tokens before end of sequence may be sampled (0: the paper's sampling)
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "SamplingSettings":
        section = params["querygen"]
        return cls(**{field.name: section[field.name] for field in fields(cls) if field.name != "seed"},
                   seed=params["seed"])


@dataclass
class GenerationStats:
    """Counts over a set of passages; chunks add up."""

    passages: int = 0
    candidates: int = 0
    empty: int = 0
    duplicates: int = 0
    dropped_empty: int = 0
    dropped_duplicates: int = 0
    queries: int = 0
    query_words: int = 0
    tokens: int = 0          # generated tokens of all candidates, end token excluded
    decisions: int = 0       # sampling decisions taken
    recomputed: int = 0      # of which re-taken from canonical logits
    seconds: float = 0.0

    def add(self, other: "GenerationStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "GenerationStats":
        return cls(**{name: values[name] for name in cls.__dataclass_fields__})

    def summary(self) -> dict[str, float]:
        """The figures a run reports (unique ratio: distinct share of the non-empty candidates)."""
        non_empty = self.candidates - self.empty
        return {
            "passages": self.passages,
            "candidates": self.candidates,
            "queries": self.queries,
            "queries_per_passage": self.queries / self.passages if self.passages else 0.0,
            "unique_ratio": (non_empty - self.duplicates) / non_empty if non_empty else 0.0,
            "mean_query_words": self.query_words / self.queries if self.queries else 0.0,
            "mean_candidate_tokens": self.tokens / self.candidates if self.candidates else 0.0,
            "empty_candidates": self.empty,
            "duplicate_candidates": self.duplicates,
            "dropped_empty": self.dropped_empty,
            "dropped_duplicates": self.dropped_duplicates,
            "recomputed_decision_rate": self.recomputed / self.decisions if self.decisions else 0.0,
        }


def decode_longest_first(passages: Sequence[tuple[str, str]], encoded: Sequence[list[int]], batch_size: int,
                         decode_batch: Callable[[list[str], list[list[int]]], tuple[list, GenerationStats]],
                         on_batch: Callable[[int], None] | None = None) -> tuple[list, GenerationStats]:
    """What ``decode_batch(pids, encoded)`` gives each ``(pid, text)`` (token ids ``encoded``), in input order,
    and the summed counts.

    Passages are batched longest first so a batch holds passages of similar
    length; as each passage samples from its own random stream, the order never
    changes what it gets. ``on_batch`` hears the size of each finished batch.
    """
    order = sorted(range(len(passages)), key=lambda i: (-len(encoded[i]), i))
    results: list = [None] * len(passages)
    stats = GenerationStats()
    for start in range(0, len(order), batch_size):
        members = order[start:start + batch_size]
        outputs, batch_stats = decode_batch([passages[i][0] for i in members], [encoded[i] for i in members])
        for i, output in zip(members, outputs):
            results[i] = output
        stats.add(batch_stats)
        if on_batch:
            on_batch(len(members))
    return results, stats


def clean_candidates(candidates: Sequence[str], drop_duplicates: bool, drop_empty: bool) -> tuple[list[str], GenerationStats]:
    """Drop empty and repeated candidates of one passage, keeping generation order.

    A candidate is empty when nothing but whitespace is left after decoding; a
    duplicate is a non-empty candidate equal to an earlier one of the same
    passage. Both are counted whether or not they are dropped.
    """
    kept: list[str] = []
    seen: set[str] = set()
    stats = GenerationStats(passages=1, candidates=len(candidates))
    for text in candidates:
        text = " ".join(text.split())
        if not text:
            stats.empty += 1
            if drop_empty:
                stats.dropped_empty += 1
                continue
        elif text in seen:
            stats.duplicates += 1
            if drop_duplicates:
                stats.dropped_duplicates += 1
                continue
        seen.add(text)
        kept.append(text)
    stats.queries = len(kept)
    stats.query_words = sum(len(text.split()) for text in kept)
    return kept, stats


def load_generator(source: str, device: torch.device | str = "cpu"):
    """Load a generator and its tokenizer by hub name or local folder, in eval mode.

    A folder saved by :class:`qac.querygen.prefix_lm.PrefixLM` loads as one;
    anything else as a Hugging Face seq2seq model (T5, bert2bert).
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    path, revision = resolve_model_name(source), split_revision(source)[1]
    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    if is_prefix_lm_folder(path):
        model = PrefixLM.from_pretrained(path)
    else:
        model = AutoModelForSeq2SeqLM.from_pretrained(path, revision=revision)
    note_loaded(path, revision)
    return model.to(device).eval(), tokenizer


def _special_ids(model, tokenizer) -> tuple[int, int, int]:
    """(decoder start, end of sequence, padding) ids, from the generation config first."""
    gen = getattr(model, "generation_config", None)
    config = model.config

    def first(*values):
        for value in values:
            if isinstance(value, (list, tuple)):
                value = value[0] if value else None
            if value is not None:
                return int(value)
        return None

    start = first(getattr(gen, "decoder_start_token_id", None), getattr(config, "decoder_start_token_id", None))
    eos = first(getattr(gen, "eos_token_id", None), getattr(config, "eos_token_id", None), tokenizer.eos_token_id,
                tokenizer.sep_token_id)
    pad = first(getattr(gen, "pad_token_id", None), getattr(config, "pad_token_id", None), tokenizer.pad_token_id)
    if start is None or eos is None or pad is None:
        raise ValueError(f"generator {getattr(config, '_name_or_path', '')!r} lacks decoder_start/eos/pad "
                         f"token ids (got {start}, {eos}, {pad}); set them in its config")
    return start, eos, pad


@dataclass
class _Batch:
    """One batch of passages being decoded."""

    pids: list[str]
    input_ids: torch.Tensor          # (B, L) on the model device
    attention_mask: torch.Tensor     # (B, L)
    uniforms: torch.Tensor           # (B*C, T) float64 on CPU
    single_encodings: dict = field(default_factory=dict)   # passage index -> (canonical encoder output, mask)


class QueryGenerator:
    """Samples candidate queries for passages; see the module docstring for the guarantees."""

    def __init__(self, model, tokenizer, settings: SamplingSettings, *, autocast_dtype: torch.dtype | None = None,
                 batch_invariant: bool = True, sync_every: int = 1, decode: str = "cache", cuda_graphs: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.settings = settings
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.batch_invariant = batch_invariant
        if sync_every < 1:
            raise ValueError(f"querygen.sync_every must be >= 1, got {sync_every}")
        # Steps between the decode loop's reads from the device (batch-invariant decoding reads every step).
        self.sync_every = sync_every
        self.start_id, self.eos_id, self.pad_id = _special_ids(model, tokenizer)
        self.cache_keyword = cache_keyword(model)
        self.static = None
        if decode == "static":
            # Fixed-shape steps decide on the device: there is no host-side decision to make canonical.
            if batch_invariant:
                raise ValueError("querygen.decode: static needs querygen.batch_invariant off (false, or auto in bf16)")
            self.static = StaticT5Decoder(model, settings, start_id=self.start_id, eos_id=self.eos_id,
                                          pad_id=self.pad_id, autocast_dtype=autocast_dtype, cuda_graphs=cuda_graphs)
        elif decode != "cache":
            raise ValueError(f"querygen.decode must be auto, cache or static, got {decode!r}")

    # -- public ---------------------------------------------------------
    def generate_candidates(self, passages: Sequence[tuple[str, str]], batch_size: int,
                            on_batch: Callable[[int], None] | None = None) -> tuple[list[list[str]], GenerationStats]:
        """Raw candidates (C per passage, in candidate order) for ``(pid, text)`` pairs, in input order.

        Passages are batched longest first so a batch holds passages of similar
        length; the order never changes a passage's candidates.
        """
        settings = self.settings
        # here, not at the top: it loads numpy
        from qac.data.tokens import cut_texts

        sources = cut_texts([settings.prefix + text for _, text in passages], settings.max_source_len)
        encoded = self.tokenizer(sources, truncation=True, max_length=settings.max_source_len)["input_ids"]
        return decode_longest_first(passages, encoded, batch_size, self._generate_batch, on_batch)

    def generate(self, passages: Sequence[tuple[str, str]], batch_size: int,
                 on_batch: Callable[[int], None] | None = None) -> tuple[list[list[str]], GenerationStats]:
        """Cleaned queries per passage (empty and repeated candidates dropped as configured) and counts."""
        candidates, decode_stats = self.generate_candidates(passages, batch_size, on_batch)
        stats = GenerationStats(tokens=decode_stats.tokens, decisions=decode_stats.decisions,
                                recomputed=decode_stats.recomputed)
        queries = []
        for texts in candidates:
            kept, passage_stats = clean_candidates(texts, self.settings.drop_duplicates, self.settings.drop_empty)
            queries.append(kept)
            stats.add(passage_stats)
        return queries, stats

    # -- decoding -------------------------------------------------------
    def _encode(self, input_ids, attention_mask):
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self._encode_output(hidden)

    @staticmethod
    def _encode_output(hidden):
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=hidden)

    def _decoder_logits(self, encoder_outputs, attention_mask, decoder_input_ids, cache=None, use_cache=True):
        out = self.model(encoder_outputs=encoder_outputs, attention_mask=attention_mask,
                         decoder_input_ids=decoder_input_ids, use_cache=use_cache, **{self.cache_keyword: cache})
        return out.logits[:, -1].float(), (output_cache(out) if use_cache else None)

    @torch.no_grad()
    def _generate_batch(self, pids: list[str], encoded: list[list[int]]) -> tuple[list[list[str]], GenerationStats]:
        settings, C, T = self.settings, self.settings.queries_per_passage, self.settings.max_new_tokens
        device = self.device
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([ids + [self.pad_id] * (width - len(ids)) for ids in encoded])
        attention_mask = (torch.arange(width)[None, :] < torch.tensor([len(ids) for ids in encoded])[:, None]).long()
        batch = _Batch(pids=pids, input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                       uniforms=torch.cat([passage_uniforms(settings.seed, pid, C, T) for pid in pids]))
        uniforms = batch.uniforms.to(device)
        rows = len(pids) * C
        stats = GenerationStats()
        if self.static is not None:
            with autocast_context(device, self.autocast_dtype):
                hidden = self._encode(batch.input_ids, batch.attention_mask).last_hidden_state
            result = self.static.decode(hidden, batch.attention_mask, uniforms, self.sync_every)
            generated, lengths, decisions = result.generated, result.lengths, result.decisions
        else:
            generated, lengths, decisions = self._cache_decode(batch, encoded, uniforms, stats)
        stats.decisions += int(decisions)
        lengths, generated = lengths.cpu(), generated.cpu()
        stats.tokens = int(lengths.sum())
        texts = self.tokenizer.batch_decode([generated[r, :lengths[r]].tolist() for r in range(rows)],
                                            skip_special_tokens=True)
        return [texts[b * C:(b + 1) * C] for b in range(len(pids))], stats

    def _cache_decode(self, batch: _Batch, encoded: list[list[int]], uniforms: torch.Tensor,
                      stats: GenerationStats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The cache loop: Hugging Face's decoder one token a step, finished rows leaving the batch at sync points.

        Returns the generated tokens ``(rows, T)``, the lengths before end of sequence and the decisions taken.
        """
        settings, C, T = self.settings, self.settings.queries_per_passage, self.settings.max_new_tokens
        device, rows = self.device, len(batch.pids) * C
        # The decoding state stays on the model's device: the host reads it only at sync points.
        generated = torch.full((rows, T), self.pad_id, dtype=torch.long, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)       # tokens before end of sequence
        decisions = torch.zeros((), dtype=torch.long, device=device)
        with autocast_context(device, self.autocast_dtype):
            if self.batch_invariant:
                # Encode each passage alone: these are the canonical encoder states, reused as they are
                # (right-padded) by the batch, so a recomputed decision only reruns the decoder.
                states = []
                for index, ids in enumerate(encoded):
                    single = torch.tensor([ids], device=device)
                    state = self._encode(single, torch.ones_like(single))
                    batch.single_encodings[index] = (state, torch.ones_like(single))
                    states.append(state.last_hidden_state[0])
                hidden = torch.nn.utils.rnn.pad_sequence(states, batch_first=True)   # zeros to the right
                encoder = self._encode_output(hidden)
            else:
                encoder = self._encode(batch.input_ids, batch.attention_mask)
            logits, cache, hidden, mask = self._first_step(encoder, batch.attention_mask, C)
            active = torch.arange(rows, device=device)     # global row of each row in the running batch
            alive = torch.ones(rows, dtype=torch.bool, device=device)     # per running row: not yet finished
            next_ids = None                                # the tokens each step feeds the next
            for step in range(T):
                if step:
                    encoder.last_hidden_state = hidden
                    logits, cache = self._decoder_logits(encoder, mask, next_ids, cache)
                logits = adjust_logits(logits, generated[active, :step], settings, self.eos_id)
                if self.batch_invariant:
                    tokens = self._invariant_tokens(batch, logits, active, alive, generated, step, stats)
                else:
                    tokens = choose_tokens(logits, uniforms[active, step], settings.top_k, settings.top_p)
                decisions += alive.sum()
                generated[active, step] = tokens.where(alive, generated[active, step])
                ended = alive & (tokens == self.eos_id)
                lengths[active] += alive & ~ended
                alive &= ~ended
                if self.batch_invariant or (step + 1) % self.sync_every == 0 or step + 1 == T:
                    # Sync point: stop when every row has ended, drop finished rows from the batch.
                    finished = self._finished_rows(alive)
                    if finished == len(active):
                        break
                    if step + 1 < T and finished >= max(1, int(len(active) * _PRUNE_FRACTION)):
                        keep = alive.nonzero().flatten()
                        if hasattr(cache, "batch_select_indices"):
                            cache.batch_select_indices(keep)
                            hidden, mask = hidden[keep], mask[keep]
                            active, alive, tokens = active[keep], alive[keep], tokens[keep]
                next_ids = tokens.where(alive, torch.full_like(tokens, self.pad_id))[:, None]
        return generated, lengths, decisions

    def _first_step(self, encoder, attention_mask, candidates: int):
        """The first decoder step, run once per passage, and the state of the loop for ``candidates`` rows each.

        Every candidate of a passage feeds the same start token against the
        same encoder states, so its first logits and caches are the passage's:
        the cross-attention keys and values of every decoder layer (which the
        model computes on its first call and reuses after) are projected once
        per passage and repeated to the candidates, instead of projected for
        each of them (C times the work: at 144 passage tokens and 64 new
        tokens about a quarter of the decoder's matrix products). Returns the
        first logits, the cache, the encoder states and the mask, each with
        ``candidates`` consecutive rows per passage.
        """
        hidden = encoder.last_hidden_state
        start = torch.full((hidden.shape[0], 1), self.start_id, dtype=torch.long, device=hidden.device)
        logits, cache = self._decoder_logits(encoder, attention_mask, start)
        cache.batch_repeat_interleave(candidates)
        return (logits.repeat_interleave(candidates, dim=0), cache, hidden.repeat_interleave(candidates, dim=0),
                attention_mask.repeat_interleave(candidates, dim=0))

    @staticmethod
    def _finished_rows(alive: torch.Tensor) -> int:
        """Rows of the running batch that have ended: the decode loop's one read from the device."""
        return int((~alive).sum())

    def _invariant_tokens(self, batch: _Batch, logits, active, alive, generated, step: int,
                          stats: GenerationStats) -> torch.Tensor:
        """This step's tokens, with every fragile decision re-taken from canonical logits (on the host)."""
        settings = self.settings
        active, alive = active.cpu(), alive.cpu()
        tokens, fragile = sample_tokens(logits, batch.uniforms[active, step], settings.top_k, settings.top_p)
        fragile &= alive
        if fragile.any():
            for index in fragile.nonzero().flatten().tolist():
                row = int(active[index])
                tokens[index] = self._canonical_token(batch, row, generated[row, :step], step)
            stats.recomputed += int(fragile.sum())
        return tokens.to(self.device)

    def _canonical_token(self, batch: _Batch, row: int, prefix: torch.Tensor, step: int) -> int:
        """Decide token ``step`` of ``row`` from logits computed for this passage alone, unpadded, without cache."""
        encoder, mask = batch.single_encodings[row // self.settings.queries_per_passage]
        decoder_ids = torch.cat([prefix.new_tensor([self.start_id]), prefix]).to(self.device)[None]
        # Only the last position's logits are needed: feed the output projection that position alone
        # (the vocabulary projection over the whole prefix would cost as much as the decoder).
        head = self.model.get_output_embeddings()
        hook = head.register_forward_pre_hook(lambda _, args: (args[0][:, -1:], *args[1:])) if head else None
        try:
            logits, _ = self._decoder_logits(encoder, mask, decoder_ids, use_cache=False)
        finally:
            if hook:
                hook.remove()
        logits = adjust_logits(logits, prefix[None], self.settings, self.eos_id)
        token, _ = sample_tokens(logits, batch.uniforms[row, step][None], self.settings.top_k, self.settings.top_p)
        return int(token[0])


def cache_keyword(model) -> str:
    """The keyword ``model``'s forward takes its key/value cache by: ``cache`` (transformers 5) or
    ``past_key_values`` (transformers 4, and qac's prefix-LM), which transformers 5 still accepts with a warning
    and drops later."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output):
    """The key/value cache a forward returned (``cache`` in transformers 5, ``past_key_values`` before)."""
    return output.cache if hasattr(output, "cache") else output.past_key_values


def adjust_logits(logits: torch.Tensor, emitted: torch.Tensor, settings: SamplingSettings, eos_id: int) -> torch.Tensor:
    """The logits a decision samples from: repeats penalised, then divided by the temperature (HF's order),
    end of sequence ruled out before ``settings.min_new_tokens`` tokens (``emitted``: the tokens so far)."""
    logits = penalise_repeats(logits, emitted, settings.repeat_penalty)
    if emitted.shape[1] < settings.min_new_tokens:
        logits = logits.index_fill(1, torch.tensor([eos_id], device=logits.device), float("-inf"))
    return logits / settings.temperature if settings.temperature != 1.0 else logits


def penalise_repeats(logits: torch.Tensor, emitted: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits`` (rows, vocab) less ``penalty`` for every token row ``i`` emitted (``emitted[i]``, token ids)."""
    if not penalty or emitted.shape[1] == 0:
        return logits
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, emitted.to(logits.device), True)
    return logits - penalty * seen


def generator_from_settings(source, settings: SamplingSettings, device, dtype_setting: str = "auto",
                            batch_invariant: str | bool = "auto", sync_every: int = 1,
                            decode: str = "auto") -> QueryGenerator:
    """Load ``source`` and wrap it with the precision, invariance, decoding loop and sync schedule the settings
    ask for."""
    model, tokenizer = load_generator(source, device)
    dtype = autocast_dtype(dtype_setting, torch.device(device))
    invariant = resolve_batch_invariant(batch_invariant, dtype)
    return QueryGenerator(model, tokenizer, settings, autocast_dtype=dtype, batch_invariant=invariant,
                          sync_every=sync_every,
                          decode=resolve_decode(decode, model.config.model_type, torch.device(device), invariant))


def resolve_decode(setting: str, model_type: str | None, device: torch.device, batch_invariant: bool) -> str:
    """``auto``: the static loop (:mod:`qac.querygen.static_decode`) on a GPU for a T5-style generator
    (``model_type``, as its config names it) without batch invariance, where the cache loop is bound by the
    host; the cache loop everywhere else."""
    if setting not in ("auto", "cache", "static"):
        raise ValueError(f"querygen.decode must be auto, cache or static, got {setting!r}")
    t5 = model_type in T5_MODEL_TYPES
    if setting == "auto":
        return "static" if device.type == "cuda" and not batch_invariant and t5 else "cache"
    if setting == "static" and not t5:
        raise ValueError(f"querygen.decode: static runs T5-style generators only; this one is a "
                         f"{model_type or 'model without a model type'} (use cache or auto)")
    return setting


@dataclass(frozen=True)
class DecodingPlan:
    """How a generation stage decodes on its device, decided before any weights load."""

    dtype: torch.dtype | None     # autocast dtype (None: fp32)
    batch_invariant: bool
    decode: str                   # "cache" or "static"
    compute: dict                 # what of this changes samples: part of the chunks' fingerprint

    @classmethod
    def for_stage(cls, section, device: torch.device, generator_dir) -> "DecodingPlan":
        """The plan for ``querygen`` settings ``section`` on ``device`` with the generator in ``generator_dir``.

        Raises :class:`qac.errors.UserError` naming the key when the settings cannot be met here.
        """
        dtype = autocast_dtype(section.dtype, device)
        invariant = resolve_batch_invariant(section.batch_invariant, dtype)
        compute: dict = {"dtype": str(dtype or "float32"), "batch_invariant": invariant}
        if section.decode == "static" and invariant:
            raise UserError(f"querygen.decode: static needs batch invariance off, and querygen.batch_invariant "
                            f"{section.batch_invariant!r} turns it on here ({compute['dtype']}): set "
                            f"querygen.batch_invariant: false, or querygen.decode: cache or auto")
        try:
            decode = resolve_decode(section.decode, generator_model_type(generator_dir), device, invariant)
        except ValueError as error:
            raise UserError(f"{error} ({generator_dir})") from None
        if not invariant:  # then the batch composition can change rare tokens: keep it fixed for resumption
            compute["batch_size"] = section.batch_size
            if section.sync_every != 1:   # so can the steps at which finished rows leave the batch
                compute["sync_every"] = section.sync_every
            if decode == "static":        # and a loop that keeps finished rows to the end of a batch
                compute["decode"] = decode
        return cls(dtype=dtype, batch_invariant=invariant, decode=decode, compute=compute)


def generator_model_type(source) -> str | None:
    """The ``model_type`` in a local generator folder's ``config.json`` (None without one): read before loading."""
    import json
    from pathlib import Path

    config = Path(source) / "config.json"
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def resolve_batch_invariant(setting: str | bool, dtype: torch.dtype | None) -> bool:
    """``auto``: recompute fragile decisions in fp32 only (see the module docstring)."""
    if setting == "auto":
        return dtype is None
    if isinstance(setting, bool):
        return setting
    raise ValueError(f"querygen.batch_invariant must be auto, true or false, got {setting!r}")


__all__ = ["SamplingSettings", "GenerationStats", "QueryGenerator", "clean_candidates", "decode_longest_first",
           "load_generator", "generator_from_settings", "resolve_batch_invariant", "resolve_decode",
           "generator_model_type", "DecodingPlan",
           "filtered_distribution"]
