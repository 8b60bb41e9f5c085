"""The query generator's quality, as its stages measured it: a small table beside Tables 1-5.

Whether query-as-context can help depends on the generated queries being
related to their passage, so the report shows what ``query_generator``
(held-out passages: ROUGE-L against real queries, BM25 self-retrieval of the
generated query against a random sentence and the real query) and
``generate_queries`` (duplicate and empty candidates) wrote to their DVC
metrics, every numeric field as it is, with the file it came from. Wall-clock
figures live in ``metrics/timing/`` and are not shown.
"""

from __future__ import annotations

import csv
import io

from qac.reporting.lineage import Study

STAGES = ("query_generator", "queries")
TITLE = "Query generator quality (stage metrics)"


def generator_rows(study: Study) -> list[tuple[str, str, float]]:
    """``(source file, metric, value)`` of every numeric field of the generator stages' metrics files."""
    rows = []
    for stage in STAGES:
        metrics = study.stage_metrics(stage) or {}
        for key in sorted(metrics):
            value = metrics[key]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append((f"metrics/{stage}.json", key, float(value)))
    return rows


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:.3f}"


def to_markdown(rows: list[tuple[str, str, float]]) -> str:
    lines = [f"### {TITLE}", "", "| file | metric | value |", "|---|---|---|"]
    lines += [f"| {source} | {metric} | {_number(value)} |" for source, metric, value in rows]
    lines += ["", "Note: self_retrieval/* = share of held-out passages whose own document BM25 ranks first for the "
                  "text (generated query, a random sentence of the passage, the real query); rougeL against the "
                  "held-out real queries. Table 5 compares passage-query with passage-passage pairs."]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[tuple[str, str, float]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["source", "metric", "value"])
    writer.writerows((source, metric, repr(value)) for source, metric, value in rows)
    return buffer.getvalue()
