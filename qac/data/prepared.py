"""Prepared datasets: the normalised BEIR folder every later stage reads.

:func:`prepare_dataset` takes a dataset as read from its source, drops
judgements of unknown ids, optionally keeps a deterministic subset of the
corpus, and removes what the subset orphaned. :func:`write_prepared` writes it
atomically as ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv`` and
``dataset.json``; :func:`load_prepared` reads it back.

``dataset.json`` holds ``name``, ``format``, ``source``, ``splits``,
``rel_threshold`` (per split), ``ignore_identical_ids``, ``counts`` (documents,
queries, judgements and queries per split), ``skipped`` (rows dropped, by
reason) and ``subset`` (the settings that made it). It contains no time stamps
or local paths, so the same input gives the same bytes (and DVC hash).

A dataset of several sub-collections (``subsets``: CQADupStack's forums) is a
folder of prepared folders, one per subset, under a ``dataset.json`` that names
them (``subsets``) and sums their counts; :func:`load_prepared_parts` reads
either layout as ``[(subset, Dataset)]``.

A corpus read from a TSV collection (MS MARCO) is a
:class:`qac.data.streamed.StreamedCorpus`: only its ids are in memory, and
writing streams the documents from the source file, so preparing the 3.2M
MS MARCO documents needs memory for their ids, not their texts.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from qac.data.beir import read_beir, write_beir
from qac.data.dataset import Dataset, drop_unknown_judgements
from qac.data.errors import DataFormatError
from qac.data.streamed import restrict_corpus
from qac.io import atomic_path
from qac.data.msmarco import iter_triple_negatives

DATASET_JSON = "dataset.json"
TRAIN_NEGATIVES = "negatives/train.jsonl"   # official training negatives per query (datasets.<name>.triples)


def select_documents(dataset: Dataset, max_documents: int | None, keep_judged_documents: bool) -> list[str]:
    """Ids of the documents a subset keeps, in corpus order.

    Without ``max_documents`` every document is kept. Otherwise the first
    ``max_documents`` in file order; with ``keep_judged_documents`` every judged
    document (of any split) is kept first and the rest is filled with the first
    unjudged ones, so evaluation stays meaningful. Depends only on file order:
    the same input always gives the same subset.
    """
    ids = list(dataset.corpus)
    if max_documents is None or max_documents >= len(ids):
        return ids
    if max_documents < 0:
        raise ValueError(f"prepare.max_documents must be >= 0 or null, not {max_documents}")
    if not keep_judged_documents:
        return ids[:max_documents]
    judged = {doc_id for qrels in dataset.qrels.values() for judgements in qrels.values() for doc_id in judgements}
    room = max(max_documents - len(judged), 0)
    keep = set(judged)
    for doc_id in ids:
        if room == 0:
            break
        if doc_id not in keep:
            keep.add(doc_id)
            room -= 1
    return [doc_id for doc_id in ids if doc_id in keep]


def prepare_dataset(dataset: Dataset, *, max_documents: int | None = None,
                    keep_judged_documents: bool = True) -> Dataset:
    """Clean and optionally subset ``dataset`` in place; counts go to ``meta['skipped']``.

    Removes judgements of unknown queries or documents (``qrels_unknown_query``,
    ``qrels_unknown_document``), documents outside the subset and their
    judgements (``qrels_dropped_document``), the queries of a split left with no
    judgement (``queries_without_qrels.<split>``), and queries judged in no
    declared split (``queries_unjudged``).
    """
    skipped = Counter(dataset.meta.get("skipped", {}))
    judged_before = {split: set(qrels) for split, qrels in dataset.qrels.items()}
    drop_unknown_judgements(dataset, skipped)
    _refuse_mostly_unknown_judgements(dataset, judged_before)
    kept = select_documents(dataset, max_documents, keep_judged_documents)
    if len(kept) < len(dataset.corpus):
        skipped["documents_outside_subset"] += len(dataset.corpus) - len(kept)
        dataset.corpus = restrict_corpus(dataset.corpus, kept)
        for split, qrels in dataset.qrels.items():
            remaining = {}
            for qid, judgements in qrels.items():
                known = {doc_id: grade for doc_id, grade in judgements.items() if doc_id in dataset.corpus}
                skipped["qrels_dropped_document"] += len(judgements) - len(known)
                if known:
                    remaining[qid] = known
                else:
                    skipped[f"queries_without_qrels.{split}"] += 1
            dataset.qrels[split] = remaining
    _require_queries_in_every_split(dataset, skipped)
    judged = {qid for qrels in dataset.qrels.values() for qid in qrels}
    skipped["queries_unjudged"] += sum(1 for qid in dataset.queries if qid not in judged)
    dataset.queries = {qid: text for qid, text in dataset.queries.items() if qid in judged}
    dataset.meta["skipped"] = dict(sorted((+skipped).items()))
    dataset.meta["subset"] = {"max_documents": max_documents, "keep_judged_documents": keep_judged_documents}
    return dataset


# Real collections judge a few documents they no longer hold; losing more of a split's queries than this to ids
# the corpus or queries file does not have means the files do not belong together (or their ids were rewritten).
MAX_UNKNOWN_SHARE = 0.5


def _refuse_mostly_unknown_judgements(dataset: Dataset, judged_before: dict[str, set[str]]) -> None:
    files = dataset.meta.get("qrels_files", {})
    for split, before in judged_before.items():
        lost = sorted(before - set(dataset.qrels.get(split, {})))
        if before and lost and len(lost) > MAX_UNKNOWN_SHARE * len(before):
            raise DataFormatError(files.get(split, f"dataset {dataset.name}, split {split}"), None, None,
                                  f"{len(lost)} of the {len(before)} queries judged in split {split!r} name a query "
                                  "or only documents that the queries and corpus files do not have (for example "
                                  f"{', '.join(lost[:3])}): do the qrels belong to this corpus and queries file?")


def _require_queries_in_every_split(dataset: Dataset, skipped: Counter) -> None:
    """A split left with no judged query (or a corpus left empty) is an error naming its file.

    An empty split would be "evaluated" to a mean over nothing stages later;
    it usually means the qrels name ids the corpus or queries file does not have.
    """
    files = dataset.meta.get("qrels_files", {})
    if not dataset.corpus:
        raise DataFormatError(f"dataset {dataset.name}", None, None,
                              "no documents left after selecting the subset (prepare.max_documents)")
    for split, qrels in dataset.qrels.items():
        if not qrels:
            counts = {reason: n for reason, n in skipped.items()
                      if reason.startswith(("qrels_", "queries_without_qrels"))}
            raise DataFormatError(files.get(split, f"dataset {dataset.name}, split {split}"), None, None,
                                  f"split {split!r} has no judged query left (dropped: {counts or 'none'}); "
                                  "do its query and document ids match the queries and corpus files?")
        threshold = dataset.rel_threshold(split)
        if not any(grade >= threshold for judgements in qrels.values() for grade in judgements.values()):
            raise DataFormatError(files.get(split, f"dataset {dataset.name}, split {split}"), None, None,
                                  f"split {split!r} judges no document relevant: no grade reaches its relevance "
                                  f"threshold {threshold}, so every binary measure (RR@10, recall) would be 0; "
                                  "are the grades in the last column?")


def dataset_record(dataset: Dataset) -> dict[str, Any]:
    """The content of ``dataset.json`` for ``dataset``."""
    return {
        "name": dataset.name,
        "format": dataset.meta.get("format", "beir"),
        "source": dataset.meta.get("source"),
        "splits": dataset.splits,
        "rel_threshold": {split: dataset.rel_threshold(split) for split in dataset.splits},
        "ignore_identical_ids": dataset.ignore_identical_ids,
        "counts": {
            "documents": len(dataset.corpus),
            "queries": len(dataset.queries),
            "qrels": {split: sum(len(j) for j in qrels.values()) for split, qrels in dataset.qrels.items()},
            "queries_per_split": {split: len(qrels) for split, qrels in dataset.qrels.items()},
        },
        "skipped": dataset.meta.get("skipped", {}),
        "subset": dataset.meta.get("subset", {}),
    }


def write_prepared(dataset: Dataset, directory: str | os.PathLike,
                   triples: str | os.PathLike | None = None) -> dict[str, Any]:
    """Write ``dataset`` as a prepared folder, atomically; returns the ``dataset.json`` record.

    The folder appears complete or not at all: it is written beside its final
    place and renamed in one step (an existing folder is replaced). With
    ``triples`` (a training-triples file) ``negatives/train.jsonl`` is written too
    (:func:`write_train_negatives`) and its counts join the record.
    """
    record = dataset_record(dataset)
    with atomic_path(directory, directory=True) as tmp:
        os.chmod(tmp, _directory_mode())  # temporary directories are private; the dataset is not
        write_beir(dataset, tmp)
        if triples is not None:
            record["train_negatives"] = write_train_negatives(dataset, triples, Path(tmp) / TRAIN_NEGATIVES)
        (Path(tmp) / DATASET_JSON).write_text(
            json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return record


def write_train_negatives(dataset: Dataset, triples: str | os.PathLike, path: Path) -> dict[str, int]:
    """``{qid, negatives}`` per training query from a training-triples file, streamed (JSONL).

    Every distinct negative of the query in file order, kept to documents of
    the prepared corpus and never one of its positives; queries outside the
    train split's judgements are left out. Sampling (the release keeps 128 per
    query) happens where the negatives are used (``finetune.official_negatives``).
    """
    judged = dataset.qrels.get("train")
    if judged is None:
        raise DataFormatError(triples, None, None, f"dataset {dataset.name} has no train split for its triples")
    counts = {"queries": 0, "negatives": 0, "queries_not_in_train": 0, "negatives_not_in_corpus": 0}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for qid, negatives in iter_triple_negatives(triples):
            if qid not in judged:
                counts["queries_not_in_train"] += 1
                continue
            kept = [doc_id for doc_id in negatives if doc_id in dataset.corpus and doc_id not in judged[qid]]
            counts["negatives_not_in_corpus"] += sum(doc_id not in dataset.corpus for doc_id in negatives)
            counts["queries"] += 1
            counts["negatives"] += len(kept)
            handle.write(json.dumps({"qid": qid, "negatives": kept}) + "\n")
    return counts


def write_prepared_parts(parts: list[tuple[str | None, Dataset]], directory: str | os.PathLike,
                         name: str, triples: str | os.PathLike | None = None) -> dict[str, Any]:
    """Write prepared sub-collections (or one dataset, subset None) atomically; returns the top ``dataset.json``.

    With subsets, ``directory/<subset>/`` is each one's prepared folder and
    ``directory/dataset.json`` names them, with the summed counts.
    """
    if len(parts) == 1 and parts[0][0] is None:
        return write_prepared(parts[0][1], directory, triples)
    if triples is not None:
        raise ValueError(f"dataset {name}: training triples cannot go with sub-collections")
    records = {}
    with atomic_path(directory, directory=True) as tmp:
        os.chmod(tmp, _directory_mode())
        for subset, dataset in parts:
            records[subset] = write_prepared(dataset, Path(tmp) / subset)
        first = next(iter(records.values()))
        counts: dict[str, Any] = {"documents": 0, "queries": 0, "qrels": Counter(), "queries_per_split": Counter()}
        skipped: Counter = Counter()
        for record in records.values():
            counts["documents"] += record["counts"]["documents"]
            counts["queries"] += record["counts"]["queries"]
            counts["qrels"].update(record["counts"]["qrels"])
            counts["queries_per_split"].update(record["counts"]["queries_per_split"])
            skipped.update(record["skipped"])
        record = {"name": name, "format": first["format"], "source": first["source"].split("#")[0],
                  "splits": first["splits"], "rel_threshold": first["rel_threshold"],
                  "ignore_identical_ids": first["ignore_identical_ids"], "subsets": list(records),
                  "counts": {**counts, "qrels": dict(counts["qrels"]),
                             "queries_per_split": dict(counts["queries_per_split"])},
                  "skipped": dict(sorted(skipped.items())), "subset": first["subset"]}
        (Path(tmp) / DATASET_JSON).write_text(
            json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return record


def _directory_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def load_prepared(path: str | os.PathLike) -> Dataset:
    """A folder written by :func:`write_prepared` (the ``prepare`` stage) as a :class:`Dataset`."""
    path = Path(path)
    record_path = path / DATASET_JSON
    if not record_path.is_file():
        raise DataFormatError(record_path, None, None,
                              "not found: is this a prepared dataset (run the prepare stage)?")
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DataFormatError(record_path, error.lineno, None, f"malformed JSON ({error.msg})") from None
    for key in ("name", "splits"):
        if key not in record:
            raise DataFormatError(record_path, None, key, "missing")
    if record.get("subsets"):
        raise DataFormatError(record_path, None, "subsets",
                              f"{record['name']} is {len(record['subsets'])} sub-collections, each evaluated on its "
                              "own: read it with load_prepared_parts")
    dataset = read_beir(path, record["splits"], name=record["name"])
    dataset.meta = {key: value for key, value in record.items() if key not in ("name", "splits")}
    return dataset


def load_prepared_parts(path: str | os.PathLike) -> list[tuple[str | None, Dataset]]:
    """``[(subset, Dataset)]`` of a prepared folder: its sub-collections in order, or ``[(None, dataset)]``."""
    path = Path(path)
    record_path = path / DATASET_JSON
    try:
        subsets = json.loads(record_path.read_text(encoding="utf-8")).get("subsets") if record_path.is_file() else None
    except json.JSONDecodeError as error:
        raise DataFormatError(record_path, error.lineno, None, f"malformed JSON ({error.msg})") from None
    if not subsets:
        return [(None, load_prepared(path))]
    return [(subset, load_prepared(path / subset)) for subset in subsets]


def prepared_folders(path: str | os.PathLike) -> list[Path]:
    """The prepared folders of a dataset: its sub-collections' (``subsets``), or the folder itself."""
    path = Path(path)
    try:
        record = json.loads((path / DATASET_JSON).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return [path]
    return [path / subset for subset in record.get("subsets") or ()] or [path]
