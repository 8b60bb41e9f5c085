"""The BEIR layout: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

``corpus.jsonl``: one JSON object per line with ``_id``, ``title`` (may be
missing or empty) and ``text``. ``queries.jsonl``: ``_id`` and ``text`` (other
fields such as ``metadata`` are ignored). ``qrels/<split>.tsv``: tab separated
``query-id corpus-id score`` with that header line.

Reading is strict: a malformed line, a missing field, a repeated id or an empty
query raise :class:`~qac.data.errors.DataFormatError`. Documents whose title and
text are both empty are skipped and counted (``corpus_empty_text``): a few real
collections have them (Cranfield has two) and they cannot be retrieved anyway.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

from qac.data.dataset import Corpus, Dataset, Document, Qrels, Queries, is_empty_text
from qac.data.errors import DataFormatError
from qac.data.textfile import (QrelsCollector, check_id, check_new_id, iter_json_objects, iter_lines, iter_rows, parse_int,
                               require_rows, required_id, required_text)

QRELS_HEADER = ("query-id", "corpus-id", "score")


def iter_corpus_jsonl(path: str | os.PathLike, *, min_text_chars: int = 1,
                      skipped: Counter | None = None) -> Iterator[Document]:
    """Documents of a BEIR ``corpus.jsonl`` one at a time, for corpora too large for memory.

    A file that yields no document (empty, or only empty texts) is an error.
    """
    seen: dict[str, int] = {}
    kept = empty = 0
    for line, record in iter_json_objects(path):
        doc_id = required_id(record, "_id", path, line)
        check_new_id(seen, doc_id, "_id", path, line)
        title = required_text(record, "title", path, line, default="")
        text = required_text(record, "text", path, line)
        document = Document(doc_id, title.strip(), text.strip())
        if is_empty_text(document.full_text, min_text_chars):
            empty += 1
            if skipped is not None:
                skipped["corpus_empty_text"] += 1
            continue
        kept += 1
        yield document
    require_rows(kept, path, "documents", skipped=empty)


def read_corpus_jsonl(path: str | os.PathLike, *, min_text_chars: int = 1,
                      skipped: Counter | None = None) -> Corpus:
    """Documents of a BEIR ``corpus.jsonl``, in file order."""
    return {document.doc_id: document
            for document in iter_corpus_jsonl(path, min_text_chars=min_text_chars, skipped=skipped)}


def read_queries_jsonl(path: str | os.PathLike, *, required: bool = True) -> Queries:
    """Queries of a BEIR ``queries.jsonl``; an empty query is an error (it would be evaluated), and so is a
    file without queries where ``required`` (a collection with no judged split, such as the prepared MS MARCO
    documents of pre-training, has none)."""
    queries: Queries = {}
    seen: dict[str, int] = {}
    for line, record in iter_json_objects(path):
        qid = required_id(record, "_id", path, line)
        check_new_id(seen, qid, "_id", path, line)
        text = required_text(record, "text", path, line).strip()
        if not text:
            raise DataFormatError(path, line, "text", "empty query")
        queries[qid] = text
    if required:
        require_rows(len(queries), path, "queries")
    return queries


def read_qrels_tsv(path: str | os.PathLike, *, skipped: Counter | None = None) -> Qrels:
    """Judgements of a BEIR ``qrels/<split>.tsv`` (header ``query-id corpus-id score``).

    A pair judged twice is kept once if the grades agree (counted as
    ``qrels_duplicate``) and is an error if they differ.
    """
    collector = QrelsCollector(path, "score", skipped)
    # BEIR writes tabs; a copy saved through an editor or a spreadsheet may hold spaces instead: a header
    # separated by spaces says which (ids cannot hold spaces: they go to whitespace-separated TREC files).
    first = next((text for _, text in iter_lines(path)), "")
    spaced = "\t" not in first and tuple(first.split()) == QRELS_HEADER
    for line, (qid, doc_id, score) in iter_rows(path, QRELS_HEADER, whitespace=spaced):
        if line == 1 and (qid, doc_id, score) == QRELS_HEADER:
            continue
        if line == 1:
            raise DataFormatError(path, 1, None,
                                  f"expected the header {' '.join(QRELS_HEADER)!r}, found {qid} {doc_id} {score}")
        qid, doc_id = check_id(qid, "query-id", path, line), check_id(doc_id, "corpus-id", path, line)
        collector.add(qid, doc_id, parse_int(score, "score", path, line), line)
    require_rows(len(collector.qrels), path, "judgements")
    return collector.qrels


def read_beir(directory: str | os.PathLike, splits: Iterable[str], *, name: str | None = None,
              min_text_chars: int = 1, skipped: Counter | None = None) -> Dataset:
    """A BEIR dataset folder with the qrels of ``splits`` (each ``qrels/<split>.tsv`` must exist)."""
    directory, splits = Path(directory), list(splits)
    skipped = Counter() if skipped is None else skipped
    corpus = read_corpus_jsonl(directory / "corpus.jsonl", min_text_chars=min_text_chars, skipped=skipped)
    queries = read_queries_jsonl(directory / "queries.jsonl", required=bool(splits))
    qrels = {split: read_qrels_tsv(directory / "qrels" / f"{split}.tsv", skipped=skipped) for split in splits}
    return Dataset(name=name or directory.name, corpus=corpus, queries=queries, qrels=qrels,
                   meta={"skipped": dict(skipped)})


def write_corpus_jsonl(corpus: Corpus, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for document in corpus.values():
            record = {"_id": document.doc_id, "title": document.title, "text": document.text}
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_queries_jsonl(queries: Queries, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for qid, text in queries.items():
            handle.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")


def write_qrels_tsv(qrels: Qrels, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\t".join(QRELS_HEADER) + "\n")
        for qid, judged in qrels.items():
            for doc_id, grade in judged.items():
                handle.write(f"{qid}\t{doc_id}\t{grade}\n")


def write_beir(dataset: Dataset, directory: str | os.PathLike) -> None:
    """Write ``dataset`` in the BEIR layout into an existing (empty) ``directory``.

    Not atomic by itself: callers write into the temporary directory of
    :func:`qac.io.atomic_path` (``directory=True``).
    """
    directory = Path(directory)
    (directory / "qrels").mkdir(parents=True, exist_ok=True)
    write_corpus_jsonl(dataset.corpus, directory / "corpus.jsonl")
    write_queries_jsonl(dataset.queries, directory / "queries.jsonl")
    for split, qrels in dataset.qrels.items():
        write_qrels_tsv(qrels, directory / "qrels" / f"{split}.tsv")
