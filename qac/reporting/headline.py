"""The headline cells of Tables 1-5 as one small JSON file: what `dvc exp show` compares.

``reports/headline/<profile>.json`` holds a few dozen numbers, nested as
``{table: {row: {column: value}}}``, so DVC shows each as ``table1.<row>.<column>``:

- Tables 1, 3 and 4: the first measure column (the in-domain measure the
  paper leads with) of every row that has a value, differences included;
- Table 2: the ``average`` row (every method without, with and the
  difference), or the first dataset's row where there is no average;
- Table 5: the share of highly correlated pairs and its difference.

Row and column names are short forms of the tables' labels
(``coCondenser+QaC (C=4), retriever 1`` -> ``cocondenser-query-q4-r1``) so
that a changed parameter and the numbers it moved fit one terminal line.
Values are the cells as the tables print them (:mod:`qac.reporting.precision`
rounds the tables before anything is written): a run on another CPU that
reproduces every printed cell leaves the file, and its hash in the lock, as
they were.
"""

from __future__ import annotations

import math
import re
from typing import Any

from qac.reporting.tables import Table
from qac.io import write_json

HEADLINE_DIR = "headline"   # reports/headline/<profile>.json, beside reports/<profile>/

# Long phrases of the tables' labels and their short forms, applied in order.
_SHORT_FORMS = (
    (re.compile(r"\s*\[[^\]]*\]"), ""),                       # "[paper: MS MARCO dev MRR@10]"
    (re.compile(r"\(C=(\d+)\)|\bC=(\d+)"), lambda m: f"q{m.group(1) or m.group(2)}"),
    (re.compile(r"\+QaC\b"), " query"),
    (re.compile(r"CoT-MAE"), "cotmae"),
    (re.compile(r"start encoder, not fine-tuned"), "untuned"),
    (re.compile(r"no pre-training"), "none"),
    (re.compile(r"zero-shot retriever on MS MARCO hard negatives"), "beir"),
    (re.compile(r"\bretriever (\d)"), r"r\1"),
    (re.compile(r"w/o \(passage\)"), "passage"),
    (re.compile(r"w/ \(query\)"), "query"),
    (re.compile(r"high correlation %"), "high%"),
    (re.compile(r"\s+context\b"), ""),
    (re.compile(r"Δ\s*"), "Δ"),
    (re.compile(r"[^\w@%Δ.]+"), "-"),
)
_DELTA = "Δ"   # kept as is: lower() would make it a small delta


def short_name(label: str) -> str:
    """``coCondenser+QaC (C=4), retriever 1`` -> ``cocondenser-query-q4-r1``."""
    text = label
    for pattern, replacement in _SHORT_FORMS:
        text = pattern.sub(replacement, text)
    return _DELTA.join(part.lower() for part in text.strip("-").split(_DELTA))


def _column_name(table: Table, column: str, metric: str | None) -> str:
    """The measure (``RR@10``) where the column is one dataset's measure, else the label's short form."""
    parts = (metric or "").split("/")
    if len(parts) == 3 and table.key != "table2":   # dataset/split/measure
        prefix = f"{table.column_retrievers[column]}-" if column in table.column_retrievers else ""
        return prefix + parts[2].replace("_at_", "@")
    return short_name(column)


def _headline_cells(table: Table) -> list[tuple[str, str]]:
    """The (row, column) cells of ``table`` that its headline holds."""
    if not table.columns:
        return []
    if table.key == "table2":
        rows = [row for row in table.rows if row == "average"] or table.rows[:1]
        return [(row, column) for row in rows for column in table.columns]
    return [(row, table.columns[0]) for row in table.rows]


def headline_metrics(tables: list[Table]) -> dict[str, dict[str, dict[str, float]]]:
    """``{table: {row: {column: value}}}`` of the headline cells that have a value."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for table in tables:
        for row, column in _headline_cells(table):
            cell = table.cells.get((row, column))
            if cell is None or cell.value is None or cell.text is not None or not math.isfinite(cell.value):
                continue
            first = table.cells.get((row, table.columns[0]))
            name = _column_name(table, column, cell.metric or (first.metric if first else None))
            out.setdefault(table.key, {}).setdefault(short_name(row), {})[name] = float(cell.value)
    return out


def write_headline(tables: list[Table], path: Any) -> dict[str, dict[str, dict[str, float]]]:
    """Write the headline of ``tables`` to ``path`` (JSON, atomically); returns it."""
    headline = headline_metrics(tables)
    write_json(path, headline)
    return headline
