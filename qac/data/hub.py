"""BEIR datasets from the Hugging Face hub (``BeIR/scifact`` and friends).

The hub's BEIR copies keep the corpus and queries in one repository (configs
``corpus`` and ``queries``) and the judgements in a second one named
``<name>-qrels`` (splits ``train``/``dev``/``test``, columns ``query-id``,
``corpus-id``, ``score``). Rows go through the same checks as the file readers;
a row's "line" in messages is its 1-based row number in the hub table.

Without a reachable hub (no network, or ``HF_HUB_OFFLINE=1`` without a warm
cache) :func:`read_hub_dataset` raises :class:`DatasetUnavailableError` naming
the dataset, before any rows are read.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from qac.data.dataset import Dataset, Document, is_empty_text
from qac.data.errors import DataFormatError, DatasetUnavailableError
from qac.data.textfile import QrelsCollector, check_new_id, require_rows, required_id, required_text


def _load(name: str, config: str | None = None, split: str | None = None):
    import datasets

    from qac.redaction import redact_text    # a hub address (HF_ENDPOINT) or token quoted by the error stays out

    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as error:  # offline, unknown repository, missing split: all say the same to the user
        what = f"{name}" + (f" ({config})" if config else "") + (f" split {split}" if split else "")
        raise DatasetUnavailableError(
            f"cannot load the Hugging Face dataset {what}: {type(error).__name__}: {redact_text(str(error))}. "
            "Is the hub reachable (HF_HUB_OFFLINE unset, network available)? "
            "Otherwise put the dataset in the data mirror (QAC_DATA_MIRROR)."
        ) from error


def check_hub_dataset(name: str) -> None:
    """Raise :class:`DatasetUnavailableError` unless ``name`` can be loaded (loads its small queries table)."""
    _load(name, "queries", "queries")


def read_hub_dataset(name: str, splits: Iterable[str], *, qrels_name: str | None = None,
                     min_text_chars: int = 1, skipped: Counter | None = None) -> Dataset:
    """A BEIR dataset from the hub: ``name`` (corpus, queries) and ``qrels_name`` (default ``<name>-qrels``)."""
    skipped = Counter() if skipped is None else skipped
    qrels_name = qrels_name or f"{name}-qrels"
    splits = list(splits)
    # Fetch every table first, so an unreachable hub fails before any work.
    corpus_rows = _load(name, "corpus", "corpus")
    query_rows = _load(name, "queries", "queries")
    qrels_rows = {split: _load(qrels_name, None, split) for split in splits}

    source = f"hf://{name}"
    corpus: dict[str, Document] = {}
    seen: dict[str, int] = {}
    for row_number, row in enumerate(corpus_rows, start=1):
        doc_id = required_id(row, "_id", f"{source}/corpus", row_number)
        check_new_id(seen, doc_id, "_id", f"{source}/corpus", row_number)
        document = Document(doc_id, required_text(row, "title", f"{source}/corpus", row_number, default="").strip(),
                            required_text(row, "text", f"{source}/corpus", row_number).strip())
        if is_empty_text(document.full_text, min_text_chars):
            skipped["corpus_empty_text"] += 1
            continue
        corpus[doc_id] = document
    require_rows(len(corpus), f"{source}/corpus", "documents", skipped=skipped["corpus_empty_text"])

    queries: dict[str, str] = {}
    seen = {}
    for row_number, row in enumerate(query_rows, start=1):
        qid = required_id(row, "_id", f"{source}/queries", row_number)
        check_new_id(seen, qid, "_id", f"{source}/queries", row_number)
        text = required_text(row, "text", f"{source}/queries", row_number).strip()
        if not text:
            raise DataFormatError(f"{source}/queries", row_number, "text", "empty query")
        queries[qid] = text
    require_rows(len(queries), f"{source}/queries", "queries")

    qrels = {}
    for split, rows in qrels_rows.items():
        where = f"hf://{qrels_name}/{split}"
        collector = QrelsCollector(where, "score", skipped)
        for row_number, row in enumerate(rows, start=1):
            qid = required_id(row, "query-id", where, row_number)
            doc_id = required_id(row, "corpus-id", where, row_number)
            grade = row.get("score")
            if isinstance(grade, bool) or not isinstance(grade, int):
                raise DataFormatError(where, row_number, "score", f"expected an integer, found {grade!r}")
            collector.add(qid, doc_id, grade, row_number)
        require_rows(len(collector.qrels), where, "judgements")
        qrels[split] = collector.qrels
    return Dataset(name=name, corpus=corpus, queries=queries, qrels=qrels, meta={"skipped": dict(skipped)})
