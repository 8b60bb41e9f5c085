"""Training pairs for context-supervised pre-training, and the batch collator.

A pair is an anchor passage and a context: another passage of the same
document (``context_type: passage``, the coCondenser / CoT-MAE baseline), one
of the passage's generated queries (``query``, query-as-context), or either
with probability ``mixed_query_prob`` for a query (``mixed``, the paper's
Table 4).

Which passages can be anchors:

- ``passage``: passages whose chosen passage context (``passage_context``:
  ``random_sampled``, ``nearby``, ``overlap``, or ``next``: the span after the
  anchor, which MASTER's NPR decoder recovers) is non-empty. A list of kinds
  mixes them: a passage that has any of them is an anchor, and each pair draws
  one kind uniformly among those its anchor has, then a candidate of it (the
  release's data_type ``mixed`` / ``cotmae``, whose data holds all three for
  every anchor, so its draw is the same uniform one). Single-span
  documents have no other span: with ``single_span: drop`` their passages are
  skipped and counted in :attr:`PairCorpus.skipped_no_passage_context`; with
  ``self`` (the release) such a passage is its own context (counted in
  :attr:`PairCorpus.self_paired`), so the passage, query and mixed variants
  draw from the same anchors.
- ``query``: passages with at least one generated query (skipped otherwise and
  counted in :attr:`PairCorpus.skipped_no_query`).
- ``mixed``: passages with both; a passage that lacks one kind is skipped, so
  both kinds are drawn from the same anchors and the mix stays 50/50.

Sampling is a pure function of ``(seed, step)``: the anchors of a step are
consecutive slots of a per-epoch permutation, the context of each pair (which
query among the first ``query_count``, which neighbour, which kind in
``mixed`` or in a mix of passage contexts) is drawn from a generator seeded with the step. Resuming at step k
therefore reproduces the batches an uninterrupted run would have seen, and every
process of a distributed run builds the same global batch and keeps its share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from qac.data.arrowstore import PASSAGES_SCHEMA, QUERIES_SCHEMA, MappedTable, RowGather, open_mapped, scan_tables
from qac.data.errors import DataFormatError
from qac.data.masking import (IGNORE_INDEX, MaskingVocab, masked_targets, round_up, whole_word_mask,
                              whole_word_mask_batch)
from qac.data.tokens import SpecialTokens, TextEncoder, check_stamp, with_special_tokens
from qac.params.vocabulary import CONTEXT_TYPES, MIXED_PASSAGE_CONTEXTS, PASSAGE_CONTEXTS, SINGLE_SPAN_DOCUMENTS

# Rows checked at a time when the corpus is loaded: bounds the memory of the scan.
_SCAN_ROWS = 1 << 13


@dataclass
class PairCorpus:
    """Anchors with their candidate contexts, restricted to what ``context_type`` needs.

    Texts stay in the memory-mapped Arrow tables; the corpus holds only the
    row numbers of its anchors (8 bytes per anchor), so a process's memory
    does not grow with the corpus's texts, and the processes of one machine
    share the mapped pages.
    """

    passages: pa.Table                    # passages.arrow, memory-mapped
    queries: pa.Table | None              # queries.arrow, memory-mapped; row i belongs to passage row i
    anchors: np.ndarray                   # passage rows usable as anchors, ascending
    passage_context: str | tuple[str, ...]  # one kind, or the kinds a pair draws among
    query_count: int
    path: Path
    total_passages: int = 0
    skipped_no_passage_context: int = 0
    skipped_no_query: int = 0
    single_span: str = "drop"             # drop | self: a single-span document's passage is its own context
    self_paired: int = 0
    # The mappings behind ``passages`` and ``queries``, when they were mapped
    # here: row reads then release the pages they touched (see RowGather).
    passages_mapped: MappedTable | None = field(default=None, repr=False)
    queries_mapped: MappedTable | None = field(default=None, repr=False)
    # True when the files' token ids (checked against the reader's tokenizer) are read with the texts.
    with_ids: bool = False

    def __len__(self) -> int:
        return len(self.anchors)

    def stats(self) -> dict[str, int]:
        stats = {"anchors": len(self), "passages": self.total_passages,
                 "skipped_no_passage_context": self.skipped_no_passage_context,
                 "skipped_no_query": self.skipped_no_query}
        if self.single_span == "self":
            stats["self_paired"] = self.self_paired
        return stats

    def __post_init__(self):
        self._passage_rows = RowGather(self.passages, self.passages_mapped)
        self._query_rows = RowGather(self.queries, self.queries_mapped) if self.queries is not None else None

    def rows(self, indices) -> list[dict]:
        """``pid``, ``doc_id``, ``position``, ``text`` and ``contexts`` of anchors ``indices`` (with ``row``;
        with ``input_ids`` and ``overlap_ids`` when the corpus reads ids)."""
        rows = self.anchors[np.asarray(indices, dtype=np.int64)]
        columns = list(PASSAGES_SCHEMA.names) + (["input_ids", "overlap_ids"] if self.with_ids else [])
        records = self._passage_rows.rows(rows, columns)
        for record, row in zip(records, rows.tolist()):
            record["row"] = row
        return records

    def pid(self, index: int) -> str:
        return self.rows([index])[0]["pid"]

    def text(self, index: int) -> str:
        return self.rows([index])[0]["text"]

    @property
    def passage_kinds(self) -> tuple[str, ...]:
        return passage_kinds(self.passage_context)

    def passage_candidates(self, record: dict, kind: str | None = None) -> list:
        """Candidates of a passage context of one kind (``kind``, else the corpus's single one): the overlap
        text (with its ids when the corpus reads ids: ``(text, ids)``), or the context passages' rows."""
        contexts = record["contexts"]
        kind = kind or self.passage_context
        if self.single_span == "self" and _single_span(record["position"], len(contexts["nearby"])):
            return [record["row"]]
        if kind == "overlap":
            overlap = contexts["overlap"].strip()
            if not overlap:
                return []
            return [(overlap, record["overlap_ids"])] if self.with_ids else [overlap]
        if kind == "next":     # the span after the anchor: its nearby pid at position + 1
            following = f"{record['doc_id']}#{record['position'] + 1}"
            return [self._context_row(record, pid, kind) for pid in contexts["nearby"] if pid == following]
        return [self._context_row(record, pid, kind) for pid in contexts[kind]]

    def passage_candidate_groups(self, record: dict) -> list[list]:
        """Per kind of the corpus's passage context that the anchor has, its candidates, in the kinds' order."""
        groups = [self.passage_candidates(record, kind) for kind in self.passage_kinds]
        return [group for group in groups if group]

    def _context_row(self, record: dict, pid: str, kind: str) -> int:
        """Row of ``pid``, a passage of the anchor's document: passages of a document are stored
        consecutively by position, and ``pid`` is ``<doc_id>#<position>`` (see docs/architecture.md)."""
        prefix, _, position = pid.rpartition("#")
        row = record["row"] - record["position"] + int(position) if position.isdigit() else -1
        if prefix != record["doc_id"] or not 0 <= row < self.passages.num_rows or \
                self._passage_rows.rows([row], ["pid"])[0]["pid"] != pid:
            raise DataFormatError(self.path, record["row"] + 1, f"contexts.{kind}",
                                  f"{pid!r} is not a passage of document {record['doc_id']!r}")
        return row

    def passage_contexts(self, index: int) -> list[str]:
        """Candidate passage-context texts of anchor ``index``, of every kind it draws among."""
        candidates = [candidate for group in self.passage_candidate_groups(self.rows([index])[0])
                      for candidate in group]
        rows = iter(self.texts_of([candidate for candidate in candidates if isinstance(candidate, int)]))
        return [next(rows) if isinstance(candidate, int) else
                candidate[0] if isinstance(candidate, tuple) else candidate for candidate in candidates]

    def query_candidates(self, row: int) -> list:
        """The first ``query_count`` non-blank queries of passage ``row`` (``(text, ids)`` when reading ids)."""
        if row >= self.queries.num_rows:
            return []
        columns = ["queries", "query_ids"] if self.with_ids else ["queries"]
        record = self._query_rows.rows([row], columns)[0]
        values = record["queries"][:self.query_count]
        if self.with_ids:
            return [(query, ids) for query, ids in zip(values, record["query_ids"]) if query.strip()]
        return [query for query in values if query.strip()]

    def queries_of(self, index: int) -> list[str]:
        return [query[0] if isinstance(query, tuple) else query
                for query in self.query_candidates(int(self.anchors[index]))]

    def texts_of(self, rows: list[int]) -> list[str]:
        if not rows:
            return []
        return [record["text"] for record in self._passage_rows.rows(rows, ["text"])]

    def texts_and_ids_of(self, rows: list[int]) -> list[tuple[str, list[int]]]:
        if not rows:
            return []
        return [(record["text"], record["input_ids"]) for record in self._passage_rows.rows(rows, ["text", "input_ids"])]


def _single_span(position, nearby):
    """A passage of a single-span document: the first, with no neighbour (nearby holds the pids
    at positions k - 1 and k + 1 that exist). Works on scalars and on NumPy columns."""
    return (position == 0) & (nearby == 0)


def passage_kinds(passage_context: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The kinds of a ``passage_context`` setting: one name, or a mix's list."""
    return (passage_context,) if isinstance(passage_context, str) else tuple(passage_context)


def check_passage_context(passage_context) -> None:
    kinds = passage_kinds(passage_context)
    if isinstance(passage_context, str):
        if passage_context not in PASSAGE_CONTEXTS:
            raise ValueError(f"passage_context must be one of {PASSAGE_CONTEXTS}, got {passage_context!r}")
    elif not kinds or len(set(kinds)) != len(kinds) or not set(kinds) <= set(MIXED_PASSAGE_CONTEXTS):
        raise ValueError(f"a mix of passage contexts names each of {MIXED_PASSAGE_CONTEXTS} at most once and at "
                         f"least one, got {list(kinds)}")


def _has_passage_context(part: pa.Table, passage_context, single_span: str = "drop") -> np.ndarray:
    if not isinstance(passage_context, str):      # a mix: any of its kinds
        return np.logical_or.reduce([_has_passage_context(part, kind, single_span) for kind in passage_context])
    if single_span == "self":
        nearby = pc.list_value_length(pc.struct_field(part.column("contexts"), "nearby")).to_numpy(
            zero_copy_only=False)
        return _has_passage_context(part, passage_context) | _single_span(part.column("position").to_numpy(), nearby)
    contexts = part.column("contexts")
    if passage_context == "overlap":
        overlap = pc.struct_field(contexts, "overlap")
        return pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(overlap)), 0).to_numpy(zero_copy_only=False)
    if passage_context == "next":
        # nearby holds the pids at positions k-1 and k+1 that exist: a next span exists when
        # more remain than the previous one (none before position 0).
        nearby = pc.list_value_length(pc.struct_field(contexts, "nearby")).to_numpy(zero_copy_only=False)
        return nearby - (part.column("position").to_numpy() > 0) >= 1
    return pc.greater(pc.list_value_length(pc.struct_field(contexts, passage_context)), 0).to_numpy(
        zero_copy_only=False)


def _has_query(part: pa.Table | None, rows: int, query_count: int) -> np.ndarray:
    """Per passage row of a slice: at least one non-blank query among the first ``query_count``."""
    found = np.zeros(rows, dtype=bool)
    if part is not None and part.num_rows:
        lists = part.column("queries").combine_chunks()
        first = pc.list_slice(lists, 0, query_count)
        non_blank = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(pc.list_flatten(first))), 0)
        parents = pc.list_parent_indices(first).to_numpy()
        found[np.unique(parents[non_blank.to_numpy(zero_copy_only=False)])] = True
    return found


def _check_query_rows(passages: pa.Table, queries: pa.Table, offset: int, path: Path) -> None:
    """Row i of the queries file belongs to passage row i (the generate_queries stage writes them so)."""
    theirs = passages.column("pid").slice(0, queries.num_rows)
    mismatch = np.flatnonzero(~pc.equal(queries.column("pid"), theirs).to_numpy(zero_copy_only=False))
    if len(mismatch):
        row = int(mismatch[0])
        raise DataFormatError(path, offset + row + 1, "pid",
                              f"{queries.column('pid')[row].as_py()!r} is not the passage of the same row "
                              f"in the passages file ({theirs[row].as_py()!r})")


def load_pair_corpus(passages_path: str | os.PathLike, queries_path: str | os.PathLike | None,
                     context_type: str, *, passage_context: str | list[str] | tuple[str, ...] = "random_sampled",
                     query_count: int = 1, tokenizer=None, tokenizer_name: str | None = None,
                     single_span: str = "drop") -> PairCorpus:
    """Map ``passages.arrow`` (and ``queries.arrow``) and index the anchors ``context_type`` can use.

    ``single_span``: ``drop`` skips a single-span document's passage in the passage and
    mixed variants (it has no other span); ``self`` pairs it with itself (the release).

    With ``tokenizer`` the pairs carry the files' token ids, which must have been
    made by that tokenizer (qac.data.tokens.check_stamp, before any scan).
    """
    if context_type not in CONTEXT_TYPES:
        raise ValueError(f"context_type must be one of {CONTEXT_TYPES}, got {context_type!r}")
    check_passage_context(passage_context)
    if not isinstance(passage_context, str):
        passage_context = passage_kinds(passage_context)
    if query_count < 1:
        raise ValueError(f"query_count must be at least 1, got {query_count}")
    if single_span not in SINGLE_SPAN_DOCUMENTS:
        raise ValueError(f"single_span_documents must be one of {SINGLE_SPAN_DOCUMENTS}, got {single_span!r}")
    passages_path = Path(passages_path)
    passages_mapped = open_mapped(passages_path, PASSAGES_SCHEMA)
    passages = passages_mapped.table
    if tokenizer is not None:
        check_stamp(passages_path, passages.schema, tokenizer, tokenizer_name, "input_ids")
    needs_queries = context_type in ("query", "mixed")
    queries, queries_mapped, query_parts = None, None, iter(())
    if needs_queries:
        if queries_path is None:
            raise ValueError(f"context_type {context_type!r} needs a queries file")
        queries_mapped = open_mapped(queries_path, QUERIES_SCHEMA)
        queries = queries_mapped.table
        if tokenizer is not None:
            check_stamp(queries_path, queries.schema, tokenizer, tokenizer_name, "query_ids")
        if queries.num_rows > passages.num_rows:
            raise DataFormatError(queries_path, passages.num_rows + 1, "pid",
                                  f"{queries.num_rows} rows for {passages.num_rows} passages")
        query_parts = scan_tables(queries_path, QUERIES_SCHEMA, _SCAN_ROWS)

    # One pass over both files, a slice at a time, read rather than mapped: the
    # corpus keeps row numbers only, and the scan leaves no pages resident.
    anchors, no_context, no_query, self_paired, offset = [], 0, 0, 0, 0
    for part in scan_tables(passages_path, PASSAGES_SCHEMA, _SCAN_ROWS):
        keep = np.ones(part.num_rows, dtype=bool)
        paired_with_self = None
        if context_type in ("passage", "mixed"):
            keep = _has_passage_context(part, passage_context, single_span)
            no_context += int((~keep).sum())
            if single_span == "self":
                paired_with_self = keep & ~_has_passage_context(part, passage_context)
        if needs_queries:
            query_part = next(query_parts, None)
            if query_part is not None:
                _check_query_rows(part, query_part, offset, Path(queries_path))
            has_query = _has_query(query_part, part.num_rows, query_count)
            no_query += int((keep & ~has_query).sum())
            keep &= has_query
        if paired_with_self is not None:
            self_paired += int((keep & paired_with_self).sum())
        anchors.append(offset + np.flatnonzero(keep))
        offset += part.num_rows
    corpus = PairCorpus(passages=passages, queries=queries,
                        anchors=np.concatenate(anchors) if anchors else np.zeros(0, dtype=np.int64),
                        passage_context=passage_context, query_count=query_count, path=passages_path,
                        total_passages=passages.num_rows, skipped_no_passage_context=no_context,
                        skipped_no_query=no_query, single_span=single_span, self_paired=self_paired,
                        passages_mapped=passages_mapped,
                        queries_mapped=queries_mapped, with_ids=tokenizer is not None)
    if not len(corpus):
        raise ValueError(f"{passages_path}: no passage has a {context_type} context ({corpus.stats()})")
    return corpus


@dataclass(frozen=True)
class Pair:
    index: int            # position in the global batch (seeds this pair's masking)
    anchor: str
    context: str
    context_kind: str     # "passage" | "query"
    row: int = -1         # the anchor's row of passages.arrow
    # Token ids of anchor and context (no special tokens), when read from the files;
    # None: the collator tokenises the texts.
    anchor_ids: object = field(default=None, compare=False, repr=False)
    context_ids: object = field(default=None, compare=False, repr=False)


@dataclass
class PairSampler:
    """The global batch of pairs at a training step, as a pure function of ``(seed, step)``.

    A query context is drawn at every step (the release's). A passage context is drawn at every step too
    (``passage_draw="step"``), or once for the run (``"once"``: from ``(seed, anchor row)`` alone, so an
    anchor keeps one partner, as the release's make_contextual_splits.py stores one per anchor).
    """

    corpus: PairCorpus
    context_type: str
    seed: int
    mixed_query_prob: float = 0.5
    passage_draw: str = "step"
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
        records = self.corpus.rows(self.anchors(step, batch_size))
        drawn = []          # per pair: (kind, query text or passage-context row or overlap text)
        for record in records:
            if self.context_type == "mixed":
                kind = "query" if rng.random() < self.mixed_query_prob else "passage"
            else:
                kind = self.context_type
            once = np.random.default_rng([self.seed, 2, int(record["row"])]) if kind == "passage" and \
                self.passage_draw == "once" else None
            if kind == "query":
                candidates = self.corpus.query_candidates(record["row"])
            elif isinstance(self.corpus.passage_context, str):
                candidates = self.corpus.passage_candidates(record)
            else:       # a mix: a kind among those the anchor has, then one of its candidates
                groups = self.corpus.passage_candidate_groups(record)
                group = int(rng.integers(len(groups)))
                candidates = groups[group if once is None else int(once.integers(len(groups)))]
            index = int(rng.integers(len(candidates)))      # drawn either way: the other pairs' draws stay put
            if once is not None:
                index = int(once.integers(len(candidates)))
            drawn.append((kind, candidates[index]))
        # Passage contexts named by row are read in one gather from the mapped table.
        wanted = [choice for kind, choice in drawn if kind == "passage" and isinstance(choice, int)]
        with_ids = self.corpus.with_ids
        gathered = iter(self.corpus.texts_and_ids_of(wanted) if with_ids else self.corpus.texts_of(wanted))
        pairs = []
        for index, (record, (kind, choice)) in enumerate(zip(records, drawn)):
            context = next(gathered) if kind == "passage" and isinstance(choice, int) else choice
            if with_ids:      # (text, ids) throughout
                pairs.append(Pair(index=index, anchor=record["text"], context=context[0], context_kind=kind,
                                  row=record["row"], anchor_ids=record["input_ids"], context_ids=context[1]))
            else:
                pairs.append(Pair(index=index, anchor=record["text"], context=context, context_kind=kind,
                                  row=record["row"]))
        return pairs


def pad_and_mask(sequences: list[np.ndarray], mask_keys: list[tuple[int, ...]], vocab: MaskingVocab,
                 mask_ratio: float, pad_id: int, pad_to: int | None = None,
                 multiple: int = 1) -> dict[str, torch.Tensor]:
    """One batch side from id arrays that already carry their special tokens.

    ``input_ids`` (whole-word masked), ``attention_mask`` and ``labels``
    (original ids at masked positions, ``-100`` elsewhere), padded to the
    longest sequence rounded up to ``multiple``, or to ``pad_to``; and the
    masked positions row by row, ``mlm_positions`` and ``mlm_labels``
    (:func:`qac.data.masking.masked_targets`). Sequence i is masked with a generator
    seeded by ``mask_keys[i]`` (qac.data.masking.whole_word_mask_batch), so its
    mask depends on that key alone, not on the batch it sits in. Every
    collator (coCondenser, CoT-MAE, others to come) builds its sides with it.
    """
    lengths = np.fromiter((len(ids) for ids in sequences), dtype=np.int64, count=len(sequences))
    width = pad_to or round_up(int(lengths.max()), multiple)
    flat = np.concatenate(sequences).astype(np.int64, copy=False)
    inputs, targets = whole_word_mask_batch(flat, lengths, mask_keys, vocab, mask_ratio)
    # scatter the flat sequences into [rows, width], left-aligned
    rows = np.repeat(np.arange(len(sequences)), lengths)
    columns = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    input_ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    labels = np.full((len(sequences), width), IGNORE_INDEX, dtype=np.int64)
    attention = np.zeros((len(sequences), width), dtype=np.int64)
    input_ids[rows, columns] = inputs
    labels[rows, columns] = targets
    attention[rows, columns] = 1
    labels = torch.from_numpy(labels)
    return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention),
            "labels": labels, **masked_targets(labels, multiple)}


def check_pad_to(pad_to: int | None, max_len: int, query_max_len: int) -> None:
    """Refuse a fixed padding length shorter than the sequences it pads."""
    if pad_to is not None and pad_to < max(max_len, query_max_len):
        raise ValueError(f"pad_to={pad_to} is shorter than max_len={max_len}")


class StoredIdsReader:
    """How the collators of stored token ids read a pair's sides; for a dataclass with ``tokenizer``,
    ``max_len``, ``seed``, ``crop`` and ``special`` (:class:`SpecialTokens`).

    A side's ids are the ones the pair carries, or, for pairs that carry none,
    its text's ids (one tokenizer call for all of them); a passage gets its
    special tokens and is cut at ``max_len`` as the tokenizer would, after a
    random window is kept of it with ``crop`` (:func:`crop_span`).
    """

    _encode = None   # the TextEncoder, made on the first pair without ids

    def _text_ids(self, texts: list[str]) -> list[list[int]]:
        if self._encode is None:
            self._encode = TextEncoder(self.tokenizer)
        return self._encode(texts)

    def _ids(self, pairs: list[Pair], attribute: str, text: str) -> list:
        """``getattr(pair, attribute)`` of each pair, or the ids of ``getattr(pair, text)`` where it is None."""
        ids = [getattr(pair, attribute) for pair in pairs]
        missing = [row for row, value in enumerate(ids) if value is None]
        if missing:
            for row, value in zip(missing, self._text_ids([getattr(pairs[row], text) for row in missing])):
                ids[row] = value
        return ids

    def _passage(self, ids, step: int, index: int, side: int) -> np.ndarray:
        if self.crop:
            ids = crop_span(ids, max(1, self.max_len - self.special.count), crop_rng(self.seed, step, index, side))
        return with_special_tokens(ids, self.max_len, self.special)


@dataclass
class PairMasking:
    """The settings of the pair collators: the pair's two sides masked at their own ratios."""

    tokenizer: object
    max_len: int
    query_max_len: int
    anchor_mask_ratio: float
    context_mask_ratio: float
    seed: int
    pad_to: int | None = None
    pad_to_multiple_of: int = 1   # lengths and masked-position counts rounded up to a multiple of this


@dataclass
class PairCollator(StoredIdsReader, PairMasking):
    """Mask and pad a list of pairs into ``{"anchor": side, "context": side}`` (see :func:`pad_and_mask`).

    Pairs read from the stage files carry their token ids; the collator adds the
    special tokens and cuts passages to ``max_len`` tokens and queries to
    ``query_max_len``, special tokens included, exactly as the tokenizer would
    (qac.data.tokens.with_special_tokens). Pairs without ids have their texts
    tokenised here (tests, benchmarks). Padding is dynamic (to the longest
    sequence of the side) unless ``pad_to`` fixes a length. Each sequence is
    masked with a generator seeded by ``(seed, 2, step, pair index, side)``, so
    masks do not depend on how the batch is split or padded. With ``crop``
    (``split.spans: overflow``) a passage over ``max_len`` keeps a random window
    (:func:`crop_span`, drawn from ``(seed, 3, step, pair index, side)``) instead
    of its head.
    """

    crop: bool = False

    def __post_init__(self):
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)
        self.special = SpecialTokens.of(self.tokenizer)
        check_pad_to(self.pad_to, self.max_len, self.query_max_len)

    def __call__(self, pairs: list[Pair], step: int) -> dict[str, dict[str, torch.Tensor]]:
        anchors = [self._passage(ids, step, pair.index, 0)
                   for pair, ids in zip(pairs, self._ids(pairs, "anchor_ids", "anchor"))]
        # Passage and query contexts have their own length limits.
        contexts = [with_special_tokens(ids, self.query_max_len, self.special) if pair.context_kind == "query"
                    else self._passage(ids, step, pair.index, 1)
                    for pair, ids in zip(pairs, self._ids(pairs, "context_ids", "context"))]
        keys = [(self.seed, 2, step, pair.index) for pair in pairs]
        pad = self.special.pad_id
        multiple = self.pad_to_multiple_of
        return {"anchor": pad_and_mask(anchors, [key + (0,) for key in keys], self.vocab, self.anchor_mask_ratio,
                                       pad, self.pad_to, multiple),
                "context": pad_and_mask(contexts, [key + (1,) for key in keys], self.vocab, self.context_mask_ratio,
                                        pad, self.pad_to, multiple)}


@dataclass
class TextPairCollator(PairMasking):
    """The collator as it was before token ids were stored: tokenise the texts, then mask word by word.

    Kept as the definition :class:`PairCollator` must equal (tests) and as the
    baseline of ``benchmarks/bench_pretrain.py``.
    """

    def __post_init__(self):
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)

    def _tokenize(self, texts: list[str], max_len: int) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, truncation=True, max_length=max_len, add_special_tokens=True)["input_ids"]

    def _side(self, token_ids, indices, side, step, mask_ratio):
        length = self.pad_to or round_up(max(len(ids) for ids in token_ids), self.pad_to_multiple_of)
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
        return {"input_ids": input_ids, "attention_mask": attention, "labels": labels,
                **masked_targets(labels, self.pad_to_multiple_of)}

    def __call__(self, pairs: list[Pair], step: int) -> dict[str, dict[str, torch.Tensor]]:
        indices = [pair.index for pair in pairs]
        anchors = self._tokenize([pair.anchor for pair in pairs], self.max_len)
        contexts: list[list[int]] = [[] for _ in pairs]
        for kind, limit in (("passage", self.max_len), ("query", self.query_max_len)):
            rows = [row for row, pair in enumerate(pairs) if pair.context_kind == kind]
            for row, ids in zip(rows, self._tokenize([pairs[row].context for row in rows], limit)):
                contexts[row] = ids
        return {"anchor": self._side(anchors, indices, 0, step, self.anchor_mask_ratio),
                "context": self._side(contexts, indices, 1, step, self.context_mask_ratio)}


def crop_rng(seed: int, step: int, index: int, side: int) -> np.random.Generator:
    """The crop's generator of one sequence: a function of ``(seed, step, pair index, side)`` only,
    as the masking's, so a crop does not depend on how a batch is split or on DataLoader workers."""
    return np.random.default_rng([seed, 3, step, index, side])


def crop_span(ids, limit: int, rng: np.random.Generator):
    """A random window of ``limit`` consecutive tokens of ``ids`` (the release's training crop of an
    overflowing span: its start drawn uniformly); ``ids`` unchanged when it fits. Works on lists
    and integer arrays."""
    if limit < 1:
        raise ValueError(f"crop limit must be at least 1, got {limit}")
    excess = len(ids) - limit
    if excess <= 0:
        return ids
    start = int(rng.integers(0, excess + 1))
    return ids[start:start + limit]


def shard(pairs: list, rank: int, world_size: int) -> list:
    """This process's contiguous share of a global batch (global rank order)."""
    if len(pairs) % world_size:
        raise ValueError(f"global batch of {len(pairs)} does not split over {world_size} processes")
    size = len(pairs) // world_size
    return pairs[rank * size:(rank + 1) * size]
