"""Sample C candidate queries per passage from a prompted causal language model.

The T5 and prefix-LM generators of :mod:`qac.querygen.generate` read a
passage and write a query; a causal LM reads a prompt
(:mod:`qac.llm_queries.prompts`: a template per query type, zero- or
few-shot) and writes on. Sampling is the same: each passage draws from its own
random stream (:func:`qac.querygen.sampling.passage_uniforms`, candidate ``j``
row ``j``), with top-k / top-p over the logits after the repeat penalty, the
minimum length and the temperature, decided where the logits are
(:func:`qac.querygen.sampling.choose_tokens`); the host reads the device every
``sync_every`` steps to stop once every row has ended. A query ends at the
model's end-of-sequence token or at the first token holding a line break
(a prompted model goes on to the next example otherwise).

The prompt is the long part (a few hundred tokens of examples against a query
of a few dozen), so each (passage, query type) prompt is run once, and its
key/value cache is repeated to the candidates of that type. A batch holds
whole passages, longest prompt first.

Decoding loops (``llm_queries.generation.decode``): ``cache`` grows Hugging
Face's dynamic cache a step at a time (the CPU reference); ``static`` writes
into a cache allocated once for the prompt plus ``max_new_tokens`` with a
mask of fixed shape, so every step has the same shapes (the form a GPU runs
without re-planning its kernels); ``auto`` picks static on a GPU. Both keep
finished rows in the batch to its end and take the same decisions up to float
rounding. A row's logits depend on its batch (the padding of the prompts
beside it), so the batch size and the loop are part of the chunks'
fingerprint: a rerun, a resumed run and any shard layout give byte-identical
queries; another batch size may change rare tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from qac.distributed import autocast_context
from qac.llm_queries.prompts import PromptBook
from qac.model_specs import is_packaged, packaged_model
from qac.querygen.generate import (GenerationStats, cache_keyword, clean_candidates, output_cache,
                                   penalise_repeats)
from qac.querygen.sampling import choose_tokens, passage_uniforms
from qac.querygen.continuation import tiny_causal_lm

TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=2048)


@dataclass(frozen=True)
class CausalSettings:
    """What determines the generated queries (everything but speed knobs, which the fingerprint adds)."""

    model: str
    revision: str | None
    gguf_file: str | None
    chat: bool                    # wrap each prompt in the tokenizer's chat template as the user's turn
    prompts: PromptBook
    queries_per_passage: int
    top_p: float
    top_k: int
    temperature: float
    repeat_penalty: float
    min_new_tokens: int
    max_new_tokens: int
    drop_duplicates: bool
    drop_empty: bool
    seed: int


def tiny_llama(tokenizer_spec: str, seed: int = 0):
    """``(LlamaForCausalLM, tokenizer)``: a 2-layer 64-wide Llama with random weights and ``tokenizer_spec``'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_spec)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, **TINY_LLAMA)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tokenizer


def load_causal_generator(spec: str, revision: str | None = None, gguf_file: str | None = None,
                          device: torch.device | str = "cpu", seed: int = 0):
    """The causal LM and tokenizer of ``spec``, in eval mode.

    ``tiny:<tokenizer>`` (a random 2-layer GPT-2) and ``tiny-llama:<tokenizer>`` (a random 2-layer Llama) are
    built from a config, for tests; ``package:<distribution>/<file>`` loads the GGUF file an installed package
    ships (:func:`qac.model_specs.packaged_model`); anything else loads with ``from_pretrained(spec,
    revision=revision)`` (a hub name at a pinned revision, or a local folder), from a GGUF file in it with
    ``gguf_file``. A GGUF file's weights are de-quantised to fp32 as they load.
    """
    if spec.startswith("tiny:"):
        model, tokenizer = tiny_causal_lm(spec.partition(":")[2], seed)
    elif spec.startswith("tiny-llama:"):
        model, tokenizer = tiny_llama(spec.partition(":")[2], seed)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if is_packaged(spec):
            if gguf_file:
                raise ValueError(f"generator {spec!r} names its file; gguf_file {gguf_file!r} would name another")
            folder, gguf_file, _ = packaged_model(spec)
            spec, revision = str(folder), None
        options = {"revision": revision, **({"gguf_file": gguf_file} if gguf_file else {})}
        tokenizer = AutoTokenizer.from_pretrained(spec, **options)
        model = AutoModelForCausalLM.from_pretrained(spec, **options)
    return model.to(device).eval(), tokenizer


def stop_token_ids(tokenizer, eos_id: int) -> list[int]:
    """End of sequence and every token whose text holds a line break: where a query ends."""
    vocab = tokenizer.get_vocab()
    breaking = [index for token, index in vocab.items() if "\n" in tokenizer.convert_tokens_to_string([token])]
    return sorted({eos_id, *breaking})


def resolve_decode(setting: str, device: torch.device) -> str:
    """``auto``: the static loop on a GPU, the cache loop (the reference) elsewhere."""
    if setting not in ("auto", "cache", "static"):
        raise ValueError(f"llm_queries.generation.decode must be auto, cache or static, got {setting!r}")
    if setting == "auto":
        return "static" if device.type == "cuda" else "cache"
    return setting


class CausalQueryGenerator:
    """Queries for passages from a prompted causal LM; see the module docstring for the guarantees."""

    def __init__(self, model, tokenizer, settings: CausalSettings, *, autocast_dtype: torch.dtype | None = None,
                 sync_every: int = 1, decode: str = "cache"):
        if sync_every < 1:
            raise ValueError(f"llm_queries.generation.sync_every must be >= 1, got {sync_every}")
        self.model, self.tokenizer, self.settings = model.eval(), tokenizer, settings
        self.device = next(model.parameters()).device
        self.autocast_dtype, self.sync_every = autocast_dtype, sync_every
        self.decode = resolve_decode(decode, self.device)
        config = model.config
        eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
        self.eos_id = eos if eos is not None else tokenizer.eos_token_id
        if self.eos_id is None:
            raise ValueError(f"generator {settings.model!r} has no end-of-sequence token id")
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else (tokenizer.pad_token_id or self.eos_id)
        self.stop_ids = torch.tensor(stop_token_ids(tokenizer, self.eos_id), device=self.device)
        self.types = list(dict.fromkeys(settings.prompts.type_of(j) for j in range(settings.queries_per_passage)))
        self.examples_block = settings.prompts.examples_block(tokenizer)

    # -- prompts --------------------------------------------------------
    def prompt_ids(self, passage: str) -> list[list[int]]:
        """Token ids of the prompt of each query type in use, in the order of :attr:`types`."""
        texts = self.settings.prompts.prompts(passage, self.tokenizer, self.examples_block)
        ids = []
        for kind in self.types:
            if self.settings.chat:
                ids.append(list(self.tokenizer.apply_chat_template([{"role": "user", "content": texts[kind]}],
                                                                   add_generation_prompt=True, tokenize=True,
                                                                   return_dict=False)))
            else:
                ids.append(self.tokenizer(texts[kind], add_special_tokens=False)["input_ids"] or [self.eos_id])
        return ids

    # -- public ---------------------------------------------------------
    def generate(self, passages: Sequence[tuple[str, str]], batch_size: int,
                 on_batch: Callable[[int], None] | None = None) -> tuple[list[list[str]], GenerationStats]:
        """Cleaned queries per ``(pid, text)``, in input order, and counts; batches longest prompt first."""
        encoded = [self.prompt_ids(text) for _, text in passages]
        order = sorted(range(len(passages)), key=lambda i: (-max(map(len, encoded[i])), i))
        results: list = [None] * len(passages)
        stats = GenerationStats()
        for start in range(0, len(order), batch_size):
            members = order[start:start + batch_size]
            candidates, batch_stats = self.generate_batch([passages[i][0] for i in members],
                                                          [encoded[i] for i in members])
            for i, texts in zip(members, candidates):
                kept, cleaned = clean_candidates(texts, self.settings.drop_duplicates, self.settings.drop_empty)
                results[i] = kept
                batch_stats.add(cleaned)
            stats.add(batch_stats)
            if on_batch:
                on_batch(len(members))
        return results, stats

    @torch.no_grad()
    def generate_batch(self, pids: list[str], prompts: list[list[list[int]]]) -> tuple[list[list[str]], GenerationStats]:
        """Raw candidates (C per passage, candidate order) for passages ``pids`` with prompt ids ``prompts``."""
        settings, C, T = self.settings, self.settings.queries_per_passage, self.settings.max_new_tokens
        groups = [ids for per_passage in prompts for ids in per_passage]        # passage-major, then type
        width = max(map(len, groups))
        device = self.device
        input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + ids for ids in groups], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in groups], device=device)
        # Row b*C + j (candidate j of passage b) continues the prompt of its type.
        group_of = torch.tensor([b * len(self.types) + self.types.index(settings.prompts.type_of(j))
                                 for b in range(len(pids)) for j in range(C)], device=device)
        uniforms = torch.cat([passage_uniforms(settings.seed, pid, C, T) for pid in pids]).to(device)
        with autocast_context(device, self.autocast_dtype):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            # Only the last position's logits are read: the vocabulary product at every prompt position was
            # a fifth of the prompt's cost and its largest tensor (rows x width x vocabulary).
            output = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                logits_to_keep=1)
            logits = output.logits[:, -1].float().index_select(0, group_of)
            cache = output_cache(output)
            cache.reorder_cache(group_of)               # the prompt's keys and values, once per candidate
            mask, positions = mask.index_select(0, group_of), positions[:, -1:].index_select(0, group_of)
            generated, lengths, decisions = self._decode(cache, logits, mask, positions, uniforms, width)
        lengths, generated = lengths.cpu(), generated.cpu()
        texts = self.tokenizer.batch_decode([generated[r, :lengths[r]].tolist() for r in range(len(group_of))],
                                            skip_special_tokens=True)
        stats = GenerationStats(tokens=int(lengths.sum()), decisions=int(decisions))
        return [texts[b * C:(b + 1) * C] for b in range(len(pids))], stats

    def _decode(self, cache, logits, mask, positions, uniforms, width: int):
        """The decoding loop over ``max_new_tokens`` steps; (tokens, lengths before the stop, decisions)."""
        settings, T = self.settings, self.settings.max_new_tokens
        rows, device = logits.shape[0], logits.device
        generated = torch.full((rows, T), self.pad_id, dtype=torch.long, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        alive = torch.ones(rows, dtype=torch.bool, device=device)
        decisions = torch.zeros((), dtype=torch.long, device=device)
        static = self.decode == "static"
        if static:
            cache = self._static_cache(cache, rows, width + T)
            mask = torch.cat([mask, torch.ones((rows, T), dtype=mask.dtype, device=device)], dim=1)
        for step in range(T):
            logits = self._adjusted(logits, generated[:, :step], step)
            tokens = choose_tokens(logits, uniforms[:, step], settings.top_k, settings.top_p)
            decisions += alive.sum()
            generated[:, step] = tokens.where(alive, generated[:, step])
            ended = alive & torch.isin(tokens, self.stop_ids)
            lengths += alive & ~ended
            alive &= ~ended
            if step + 1 == T or ((step + 1) % self.sync_every == 0 and not bool(alive.any())):
                break
            following = tokens.where(alive, torch.full_like(tokens, self.pad_id))[:, None]
            positions = positions + 1
            extra = {}
            if static:
                extra["cache_position"] = torch.tensor([width + step], device=device)
            else:
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=device)], dim=1)
            output = self.model(input_ids=following, attention_mask=mask, position_ids=positions, use_cache=True,
                                logits_to_keep=1, **{cache_keyword(self.model): cache}, **extra)
            logits = output.logits[:, -1].float()
        return generated, lengths, decisions

    def _static_cache(self, prompt_cache, rows: int, length: int):
        """A cache of ``length`` positions for ``rows`` rows, holding the prompt's keys and values."""
        from transformers import StaticCache

        static = StaticCache(config=self.model.config, max_cache_len=length)
        for index, layer in enumerate(prompt_cache.layers):
            width = layer.keys.shape[2]
            static.update(layer.keys, layer.values, index,
                          {"cache_position": torch.arange(width, device=layer.keys.device)})
        return static

    def _adjusted(self, logits: torch.Tensor, emitted: torch.Tensor, step: int) -> torch.Tensor:
        """Repeats penalised, stops ruled out before ``min_new_tokens``, then the temperature."""
        settings = self.settings
        logits = penalise_repeats(logits, emitted, settings.repeat_penalty)
        if step < settings.min_new_tokens:
            logits = logits.index_fill(1, self.stop_ids, float("-inf"))
        return logits / settings.temperature if settings.temperature != 1.0 else logits


def describe(settings: CausalSettings) -> dict[str, Any]:
    """The generator as it is recorded beside its queries: model, revision (a packaged model's: its package's
    version), file and the prompt book."""
    revision = packaged_model(settings.model)[2] if is_packaged(settings.model) else settings.revision
    return {"model": settings.model, "revision": revision, "gguf_file": settings.gguf_file,
            "chat": settings.chat, "prompts": settings.prompts.record()}
