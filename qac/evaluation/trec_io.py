"""Run and qrels files: TREC runs, TREC qrels and BEIR qrels TSV.

Formats (whitespace separated unless noted):

* TREC run: ``qid Q0 docid rank score tag``; ranks are ignored on reading (trec_eval
  ranks by score), written as 1..n in trec_eval order.
* TREC qrels: ``qid 0 docid rel`` (the second column is ignored).
* BEIR qrels: tab separated ``query-id corpus-id score`` with that header line.

A malformed line raises ``ValueError`` naming the file, the line and the field.
"""

from __future__ import annotations

import os
from typing import Mapping

from qac.evaluation.metrics import trec_order
from qac.io import atomic_path

BEIR_QRELS_HEADER = ("query-id", "corpus-id", "score")


def _parse_int(value: str, path, line_number: int, field: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{path}:{line_number}: field '{field}' must be an integer, got {value!r}") from None


def read_run(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Read a TREC run file into ``{qid: {docid: score}}``."""
    run: dict[str, dict[str, float]] = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 6:
                raise ValueError(f"{path}:{line_number}: expected 6 fields 'qid Q0 docid rank score tag', "
                                 f"got {len(fields)}")
            qid, _, doc_id, rank, score, _ = fields
            if not rank.isdigit():          # the cheap check first: this loop runs millions of times
                _parse_int(rank, path, line_number, "rank")
            try:
                value = float(score)
            except ValueError:
                raise ValueError(f"{path}:{line_number}: field 'score' must be a number, got {score!r}") from None
            if value != value:
                raise ValueError(f"{path}:{line_number}: field 'score' is NaN")
            docs = run.setdefault(qid, {})
            if doc_id in docs:
                raise ValueError(f"{path}:{line_number}: document {doc_id!r} appears twice for query {qid!r}")
            docs[doc_id] = value
    return run


def write_run(path: str | os.PathLike, run: Mapping[str, Mapping[str, float]], tag: str = "qac") -> None:
    """Write ``run`` as a TREC run file, atomically, ranks in trec_eval order.

    Scores are written with ``repr`` so that reading the file back gives exactly
    the same ranking (rounding could create ties that were not there).
    """
    if not tag or any(ch.isspace() for ch in tag):
        raise ValueError(f"run tag must be a non-empty word, got {tag!r}")
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for qid, docs in run.items():
            for rank, doc_id in enumerate(trec_order(docs), start=1):
                handle.write(f"{qid} Q0 {doc_id} {rank} {float(docs[doc_id])!r} {tag}\n")


def read_trec_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Read TREC qrels (``qid 0 docid rel``) into ``{qid: {docid: rel}}``."""
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 4:
                raise ValueError(f"{path}:{line_number}: expected 4 fields 'qid 0 docid rel', got {len(fields)}")
            qid, _, doc_id, rel = fields
            _add_judgement(qrels, qid, doc_id, _parse_int(rel, path, line_number, "rel"), path, line_number)
    return qrels


def read_beir_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Read a BEIR qrels TSV (header ``query-id corpus-id score``) into ``{qid: {docid: rel}}``."""
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as handle:
        header = handle.readline().rstrip("\n").split("\t")
        if tuple(field.strip() for field in header) != BEIR_QRELS_HEADER:
            raise ValueError(f"{path}:1: expected the header 'query-id<TAB>corpus-id<TAB>score', got {header!r}")
        for line_number, line in enumerate(handle, start=2):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{line_number}: expected 3 tab-separated fields "
                                 f"'query-id corpus-id score', got {len(fields)}")
            qid, doc_id, score = (field.strip() for field in fields)
            _add_judgement(qrels, qid, doc_id, _parse_int(score, path, line_number, "score"), path, line_number)
    return qrels


def read_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Read qrels in either format: BEIR TSV when the first line is its header, TREC otherwise."""
    with open(path, encoding="utf-8") as handle:
        first = handle.readline()
    if first.split("\t")[0].strip() == BEIR_QRELS_HEADER[0]:
        return read_beir_qrels(path)
    return read_trec_qrels(path)


def _add_judgement(qrels, qid, doc_id, rel, path, line_number) -> None:
    docs = qrels.setdefault(qid, {})
    if doc_id in docs and docs[doc_id] != rel:
        raise ValueError(f"{path}:{line_number}: document {doc_id!r} judged twice for query {qid!r} "
                         f"({docs[doc_id]} and {rel})")
    docs[doc_id] = rel
