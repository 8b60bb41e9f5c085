"""MASTER's decoder inputs: what each of its five decoders reads and must recover.

A MASTER batch is a batch of pre-training pairs (qac.data.context_pairs) whose anchor
the encoder reads and whose context is the NPR decoder's text, plus, per
anchor, its generated queries (DOR) and its causal-LM continuation (GOR). For
each pair (all sequences ``[CLS] text [SEP]``, position 0 later replaced by
the encoder's [CLS] vector):

========  ==============================================  =========================================
decoder   text                                             masked (labels)
========  ==============================================  =========================================
``mkp``   the anchor                                       ``decoder_mask_ratio`` of its words, drawn
                                                           with TF-IDF weights (rare words more)
``cmp``   the anchor                                       exactly the words the encoder saw (every
                                                           maskable word the encoder's mask left)
``npr``   the pair's context: the next span of the         ``decoder_mask_ratio`` of its words,
          document (``passage_context: next``) or a        uniformly, or with TF-IDF weights as
          generated query (query-as-context)               MKP (``npr_mask: keyword``, MASTER's)
``dor``   the first ``dor_queries`` generated queries,     ``decoder_mask_ratio`` of its words,
          joined by [SEP], cut at ``max_len`` tokens       uniformly
``gor``   the anchor's continuation (continuations.arrow)  ``decoder_mask_ratio`` of its words,
                                                           uniformly
========  ==============================================  =========================================

Texts come as the token ids the stage files store (passages.arrow's
``input_ids``, queries.arrow's and continuations.arrow's ``query_ids``, each
file stamped with its tokenizer and checked against the run's,
qac.data.tokens); the collator adds special tokens, cuts, pads and masks
integer arrays. Pairs without ids (tests, benchmarks) have their texts
tokenised by the collator; :class:`TextMasterCollator` is the collator that
tokenised every text itself, kept as the definition the batches must equal.

Masked tokens follow BERT's 80/10/10 recipe everywhere (MASTER's release
does the same). A pair without a text for a decoder (no generated query, an
empty continuation) gives that decoder ``[CLS] [SEP]`` and no label: it adds
nothing to the decoder's mean. Every sequence is masked with a generator
seeded by ``(seed, step, pair index, side)``, sides 0 (anchor) and 1 (npr) as
in :class:`qac.data.context_pairs.PairCollator`, 2-5 for mkp, cmp, dor, gor, so masks
do not depend on how a batch is split over processes or padded.

TF-IDF weights. A word (word-pieces joined, as :func:`qac.data.masking.word_strings`)
occurring in the anchor gets the weight ``idf = ln((1 + N) / (1 + df)) + 1``
per occurrence (so a word's total weight is its tf-idf), ``N`` the number of
passages and ``df`` the number of passages containing the word, counted once
over ``passages.arrow`` (:func:`count_word_frequencies`, the
``word_frequencies`` stage). MASTER's release weights a word by the inverse
of its count of occurrences in the corpus; the paper says TF-IDF, which is
what this follows. MASTER's paper masks NPR's text by the same weights ("we
also rely on the TF-IDF weights of words to mask more keywords in the decoder
as MKP") and so does its release: ``npr_mask`` chooses ``keyword`` (theirs)
or ``uniform`` (the earlier choice here, kept as a switch).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from qac.data.arrowstore import PASSAGES_SCHEMA, QUERIES_SCHEMA, RowGather, open_mapped, scan_tables
from qac.data.context_pairs import Pair, PairSampler, StoredIdsReader, check_pad_to, pad_and_mask
from qac.data.masking import (IGNORE_INDEX, MaskingVocab, mask_positions, masked_targets, round_up,
                              weighted_word_mask, whole_word_mask, word_spans, word_strings)
from qac.data.tokens import SpecialTokens, check_stamp, with_special_tokens
from qac.params.vocabulary import MASTER_TASKS, NPR_MASKS
from qac.data.errors import DataFormatError

# Masking-generator side of each decoder's sequence (anchor 0 and context 1 are PairCollator's).
SIDES = {"npr": 1, "mkp": 2, "cmp": 3, "dor": 4, "gor": 5}
DOR_WINDOW_SIDE = 6     # the random stream of DOR's crop window (dor_crop: window), apart from every mask's
FREQUENCY_BATCH = 1024


def passage_words(tokenizer, texts: list[str], vocab: MaskingVocab) -> list[list[str]]:
    """The words (word-pieces joined) of each text, tokenized as the encoder tokenizes it."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return [word_strings(tokenizer.convert_ids_to_tokens(row), word_spans(row, vocab)) for row in ids]


def count_word_frequencies(passages_path: str | os.PathLike, tokenizer,
                           progress=None) -> dict[str, object]:
    """One pass over ``passages.arrow``: ``{"passages": N, "document_frequency": {word: passages containing it}}``.

    Words are sorted, so the same passages give the same file.
    """
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    frequency: Counter = Counter()
    passages = 0
    for part in scan_tables(passages_path, PASSAGES_SCHEMA, FREQUENCY_BATCH):
        texts = part.column("text").to_pylist()
        for words in passage_words(tokenizer, texts, vocab):
            frequency.update(set(words))
        passages += len(texts)
        if progress is not None:
            progress(len(texts))
    return {"passages": passages, "document_frequency": dict(sorted(frequency.items()))}


@dataclass(frozen=True)
class WordWeights:
    """Inverse document frequencies of words (the ``word_frequencies`` stage's file)."""

    passages: int
    document_frequency: dict[str, int] = field(repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WordWeights":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise DataFormatError(path, 1, "word_frequencies", f"not readable JSON ({error})") from None
        for key in ("passages", "document_frequency"):
            if key not in data:
                raise DataFormatError(path, 1, key, "missing")
        if not isinstance(data["passages"], int) or data["passages"] < 1:
            raise DataFormatError(path, 1, "passages", f"must be a positive integer, got {data['passages']!r}")
        return cls(passages=data["passages"], document_frequency=data["document_frequency"])

    def idf(self, word: str) -> float:
        """``ln((1 + N) / (1 + df)) + 1``: positive, largest for a word no passage contains."""
        return math.log((1 + self.passages) / (1 + self.document_frequency.get(word, 0))) + 1.0


@dataclass(frozen=True)
class MasterPair(Pair):
    """A pair and the anchor's DOR and GOR texts (with their token ids, no special tokens, when read
    from the stage files; None: the collator tokenises the texts)."""

    queries: tuple[str, ...] = ()
    continuation: str = ""
    query_ids: object = field(default=None, compare=False, repr=False)          # one id list per kept query
    continuation_ids: object = field(default=None, compare=False, repr=False)


@dataclass
class MasterSources:
    """The generated queries and continuations of passage rows (memory-mapped; row i is passage row i).

    With ``tokenizer`` the files' token ids are read too; each file must have
    been stamped with that tokenizer (qac.data.tokens.check_stamp, on opening).
    """

    queries_path: str | os.PathLike | None = None
    continuations_path: str | os.PathLike | None = None
    dor_queries: int = 10
    tokenizer: object = field(default=None, repr=False)
    tokenizer_name: str | None = None

    def __post_init__(self):
        self._queries = self._open(self.queries_path)
        self._continuations = self._open(self.continuations_path)

    def _open(self, path) -> RowGather | None:
        if path is None:
            return None
        mapped = open_mapped(path, QUERIES_SCHEMA)
        if self.tokenizer is not None:
            check_stamp(path, mapped.table.schema, self.tokenizer, self.tokenizer_name, "query_ids")
        return RowGather(mapped.table, mapped)

    def _lists(self, gather: RowGather | None, rows: list[int]) -> list[tuple[list[str], list | None]]:
        """``(texts, ids)`` of each row (ids None unless read with a tokenizer); rows past the file: empty."""
        with_ids = self.tokenizer is not None
        if gather is None:
            return [([], [] if with_ids else None) for _ in rows]
        columns = ["queries", "query_ids"] if with_ids else ["queries"]
        inside = [row for row in rows if row < gather.num_rows]
        values = iter(gather.rows(inside, columns)) if inside else iter(())
        out = []
        for row in rows:
            record = next(values) if row < gather.num_rows else {"queries": [], "query_ids": []}
            out.append((record["queries"], record["query_ids"] if with_ids else None))
        return out

    def attach(self, pairs: list[Pair]) -> list[MasterPair]:
        rows = [pair.row for pair in pairs]
        queries = self._lists(self._queries, rows)
        continuations = self._lists(self._continuations, rows)
        out = []
        for pair, (texts, ids), (continuation, continuation_ids) in zip(pairs, queries, continuations):
            kept = [index for index, text in enumerate(texts) if text.strip()][:self.dor_queries]
            out.append(MasterPair(**{name: getattr(pair, name) for name in pair.__dataclass_fields__},
                                  queries=tuple(texts[index] for index in kept),
                                  continuation=continuation[0] if continuation else "",
                                  query_ids=None if ids is None else [ids[index] for index in kept],
                                  continuation_ids=None if continuation_ids is None else
                                  (continuation_ids[0] if continuation_ids else [])))
        return out


@dataclass
class MasterSampler:
    """:class:`PairSampler`'s batches with each anchor's queries and continuation attached."""

    pairs: PairSampler
    sources: MasterSources

    def batch(self, step: int, batch_size: int) -> list[MasterPair]:
        return self.sources.attach(self.pairs.batch(step, batch_size))


def pack_side(rows: list[tuple[list[int], list[int]]], pad_id: int, pad_to: int | None = None,
              multiple: int = 1) -> dict[str, torch.Tensor]:
    """``(inputs, labels)`` rows padded into ``input_ids``, ``attention_mask`` and ``labels`` tensors (to the
    longest row rounded up to ``multiple``, or to ``pad_to``), with the masked positions row by row
    (:func:`qac.data.masking.masked_targets`)."""
    length = pad_to or round_up(max(len(inputs) for inputs, _ in rows), multiple)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for row, (inputs, targets) in enumerate(rows):
        input_ids[row, :len(inputs)] = torch.tensor(inputs, dtype=torch.long)
        labels[row, :len(inputs)] = torch.tensor(targets, dtype=torch.long)
        attention[row, :len(inputs)] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels,
            **masked_targets(labels, multiple)}


@dataclass
class MasterMasking:
    """What the MASTER collators share: their settings, the checks of them, and the two decoders that mask
    the anchor's words, MKP and CMP (``vocab`` is set by the collator)."""

    tokenizer: object
    max_len: int
    query_max_len: int
    mask_ratio: float
    decoder_mask_ratio: float
    seed: int
    decoders: tuple[str, ...] = MASTER_TASKS
    word_weights: WordWeights | None = None
    pad_to: int | None = None
    npr_mask: str = "uniform"
    pad_to_multiple_of: int = 1   # lengths and masked-position counts rounded up to a multiple of this
    dor_crop: str = "start"       # start | window: DOR's joined queries over max_len cut at a random window
    empty_continuation: str = "no_label"   # no_label | anchor: GOR reads the anchor where the continuation is empty

    @property
    def keyword_tasks(self) -> tuple[str, ...]:
        """The decoders whose words are masked with TF-IDF weights."""
        return tuple(task for task in self.decoders
                     if task == "mkp" or (task == "npr" and self.npr_mask == "keyword"))

    def _check_settings(self) -> None:
        if self.npr_mask not in NPR_MASKS:
            raise ValueError(f"npr_mask {self.npr_mask!r} is not one of {', '.join(NPR_MASKS)}")
        if self.dor_crop not in ("start", "window"):
            raise ValueError(f"dor_crop must be start or window, got {self.dor_crop!r}")
        if self.empty_continuation not in ("no_label", "anchor"):
            raise ValueError(f"empty_continuation must be no_label or anchor, got {self.empty_continuation!r}")
        if self.keyword_tasks and self.word_weights is None:
            raise ValueError(f"the {' and '.join(self.keyword_tasks)} decoder(s) need word frequencies "
                             f"(the word_frequencies stage's file)")
        check_pad_to(self.pad_to, self.max_len, self.query_max_len)

    def join_queries(self, pieces: list[list[int]], step: int, index: int) -> list[int]:
        """``[CLS] q1 [SEP] q2 [SEP] ...`` of the queries' ids in ``max_len`` tokens (``[CLS] [SEP]`` for none).

        Over ``max_len``, ``dor_crop`` start keeps the beginning (ending in [SEP]); window keeps a window of
        ``max_len - 2`` tokens of ``q1 [SEP] q2 [SEP] ...`` whose start is drawn per pair and step (side
        :data:`DOR_WINDOW_SIDE`), between [CLS] and [SEP], as MASTER's release crops its decoder's text.
        """
        cls_id, sep_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        body = [token for piece in pieces for token in [*piece, sep_id]]
        if len(body) + 1 <= self.max_len:
            return [cls_id, *body] if body else [cls_id, sep_id]
        if self.dor_crop == "start":
            return [cls_id, *body[:self.max_len - 2], sep_id]
        width = self.max_len - 2
        rng = np.random.default_rng([self.seed, 2, step, index, DOR_WINDOW_SIDE])
        start = int(rng.integers(0, len(body) - width + 1))
        return [cls_id, *body[start:start + width], sep_id]

    def continuation_or_anchor(self, continuation, anchor):
        """GOR's text: the continuation's ids, or with ``empty_continuation`` anchor the anchor's (as the encoder
        reads it) where the continuation has no token of its own."""
        if self.empty_continuation == "anchor" and len(continuation) <= self._special_count:
            return anchor           # nothing but the special tokens ([CLS] [SEP])
        return continuation

    @functools.cached_property
    def _special_count(self) -> int:
        return self.tokenizer.num_special_tokens_to_add(pair=False)

    def keyword_mask(self, ids: list[int], rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """``decoder_mask_ratio`` of the words of ``ids``, drawn with TF-IDF weights (MKP; NPR with ``keyword``)."""
        spans = word_spans(ids, self.vocab)
        words = word_strings(self.tokenizer.convert_ids_to_tokens(ids), spans)
        weights = [self.word_weights.idf(word) for word in words]
        return weighted_word_mask(ids, self.vocab, self.decoder_mask_ratio, weights, rng)

    def cmp(self, ids: list[int], encoder_labels: list[int], rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """The anchor with every maskable token the encoder's mask left masked (80/10/10)."""
        seen = [position for start, end in word_spans(ids, self.vocab) for position in range(start, end)
                if encoder_labels[position] == IGNORE_INDEX]
        return mask_positions(ids, seen, self.vocab, rng)


@dataclass
class MasterCollator(StoredIdsReader, MasterMasking):
    """Mask and pad a list of :class:`MasterPair` into the anchor side and one side per decoder.

    Reads the pairs' stored ids (texts without ids are tokenised here), adds
    the special tokens and cuts as the tokenizer would
    (qac.data.tokens.with_special_tokens): the anchor, the NPR passage and the
    continuation at ``max_len``, a query context at ``query_max_len``. The
    anchor and the NPR, DOR and GOR sides are masked a batch at a time
    (:func:`qac.data.context_pairs.pad_and_mask`); MKP and CMP depend on the anchor's
    words and on the encoder's mask, and are masked per sequence. Batches
    equal :class:`TextMasterCollator`'s for the same seed (tested). With
    ``crop`` (``split.spans: overflow``) the anchor and the NPR passage keep a
    random window of an overflowing passage, drawn as
    :class:`qac.data.context_pairs.PairCollator` draws it (sides 0 and 1), so MKP and
    CMP read the window the encoder reads.
    """

    crop: bool = False

    def __post_init__(self):
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)
        self.special = SpecialTokens.of(self.tokenizer)
        self.decoders = tuple(self.decoders)
        self._check_settings()

    def joined_queries(self, pieces: list, step: int = 0, index: int = 0) -> np.ndarray:
        """:meth:`join_queries` of the stored query ids, as an array."""
        return np.asarray(self.join_queries([list(piece) for piece in pieces], step, index), dtype=np.int64)

    def _query_ids(self, pairs: list[MasterPair]) -> list[list]:
        ids = [pair.query_ids for pair in pairs]
        missing = [row for row, value in enumerate(ids) if value is None]
        flat = self._text_ids([query for row in missing for query in pairs[row].queries])
        start = 0
        for row in missing:
            count = len(pairs[row].queries)
            ids[row], start = flat[start:start + count], start + count
        return ids

    def __call__(self, pairs: list[MasterPair], step: int) -> dict[str, dict[str, torch.Tensor]]:
        pad, rate = self.special.pad_id, self.decoder_mask_ratio
        keys = [(self.seed, 2, step, pair.index) for pair in pairs]
        anchors = [self._passage(ids, step, pair.index, 0)
                   for pair, ids in zip(pairs, self._ids(pairs, "anchor_ids", "anchor"))]
        multiple = self.pad_to_multiple_of
        batch = {"anchor": pad_and_mask(anchors, [key + (0,) for key in keys], self.vocab, self.mask_ratio,
                                        pad, self.pad_to, multiple)}
        sequences: dict[str, list[np.ndarray]] = {}
        weighted = {"mkp": anchors}      # masked word by word with TF-IDF weights
        if "npr" in self.decoders:
            target = weighted if "npr" in self.keyword_tasks else sequences
            target["npr"] = [
                with_special_tokens(ids, self.query_max_len, self.special) if pair.context_kind == "query"
                else self._passage(ids, step, pair.index, 1)
                for pair, ids in zip(pairs, self._ids(pairs, "context_ids", "context"))]
        if "dor" in self.decoders:
            sequences["dor"] = [self.joined_queries(ids, step, pair.index)
                                for pair, ids in zip(pairs, self._query_ids(pairs))]
        if "gor" in self.decoders:
            sequences["gor"] = [self.continuation_or_anchor(with_special_tokens(ids, self.max_len, self.special),
                                                            anchor)
                                for ids, anchor in zip(self._ids(pairs, "continuation_ids", "continuation"), anchors)]
        for task in self.decoders:
            if task in sequences:
                batch[task] = pad_and_mask(sequences[task], [key + (SIDES[task],) for key in keys], self.vocab,
                                           rate, pad, self.pad_to, multiple)
                continue
            rows = []
            lengths = batch["anchor"]["attention_mask"].sum(dim=1).tolist()
            for row, pair in enumerate(pairs):
                rng = np.random.default_rng([self.seed, 2, step, pair.index, SIDES[task]])
                if task in weighted:
                    rows.append(self.keyword_mask(weighted[task][row].tolist(), rng))
                else:
                    encoder_labels = batch["anchor"]["labels"][row, :lengths[row]].tolist()
                    rows.append(self.cmp(anchors[row].tolist(), encoder_labels, rng))
            batch[task] = pack_side(rows, pad, self.pad_to, multiple)
        return batch


@dataclass
class TextMasterCollator(MasterMasking):
    """The MASTER collator as it was before token ids were stored: tokenise the texts, then mask word
    by word. Kept as the definition :class:`MasterCollator` must equal (tests)."""

    def __post_init__(self):
        self.vocab = MaskingVocab.from_tokenizer(self.tokenizer)
        self.decoders = tuple(self.decoders)
        self._check_settings()

    def _rng(self, step: int, index: int, side: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, 2, step, index, side])

    def _tokenize(self, texts: list[str], max_len: int) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, truncation=True, max_length=max_len, add_special_tokens=True)["input_ids"]

    def joined_queries(self, queries: tuple[str, ...], step: int = 0, index: int = 0) -> list[int]:
        """:meth:`join_queries` of the queries' texts, tokenised here."""
        pieces = self.tokenizer(list(queries), add_special_tokens=False)["input_ids"] if queries else []
        return self.join_queries(pieces, step, index)

    def __call__(self, pairs: list[MasterPair], step: int) -> dict[str, dict[str, torch.Tensor]]:
        pad, rate = self.tokenizer.pad_token_id, self.decoder_mask_ratio
        anchors = self._tokenize([pair.anchor for pair in pairs], self.max_len)
        anchor_rows = [whole_word_mask(ids, self.vocab, self.mask_ratio, self._rng(step, pair.index, 0))
                       for ids, pair in zip(anchors, pairs)]
        multiple = self.pad_to_multiple_of
        batch = {"anchor": pack_side(anchor_rows, pad, self.pad_to, multiple)}
        texts: dict[str, list[list[int]]] = {}
        if "npr" in self.decoders:
            texts["npr"] = [[] for _ in pairs]
            for kind, limit in (("passage", self.max_len), ("query", self.query_max_len)):
                rows = [row for row, pair in enumerate(pairs) if pair.context_kind == kind]
                for row, ids in zip(rows, self._tokenize([pairs[row].context for row in rows], limit)):
                    texts["npr"][row] = ids
        if "dor" in self.decoders:
            texts["dor"] = [self.joined_queries(pair.queries, step, pair.index) for pair in pairs]
        if "gor" in self.decoders:
            texts["gor"] = [self.continuation_or_anchor(ids, anchor) for ids, anchor in
                            zip(self._tokenize([pair.continuation.strip() for pair in pairs], self.max_len), anchors)]
        for task in self.decoders:
            rows = []
            for row, pair in enumerate(pairs):
                rng = self._rng(step, pair.index, SIDES[task])
                if task == "mkp":
                    rows.append(self.keyword_mask(anchors[row], rng))
                elif task in self.keyword_tasks:
                    rows.append(self.keyword_mask(texts[task][row], rng))
                elif task == "cmp":
                    rows.append(self.cmp(anchors[row], anchor_rows[row][1], rng))
                else:
                    rows.append(whole_word_mask(texts[task][row], self.vocab, rate, rng))
            batch[task] = pack_side(rows, pad, self.pad_to, multiple)
        return batch


def master_batches(settings, mask_ratios: tuple[float, float], tokenizer, sampler: PairSampler,
                   inputs: dict[str, str | os.PathLike | None]) -> tuple[MasterSampler, MasterCollator]:
    """The sampler and collator of a MASTER run (``inputs``: ``queries``, ``continuations``, ``word_frequencies``)."""
    decoders = tuple(settings.master_decoders)
    needs = required_inputs(settings)
    missing = [name for name in needs if not inputs.get(name)]
    if missing:
        raise ValueError(f"MASTER decoders {list(decoders)} need the input file(s) {', '.join(missing)}")
    sources = MasterSources(queries_path=inputs.get("queries") if "dor" in decoders else None,
                            continuations_path=inputs.get("continuations") if "gor" in decoders else None,
                            dor_queries=int(settings.master_dor_queries), tokenizer=tokenizer,
                            tokenizer_name=settings.init)
    weights = WordWeights.load(inputs["word_frequencies"]) if "word_frequencies" in needs else None
    collator = MasterCollator(tokenizer, settings.max_len, settings.query_max_len, *mask_ratios,
                              seed=settings.seed, decoders=decoders, word_weights=weights, pad_to=settings.pad_to,
                              pad_to_multiple_of=settings.pad_to_multiple_of, crop=settings.spans == "overflow",
                              npr_mask=settings.master_npr_mask, dor_crop=settings.master_dor_crop,
                              empty_continuation=settings.master_empty_continuation)
    return MasterSampler(sampler, sources), collator


def required_inputs(settings) -> list[str]:
    """The files besides ``passages.arrow`` a MASTER run reads."""
    decoders = tuple(settings.master_decoders)
    needs = []
    if "dor" in decoders or settings.context_type in ("query", "mixed"):
        needs.append("queries")
    if "gor" in decoders:
        needs.append("continuations")
    if "mkp" in decoders or ("npr" in decoders and settings.master_npr_mask == "keyword"):
        needs.append("word_frequencies")
    return needs


__all__ = ["MasterCollator", "MasterPair", "MasterSampler", "MasterSources", "TextMasterCollator",
           "WordWeights",
           "count_word_frequencies", "master_batches", "pack_side", "required_inputs"]
