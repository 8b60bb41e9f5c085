"""Expected-score checks: did this run reproduce the recorded one? (Pyserini's two-click reproductions.)

Each profile carries its expected cells in a YAML file (``check.expected`` in
params: ``profiles/expected/<profile>.yaml``): for every number of Tables 1-5
that averages per-query (or per-document) values, and for the query
generator's figures that average over candidates, held-out pairs or judged
documents (:func:`qac.reporting.generator_report.checked_table`), the
expected value and how far ours may be from it. ``qac check`` rebuilds the tables from the DVC
outputs (no MLflow store) and prints OK / FAIL per cell.

Tolerance. A cell is a mean over ``n`` queries of a measure whose per-query
value lies in [0, 1] (RR, nDCG, AP, recall, hit; a document's high/low label
in Table 5; a candidate's ROUGE-L or self-retrieval hit). One query changing its value over the whole range moves the mean
by 1/n, so the tolerance is ``SLACK_QUERIES / n`` in the table's unit (times
100 for percentages). Two queries' worth is what a rerun on another machine
can honestly change: float sums in another order (thread count, BLAS) flip
near-tied scores, which reorders a document pair in a query or two; a change
of the code or data that matters moves many more queries than that. Counts
(Table 5's pairs) must match exactly. Values copied from the paper were
rounded when printed, so half of the last printed digit is added to their
tolerance (0.05 points, 0.0005 nDCG), and ``n`` is ours, known only at check
time.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from qac.reporting.tables import FRACTION, PERCENT, Table, _SCALE

SLACK_QUERIES = 2
PAPER_ROUNDING = {PERCENT: 0.05, FRACTION: 0.0005}
COUNT = "count"
_CELL_FIELDS = {"table", "row", "column", "value", "unit", "tolerance", "rounding", "n", "published"}


@dataclass(frozen=True)
class Expected:
    """One expected cell. ``tolerance`` None: derived at check time from our ``n`` (plus ``rounding``)."""

    table: str
    row: str
    column: str
    value: float
    unit: str
    tolerance: float | None = None
    rounding: float = 0.0

    @property
    def key(self) -> tuple[str, str, str]:
        return self.table, self.row, self.column


@dataclass(frozen=True)
class Outcome:
    expected: Expected
    ours: float | None
    tolerance: float | None
    why: str | None = None   # for a missing cell: the table's note

    @property
    def ok(self) -> bool:
        if self.ours is None or self.tolerance is None:
            return False
        # The slack of one float64 rounding of the subtraction, at the values' scale.
        return abs(self.ours - self.expected.value) <= self.tolerance + 4 * math.ulp(max(abs(self.ours), 1.0))

    def line(self) -> str:
        e = self.expected
        where = f"{e.table} | {e.row} | {e.column}"
        if self.ours is None:
            return f"FAIL {where}: missing ({self.why or 'no value'}); expected {e.value:.4g}"
        if self.tolerance is None:
            return f"FAIL {where}: {self.ours:.4g}, but the number of queries is unknown: no tolerance"
        status = "OK  " if self.ok else "FAIL"
        return f"{status} {where}: {self.ours:.4g} (expected {e.value:.4g} ± {self.tolerance:.3g})"


def _unit(table: Table, column: str) -> str:
    return COUNT if column in table.count_columns else table.unit


def checkable_cells(tables: Sequence[Table]) -> Iterator[tuple[Table, str, str]]:
    """``(table, row, column)`` of every cell that reads one measure (a mean over queries or a count).

    Differences follow from their two cells, and Table 2's average from its
    rows, so neither is checked on its own.
    """
    for table in tables:
        for row in table.rows:
            for column in table.columns:
                cell = table.cells.get((row, column))
                if cell is not None and cell.metric and not cell.difference and cell.text is None:
                    yield table, row, column


def tolerance(unit: str, n: int | None, rounding: float = 0.0) -> float | None:
    """``rounding + SLACK_QUERIES / n`` in the table's unit; 0 for counts; None without ``n``."""
    if unit == COUNT:
        return 0.0
    if not n:
        return None
    return rounding + SLACK_QUERIES * _SCALE[unit] / n


def record(tables: Sequence[Table], profile: str, from_paper: bool = False) -> dict[str, Any]:
    """The expected-values document: our current cells, or (``from_paper``) the paper's values of those cells."""
    cells = []
    for table, row, column in checkable_cells(tables):
        cell = table.cells[(row, column)]
        unit = _unit(table, column)
        if from_paper:
            if cell.paper is None:
                continue
            entry = {"table": table.key, "row": row, "column": column, "value": float(cell.paper), "unit": unit}
            if unit == COUNT:
                entry["tolerance"] = 0.0
            else:
                entry["rounding"] = PAPER_ROUNDING[unit]
        else:
            if cell.value is None:
                continue
            entry = {"table": table.key, "row": row, "column": column, "value": float(cell.value), "unit": unit,
                     "n": cell.n_queries, "tolerance": tolerance(unit, cell.n_queries)}
            if entry["n"] is None:
                del entry["n"]
            if cell.published is not None:
                entry["published"] = float(cell.published)   # the model's published figure, for the reader
        cells.append(entry)
    return {"profile": profile, "source": "the paper (qac/reporting/paper_results.yaml)" if from_paper
            else "this profile's DVC outputs", "slack_queries": SLACK_QUERIES, "cells": cells}


def _header(document: Mapping[str, Any]) -> str:
    rule = (f"# tolerance = {document['slack_queries']} queries' worth of the per-query measure (SLACK_QUERIES / n "
            "in the table's unit), see qac/reporting/check.py;\n# counts exactly; paper values add half their last "
            "printed digit ('rounding') and take n from our outputs at check time.\n")
    return (f"# Expected cells of profile '{document['profile']}' from {document['source']}.\n"
            "# Written by `qac check --record`; `qac check` compares the current DVC outputs with it.\n" + rule)


def write_expected(document: Mapping[str, Any], path: str | os.PathLike) -> None:
    import yaml

    from qac.io import atomic_path

    with atomic_path(path) as tmp:
        Path(tmp).write_text(_header(document) + yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True,
                                                                width=120), encoding="utf-8")


def load_expected(path: str | os.PathLike) -> tuple[str, list[Expected]]:
    """``(profile, cells)`` of an expected file; a bad entry raises naming the file, cell index and field."""
    import yaml

    path = Path(path)
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
        raise ValueError(f"{path}: expected a mapping with a 'cells' list")
    cells = []
    for index, entry in enumerate(document["cells"]):
        where = f"{path}: cells[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: not a mapping")
        unknown = set(entry) - _CELL_FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
        for name in ("table", "row", "column", "value", "unit"):
            if name not in entry:
                raise ValueError(f"{where}: field '{name}' missing")
        if entry["unit"] not in (PERCENT, FRACTION, COUNT):
            raise ValueError(f"{where}: field 'unit' must be percent, fraction or count, got {entry['unit']!r}")
        try:
            value = float(entry["value"])
            limit = None if entry.get("tolerance") is None else float(entry["tolerance"])
            rounding = float(entry.get("rounding") or 0.0)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: 'value', 'tolerance' and 'rounding' must be numbers") from None
        if (limit is not None and limit < 0) or rounding < 0:
            raise ValueError(f"{where}: a tolerance cannot be negative")
        cells.append(Expected(str(entry["table"]), str(entry["row"]), str(entry["column"]), value,
                              entry["unit"], limit, rounding))
    return str(document.get("profile", "")), cells


def compare(tables: Sequence[Table], expected: Sequence[Expected]) -> list[Outcome]:
    """Our value of every expected cell and the tolerance it is held to."""
    by_key = {table.key: table for table in tables}
    outcomes = []
    for cell_expected in expected:
        table = by_key.get(cell_expected.table)
        cell = table.cells.get((cell_expected.row, cell_expected.column)) if table else None
        if cell is None or cell.value is None:
            why = "no such cell in the tables" if cell is None else cell.note
            outcomes.append(Outcome(cell_expected, None, None, why))
            continue
        limit = cell_expected.tolerance
        if limit is None:
            limit = tolerance(cell_expected.unit, cell.n_queries, cell_expected.rounding)
        outcomes.append(Outcome(cell_expected, float(cell.value), limit))
    return outcomes


def summary_line(outcomes: Sequence[Outcome], path: str | os.PathLike) -> str:
    passed = sum(outcome.ok for outcome in outcomes)
    missing = sum(outcome.ours is None for outcome in outcomes)
    outside = len(outcomes) - passed - missing
    verdict = "reproduced" if passed == len(outcomes) and outcomes else "NOT reproduced"
    return (f"check: {verdict}: {passed} of {len(outcomes)} cells within tolerance, {outside} outside, "
            f"{missing} missing ({Path(path).as_posix()})")
