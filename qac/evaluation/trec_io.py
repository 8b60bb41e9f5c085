"""Run and qrels files: TREC runs, TREC qrels and BEIR qrels TSV.

Formats (whitespace separated unless noted):

* TREC run: ``qid Q0 docid rank score tag``, optionally after an ``ir_metadata`` block
  (PRIMAD facts in YAML between ``# ir_metadata.start`` and ``# ir_metadata.end``, each
  line behind ``# ``; :func:`read_ir_metadata`); ranks are ignored on reading (trec_eval
  ranks by score; a rank must still be a number, ``2`` or ``2.0``), written as 1..n in
  trec_eval order. As trec_eval, fields after the tag are ignored and a line whose first
  word starts with ``#`` is a comment.
* TREC qrels: ``qid 0 docid rel`` (the second column is ignored); as trec_eval, a line
  starting with ``#`` is a comment, and a fifth field is an error.
* BEIR qrels: tab separated ``query-id corpus-id score`` with that header line (a copy
  separated by spaces, header included, is read too).

Fields are split on ASCII whitespace, as trec_eval splits them: a no-break space inside an
id is named as such. Numbers are read as trec_eval reads them (ASCII digits; no digit-group
underscores, which Python's ``int`` would take).

Every file is read through :mod:`qac.data.textfile`, the decoding path of all
inputs: a byte order mark is dropped, ``.gz`` files are decompressed, and an
undecodable byte, a malformed line, an id a TREC file cannot hold or an empty
file raise :class:`~qac.data.errors.DataFormatError` (a ``ValueError``) naming
the file, the line and the field.
"""

from __future__ import annotations

import os
from typing import Mapping

from qac.data import beir, trec
from qac.data.errors import DataFormatError
from qac.data.textfile import check_id, is_number, iter_lines, iter_trec_rows, parse_number, require_rows
from qac.evaluation.metrics import trec_order
from qac.io import atomic_path

BEIR_QRELS_HEADER = ("query-id", "corpus-id", "score")
RUN_FIELDS = ("qid", "Q0", "docid", "rank", "score", "tag")


def read_run(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Read a TREC run file into ``{qid: {docid: score}}``; an empty run is an error."""
    run: dict[str, dict[str, float]] = {}
    rows = iter_trec_rows(path, RUN_FIELDS, comments="first-word", extra_fields=True)
    for line_number, (qid, _, doc_id, rank, score, _) in rows:
        if not rank.isdigit() and not is_number(rank):   # the cheap check first: this loop runs millions of times
            raise DataFormatError(path, line_number, "rank",
                                  f"must be a number, got {rank!r} (ranks are ignored, as trec_eval ignores them, "
                                  "but a word here means a missing or shifted column)")
        try:
            value = float(score)
        except ValueError:
            value = None
        if value is None or "_" in score or not score.isascii():
            value = parse_number(score, "score", path, line_number)
        if value != value:
            raise DataFormatError(path, line_number, "score", "is NaN")
        docs = run.setdefault(qid, {})
        if doc_id in docs:
            raise DataFormatError(path, line_number, "docid",
                                  f"document {doc_id!r} appears twice for query {qid!r}")
        docs[doc_id] = value
    require_rows(len(run), path, "results")
    return run


IR_METADATA_START, IR_METADATA_END = "# ir_metadata.start", "# ir_metadata.end"


def ir_metadata_block(metadata: Mapping) -> str:
    """``metadata`` as the ir_metadata header of a run file: YAML, every line behind ``# ``."""
    import yaml

    body = yaml.safe_dump(dict(metadata), sort_keys=False, allow_unicode=True, default_flow_style=False)
    return "\n".join([IR_METADATA_START, *(f"# {line}" for line in body.splitlines()), IR_METADATA_END]) + "\n"


def read_ir_metadata(path: str | os.PathLike) -> dict | None:
    """The ir_metadata block at the head of a run file, as a dict; None without one."""
    import yaml

    lines = []
    with open(path, encoding="utf-8") as handle:
        if handle.readline().rstrip("\n") != IR_METADATA_START:
            return None
        for line in handle:
            if line.rstrip("\n") == IR_METADATA_END:
                return yaml.safe_load("\n".join(lines)) or {}
            lines.append(line.rstrip("\n")[2:])
    raise DataFormatError(path, None, None, f"an ir_metadata block without its {IR_METADATA_END!r} line")


def write_run(path: str | os.PathLike, run: Mapping[str, Mapping[str, float]], tag: str = "qac",
              metadata: Mapping | None = None) -> None:
    """Write ``run`` as a TREC run file, atomically, ranks in trec_eval order; ``metadata`` (PRIMAD facts)
    goes first as an ir_metadata block.

    Scores are written with ``repr`` so that reading the file back gives exactly
    the same ranking (rounding could create ties that were not there). An id
    that the whitespace-separated format cannot hold is an error before any
    byte is written.
    """
    if not tag or any(ch.isspace() for ch in tag):
        raise ValueError(f"run tag must be a non-empty word, got {tag!r}")
    for qid, docs in run.items():
        check_id(str(qid), "qid", path, None)
        for doc_id in docs:
            check_id(str(doc_id), "docid", path, None)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        if metadata:
            handle.write(ir_metadata_block(metadata))
        for qid, docs in run.items():
            for rank, doc_id in enumerate(trec_order(docs), start=1):
                handle.write(f"{qid} Q0 {doc_id} {rank} {float(docs[doc_id])!r} {tag}\n")


def read_trec_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Read TREC qrels (``qid 0 docid rel``) into ``{qid: {docid: rel}}``."""
    return trec.read_trec_qrels(path)


def read_beir_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Read a BEIR qrels TSV (header ``query-id corpus-id score``) into ``{qid: {docid: rel}}``."""
    return beir.read_qrels_tsv(path)


def read_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Read qrels in either format: BEIR when the first line is its header (tab- or space-separated),
    TREC otherwise."""
    first = next((line for _, line in iter_lines(path)), None)
    if first is None:
        raise DataFormatError(path, None, None, "no judgements: the file is empty")
    words = first.split("\t")[0].split()
    if words and words[0] == BEIR_QRELS_HEADER[0]:
        return read_beir_qrels(path)
    return read_trec_qrels(path)
