"""A corpus that stays in its file: ids in memory, documents read on demand.

MS MARCO documents (22 GB) do not fit in memory as Python objects (about
30 GB). :class:`StreamedCorpus` is the ``Corpus`` mapping the prepare stage
needs without that: it knows its ids (read once, in file order, checking
duplicates and counting empty texts) and streams the documents again from the
file whenever its values are iterated. Memory grows with the number of ids
only (about 100 bytes per document), not with their texts.

A subset (:meth:`StreamedCorpus.restricted`) keeps the ids it is given and
skips the others while streaming, so writing a subset is one more pass over
the file.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Iterator, Mapping

from qac.data.dataset import Document

DocumentStream = Callable[[Counter | None], Iterator[Document]]


class StreamedCorpus(Mapping[str, Document]):
    """doc id -> :class:`Document`, in file order, read from the file on iteration.

    ``stream(skipped)`` yields the file's kept documents in order, adding skip
    counts to ``skipped`` when it is not None (only the first pass counts).
    """

    def __init__(self, stream: DocumentStream, ids: Iterable[str] | None = None,
                 skipped: Counter | None = None):
        self._stream = stream
        if ids is None:
            ids = (document.doc_id for document in stream(skipped))
        self._ids = dict.fromkeys(ids)      # ordered, with constant-time membership

    def __contains__(self, doc_id) -> bool:
        return doc_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __getitem__(self, doc_id: str) -> Document:
        """One document, found by reading the file up to it (for single lookups, not loops)."""
        if doc_id in self._ids:
            for document in self._stream(None):
                if document.doc_id == doc_id:
                    return document
        raise KeyError(doc_id)

    def values(self) -> Iterator[Document]:   # type: ignore[override]
        """The documents, streamed from the file in file order."""
        for document in self._stream(None):
            if document.doc_id in self._ids:
                yield document

    def items(self) -> Iterator[tuple[str, Document]]:   # type: ignore[override]
        for document in self.values():
            yield document.doc_id, document

    def restricted(self, doc_ids: Iterable[str]) -> "StreamedCorpus":
        """The same file, keeping only ``doc_ids`` (which must be ids of this corpus)."""
        return StreamedCorpus(self._stream, (doc_id for doc_id in doc_ids if doc_id in self._ids))


def restrict_corpus(corpus: Mapping[str, Document], doc_ids: list[str]) -> Mapping[str, Document]:
    """``corpus`` limited to ``doc_ids`` (in that order), without loading a streamed corpus."""
    if isinstance(corpus, StreamedCorpus):
        return corpus.restricted(doc_ids)
    return {doc_id: corpus[doc_id] for doc_id in doc_ids}
