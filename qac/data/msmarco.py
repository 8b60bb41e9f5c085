"""MS MARCO collections in their distributed TSV formats.

- Documents (``msmarco-docs.tsv``, 3.2M rows): ``docid<TAB>url<TAB>title<TAB>body``.
  The URL is dropped; title and body are kept apart in :class:`Document` and
  joined with a space by :attr:`Document.full_text`, as the paper does.
- Passages (``collection.tsv``, 8.8M rows): ``pid<TAB>text``.
- Passage titles (RocketQA's ``para.title.txt``, beside its ``para.txt``
  passages in ``marco.tar.gz``): ``pid<TAB>title``, one line per passage in the
  passages file's order (``-`` where a passage has no title: kept as is, as
  Tevatron encodes it). Read alongside the passages, line by line, so no table
  of 8.8M titles is held in memory; a pid out of step is an error.

- Training triples (``qidpidtriples.train.full.2.tsv.gz``, 398M rows):
  ``qid<TAB>positive pid<TAB>negative pid``, a query's rows together. The
  release takes its retriever-1 negatives from them (:func:`iter_triple_negatives`).

Both are read one row at a time (:func:`iter_msmarco_documents`); the prepare
stage keeps them in their file (:func:`stream_tsv_corpus`). Both may be
gzip-compressed (``.gz``). Rows whose text is empty are skipped and
counted (``corpus_empty_text``); a repeated id is an error.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Iterator

from qac.data.dataset import Corpus, Document, is_empty_text
from qac.data.errors import DataFormatError
from qac.data.streamed import StreamedCorpus
from qac.data.textfile import check_id, check_new_id, iter_rows, require_rows

DOCUMENT_FIELDS = ("docid", "url", "title", "body")
PASSAGE_FIELDS = ("pid", "text")
TITLE_FIELDS = ("pid", "title")
TRIPLE_FIELDS = ("qid", "positive pid", "negative pid")


def iter_msmarco_documents(path: str | os.PathLike, *, min_text_chars: int = 1,
                           skipped: Counter | None = None) -> Iterator[Document]:
    """The MS MARCO document collection, one :class:`Document` at a time, in file order.

    Checks repeated ids with a dict of the ids seen (memory grows with the
    number of documents, not with their texts).
    """
    seen: dict[str, int] = {}
    empty = kept = 0
    for line, (doc_id, _url, title, body) in iter_rows(path, DOCUMENT_FIELDS):
        doc_id = check_id(doc_id, "docid", path, line)
        check_new_id(seen, doc_id, "docid", path, line)
        document = Document(doc_id, title.strip(), body.strip())
        if is_empty_text(document.full_text, min_text_chars):
            empty += 1
            if skipped is not None:
                skipped["corpus_empty_text"] += 1
            continue
        kept += 1
        yield document
    require_rows(kept, path, "documents", skipped=empty)


def iter_passage_collection(path: str | os.PathLike, *, min_text_chars: int = 1,
                            skipped: Counter | None = None,
                            titles: str | os.PathLike | None = None) -> Iterator[Document]:
    """A passage collection (``pid<TAB>text``), one Document at a time.

    Without ``titles`` every title is empty; with it (``pid<TAB>title`` in the
    same pid order) each passage gets its title.
    """
    seen: dict[str, int] = {}
    empty = kept = 0
    title_rows = iter_rows(titles, TITLE_FIELDS) if titles is not None else None
    for line, (pid, text) in iter_rows(path, PASSAGE_FIELDS):
        pid = check_id(pid, "pid", path, line)
        check_new_id(seen, pid, "pid", path, line)
        title = ""
        if title_rows is not None:
            title_line, (title_pid, title) = next(title_rows, (None, (None, "")))
            if title_line is None:
                raise DataFormatError(titles, None, "pid", f"ends before passage {pid!r} (line {line} of {path})")
            if title_pid.strip() != pid:
                raise DataFormatError(titles, title_line, "pid",
                                      f"{title_pid!r} where line {line} of {path} has passage {pid!r}: the titles "
                                      "file must list the passages in the collection's order")
        if is_empty_text(text, min_text_chars):
            empty += 1
            if skipped is not None:
                skipped["corpus_empty_text"] += 1
            continue
        kept += 1
        yield Document(pid, title.strip(), text.strip())
    if title_rows is not None:
        extra = next(title_rows, None)
        if extra is not None:
            raise DataFormatError(titles, extra[0], "pid", f"title of {extra[1][0]!r}, a passage {path} does not have")
    require_rows(kept, path, "passages", skipped=empty)


def read_msmarco_documents(path: str | os.PathLike, *, min_text_chars: int = 1,
                           skipped: Counter | None = None) -> Corpus:
    """The MS MARCO document collection in memory: doc id -> Document(title, body)."""
    return {document.doc_id: document
            for document in iter_msmarco_documents(path, min_text_chars=min_text_chars, skipped=skipped)}


def read_passage_collection(path: str | os.PathLike, *, min_text_chars: int = 1,
                            skipped: Counter | None = None) -> Corpus:
    """A passage collection (``pid<TAB>text``) in memory: pid -> Document with an empty title."""
    return {document.doc_id: document
            for document in iter_passage_collection(path, min_text_chars=min_text_chars, skipped=skipped)}


def stream_tsv_corpus(path: str | os.PathLike, documents: bool, *, min_text_chars: int = 1,
                      skipped: Counter | None = None, titles: str | os.PathLike | None = None) -> StreamedCorpus:
    """A TSV collection as a :class:`StreamedCorpus`: ids read now, texts read when iterated.

    ``documents``: the MS MARCO documents format (docid, url, title, body);
    otherwise a passage collection (pid, text), with its ``titles`` file if given.
    """
    if documents:
        return StreamedCorpus(lambda counts: iter_msmarco_documents(path, min_text_chars=min_text_chars,
                                                                    skipped=counts), skipped=skipped)
    return StreamedCorpus(lambda counts: iter_passage_collection(path, min_text_chars=min_text_chars, skipped=counts,
                                                                 titles=titles), skipped=skipped)



def iter_triple_negatives(path: str | os.PathLike) -> Iterator[tuple[str, list[str]]]:
    """``(qid, negatives)`` per query of a training-triples file, negatives once each in file order.

    A query's rows must be consecutive (the official file lists them so); a
    query that comes back after another one is an error naming its line, since
    grouping a 398M-row file in memory is not an option.
    """
    done: set[str] = set()
    current, negatives, seen = None, [], set()
    rows = 0
    for line, (qid, _positive, negative) in iter_rows(path, TRIPLE_FIELDS):
        qid = check_id(qid, "qid", path, line)
        negative = check_id(negative, "negative pid", path, line)
        rows += 1
        if qid != current:
            if current is not None:
                yield current, negatives
                done.add(current)
            if qid in done:
                raise DataFormatError(path, line, "qid", f"query {qid!r} appears again after other queries' rows; "
                                      "the file must list each query's triples together, as the official file does")
            current, negatives, seen = qid, [], set()
        if negative not in seen:
            seen.add(negative)
            negatives.append(negative)
    require_rows(rows, path, "triples")
    if current is not None:
        yield current, negatives
