"""TREC-style topics and qrels, as the standard IR toolkits distribute them.

- Topics: ``qid<TAB>text`` per line (MS MARCO queries, TREC DL topics).
- Qrels: ``qid iter docid rel`` separated by whitespace; ``iter`` (``Q0`` or
  ``0``) is ignored.
"""

from __future__ import annotations

import os
from collections import Counter

from qac.data.dataset import Qrels, Queries
from qac.data.errors import DataFormatError
from qac.data.textfile import (QrelsCollector, check_id, check_new_id, iter_rows, iter_trec_rows, parse_int,
                               require_rows)

TOPIC_FIELDS = ("qid", "text")
QRELS_FIELDS = ("qid", "iter", "docid", "rel")


def read_topics(path: str | os.PathLike) -> Queries:
    """Topics file: qid -> text. An empty topic is an error (it would be evaluated)."""
    queries: Queries = {}
    seen: dict[str, int] = {}
    for line, (qid, text) in iter_rows(path, TOPIC_FIELDS):
        qid, text = check_id(qid, "qid", path, line), text.strip()
        check_new_id(seen, qid, "qid", path, line)
        if not text:
            raise DataFormatError(path, line, "text", "empty query")
        queries[qid] = text
    require_rows(len(queries), path, "topics")
    return queries


def read_trec_qrels(path: str | os.PathLike, *, skipped: Counter | None = None) -> Qrels:
    """TREC qrels: qid -> {docid: grade}.

    A pair judged twice is kept once if the grades agree (counted as
    ``qrels_duplicate``) and is an error if they differ.
    """
    collector = QrelsCollector(path, "rel", skipped)
    # As trec_eval: a line starting with '#' is a comment; exactly four fields.
    for line, (qid, _iteration, doc_id, rel) in iter_trec_rows(path, QRELS_FIELDS, comments="line-start",
                                                                extra_fields=False):
        collector.add(check_id(qid, "qid", path, line), check_id(doc_id, "docid", path, line),
                      parse_int(rel, "rel", path, line), line)
    require_rows(len(collector.qrels), path, "judgements")
    return collector.qrels
