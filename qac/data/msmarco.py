"""MS MARCO collections in their distributed TSV formats.

- Documents (``msmarco-docs.tsv``, 3.2M rows): ``docid<TAB>url<TAB>title<TAB>body``.
  The URL is dropped; title and body are kept apart in :class:`Document` and
  joined with a space by :attr:`Document.full_text`, as the paper does.
- Passages (``collection.tsv``, 8.8M rows): ``pid<TAB>text``.

Both may be gzip-compressed (``.gz``). Rows whose text is empty are skipped and
counted (``corpus_empty_text``); a repeated id is an error.
"""

from __future__ import annotations

import os
from collections import Counter

from qac.data.dataset import Corpus, Document, is_empty_text
from qac.data.textfile import check_id, check_new_id, iter_rows, require_rows

DOCUMENT_FIELDS = ("docid", "url", "title", "body")
PASSAGE_FIELDS = ("pid", "text")


def read_msmarco_documents(path: str | os.PathLike, *, min_text_chars: int = 1,
                           skipped: Counter | None = None) -> Corpus:
    """The MS MARCO document collection: doc id -> Document(title, body)."""
    corpus: Corpus = {}
    seen: dict[str, int] = {}
    empty = 0
    for line, (doc_id, _url, title, body) in iter_rows(path, DOCUMENT_FIELDS):
        doc_id = check_id(doc_id, "docid", path, line)
        check_new_id(seen, doc_id, "docid", path, line)
        document = Document(doc_id, title.strip(), body.strip())
        if is_empty_text(document.full_text, min_text_chars):
            empty += 1
            if skipped is not None:
                skipped["corpus_empty_text"] += 1
            continue
        corpus[doc_id] = document
    require_rows(len(corpus), path, "documents", skipped=empty)
    return corpus


def read_passage_collection(path: str | os.PathLike, *, min_text_chars: int = 1,
                            skipped: Counter | None = None) -> Corpus:
    """A passage collection (``pid<TAB>text``): pid -> Document with an empty title."""
    corpus: Corpus = {}
    seen: dict[str, int] = {}
    empty = 0
    for line, (pid, text) in iter_rows(path, PASSAGE_FIELDS):
        pid = check_id(pid, "pid", path, line)
        check_new_id(seen, pid, "pid", path, line)
        if is_empty_text(text, min_text_chars):
            empty += 1
            if skipped is not None:
                skipped["corpus_empty_text"] += 1
            continue
        corpus[pid] = Document(pid, "", text.strip())
    require_rows(len(corpus), path, "passages", skipped=empty)
    return corpus
