"""Converters from the public classic collections to the BEIR layout qac reads.

Cranfield and CISI are distributed by the University of Glasgow IR group
(``http://ir.dcs.gla.ac.uk/resources/test_collections/``) as SMART-style text
files: records start with ``.I <id>`` and fields with ``.T`` (title), ``.A``
(authors), ``.B`` (bibliography), ``.W`` (text) or ``.X`` (CISI's
cross-references). The converters write ``corpus.jsonl``, ``queries.jsonl`` and
``qrels/test.tsv`` exactly as the data mirror holds them (its README):

- **Cranfield** (``cran.tar.gz``: ``cran.all.1400``, ``cran.qry``, ``cranqrel``):
  query ids are 1..225 in file order, because ``cranqrel`` numbers the queries
  by position, not by their ``.I`` numbers (which skip: 1, 2, 4, 8, ...). The
  relevance codes are Cleverdon's 1 (complete answer) to 4 (minimum interest)
  and -1 (no interest): gain = 5 - code, rows coded -1 dropped.
- **CISI** (``cisi.tar.gz``: ``CISI.ALL``, ``CISI.QRY``, ``CISI.REL``): ids as
  given; every ``CISI.REL`` row (``qid docid 0 0.0``) is a relevant pair (1).

Text lines of a field are joined with single spaces. A malformed line raises
:class:`~qac.data.errors.DataFormatError` naming the file, line and field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from qac.data.errors import DataFormatError
from qac.io import atomic_path, write_jsonl

FIELDS = {".T": "title", ".A": "author", ".B": "bib", ".W": "text", ".X": "cross_references"}


def read_smart_records(path: str | os.PathLike) -> Iterator[tuple[str, dict[str, str], int]]:
    """``(id, {field: text}, line number of .I)`` for every record of a SMART-style file, in file order."""
    path = Path(path)
    record_id, fields, field, start = None, {}, None, 0
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            line = line.rstrip("\n")
            marker = line[:2]
            if line.startswith(".I"):
                if record_id is not None:
                    yield record_id, _joined(fields), start
                parts = line.split()
                if len(parts) != 2:
                    raise DataFormatError(path, number, ".I", f"expected '.I <id>', found {line!r}")
                record_id, fields, field, start = parts[1], {}, None, number
            elif marker in FIELDS and line[2:].strip() == "":
                field = FIELDS[marker]
                fields.setdefault(field, [])
            elif record_id is None:
                if line.strip():
                    raise DataFormatError(path, number, ".I", "text before the first '.I' record")
            elif field is None:
                if line.strip():
                    raise DataFormatError(path, number, "field", f"text outside a field in record {record_id}")
            else:
                fields[field].append(line.strip())
    if record_id is not None:
        yield record_id, _joined(fields), start


def _joined(fields: dict[str, list[str]]) -> dict[str, str]:
    return {name: " ".join(part for part in parts if part) for name, parts in fields.items()}


def _find(directory: Path, names: tuple[str, ...]) -> Path:
    """The first of ``names`` under ``directory`` (the archives nest them one folder deep or not at all)."""
    for name in names:
        for candidate in (directory / name, *directory.glob(f"*/{name}")):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(f"{directory}: none of {', '.join(names)} found")


def _write(out_dir: Path, corpus: list[dict], queries: list[dict], qrels: list[tuple[str, str, int]]) -> None:
    write_jsonl(out_dir / "corpus.jsonl", corpus)
    write_jsonl(out_dir / "queries.jsonl", queries)
    with atomic_path(out_dir / "qrels" / "test.tsv") as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write("query-id\tcorpus-id\tscore\n")
            handle.writelines(f"{qid}\t{doc_id}\t{score}\n" for qid, doc_id, score in qrels)


def _qrels_rows(path: Path, columns: int) -> Iterator[tuple[int, list[str]]]:
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != columns:
                raise DataFormatError(path, number, "qrels", f"expected {columns} columns, found {len(parts)}")
            yield number, parts


def convert_cranfield(source_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, int]:
    """Write Cranfield from ``cran.tar.gz``'s files in ``source_dir`` to BEIR files in ``out_dir``; counts."""
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    corpus = [{"_id": doc_id, "title": fields.get("title", ""), "text": fields.get("text", "")}
              for doc_id, fields, _ in read_smart_records(_find(source_dir, ("cran.all.1400", "cran.all")))]
    queries = [{"_id": str(position), "text": fields.get("text", "")}
               for position, (_, fields, _) in enumerate(read_smart_records(_find(source_dir, ("cran.qry",))),
                                                         start=1)]
    qrels_path = _find(source_dir, ("cranqrel",))
    known_queries, known_docs = {q["_id"] for q in queries}, {d["_id"] for d in corpus}
    qrels, dropped = [], 0
    for number, (qid, doc_id, code) in _qrels_rows(qrels_path, 3):
        try:
            code = int(code)
        except ValueError:
            raise DataFormatError(qrels_path, number, "relevance", f"not an integer: {code!r}") from None
        if code == -1:
            dropped += 1
            continue
        if not 1 <= code <= 5:
            raise DataFormatError(qrels_path, number, "relevance", f"Cleverdon code must be -1 or 1..5, got {code}")
        if qid not in known_queries or doc_id not in known_docs:
            raise DataFormatError(qrels_path, number, "qrels", f"query {qid} or document {doc_id} does not exist")
        qrels.append((qid, doc_id, 5 - code))
    _write(out_dir, corpus, queries, qrels)
    return {"documents": len(corpus), "queries": len(queries), "qrels": len(qrels), "dropped_no_interest": dropped}


def convert_cisi(source_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, int]:
    """Write CISI from ``cisi.tar.gz``'s files in ``source_dir`` to BEIR files in ``out_dir``; counts."""
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    corpus = [{"_id": doc_id, "title": fields.get("title", ""), "text": fields.get("text", "")}
              for doc_id, fields, _ in read_smart_records(_find(source_dir, ("CISI.ALL",)))]
    queries = [{"_id": qid, "text": fields.get("text", "")}
               for qid, fields, _ in read_smart_records(_find(source_dir, ("CISI.QRY",)))]
    qrels_path = _find(source_dir, ("CISI.REL",))
    known_queries, known_docs = {q["_id"] for q in queries}, {d["_id"] for d in corpus}
    qrels, seen = [], set()
    for number, (qid, doc_id, _, _) in _qrels_rows(qrels_path, 4):
        if qid not in known_queries or doc_id not in known_docs:
            raise DataFormatError(qrels_path, number, "qrels", f"query {qid} or document {doc_id} does not exist")
        if (qid, doc_id) not in seen:   # CISI.REL repeats a few pairs
            seen.add((qid, doc_id))
            qrels.append((qid, doc_id, 1))
    _write(out_dir, corpus, queries, qrels)
    return {"documents": len(corpus), "queries": len(queries), "qrels": len(qrels)}


CONVERTERS = {"cranfield": convert_cranfield, "cisi": convert_cisi}
