"""(source text -> query) pairs for training a query generator, from offline datasets.

Two kinds of pair, both available without the hub:

- ``query``: a training query of ``train_dataset`` (qrels split ``train`` only)
  and the text of each of its relevant documents (``title + " " + text``);
- ``title``: a document's body and its title, for documents of
  ``pretrain_corpus`` and ``train_dataset`` that have one (``use_titles``).

A relevant document is longer than the generator reads (SciFact abstracts:
median 306 tokens, the generator 128), and a claim usually restates a finding
that lies past the first 128 tokens (for 35% of the training claims the
sentence closest to the claim starts there). With
``query_generator.evidence_windows`` a query pair's source is the document's
evidence window instead
(:func:`evidence_window`): the run of consecutive sentences within the budget
that holds most of the query's words, as MS MARCO pairs a query with the
passage that answers it rather than with the start of its document.

Evaluation queries never reach the pairs: queries judged in any other split
are excluded by id, and any pair whose target equals (ignoring case and
spacing) the text of such a query is dropped as well.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from qac.data.dataset import Dataset
from qac.data.prepared import load_prepared
from qac.retrieval import document_text


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    kind: str        # "query" | "title"
    dataset: str
    doc_id: str


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def corpus_texts(dataset: Dataset) -> dict[str, tuple[str, str]]:
    """``doc id -> (title, text)`` of a prepared dataset."""
    return {doc_id: (document.title or "", document.text or "") for doc_id, document in dataset.corpus.items()}


def held_out_query_texts(dataset: Dataset) -> tuple[set[str], set[str]]:
    """Ids and normalised texts of the queries judged in any split other than ``train``."""
    ids = {qid for split, qrels in dataset.qrels.items() if split != "train" for qid in qrels}
    return ids, {_normalise(dataset.queries[qid]) for qid in ids if qid in dataset.queries}


def build_pairs(datasets_dir: str | Path, train_dataset: str, corpora: Iterable[str], use_titles: bool) -> list[Pair]:
    """All training pairs, in a fixed order (see the module docstring for what is included)."""
    datasets_dir = Path(datasets_dir)
    train = load_prepared(datasets_dir / train_dataset)
    excluded_ids, excluded_texts = held_out_query_texts(train)
    pairs: list[Pair] = []

    qrels_path = datasets_dir / train_dataset / "qrels" / "train.tsv"
    if "train" in train.qrels:
        corpus, queries, threshold = corpus_texts(train), train.queries, train.rel_threshold("train")
        for qid, judged in train.qrels["train"].items():
            for doc_id, score in judged.items():
                if score < threshold or qid in excluded_ids or qid not in queries or doc_id not in corpus:
                    continue
                source = document_text(*corpus[doc_id])
                if source and queries[qid].strip():
                    pairs.append(Pair(source, queries[qid].strip(), "query", train_dataset, doc_id))

    if use_titles:
        for name in dict.fromkeys([*corpora, train_dataset]):
            dataset = train if name == train_dataset else load_prepared(datasets_dir / name)
            for doc_id, (title, text) in corpus_texts(dataset).items():
                if title.strip() and text.strip():
                    pairs.append(Pair(text.strip(), title.strip(), "title", name, doc_id))

    pairs = [pair for pair in dict.fromkeys(pairs) if _normalise(pair.target) not in excluded_texts]
    if not pairs:
        raise ValueError(f"no training pairs: {qrels_path} has no usable rows and no document has a title")
    return pairs


_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """``text`` split after ``.``, ``!`` or ``?`` followed by white space."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` less English stop words (bm25s's list, as the BM25 index has it)."""
    from bm25s.stopwords import STOPWORDS_EN

    return set(_WORD.findall(text.lower())).difference(STOPWORDS_EN)


def evidence_window(title: str, text: str, target: str, lengths, budget: int) -> str:
    """The run of consecutive units (title, then the body's sentences) within ``budget`` tokens sharing most words with ``target``.

    ``lengths(texts)`` gives token counts. Every window starts at a unit and
    takes the following units while they fit (a unit longer than the budget
    stands alone: the tokenizer truncates it); ties go to the earliest window,
    so a target sharing no word keeps the document's start.
    """
    units = [u for u in [title.strip(), *sentences(text)] if u.strip()]
    if not units:
        return ""
    sizes = lengths(units)
    wanted = content_words(target)
    # each unit's share of the target's words, once: a window's words are the union of its units'
    shared = [wanted & content_words(unit) for unit in units]
    best, best_score = (0, 1), -1
    for start in range(len(units)):
        end, used = start + 1, sizes[start]
        while end < len(units) and used + sizes[end] <= budget:
            used += sizes[end]
            end += 1
        score = len(set().union(*shared[start:end]))
        if score > best_score:
            best, best_score = (start, end), score
    return " ".join(units[best[0]:best[1]])


def with_evidence_windows(pairs: list[Pair], documents: dict[tuple[str, str], tuple[str, str]], lengths,
                          budget: int) -> list[Pair]:
    """``pairs`` with each query pair's source replaced by its :func:`evidence_window`; title pairs unchanged.

    ``documents`` maps ``(dataset, doc_id)`` to ``(title, text)``.
    """
    out = []
    for pair in pairs:
        if pair.kind == "query":
            title, text = documents[(pair.dataset, pair.doc_id)]
            pair = replace(pair, source=evidence_window(title, text, pair.target, lengths, budget))
        out.append(pair)
    return out


def split_heldout(pairs: list[Pair], fraction: float, maximum: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    """A seeded held-out sample of ``min(maximum, round(fraction * n))`` pairs; the rest train."""
    count = min(int(maximum), round(float(fraction) * len(pairs)))
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    heldout_index = set(order[:count])
    train = [p for i, p in enumerate(pairs) if i not in heldout_index]
    heldout = [pairs[i] for i in sorted(heldout_index)]
    return train, heldout


def cap_training_pairs(pairs: list[Pair], maximum: int | None, seed: int) -> list[Pair]:
    """At most ``maximum`` pairs: query pairs first, then title pairs, each kind in seeded random order.

    Real queries are the signal the generator should imitate; titles only fill
    the remaining budget. The kept pairs stay in their original order.
    """
    if not maximum or len(pairs) <= maximum:
        return list(pairs)
    rng = random.Random(seed)
    chosen: set[int] = set()
    for kind in ("query", "title"):
        members = [i for i, pair in enumerate(pairs) if pair.kind == kind]
        rng.shuffle(members)
        chosen.update(members[:max(0, int(maximum) - len(chosen))])
    return [pair for i, pair in enumerate(pairs) if i in chosen]
