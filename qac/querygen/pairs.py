"""(source text -> query) pairs for training a query generator, from offline datasets.

Two kinds of pair, both available without the hub:

- ``query``: a training query of ``train_dataset`` (qrels split ``train`` only)
  and the text of each of its relevant documents (``title + " " + text``);
- ``title``: a document's body and its title, for documents of
  ``pretrain_corpus`` and ``train_dataset`` that have one (``use_titles``).

Evaluation queries never reach the pairs: queries judged in any other split
are excluded by id, and any pair whose target equals (ignoring case and
spacing) the text of such a query is dropped as well.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from qac.io import iter_jsonl


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    kind: str        # "query" | "title"
    dataset: str
    doc_id: str


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def document_text(title: str, text: str) -> str:
    """The text of a document as retrieval sees it: ``title + " " + text``, stripped."""
    return f"{title} {text}".strip()


def read_corpus(dataset_dir: Path) -> dict[str, tuple[str, str]]:
    """``_id -> (title, text)`` of a BEIR ``corpus.jsonl``."""
    path = dataset_dir / "corpus.jsonl"
    corpus = {}
    for line_number, record in enumerate(iter_jsonl(path), start=1):
        if not isinstance(record.get("_id"), str) or not isinstance(record.get("text", ""), str):
            raise ValueError(f"{path}: record {line_number}: '_id' and 'text' must be strings")
        corpus[record["_id"]] = (record.get("title") or "", record.get("text") or "")
    return corpus


def read_queries(dataset_dir: Path) -> dict[str, str]:
    path = dataset_dir / "queries.jsonl"
    queries = {}
    for line_number, record in enumerate(iter_jsonl(path), start=1):
        if not isinstance(record.get("_id"), str) or not isinstance(record.get("text"), str):
            raise ValueError(f"{path}: record {line_number}: '_id' and 'text' must be strings")
        queries[record["_id"]] = record["text"]
    return queries


def read_qrels(path: Path) -> list[tuple[str, str, int]]:
    """Rows ``(query-id, corpus-id, score)`` of a BEIR qrels TSV (with its header)."""
    rows = []
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["query-id", "corpus-id", "score"]:
            raise ValueError(f"{path}:1: expected the header 'query-id corpus-id score', got {header}")
        for line_number, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                rows.append((row[0], row[1], int(float(row[2]))))
            except (IndexError, ValueError):
                raise ValueError(f"{path}:{line_number}: expected query-id, corpus-id and an integer score") from None
    return rows


def _train_threshold(dataset_dir: Path) -> int:
    info_path = dataset_dir / "dataset.json"
    if not info_path.exists():
        return 1
    threshold = json.loads(info_path.read_text(encoding="utf-8")).get("rel_threshold", 1)
    return int(threshold.get("train", 1) if isinstance(threshold, dict) else threshold)


def held_out_query_texts(dataset_dir: Path) -> tuple[set[str], set[str]]:
    """Ids and normalised texts of the queries judged in any split other than ``train``."""
    queries = read_queries(dataset_dir)
    ids: set[str] = set()
    for qrels in sorted((dataset_dir / "qrels").glob("*.tsv")):
        if qrels.stem != "train":
            ids.update(qid for qid, _, _ in read_qrels(qrels))
    return ids, {_normalise(queries[qid]) for qid in ids if qid in queries}


def build_pairs(datasets_dir: str | Path, train_dataset: str, corpora: Iterable[str], use_titles: bool) -> list[Pair]:
    """All training pairs, in a fixed order (see the module docstring for what is included)."""
    datasets_dir = Path(datasets_dir)
    train_dir = datasets_dir / train_dataset
    excluded_ids, excluded_texts = held_out_query_texts(train_dir)
    pairs: list[Pair] = []

    qrels_path = train_dir / "qrels" / "train.tsv"
    if qrels_path.exists():
        corpus, queries = read_corpus(train_dir), read_queries(train_dir)
        threshold = _train_threshold(train_dir)
        for qid, doc_id, score in read_qrels(qrels_path):
            if score < threshold or qid in excluded_ids or qid not in queries or doc_id not in corpus:
                continue
            source = document_text(*corpus[doc_id])
            if source and queries[qid].strip():
                pairs.append(Pair(source, queries[qid].strip(), "query", train_dataset, doc_id))

    if use_titles:
        for name in dict.fromkeys([*corpora, train_dataset]):
            for doc_id, (title, text) in read_corpus(datasets_dir / name).items():
                if title.strip() and text.strip():
                    pairs.append(Pair(text.strip(), title.strip(), "title", name, doc_id))

    pairs = [pair for pair in dict.fromkeys(pairs) if _normalise(pair.target) not in excluded_texts]
    if not pairs:
        raise ValueError(f"no training pairs: {qrels_path} has no usable rows and no document has a title")
    return pairs


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
