"""MS MARCO collections in their distributed TSV formats.

- Documents (``msmarco-docs.tsv``, 3.2M rows): ``docid<TAB>url<TAB>title<TAB>body``.
  The URL is dropped; title and body are kept apart in :class:`Document` and
  joined with a space by :attr:`Document.full_text`, as the paper does.
- Passages (``collection.tsv``, 8.8M rows): ``pid<TAB>text``.

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
from qac.data.streamed import StreamedCorpus
from qac.data.textfile import check_id, check_new_id, iter_rows, require_rows

DOCUMENT_FIELDS = ("docid", "url", "title", "body")
PASSAGE_FIELDS = ("pid", "text")


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
                            skipped: Counter | None = None) -> Iterator[Document]:
    """A passage collection (``pid<TAB>text``), one Document (empty title) at a time."""
    seen: dict[str, int] = {}
    empty = kept = 0
    for line, (pid, text) in iter_rows(path, PASSAGE_FIELDS):
        pid = check_id(pid, "pid", path, line)
        check_new_id(seen, pid, "pid", path, line)
        if is_empty_text(text, min_text_chars):
            empty += 1
            if skipped is not None:
                skipped["corpus_empty_text"] += 1
            continue
        kept += 1
        yield Document(pid, "", text.strip())
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
                      skipped: Counter | None = None) -> StreamedCorpus:
    """A TSV collection as a :class:`StreamedCorpus`: ids read now, texts read when iterated.

    ``documents``: the MS MARCO documents format (docid, url, title, body);
    otherwise a passage collection (pid, text).
    """
    reader = iter_msmarco_documents if documents else iter_passage_collection
    return StreamedCorpus(lambda counts: reader(path, min_text_chars=min_text_chars, skipped=counts),
                          skipped=skipped)

