"""One causal-LM continuation per passage: the texts MASTER's GOR decoder recovers.

MASTER feeds each passage to GPT-2 and keeps what it writes next. The paper
names the model and nothing of the decoding; its release ships the texts,
about 128 BERT tokens each, cut to the pre-training length. Here the model is
any Hugging Face causal LM (``continuation.model``: ``gpt2`` by default, a
local folder, or ``tiny:<tokenizer>``, a 2-layer 64-wide GPT-2 with random
weights and that tokenizer's vocabulary, for tests and the smoke profile). The
LM reads the last ``max_source_len`` tokens of the passage (the end is what it
continues) and samples ``max_new_tokens`` tokens with top-k / top-p from the
passage's own random stream (:func:`qac.querygen.sampling.passage_uniforms`,
the same as query generation): a passage's continuation depends on the seed,
the passage and the batch it is decoded in, never on which process or which
resumed run decodes it.

The work is sharded, committed per chunk and merged exactly as
``generate_queries`` does (:mod:`qac.querygen.shards`): :class:`ContinuationGenerator`
has the ``generate(passages, batch_size, on_batch)`` method the chunk runner
calls, and ``continuations.arrow`` has the schema of ``queries.arrow`` (``pid``,
``queries``: a list holding the one continuation, empty when the LM wrote
nothing).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

import torch

from qac.distributed import autocast_context
from qac.querygen.generate import GenerationStats, cache_keyword, decode_longest_first, output_cache
from qac.querygen.sampling import passage_uniforms, sample_tokens
from qac.model_specs import note_loaded, resolve_model_name, split_revision

TINY_GPT2 = dict(n_embd=64, n_layer=2, n_head=2, n_inner=128, n_positions=512)


@dataclass(frozen=True)
class ContinuationSettings:
    """What determines the continuations (everything but speed knobs)."""

    model: str
    max_source_len: int
    max_new_tokens: int
    top_k: int
    top_p: float
    temperature: float
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "ContinuationSettings":
        section = params["continuation"]
        return cls(**{field.name: section[field.name] for field in fields(cls) if field.name != "seed"},
                   seed=params["seed"])


def tiny_causal_lm(tokenizer_spec: str, seed: int = 0):
    """``(GPT2LMHeadModel, tokenizer)``: a 2-layer 64-wide GPT-2 with random weights and ``tokenizer_spec``'s vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_spec)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, **TINY_GPT2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model, tokenizer


def load_causal_lm(spec: str, device: torch.device | str = "cpu", seed: int = 0):
    """A causal LM and its tokenizer, in eval mode: ``tiny:<tokenizer>``, a hub name or a local folder."""
    if spec.startswith("tiny:"):
        model, tokenizer = tiny_causal_lm(spec.partition(":")[2], seed)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path, revision = resolve_model_name(spec), split_revision(spec)[1]
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
        model = AutoModelForCausalLM.from_pretrained(path, revision=revision)
        note_loaded(path, revision)
    return model.to(device).eval(), tokenizer


class ContinuationGenerator:
    """Samples one continuation per passage; batches of passages share one decoding loop."""

    def __init__(self, model, tokenizer, settings: ContinuationSettings, *, autocast_dtype: torch.dtype | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.settings = settings
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        config = model.config
        eos = getattr(config, "eos_token_id", None)
        self.eos_id = eos if eos is not None else (tokenizer.eos_token_id or tokenizer.sep_token_id)
        pad = getattr(config, "pad_token_id", None)
        self.pad_id = pad if pad is not None else self.eos_id
        if self.eos_id is None:
            raise ValueError(f"continuation model {getattr(config, '_name_or_path', '')!r} has no end-of-sequence id")

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The last ``max_source_len`` tokens of each text (no special tokens; an empty text reads end-of-sequence)."""
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
        return [row[-self.settings.max_source_len:] or [self.eos_id] for row in ids]

    def generate(self, passages: Sequence[tuple[str, str]], batch_size: int,
                 on_batch: Callable[[int], None] | None = None) -> tuple[list[list[str]], GenerationStats]:
        """``[[continuation]]`` per ``(pid, text)``, in input order, and counts (batches longest first)."""
        encoded = self.encode([text for _, text in passages])
        texts, stats = decode_longest_first(passages, encoded, batch_size, self._generate_batch, on_batch)
        return [[text] for text in texts], stats

    @torch.no_grad()
    def _generate_batch(self, pids: list[str], encoded: list[list[int]]) -> tuple[list[str], GenerationStats]:
        settings, steps, rows = self.settings, self.settings.max_new_tokens, len(pids)
        width = max(len(ids) for ids in encoded)
        # Left padding: every row's next token comes at the same column.
        input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + ids for ids in encoded], device=self.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        uniforms = torch.cat([passage_uniforms(settings.seed, pid, 1, steps) for pid in pids])
        generated = torch.full((rows, steps), self.pad_id, dtype=torch.long)
        lengths = torch.zeros(rows, dtype=torch.long)
        alive = torch.ones(rows, dtype=torch.bool)
        stats = GenerationStats()
        with autocast_context(self.device, self.autocast_dtype):
            output = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
            for step in range(steps):
                logits = output.logits[:, -1].float()
                if settings.temperature != 1.0:
                    logits = logits / settings.temperature
                tokens, _ = sample_tokens(logits, uniforms[:, step], settings.top_k, settings.top_p)
                stats.decisions += int(alive.sum())
                generated[alive, step] = tokens[alive]
                ended = alive & (tokens == self.eos_id)
                lengths[alive & ~ended] += 1
                alive &= ~ended
                if not alive.any() or step + 1 == steps:
                    break
                attention = torch.cat([attention, torch.ones((rows, 1), dtype=attention.dtype, device=self.device)], 1)
                positions = positions[:, -1:] + 1
                following = tokens.where(alive, torch.full_like(tokens, self.pad_id)).to(self.device)[:, None]
                output = self.model(input_ids=following, attention_mask=attention, position_ids=positions,
                                    use_cache=True, **{cache_keyword(self.model): output_cache(output)})
        texts = [" ".join(text.split()) for text in self.tokenizer.batch_decode(
            [generated[row, :lengths[row]].tolist() for row in range(rows)], skip_special_tokens=True)]
        stats.passages = stats.candidates = stats.queries = rows
        stats.empty = sum(1 for text in texts if not text)
        stats.tokens = int(lengths.sum())
        stats.query_words = sum(len(text.split()) for text in texts)
        return texts, stats


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams over all n-grams of the texts (word level); 0 when there is none."""
    grams: Counter = Counter()
    for text in texts:
        words = text.split()
        grams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else 0.0


def continuation_quality(texts: Sequence[str], stats: GenerationStats) -> dict[str, float]:
    """The continuation stage's quality figures: length, distinct-1/2, empty and duplicate shares.

    A duplicate is a non-empty continuation equal to another passage's (a
    degenerate LM repeats itself across passages); the share counts all but
    the first of each group.
    """
    non_empty = [text for text in texts if text]
    counts = Counter(non_empty)
    passages = len(texts)
    return {
        "passages": passages,
        "mean_words": sum(len(text.split()) for text in texts) / passages if passages else 0.0,
        "mean_tokens": stats.tokens / passages if passages else 0.0,
        "distinct_1": distinct_n(non_empty, 1),
        "distinct_2": distinct_n(non_empty, 2),
        "empty_share": (passages - len(non_empty)) / passages if passages else 0.0,
        "duplicate_share": sum(count - 1 for count in counts.values()) / passages if passages else 0.0,
    }
