"""Build the ``msmarco-dl19-subset`` dataset (BEIR layout) from the public MS MARCO and TREC DL files.

The subset is what the data mirror holds: the TREC DL 2019 passage queries
that have judgements, every passage judged relevant (grade >= 1) for one of
them, plus ``others`` more passages (default 898, for 5,000 in all): first the
passages judged non-relevant (grade 0), in qrels order, then passages of the
collection in file order (these also stand in for judged passages the
collection does not have). Its qrels are the DL19 judgements of the kept
passages (graded 0-3; binary measures count grade >= 2 as relevant).

Public inputs, in their native formats:

- the MS MARCO passage collection ``collection.tsv`` (``pid<TAB>text``), in
  https://msmarco.z22.web.core.windows.net/msmarcoranking/collectionandqueries.tar.gz;
- the DL19 topics ``msmarco-test2019-queries.tsv`` (``qid<TAB>text``),
  https://msmarco.z22.web.core.windows.net/msmarcoranking/msmarco-test2019-queries.tsv.gz;
- the DL19 passage qrels ``2019qrels-pass.txt`` (TREC: ``qid Q0 pid grade``),
  https://trec.nist.gov/data/deep/2019qrels-pass.txt.

Usage (``.gz`` inputs are read as they are)::

    python -m qac.cli.dl19_subset_command --collection collection.tsv \\
        --topics msmarco-test2019-queries.tsv.gz --qrels 2019qrels-pass.txt \\
        --out ../shared/data/msmarco-dl19-subset

The collection is streamed once (8.8M lines); only the kept passages are held.
"""

from __future__ import annotations

import os
from pathlib import Path

from qac.data.errors import DataFormatError
from qac.data.textfile import iter_rows
from qac.data.trec import read_topics, read_trec_qrels
from qac.io import atomic_path, write_jsonl

DEFAULT_OTHERS = 898


def build_dl19_subset(collection: str | os.PathLike, topics: str | os.PathLike, qrels: str | os.PathLike,
                      out_dir: str | os.PathLike, others: int = DEFAULT_OTHERS) -> dict[str, int]:
    """Write ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/test.tsv`` to ``out_dir``; returns the counts."""
    judgements = read_trec_qrels(qrels)
    all_topics = read_topics(topics)
    missing = sorted(set(judgements) - set(all_topics))
    if missing:
        raise DataFormatError(topics, None, "qid", f"judged queries without a topic: {', '.join(missing[:5])}")
    relevant = {pid for by_pid in judgements.values() for pid, grade in by_pid.items() if grade >= 1}
    non_relevant = [pid for by_pid in judgements.values() for pid, grade in by_pid.items() if grade < 1]
    wanted = set(relevant)
    for pid in non_relevant:
        if len(wanted) >= len(relevant) + others:
            break
        wanted.add(pid)

    # One pass: the wanted passages, and the first `others` of the rest in file order, which fill the count
    # where judged passages are missing from this collection. Kept in collection order.
    found: dict[str, tuple[int, str]] = {}
    fillers: list[tuple[int, str, str]] = []
    filler_ids: set[str] = set()
    for line, (pid, text) in iter_rows(collection, ("pid", "text")):
        pid = pid.strip()
        if pid in found or pid in filler_ids:
            raise DataFormatError(collection, line, "pid", f"duplicate id {pid!r}: a passage id appears twice in "
                                                           "the collection, and the two texts cannot both be its")
        if pid in wanted:
            found[pid] = (line, text.strip())
        elif len(fillers) < others:
            fillers.append((line, pid, text.strip()))
            filler_ids.add(pid)
    absent = sorted(relevant - set(found))
    if absent:
        raise DataFormatError(collection, None, "pid", f"{len(absent)} judged passages are not in the collection "
                                                       f"(first: {', '.join(absent[:5])})")
    room = max(len(relevant) + others - len(found), 0)
    chosen = sorted([(line, pid, text) for pid, (line, text) in found.items()] + fillers[:room])
    kept = {pid: text for _, pid, text in chosen}
    out_dir = Path(out_dir)
    rows = [(qid, pid, grade) for qid, by_pid in judgements.items() for pid, grade in by_pid.items() if pid in kept]
    # The folder is replaced as a whole: nothing of an earlier build stays beside the new files.
    with atomic_path(out_dir, directory=True) as staging:
        write_jsonl(staging / "corpus.jsonl",
                    ({"_id": pid, "title": "", "text": text} for pid, text in kept.items()))
        write_jsonl(staging / "queries.jsonl", ({"_id": qid, "text": all_topics[qid]} for qid in judgements))
        (staging / "qrels").mkdir()
        with open(staging / "qrels" / "test.tsv", "w", encoding="utf-8") as handle:
            handle.write("query-id\tcorpus-id\tscore\n")
            handle.writelines(f"{qid}\t{pid}\t{grade}\n" for qid, pid, grade in rows)
    return {"documents": len(kept), "queries": len(judgements), "qrels": len(rows), "relevant": len(relevant),
            "others_asked": others, "others": len(kept) - len(relevant)}
