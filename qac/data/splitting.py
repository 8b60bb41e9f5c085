"""Split documents into passages of at most ``max_len`` tokens, with their contexts.

What the paper does (and what this module reproduces, deterministically):

1. A document's text (title and body joined by a space) is split into
   sentences with Punkt (:mod:`qac.data.punkt`).
2. Sentences are tokenized with the encoder's tokenizer, without special tokens.
3. Sentences are grouped greedily into passages. A passage's target length is
   ``max_len`` or, with probability ``short_span_prob``, a length drawn
   uniformly from ``[2, max_len]`` (the "short spans" of coCondenser/CoT-MAE).

``split.spans`` chooses how a passage meets its target:

- ``bounded`` (stricter than the release): no passage ever exceeds ``max_len``
  tokens. A sentence joins a passage only if the passage stays within its
  target (a passage always takes at least one sentence, so a short target
  never leaves it empty), and a sentence longer than ``max_len`` is first cut
  into pieces at token boundaries (preferring word starts).
- ``overflow`` (the release): a passage takes sentences until it crosses its
  target (one that reaches it exactly takes another, as the release's
  ``curr_len > target_seq_len``), so it closes after the sentence that crosses the limit and may hold
  more than ``max_len`` tokens; sentences are never cut. Pre-training crops
  such a passage to a random window of its length (qac.data.context_pairs.crop_span). Passages are cut from the document text by character offsets, never
decoded from token ids, and every passage, piece and overlap text is
re-tokenized: ``n_tokens`` is the length of the text as a stage downstream will
tokenize it, and with ``bounded`` is checked to be ``<= max_len`` (a passage that a
non-additive tokenizer makes longer is split again between its sentences).

Each passage records its contexts (the passage-passage baseline):

- ``nearby``: pids of the passages at positions ``k - 1`` and ``k + 1``;
- ``random_sampled``: pids of every other passage of the document within
  ``random_sampled_window`` positions; the pair sampler draws one;
- ``overlap``: the text of the passage's last ``overlap_sentences`` sentences
  followed by the next sentences of the document, as many as fit in
  ``max_len`` tokens; empty for a document's last passage (nothing follows,
  so the text would lie inside the passage itself).

Determinism: a document's random draws come from a generator seeded with a
stable hash of ``(seed, doc_id)``, and chunks of documents are processed in
parallel but written in corpus order (``Pool.imap``), so the output bytes
depend on the corpus, the settings and the seed only, not on the number of
processes. Memory stays bounded: documents are read one at a time, a few
chunks per worker are in flight, and passages are written in batches of a
fixed number of rows (so the Arrow file's bytes do not depend on the number
of processes either). Tokenization is batched: one tokenizer call per chunk and check,
not one per sentence.
"""

from __future__ import annotations

import itertools

import hashlib
import os
import random
import re
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Iterator, Sequence

from qac.data.arrowstore import write_passages
from qac.data.tokens import CHARS_PER_TOKEN, cut_end
from qac.params.vocabulary import SpanRule
from qac.console import progress as progress_bar
from qac.data.beir import iter_corpus_jsonl
from qac.errors import UserError
from qac.io import file_md5


@dataclass(frozen=True)
class SplitSettings:
    """The ``split`` section of ``params.yaml`` (plus the global seed)."""

    max_len: int
    short_span_prob: float
    random_sampled_window: int
    overlap_sentences: int | str   # k, or "random": k drawn per passage in [1, its units // 2] (the release's)
    seed: int
    spans: SpanRule  # bounded: never over max_len; overflow: close after the crossing sentence

    @property
    def overflow(self) -> bool:
        return self.spans == "overflow"

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "SplitSettings":
        split = params["split"]
        return cls(**{field.name: split[field.name] for field in fields(cls) if field.name != "seed"},
                   seed=params["seed"])


class TokenCounter:
    """Counts tokens of texts with a Hugging Face tokenizer, without special tokens.

    ``batched=True`` sends a whole list to the tokenizer in one call (the Rust
    tokenizer of a fast tokenizer, without computing offsets it does not need);
    ``batched=False`` calls the tokenizer once per text, as the reference
    release does for every sentence. Both give the same numbers.
    """

    def __init__(self, tokenizer, batched: bool = True):
        self.tokenizer = tokenizer
        self.batched = batched
        self._backend = None
        if batched and getattr(tokenizer, "is_fast", False):
            from tokenizers import Tokenizer

            # A copy without the truncation and padding a tokenizer.json may carry
            # (sentence-transformers models truncate at 128): we need true lengths.
            self._backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            self._backend.no_truncation()
            self._backend.no_padding()

    def lengths(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.ids(texts)]

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens): what passages.arrow stores beside the text."""
        if not texts:
            return []
        if self._backend is not None:
            return [encoding.ids for encoding in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        options = dict(add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False,
                       verbose=False)
        if self.batched:
            return list(self.tokenizer(list(texts), **options)["input_ids"])
        return [self.tokenizer(text, **options)["input_ids"] for text in texts]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of every token of ``text``."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return [tuple(span) for span in encoded["offset_mapping"]]


@dataclass
class DocumentSplit:
    """The passages of one document and how many sentences it had."""

    doc_id: str
    passages: list[dict[str, Any]]
    sentences: int
    long_sentences: int


def document_rng(seed: int, doc_id: str) -> random.Random:
    """The random generator of one document: a stable function of ``(seed, doc_id)``.

    Python's ``hash`` is salted per process, so a cryptographic hash keeps the
    draws identical across processes and runs.
    """
    digest = hashlib.sha256(f"{seed}\x00{doc_id}".encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def draw_targets(rng: random.Random, settings: SplitSettings):
    """Target lengths of successive passages: ``max_len``, or short with probability ``short_span_prob``."""
    while True:
        if rng.random() < settings.short_span_prob:
            yield rng.randint(2, settings.max_len)
        else:
            yield settings.max_len


def group_units(lengths: Sequence[int], targets: Iterator[int], overflow: bool = False) -> list[tuple[int, int]]:
    """Greedy grouping of units (sentences) into ``[start, end)`` ranges.

    A range takes the next unit while its total stays within the range's
    target, and always takes at least one unit. With ``overflow`` (the
    release's rule) a range takes the next unit while its total is within the
    target: it closes after the unit that crosses the target, so its total
    exceeds it (a range that reaches its target exactly takes one more unit,
    as the release's ``curr_len > target_seq_len`` test).
    """
    ranges = []
    start = 0
    while start < len(lengths):
        target = next(targets)
        total, end = lengths[start], start + 1
        while end < len(lengths) and (total <= target if overflow else total + lengths[end] <= target):
            total += lengths[end]
            end += 1
        ranges.append((start, end))
        start = end
    return ranges


def _piece_ends(offsets: list[tuple[int, int]], limit: int) -> list[int]:
    """Token indices where a long sentence is cut: at most ``limit`` tokens a piece.

    A cut prefers the start of a word (a token preceded by a gap in the text)
    in the second half of the piece, so words are not torn apart when avoidable.
    """
    ends = []
    start = 0
    while start < len(offsets):
        end = min(start + limit, len(offsets))
        if end < len(offsets):
            for candidate in range(end, start + max(limit // 2, 1), -1):
                if offsets[candidate][0] > offsets[candidate - 1][1]:
                    end = candidate
                    break
        ends.append(end)
        start = end
    return ends


def cut_to_fit(text: str, span: tuple[int, int], limit: int,
               counter: TokenCounter) -> list[tuple[tuple[int, int], int]]:
    """Cut ``text[span]`` into pieces of at most ``limit`` tokens: ``[(piece span, tokens)]``.

    Cuts at token boundaries of the span's own tokenization (character offsets,
    so no text is lost or altered by decoding); every piece is re-tokenized, and
    a piece that still exceeds the limit (a tokenizer may split characters
    differently once a word is cut) is cut again.
    """
    if span[1] - span[0] > limit * CHARS_PER_TOKEN * WINDOW_PIECES:
        return _cut_long_span(text, span, limit, counter)
    base = span[0]
    offsets = [(base + s, base + e) for s, e in counter.offsets(text[span[0]:span[1]]) if e > s]
    pieces, start = [], 0
    for end in _piece_ends(offsets, limit):
        pieces.append((offsets[start][0], offsets[end - 1][1]))
        start = end
    fitted = []
    for piece, length in zip(pieces, counter.lengths([text[s:e] for s, e in pieces])):
        if length <= limit:
            fitted.append((piece, length))
        elif piece == span:
            raise ValueError(f"cannot cut {text[piece[0]:piece[1]]!r} into pieces of at most {limit} tokens")
        else:
            fitted.extend(cut_to_fit(text, piece, limit, counter))
    return fitted


# A sentence longer than this many pieces' worth of characters (limit x CHARS_PER_TOKEN each: 74k characters
# at 144 tokens) is cut window by window, so a 40 MB line never has its millions of tokens and offsets in
# memory at once; a shorter one, every sentence of a normal text, is cut from its whole tokenization.
WINDOW_PIECES = 8
_NOT_SPACE = re.compile(r"\S")


def _cut_long_span(text: str, span: tuple[int, int], limit: int,
                   counter: TokenCounter) -> list[tuple[tuple[int, int], int]]:
    """:func:`cut_to_fit` of a span too long to tokenise whole: a window of ``WINDOW_PIECES`` pieces' worth
    of characters (ending before a word) at a time, keeping every piece but the window's last, which the
    window's end may have cut, and going on from the first character after the last piece kept."""
    fitted, start, end = [], span[0], span[1]
    while True:
        stop = cut_end(text, limit * WINDOW_PIECES, start, end)
        pieces = cut_to_fit(text, (start, stop), limit, counter) if stop > start else []
        if stop >= end or not pieces:
            return fitted + pieces
        kept = pieces[:-1] or pieces
        fitted.extend(kept)
        following = _NOT_SPACE.search(text, kept[-1][0][1], end)
        if following is None:
            return fitted
        start = following.start()


def sentence_units(text: str, spans: list[tuple[int, int]], lengths: list[int], max_len: int,
                   counter: TokenCounter) -> tuple[list[tuple[int, int]], list[int], int]:
    """Sentence spans with their token counts, sentences over ``max_len`` cut into pieces.

    Returns the unit spans, their lengths and the number of sentences that were cut.
    """
    units, unit_lengths, long_sentences = [], [], 0
    for span, length in zip(spans, lengths):
        if length == 0:
            continue  # nothing the tokenizer sees (e.g. only control characters)
        if length <= max_len:
            units.append(span)
            unit_lengths.append(length)
            continue
        long_sentences += 1
        for piece, piece_length in cut_to_fit(text, span, max_len, counter):
            units.append(piece)
            unit_lengths.append(piece_length)
    return units, unit_lengths, long_sentences


def _fit_ranges(work: "_DocumentWork", ranges, max_len: int, counter: TokenCounter):
    """Re-tokenize passages; split any that is too long between its units (rare: non-additive tokenizers)."""
    fitted = []
    texts = [work.span_text(a, b) for a, b in ranges]
    for (a, b), ids in zip(ranges, counter.ids(texts)):
        if len(ids) <= max_len or b - a == 1:
            fitted.append(((a, b), ids))
        else:
            middle = (a + b) // 2
            fitted.extend(_fit_ranges(work, [(a, middle), (middle, b)], max_len, counter))
    return fitted


def overlap_range(start: int, end: int, lengths: Sequence[int], settings: SplitSettings,
                  count: int | None = None) -> tuple[int, int] | None:
    """Units of the overlap context of the passage made of units ``[start, end)``.

    The passage's last ``count`` units (default ``overlap_sentences``), then following units while
    the total stays within ``max_len``; None when no unit follows the passage.
    """
    if end >= len(lengths):
        return None
    first = max(start, end - (count if count is not None else settings.overlap_sentences))
    total = sum(lengths[first:end])
    while first < end - 1 and total + lengths[end] > settings.max_len:  # leave room for what follows
        total -= lengths[first]
        first += 1
    last = end
    while last < len(lengths) and total + lengths[last] <= settings.max_len:
        total += lengths[last]
        last += 1
    return (first, last) if last > end else None


def passage_records(doc_id: str, texts: list[str], n_tokens: list[int], overlaps: list[str],
                    window: int, ids: list[list[int]] | None = None,
                    overlap_ids: list[list[int]] | None = None) -> list[dict[str, Any]]:
    """The ``passages.arrow`` rows of one document (format in docs/architecture.md); with ``ids``
    and ``overlap_ids``, the token ids of each text and overlap (qac.data.tokens)."""
    pids = [f"{doc_id}#{k}" for k in range(len(texts))]
    records = []
    for k, pid in enumerate(pids):
        records.append({
            "pid": pid,
            "doc_id": doc_id,
            "position": k,
            "text": texts[k],
            "n_tokens": n_tokens[k],
            "contexts": {
                "nearby": [pids[j] for j in (k - 1, k + 1) if 0 <= j < len(pids)],
                "random_sampled": [pids[j] for j in range(max(0, k - window), min(len(pids), k + window + 1))
                                   if j != k],
                "overlap": overlaps[k],
            },
        })
        if ids is not None:
            records[-1]["input_ids"] = ids[k]
            records[-1]["overlap_ids"] = overlap_ids[k]
    return records


@dataclass
class _DocumentWork:
    """One document on its way through :func:`split_documents`."""

    doc_id: str
    text: str
    units: list[tuple[int, int]]       # character spans of sentences (or pieces of long ones)
    lengths: list[int]                 # tokens per unit
    sentences: int
    long_sentences: int
    ranges: list[tuple[int, int]] = field(default_factory=list)   # passages as unit ranges
    n_tokens: list[int] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=list)            # token ids per passage
    overlaps: list[str] = field(default_factory=list)
    overlap_ids: list[list[int]] = field(default_factory=list)

    def span_text(self, start: int, end: int) -> str:
        return self.text[self.units[start][0]:self.units[end - 1][1]]


def _sentences(sentence_splitter, doc_id: str, text: str) -> list[tuple[int, int]]:
    """The sentence spans of one document; NLTK's guard against runaway regular expressions named with it."""
    try:
        return list(sentence_splitter.span_tokenize(text))
    except TimeoutError as error:
        raise UserError(f"document {doc_id!r} ({len(text):,} characters): NLTK's Punkt sentence splitter gave up on "
                        f"it ({error}). A text this long or repetitive is no passage source: drop or cut it in the "
                        "corpus, then run prepare and split_passages again") from None


def split_documents(documents: Sequence[tuple[str, str]], sentence_splitter, counter: TokenCounter,
                    settings: SplitSettings) -> list[DocumentSplit]:
    """Split ``(doc_id, text)`` pairs into passages.

    The sentences of all ``documents`` go to the tokenizer in one call, then
    all their passages in one call, then all overlap texts in one call (plus
    rare extra calls for sentences longer than ``max_len``).
    """
    sentence_spans = [_sentences(sentence_splitter, doc_id, text) for doc_id, text in documents]
    # A sentence's length only decides whether it fits max_len, so it is counted on what its first max_len + 1
    # tokens can come from (qac.data.tokens.CHARS_PER_TOKEN): a 40 MB sentence costs the tokenizer 9 kB here.
    all_lengths = iter(counter.lengths([text[s:cut_end(text, settings.max_len + 1, s, e)]
                                        for (_, text), spans in zip(documents, sentence_spans) for s, e in spans]))
    works = []
    for (doc_id, text), spans in zip(documents, sentence_spans):
        lengths = [next(all_lengths) for _ in spans]
        if settings.overflow:   # sentences stay whole; a passage over max_len is cropped in training
            units = [span for span, length in zip(spans, lengths) if length]
            unit_lengths = [length for length in lengths if length]
            long_sentences = sum(length > settings.max_len for length in lengths)
        else:
            units, unit_lengths, long_sentences = sentence_units(text, spans, lengths, settings.max_len, counter)
        work = _DocumentWork(doc_id, text, units, unit_lengths, len(spans), long_sentences)
        work.ranges = group_units(unit_lengths, draw_targets(document_rng(settings.seed, doc_id), settings),
                                  overflow=settings.overflow)
        works.append(work)
    _check_passages(works, counter, None if settings.overflow else settings.max_len)
    _add_overlaps(works, counter, settings)
    return [DocumentSplit(work.doc_id,
                          passage_records(work.doc_id, [work.span_text(a, b) for a, b in work.ranges],
                                          work.n_tokens, work.overlaps, settings.random_sampled_window,
                                          work.ids, work.overlap_ids),
                          work.sentences, work.long_sentences)
            for work in works]


def _check_passages(works: list[_DocumentWork], counter: TokenCounter, max_len: int | None) -> None:
    """Set each passage's ids and ``n_tokens`` from its re-tokenized text, re-splitting any over ``max_len``
    (None: none)."""
    all_ids = iter(counter.ids([work.span_text(a, b) for work in works for a, b in work.ranges]))
    for work in works:
        work.ids = [next(all_ids) for _ in work.ranges]
        if max_len is not None and any(len(ids) > max_len for ids in work.ids):
            fitted = _fit_ranges(work, work.ranges, max_len, counter)
            work.ranges = [rng for rng, _ in fitted]
            work.ids = [ids for _, ids in fitted]
        work.n_tokens = [len(ids) for ids in work.ids]


def overlap_counts(work: _DocumentWork, settings: SplitSettings) -> list[int]:
    """How many of its last units each passage's overlap context keeps: ``overlap_sentences``, or with
    ``random`` a count drawn per passage in ``[1, max(1, units // 2)]`` from the document's own overlap
    stream (apart from the span targets' draws, so the spans are the same either way)."""
    if settings.overlap_sentences != "random":
        return [int(settings.overlap_sentences)] * len(work.ranges)
    rng = document_rng(settings.seed, f"{work.doc_id}\x00overlap")
    return [rng.randint(1, max(1, (end - start) // 2)) for start, end in work.ranges]


def _add_overlaps(works: list[_DocumentWork], counter: TokenCounter, settings: SplitSettings) -> None:
    """Set each passage's overlap text; one a tokenizer makes too long loses trailing units."""
    pending = []
    for work in works:
        work.overlaps = [""] * len(work.ranges)
        work.overlap_ids = [[] for _ in work.ranges]
        for k, ((start, end), count) in enumerate(zip(work.ranges, overlap_counts(work, settings))):
            units = overlap_range(start, end, work.lengths, settings, count)
            if units is not None:
                pending.append((work, k, units))
    while pending:
        texts = [work.span_text(*units) for work, _, units in pending]
        retry = []
        for (work, k, (first, last)), text, ids in zip(pending, texts, counter.ids(texts)):
            if len(ids) <= settings.max_len:
                work.overlaps[k], work.overlap_ids[k] = text, ids
            elif last - first > 1:
                retry.append((work, k, (first, last - 1)))
        pending = retry


# ---------------------------------------------------------------------------
# A whole corpus, in parallel, in corpus order.

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_spec: str, punkt_dir: str, settings: SplitSettings, batched: bool) -> None:
    # here, not at the top: it loads nltk
    from qac.data.punkt import load_sentence_splitter
    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    _WORKER.update(splitter=load_sentence_splitter(punkt_dir), settings=settings,
                   counter=TokenCounter(load_tokenizer(tokenizer_spec), batched=batched))


def _split_chunk(chunk: list[tuple[str, str]]) -> list[DocumentSplit]:
    return split_documents(chunk, _WORKER["splitter"], _WORKER["counter"], _WORKER["settings"])


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def iter_split_corpus(documents: Iterable[tuple[str, str]], *, tokenizer_spec: str,
                      punkt_dir: str | os.PathLike, settings: SplitSettings, workers: int = 1,
                      chunk_size: int = 64, batched: bool = True) -> Iterator[DocumentSplit]:
    """Split ``(doc_id, text)`` pairs, yielding one :class:`DocumentSplit` per document in input order.

    ``workers > 1`` splits chunks of ``chunk_size`` documents in that many
    processes; results come back in order and at most a few chunks per worker
    are in flight, so memory stays bounded on large corpora. The output does
    not depend on ``workers`` or ``chunk_size`` (each document's draws depend on
    its own id only).
    """
    init_args = (tokenizer_spec, str(punkt_dir), settings, batched)
    if workers <= 1:
        _init_worker(*init_args)
        for chunk in _chunks(documents, chunk_size):
            yield from _split_chunk(chunk)
        return
    import collections
    import multiprocessing

    # spawn: workers start clean, without the parent's threads (MLflow's
    # system-metrics monitor) or the tokenizer's thread pool.
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=init_args) as pool:
        in_flight: collections.deque = collections.deque()
        for chunk in _chunks(documents, chunk_size):
            in_flight.append(pool.apply_async(_split_chunk, (chunk,)))
            if len(in_flight) >= 4 * workers:
                yield from in_flight.popleft().get()
        while in_flight:
            yield from in_flight.popleft().get()


@dataclass
class SplitStats:
    """What a split produced, for the stage's metrics."""

    documents: int = 0
    documents_without_passages: int = 0
    passages: int = 0
    sentences: int = 0
    long_sentences: int = 0
    tokens: int = 0
    max_tokens: int = 0
    single_passage_documents: int = 0

    def add(self, split: DocumentSplit) -> None:
        self.documents += 1
        self.sentences += split.sentences
        self.long_sentences += split.long_sentences
        self.passages += len(split.passages)
        self.documents_without_passages += not split.passages
        self.single_passage_documents += len(split.passages) == 1
        for passage in split.passages:
            self.tokens += passage["n_tokens"]
            self.max_tokens = max(self.max_tokens, passage["n_tokens"])

    def as_metrics(self) -> dict[str, float]:
        metrics = {key: float(value) for key, value in vars(self).items() if key != "tokens"}
        metrics["mean_tokens"] = self.tokens / self.passages if self.passages else 0.0
        metrics["passages_per_document"] = self.passages / self.documents if self.documents else 0.0
        return metrics


def split_corpus_file(corpus_path: str | os.PathLike, passages_path: str | os.PathLike,
                      punkt_dir: str | os.PathLike, *, tokenizer_spec: str, settings: SplitSettings,
                      punkt: str = "trained", punkt_train_documents: int | None = None, workers: int = 1,
                      chunk_size: int = 64, batched: bool = True, progress: bool = True,
                      max_documents: int | None = None) -> tuple[SplitStats, str]:
    """Split a BEIR ``corpus.jsonl`` into ``passages.arrow`` (:mod:`qac.data.arrowstore`, written atomically).

    ``max_documents`` splits only the first N documents in file order (a
    scaled-down pre-training corpus); Punkt still learns from the whole corpus.

    Prepares the Punkt model in ``punkt_dir`` first (:func:`qac.data.punkt.prepare_punkt`:
    ``punkt`` is ``pretrained``, NLTK's English model, or ``trained`` on the first
    ``punkt_train_documents`` documents). Returns the statistics and which Punkt model ran.
    """
    # here, not at the top: it loads nltk
    from qac.data.punkt import prepare_punkt

    def texts() -> Iterator[str]:
        return (document.full_text for document in iter_corpus_jsonl(corpus_path))

    punkt_model = prepare_punkt(punkt, punkt_dir, texts, file_md5(corpus_path), punkt_train_documents)
    total = sum(1 for _ in open(corpus_path, "rb"))
    if max_documents is not None:
        total = min(total, int(max_documents))
    stats = SplitStats()
    documents = itertools.islice(((document.doc_id, document.full_text) for document in iter_corpus_jsonl(corpus_path)),
                                 None if max_documents is None else int(max_documents))
    splits = iter_split_corpus(documents, tokenizer_spec=tokenizer_spec, punkt_dir=punkt_dir, settings=settings,
                               workers=workers, chunk_size=chunk_size, batched=batched)

    def records() -> Iterator[dict[str, Any]]:
        bar = (progress_bar(splits, total=total, unit="doc", desc="split", mininterval=2) if progress else splits)
        for split in bar:
            stats.add(split)
            yield from split.passages

    # here, not at the top: it loads safetensors
    from qac.data.tokenizer import load_tokenizer

    write_passages(passages_path, records(), tokenizer=load_tokenizer(tokenizer_spec), tokenizer_name=tokenizer_spec)
    return stats, punkt_model
