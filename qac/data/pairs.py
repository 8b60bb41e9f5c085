"""Training pairs for context-supervised pre-training, and the batch collator.

A pair is an anchor passage and a context: another passage of the same
document (``context_type: passage``, the coCondenser / CoT-MAE baseline), one
of the passage's generated queries (``query``, query-as-context), or either
with probability ``mixed_query_prob`` for a query (``mixed``, the paper's
Table 4).

Which passages can be anchors:

- ``passage``: passages whose chosen passage context (``passage_context``:
  ``random_sampled``, ``nearby`` or ``overlap``) is non-empty. Single-span
  documents have no other span, so their passages are skipped and counted in
  :attr:`PairCorpus.skipped_no_passage_context`.
- ``query``: passages with at least one generated query (skipped otherwise and
  counted in :attr:`PairCorpus.skipped_no_query`).
- ``mixed``: passages with both; a passage that lacks one kind is skipped, so
  both kinds are drawn from the same anchors and the mix stays 50/50.

Sampling is a pure function of ``(seed, step)``: the anchors of a step are
consecutive slots of a per-epoch permutation, the context of each pair (which
query among the first ``query_count``, which neighbour, which kind in
``mixed``) is drawn from a generator seeded with the step. Resuming at step k
therefore reproduces the batches an uninterrupted run would have seen, and every
process of a distributed run builds the same global batch and keeps its share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from qac.data.masking import IGNORE_INDEX, MaskingVocab, whole_word_mask
from qac.io import iter_jsonl

CONTEXT_TYPES = ("passage", "query", "mixed")
PASSAGE_CONTEXTS = ("random_sampled", "nearby", "overlap")


@dataclass
class PairCorpus:
    """Anchors with their candidate contexts, restricted to what ``context_type`` needs."""

    pids: list[str]
    texts: list[str]
    passage_contexts: list[list[str]]     # candidate passage-context texts per anchor
    queries: list[list[str]]              # the first ``query_count`` queries per anchor
    total_passages: int = 0
    skipped_no_passage_context: int = 0
    skipped_no_query: int = 0

    def __len__(self) -> int:
        return len(self.pids)

    def stats(self) -> dict[str, int]:
        return {"anchors": len(self), "passages": self.total_passages,
                "skipped_no_passage_context": self.skipped_no_passage_context,
                "skipped_no_query": self.skipped_no_query}


def _field(record: dict, name: str, kind, path, line: int):
    if name not in record:
        raise ValueError(f"{path}:{line}: missing field {name!r}")
    value = record[name]
    if not isinstance(value, kind):
        raise ValueError(f"{path}:{line}: field {name!r} must be {getattr(kind, '__name__', kind)}, "
                         f"got {type(value).__name__}")
    return value


def _read_passages(path: Path) -> tuple[list[str], list[str], list[dict]]:
    pids, texts, contexts = [], [], []
    seen: set[str] = set()
    for line, record in enumerate(iter_jsonl(path), start=1):
        pid = _field(record, "pid", str, path, line)
        if pid in seen:
            raise ValueError(f"{path}:{line}: duplicate pid {pid!r}")
        seen.add(pid)
        pids.append(pid)
        texts.append(_field(record, "text", str, path, line))
        context = _field(record, "contexts", dict, path, line)
        for name in ("nearby", "random_sampled"):
            if not isinstance(context.get(name, []), list):
                raise ValueError(f"{path}:{line}: field 'contexts.{name}' must be a list of pids")
        if not isinstance(context.get("overlap", ""), (str, type(None))):
            raise ValueError(f"{path}:{line}: field 'contexts.overlap' must be text")
        contexts.append(context)
    return pids, texts, contexts


def _read_queries(path: Path, known_pids: set[str], query_count: int) -> dict[str, list[str]]:
    queries: dict[str, list[str]] = {}
    for line, record in enumerate(iter_jsonl(path), start=1):
        pid = _field(record, "pid", str, path, line)
        if pid not in known_pids:
            raise ValueError(f"{path}:{line}: pid {pid!r} is not in the passages file")
        candidates = _field(record, "queries", list, path, line)
        if not all(isinstance(query, str) for query in candidates):
            raise ValueError(f"{path}:{line}: field 'queries' must be a list of strings")
        queries[pid] = [query for query in candidates[:query_count] if query.strip()]
    return queries


def load_pair_corpus(passages_path: str | os.PathLike, queries_path: str | os.PathLike | None,
                     context_type: str, *, passage_context: str = "random_sampled",
                     query_count: int = 1) -> PairCorpus:
    """Read ``passages.jsonl`` (and ``queries.jsonl``) into the anchors ``context_type`` can use."""
    if context_type not in CONTEXT_TYPES:
        raise ValueError(f"context_type must be one of {CONTEXT_TYPES}, got {context_type!r}")
    if passage_context not in PASSAGE_CONTEXTS:
        raise ValueError(f"passage_context must be one of {PASSAGE_CONTEXTS}, got {passage_context!r}")
    if query_count < 1:
        raise ValueError(f"query_count must be at least 1, got {query_count}")
    passages_path = Path(passages_path)
    pids, texts, contexts = _read_passages(passages_path)
    text_of = dict(zip(pids, texts))

    def passage_candidates(line: int, context: dict) -> list[str]:
        if passage_context == "overlap":
            overlap = (context.get("overlap") or "").strip()
            return [overlap] if overlap else []
        linked = context.get(passage_context) or []
        missing = [pid for pid in linked if pid not in text_of]
        if missing:
            raise ValueError(f"{passages_path}:{line}: contexts.{passage_context} names unknown pid {missing[0]!r}")
        return [text_of[pid] for pid in linked if text_of[pid].strip()]

    needs_queries = context_type in ("query", "mixed")
    queries: dict[str, list[str]] = {}
    if needs_queries:
        if queries_path is None:
            raise ValueError(f"context_type {context_type!r} needs a queries file")
        queries = _read_queries(Path(queries_path), set(pids), query_count)

    corpus = PairCorpus(pids=[], texts=[], passage_contexts=[], queries=[], total_passages=len(pids))
    for line, (pid, text, context) in enumerate(zip(pids, texts, contexts), start=1):
        candidates = passage_candidates(line, context) if context_type != "query" else []
        own_queries = queries.get(pid, []) if needs_queries else []
        if context_type in ("passage", "mixed") and not candidates:
            corpus.skipped_no_passage_context += 1
            continue
        if needs_queries and not own_queries:
            corpus.skipped_no_query += 1
            continue
        corpus.pids.append(pid)
        corpus.texts.append(text)
        corpus.passage_contexts.append(candidates)
        corpus.queries.append(own_queries)
    if not corpus.pids:
        raise ValueError(f"{passages_path}: no passage has a {context_type} context "
                         f"({corpus.stats()})")
    return corpus


@dataclass(frozen=True)
class Pair:
    index: int            # position in the global batch (seeds this pair's masking)
    anchor: str
    context: str
    context_kind: str     # "passage" | "query"


@dataclass
class PairSampler:
    """The global batch of pairs at a training step, as a pure function of ``(seed, step)``."""

    corpus: PairCorpus
    context_type: str
    seed: int
    mixed_query_prob: float = 0.5
    _epoch_order: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._epoch_order:
            self._epoch_order.clear()
            self._epoch_order[epoch] = np.random.default_rng([self.seed, 0, epoch]).permutation(len(self.corpus))
        return self._epoch_order[epoch]

    def anchors(self, step: int, batch_size: int) -> list[int]:
        """Corpus indices of the anchors of ``step``: slots ``step*B .. step*B+B-1`` of the epoch orders."""
        size = len(self.corpus)
        slots = range(step * batch_size, (step + 1) * batch_size)
        return [int(self._order(slot // size)[slot % size]) for slot in slots]

    def batch(self, step: int, batch_size: int) -> list[Pair]:
        rng = np.random.default_rng([self.seed, 1, step])
        pairs = []
        for index, anchor in enumerate(self.anchors(step, batch_size)):
            if self.context_type == "mixed":
                kind = "query" if rng.random() < self.mixed_query_prob else "passage"
            else:
                kind = self.context_type
            candidates = self.corpus.queries[anchor] if kind == "query" else self.corpus.passage_contexts[anchor]
            context = candidates[int(rng.integers(len(candidates)))]
            pairs.append(Pair(index=index, anchor=self.corpus.texts[anchor], context=context, context_kind=kind))
        return pairs


@dataclass
class PairCollator:
    """Tokenize, mask and pad a list of pairs into ``{"anchor": side, "context": side}``.

    A side holds ``input_ids`` (masked), ``attention_mask`` and ``labels``
    (original ids at masked positions, ``-100`` elsewhere; all ``-100`` when the
    side's mask ratio is 0). Passages are truncated to ``max_len`` tokens and
    queries to ``query_max_len``, special tokens included. Padding is dynamic
    (to the longest sequence of the side) unless ``pad_to`` fixes a length.
    Each sequence is masked with a generator seeded by ``(seed, step, pair
    index, side)``, so masks do not depend on how the batch is split or padded.
    """

    tokenizer: object
    max_len: int
    query_max_len: int
    anchor_mask_ratio: float
    context_mask_ratio: float
    seed: int
    pad_to: int | None = None

    def __post_init__(self):
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)
        if self.pad_to is not None and self.pad_to < max(self.max_len, self.query_max_len):
            raise ValueError(f"pad_to={self.pad_to} is shorter than max_len={self.max_len}")

    def _tokenize(self, texts: list[str], max_len: int) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, truncation=True, max_length=max_len, add_special_tokens=True)["input_ids"]

    def _side(self, token_ids: list[list[int]], indices: list[int], side: int, step: int,
              mask_ratio: float) -> dict[str, torch.Tensor]:
        length = self.pad_to or max(len(ids) for ids in token_ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(token_ids), length), pad, dtype=torch.long)
        labels = torch.full((len(token_ids), length), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((len(token_ids), length), dtype=torch.long)
        for row, (ids, index) in enumerate(zip(token_ids, indices)):
            rng = np.random.default_rng([self.seed, 2, step, index, side])
            masked, target = whole_word_mask(ids, self.vocab, mask_ratio, rng)
            input_ids[row, :len(ids)] = torch.tensor(masked)
            labels[row, :len(ids)] = torch.tensor(target)
            attention[row, :len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}

    def __call__(self, pairs: list[Pair], step: int) -> dict[str, dict[str, torch.Tensor]]:
        indices = [pair.index for pair in pairs]
        anchors = self._tokenize([pair.anchor for pair in pairs], self.max_len)
        # Passage and query contexts have their own length limits; tokenize each
        # kind with its limit, then put the rows back in pair order.
        contexts: list[list[int]] = [[] for _ in pairs]
        for kind, limit in (("passage", self.max_len), ("query", self.query_max_len)):
            rows = [row for row, pair in enumerate(pairs) if pair.context_kind == kind]
            for row, ids in zip(rows, self._tokenize([pairs[row].context for row in rows], limit)):
                contexts[row] = ids
        return {"anchor": self._side(anchors, indices, 0, step, self.anchor_mask_ratio),
                "context": self._side(contexts, indices, 1, step, self.context_mask_ratio)}


def shard(pairs: list, rank: int, world_size: int) -> list:
    """This process's contiguous share of a global batch (global rank order)."""
    if len(pairs) % world_size:
        raise ValueError(f"global batch of {len(pairs)} does not split over {world_size} processes")
    size = len(pairs) // world_size
    return pairs[rank * size:(rank + 1) * size]
