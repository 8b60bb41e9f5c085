"""Retriever 1's in-domain evaluation runs, searched while its corpus vectors exist.

Retriever 1 encodes the training corpus to mine retriever 2's negatives, and
its in-domain evaluation needs the same vectors: on MS MARCO that is 8.8M
passages encoded twice per variant. The fine-tuning stage therefore also
searches every evaluation split of the in-domain dataset with those vectors and
writes the runs beside the retrievers (``<finetune>/r1_runs/<split>.trec``) with
``encoding.json``, how they were made (lengths, pooling, title separator,
depth). The evaluation stage scores these runs instead of encoding the corpus
again when that record matches the encoding it would use itself; otherwise it
encodes, as it does for every other retriever and dataset.

The queries are encoded as the mining encodes its queries
(``finetune.encode_batch_size`` texts per forward pass): in fp32 a different
batch size moves a vector by float noise only.
"""

from __future__ import annotations

import json
from pathlib import Path

from qac.io import write_json

RUNS_FOLDER = "r1_runs"
ENCODING_FILE = "encoding.json"


def run_encoding(*, query_max_len: int, passage_max_len: int, pooling: str, separator: str, depth: int) -> dict:
    """What decides a run besides the retriever: the record both stages compare."""
    return {"query_max_len": int(query_max_len), "passage_max_len": int(passage_max_len), "pooling": pooling,
            "normalize": False, "separator": separator, "depth": int(depth)}


def write_indomain_runs(folder: str | Path, runs: dict[str, dict], encoding: dict, tag: str) -> None:
    """``<split>.trec`` per run and ``encoding.json`` into ``folder`` (inside the stage's staging folder)."""
    # here, not at the top: it loads numpy
    from qac.evaluation.trec_io import write_run

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, run in runs.items():
        write_run(folder / f"{split}.trec", run, tag=tag)
    write_json(folder / ENCODING_FILE, {**encoding, "splits": sorted(runs)})


def read_indomain_runs(folder: str | Path, encoding: dict, splits: list[str]) -> dict[str, dict] | None:
    """The runs of ``splits`` from ``folder`` when they were made with ``encoding``; None when the folder,
    a split or the record is missing, or the record differs (the caller then encodes)."""
    # here, not at the top: it loads numpy
    from qac.evaluation.trec_io import read_run

    folder = Path(folder)
    record_path = folder / ENCODING_FILE
    if not record_path.is_file():
        return None
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if {key: record.get(key) for key in encoding} != encoding or not set(splits) <= set(record.get("splits", [])):
        return None
    return {split: read_run(folder / f"{split}.trec") for split in splits}
