"""The in-memory types every reader returns and every later stage consumes.

- :class:`Document`: ``doc_id``, ``title``, ``text``; :attr:`Document.full_text`
  is ``title + " " + text`` stripped, the text that is split into passages and
  retrieved (the paper joins an MS MARCO document's title and body this way).
- ``Corpus``: ``dict`` doc id -> :class:`Document`, in file order.
- ``Queries``: ``dict`` query id -> query text.
- ``Qrels``: ``dict`` query id -> {doc id: relevance grade}.
- :class:`Dataset`: a corpus, its queries, qrels per split and metadata.

Rows that readers skip (empty documents, repeated judgements, judgements of
unknown ids) are counted in a ``collections.Counter`` keyed by reason, which
ends up in ``dataset.json`` so nothing disappears silently.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str

    @property
    def full_text(self) -> str:
        """Title and text joined with a space, stripped: what is split and retrieved."""
        return f"{self.title} {self.text}".strip()


Corpus = dict[str, Document]
Queries = dict[str, str]
Qrels = dict[str, dict[str, int]]


@dataclass
class Dataset:
    """A retrieval dataset: ``qrels`` maps a split name to that split's judgements.

    ``meta`` holds what ``dataset.json`` records: ``rel_threshold`` per split,
    ``ignore_identical_ids``, counts of skipped rows, the source.
    """

    name: str
    corpus: Corpus
    queries: Queries
    qrels: dict[str, Qrels]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def splits(self) -> list[str]:
        return list(self.qrels)

    def split_queries(self, split: str) -> Queries:
        """The queries judged in ``split``, in the order of the queries file."""
        judged = self.qrels[split]
        return {qid: text for qid, text in self.queries.items() if qid in judged}

    def rel_threshold(self, split: str) -> int:
        """The grade from which a judgement counts as relevant in binary measures."""
        return int(self.meta.get("rel_threshold", {}).get(split, 1))

    @property
    def ignore_identical_ids(self) -> bool:
        return bool(self.meta.get("ignore_identical_ids", False))


def is_empty_text(text: str, min_text_chars: int = 1) -> bool:
    """Whether a text is too short to keep (after stripping whitespace)."""
    return len(text.strip()) < max(min_text_chars, 1)


def drop_unknown_judgements(dataset: Dataset, skipped: Counter | None = None) -> Counter:
    """Remove judgements that name a query or document the dataset does not have.

    Real collections have these (a judged document that was later removed,
    a query without text). Returns, and adds to ``skipped``, the counts
    ``qrels_unknown_query`` and ``qrels_unknown_document`` (per judgement row).
    """
    counts: Counter = Counter()
    for split, qrels in dataset.qrels.items():
        kept: Qrels = {}
        for qid, judged in qrels.items():
            if qid not in dataset.queries:
                counts["qrels_unknown_query"] += len(judged)
                continue
            known = {doc_id: grade for doc_id, grade in judged.items() if doc_id in dataset.corpus}
            counts["qrels_unknown_document"] += len(judged) - len(known)
            if known:
                kept[qid] = known
        dataset.qrels[split] = kept
    counts = +counts
    if skipped is not None:
        skipped.update(counts)
    return counts
