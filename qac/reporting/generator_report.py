"""The query generator's quality, as its stages measured it: a small table beside Tables 1-5.

Whether query-as-context can help depends on the generated queries being
related to their passage, so the report shows what ``query_generator``
(held-out passages: ROUGE-L against real queries, BM25 self-retrieval of the
generated query against a random sentence and the real query) and
``generate_queries`` (duplicate and empty candidates) wrote to their DVC
metrics, every numeric field as it is, with the file it came from. Wall-clock
figures live in ``metrics/timing/`` and are not shown.

:func:`checked_table` holds the figures that are means over items (candidates,
held-out pairs, judge anchors) of values in [0, 1], and the item counts, as
cells that ``qac check`` records and checks like those of Tables 1-5.
"""

from __future__ import annotations

import csv
import io

from qac.reporting.lineage import Study, read_json
from qac.reporting.tables import FRACTION, Cell, Table

STAGES = ("query_generator", "queries")
TITLE = "Query generator quality (stage metrics)"
VALUE, COUNT_COLUMN = "value", "count"
# (stage, mean over items of a value in [0, 1], the metric that counts the items)
CHECKED_MEANS = (
    ("query_generator", "rougeL", "candidates"),
    ("query_generator", "query/rougeL", "query/candidates"),
    ("query_generator", "title/rougeL", "title/candidates"),
    ("query_generator", "rougeL_greedy", "heldout_pairs"),
    ("query_generator", "self_retrieval/generated/top10", "candidates"),
    ("query_generator", "self_retrieval/generated/top1", "candidates"),
    ("query_generator", "duplicate_share", "candidates"),
    ("query_generator", "empty_share", "candidates"),
    ("query_generator", "judge/high_share/passage-query", "judge/anchors"),
    ("query_generator", "judge/high_share/passage-passage", "judge/anchors"),
    ("queries", "unique_ratio", "candidates"),
)
CHECKED_COUNTS = (("query_generator", "pairs/train"), ("query_generator", "pairs/heldout"),
                  ("query_generator", "candidates"), ("query_generator", "judge/anchors"),
                  ("queries", "passages"), ("queries", "queries"))


def generator_rows(study: Study) -> list[tuple[str, str, float]]:
    """``(source file, metric, value)`` of every numeric field of the generator stages' metrics files."""
    rows = []
    for stage in STAGES:
        metrics = study.stage_metrics(stage) or {}
        for key in sorted(metrics):
            value = metrics[key]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append((f"metrics/{stage}.json", key, float(value)))
    return rows + llm_generator_rows(study)


def llm_generator_rows(study: Study) -> list[tuple[str, str, float]]:
    """The figures of the LLM generators behind the extension's variants, from the queries record each
    pre-training wrote (``pretrain/<variant>/queries.json``): what the generator wrote (``generation/*``), what its
    filters kept (``filter/*``: ``kept_share/round_trip`` is BM25 self-retrieval at the filter's depth among the
    pre-training passages) and what the variant read (``used/*``)."""
    rows = []
    for path in sorted((study.root / "pretrain").glob("*/queries.json")):
        record, source = read_json(path), path.relative_to(study.root).as_posix()
        used = {"used/passages": record.get("passages"), "used/passages_with_queries":
                record.get("passages_with_queries"), "used/queries": record.get("queries")}
        found = [(f"{section}/{key}", value) for section in ("generation", "filter")
                 for key, value in sorted((record.get(section) or {}).items())] + sorted(used.items())
        rows += [(source, key, float(value)) for key, value in found
                 if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return rows


def checked_table(study: Study) -> Table:
    """The generator's checkable figures as a table (key ``generator``): means in column ``value``, with the
    number of items they average over, and counts in column ``count``; figures a run did not write are left
    out."""
    table = Table("generator", TITLE, FRACTION, [VALUE, COUNT_COLUMN], count_columns={COUNT_COLUMN})
    found = {stage: study.stage_metrics(stage) or {} for stage in STAGES}
    runs = {stage: (study.stage_record(stage) or {}).get("run_id") for stage in STAGES}

    def cell(stage: str, metric: str, n: int | None) -> Cell:
        return Cell(value=float(found[stage][metric]), metric=metric, n_queries=n, source=f"metrics/{stage}.json",
                    run_id=runs[stage])

    for stage, metric, counted_by in CHECKED_MEANS:
        if isinstance(found[stage].get(metric), (int, float)) and found[stage].get(counted_by):
            table.put(f"{stage}/{metric}", VALUE, cell(stage, metric, int(found[stage][counted_by])))
    for stage, metric in CHECKED_COUNTS:
        if isinstance(found[stage].get(metric), (int, float)):
            table.put(f"{stage}/{metric}", COUNT_COLUMN, cell(stage, metric, None))
    return table


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:.3f}"


def to_markdown(rows: list[tuple[str, str, float]]) -> str:
    lines = [f"### {TITLE}", "", "| file | metric | value |", "|---|---|---|"]
    lines += [f"| {source} | {metric} | {_number(value)} |" for source, metric, value in rows]
    lines += ["", "Note: self_retrieval/* = share of held-out passages whose own document BM25 ranks first for the "
                  "text (generated query, a random sentence of the passage, the real query); rougeL against the "
                  "held-out real queries. Table 5 compares passage-query with passage-passage pairs. pretrain/<variant>/"
                  "queries.json: an LLM generator's queries as that variant read them (its extension table row); "
                  "filter/kept_share/round_trip = share of the queries whose own passage BM25 ranks in the filter's "
                  "top depth among the pre-training passages."]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[tuple[str, str, float]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["source", "metric", "value"])
    # As printed (_number): a share at 0.001, a count whole, so float noise leaves the file as it is.
    writer.writerows((source, metric, repr(float(_number(value)))) for source, metric, value in rows)
    return buffer.getvalue()
