"""Expected-score checks, in two kinds (Pyserini's two-click reproductions).

Each profile carries its expected cells in a YAML file (``check.expected`` in
params: ``profiles/expected/<profile>.yaml``): for every number of Tables 1-5
that averages per-query (or per-document) values, and for the query
generator's figures that average over candidates, held-out pairs or judged
documents (:func:`qac.reporting.generator_report.checked_table`), the
expected value. ``qac check`` rebuilds the tables from the DVC outputs (no
MLflow store) and prints one line per cell. The file's ``kind`` says which of
two questions it answers.

*Rerun* (``kind: rerun``; the smoke and default profiles, any profile against
its own recorded run). Did this run give the recorded numbers again? A cell
is a mean over ``n`` queries of a measure whose per-query value lies in
[0, 1] (RR, nDCG, AP, recall, hit; a document's high/low label in Table 5; a
candidate's ROUGE-L or self-retrieval hit). One query changing its value
over the whole range moves the mean by 1/n, so the tolerance is
``SLACK_QUERIES / n`` in the table's unit (times 100 for percentages). Two
queries' worth is what a rerun on another machine can honestly change: float
sums in another order (thread count, BLAS) flip near-tied scores, which
reorders a document pair in a query or two; a change of the code or data that
matters moves many more queries than that. Counts must match exactly. The
verdict is OK / FAIL.

*Reproduction* (``kind: reproduction``; the paper profile against the
published figures). Another team's training run is not a rerun: a retriever
retrained with another seed moves MS MARCO dev MRR@10 by a few tenths of a
point, so each cell is judged against bands with a stated basis, three levels
as Pyserini's reproductions:

- ``reproduced``: ours equals the published figure as printed: within its
  rounding (half its last printed digit: 0.05 points, 0.0005 nDCG);
- ``within noise``: within the rounding plus the larger of two noise bands:
  the *sampling error* of our mean, one standard error of the per-query
  values over the evaluated queries (:data:`SAMPLING_STANDARD_ERRORS`; both
  runs are scored on the same queries, so two faithful runs differ by less
  than the error of a resampled query set: one standard error bounds that
  difference), and, where the profile ran several seeds, the *seed spread*:
  :data:`SEED_SPREAD_DEVIATIONS` standard deviations of one run across our
  seeds, widened by sqrt(1 + 1/k) because our figure is the mean of k seeds
  and the paper's is one run;
- ``differs``: outside both; the cell fails.

Each line names the basis that decided it (``rounding``, ``sampling error``
or ``seed spread``) and its size. A reproduced or within-noise cell passes.
A published figure that is not the same configuration as ours (another
fine-tuning recipe, another BM25, human judges against an automatic one) is
never in the file: the tables show it beside ours as cited
(:mod:`qac.reporting.paper`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from qac.errors import UserError
from qac.reporting.tables import FRACTION, PERCENT, Table, _SCALE

SLACK_QUERIES = 2
PAPER_ROUNDING = {PERCENT: 0.05, FRACTION: 0.0005}
COUNT = "count"
RERUN, REPRODUCTION = "rerun", "reproduction"
KINDS = (RERUN, REPRODUCTION)
SAMPLING_STANDARD_ERRORS = 1.0
SEED_SPREAD_DEVIATIONS = 2.0
REPRODUCED, WITHIN_NOISE, DIFFERS, MISSING = "reproduced", "within noise", "differs", "missing"
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


def _slack(value: float) -> float:
    """The slack of one float64 rounding of a subtraction, at the values' scale."""
    return 4 * math.ulp(max(abs(value), 1.0))


@dataclass(frozen=True)
class Outcome:
    """A rerun check of one cell: ours against the recorded value, OK / FAIL."""

    expected: Expected
    ours: float | None
    tolerance: float | None
    why: str | None = None   # for a missing cell: the table's note

    @property
    def ok(self) -> bool:
        if self.ours is None or self.tolerance is None:
            return False
        return abs(self.ours - self.expected.value) <= self.tolerance + _slack(self.ours)

    @property
    def verdict(self) -> str:
        return MISSING if self.ours is None else (REPRODUCED if self.ok else DIFFERS)

    def line(self) -> str:
        e = self.expected
        where = f"{e.table} | {e.row} | {e.column}"
        if self.ours is None:
            return f"FAIL {where}: missing ({self.why or 'no value'}); expected {e.value:.4g}"
        if self.tolerance is None:
            return f"FAIL {where}: {self.ours:.4g}, but the number of queries is unknown: no tolerance"
        status = "OK  " if self.ok else "FAIL"
        return f"{status} {where}: {self.ours:.4g} (expected {e.value:.4g} ± {self.tolerance:.3g})"


@dataclass(frozen=True)
class Judgement:
    """A reproduction check of one cell: ours against a published figure, three levels, the deciding basis named.

    ``std_error`` is our cell's sampling error (table unit), ``seed_values``
    our figure of each seed where the profile ran several.
    """

    expected: Expected
    ours: float | None
    std_error: float | None = None
    seed_values: tuple[float, ...] = ()
    n: int | None = None
    why: str | None = None

    @property
    def rounding(self) -> float:
        return self.expected.rounding

    def bands(self) -> list[tuple[str, float, str]]:
        """``(basis, size, how it was computed)`` of each noise band this cell has, beyond the rounding."""
        bands = []
        if self.std_error is not None:
            queries = f" over {self.n} queries" if self.n else ""
            bands.append(("sampling error", SAMPLING_STANDARD_ERRORS * self.std_error,
                          f"{SAMPLING_STANDARD_ERRORS:g} standard error of the per-query values{queries}"))
        if len(self.seed_values) >= 2:
            k = len(self.seed_values)
            mean = math.fsum(self.seed_values) / k
            deviation = math.sqrt(math.fsum((v - mean) ** 2 for v in self.seed_values) / (k - 1))
            bands.append(("seed spread", SEED_SPREAD_DEVIATIONS * deviation * math.sqrt(1 + 1 / k),
                          f"{SEED_SPREAD_DEVIATIONS:g} sd of one run across {k} seeds (sd {deviation:.3g}) "
                          f"x sqrt(1 + 1/{k})"))
        return bands

    @property
    def deciding_band(self) -> tuple[str, float, str] | None:
        bands = self.bands()
        return max(bands, key=lambda band: band[1]) if bands else None

    @property
    def difference(self) -> float | None:
        return None if self.ours is None else self.ours - self.expected.value

    @property
    def verdict(self) -> str:
        if self.ours is None:
            return MISSING
        gap = abs(self.difference)
        if gap <= self.rounding + _slack(self.ours):
            return REPRODUCED
        band = self.deciding_band
        if band is not None and gap <= self.rounding + band[1] + _slack(self.ours):
            return WITHIN_NOISE
        return DIFFERS

    @property
    def ok(self) -> bool:
        return self.verdict in (REPRODUCED, WITHIN_NOISE)

    @property
    def basis(self) -> str:
        """The basis that decided the verdict: rounding, sampling error or seed spread."""
        band = self.deciding_band
        if self.verdict == REPRODUCED or band is None:
            return "rounding"
        return band[0]

    def line(self) -> str:
        e = self.expected
        where = f"{e.table} | {e.row} | {e.column}"
        printed = ".3f" if e.unit == FRACTION else ".1f"
        if self.ours is None:
            return f"MISSING      {where}: {self.why or 'no value'}; published {e.value:{printed}}"
        digits = ".4f" if e.unit == FRACTION else ".2f"
        gap = abs(self.difference)
        head = (f"{self.verdict.upper():12} {where}: {self.ours:{digits}} (published {e.value:{printed}}, "
                f"|Δ| {gap:{digits}}")
        band = self.deciding_band
        if self.verdict == REPRODUCED or band is None:
            relation = "≤" if self.verdict == REPRODUCED else ">"
            extra = "" if band is not None else "; no per-query values or seeds: no noise band"
            return f"{head} {relation} {self.rounding:g} rounding){extra}; basis: rounding"
        relation = "≤" if self.verdict == WITHIN_NOISE else ">"
        return (f"{head} {relation} {self.rounding:g} rounding + {band[1]:{digits}} {band[0]}); "
                f"basis: {band[0]} ({band[2]})")


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
    """The expected-values document: our current cells (a rerun check), or (``from_paper``) the paper's values
    of those cells (a reproduction check)."""
    cells = []
    for table, row, column in checkable_cells(tables):
        cell = table.cells[(row, column)]
        unit = _unit(table, column)
        if from_paper:
            if cell.paper is None or unit == COUNT:
                continue
            entry = {"table": table.key, "row": row, "column": column, "value": float(cell.paper), "unit": unit,
                     "rounding": PAPER_ROUNDING[unit]}
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
    if from_paper:
        return {"profile": profile, "kind": REPRODUCTION, "source": "the paper (qac/reporting/paper_results.yaml)",
                "sampling_standard_errors": SAMPLING_STANDARD_ERRORS, "seed_spread_deviations": SEED_SPREAD_DEVIATIONS,
                "cells": cells}
    return {"profile": profile, "kind": RERUN, "source": "this profile's DVC outputs", "slack_queries": SLACK_QUERIES,
            "cells": cells}


def _header(document: Mapping[str, Any]) -> str:
    if document.get("kind") == REPRODUCTION:
        rule = ("# reproduction check: each cell is 'reproduced' within the published figure's rounding (half its "
                "last printed digit),\n# 'within noise' within the rounding plus the larger of our sampling error "
                "(standard errors of the per-query values)\n# and our seed spread (sd of one run across seeds, where "
                "several ran), else 'differs'; see qac/reporting/check.py.\n")
    else:
        rule = (f"# rerun check: tolerance = {document['slack_queries']} queries' worth of the per-query measure "
                "(SLACK_QUERIES / n in the table's unit),\n# counts exactly; see qac/reporting/check.py.\n")
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
    profile, _, cells = load_expected_document(path)
    return profile, cells


class ExpectedFileError(ValueError, UserError):
    """An expected file that cannot be read: the message names the file, the line and the cell's field."""


_DOCUMENT_FIELDS = {"profile", "kind", "source", "slack_queries", "sampling_standard_errors",
                    "seed_spread_deviations", "cells"}


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def load_expected_document(path: str | os.PathLike) -> tuple[str, str, list[Expected]]:
    """``(profile, kind, cells)`` of an expected file. A file without ``kind`` is a rerun check."""
    import yaml

    from qac.params.yaml_io import key_lines, read_yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        document = read_yaml(text)          # numbers as YAML 1.2 reads them (1e-5 is a number), no key twice
    except UnicodeDecodeError as error:
        raise ExpectedFileError(f"{path}: not UTF-8 text (byte {error.start}); an expected file is YAML written "
                                "by `qac check --record`") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f":{mark.line + 1}" if mark else ""
        raise ExpectedFileError(f"{path}{at}: not valid YAML: {getattr(error, 'problem', None) or error}; an "
                                "expected file is written by `qac check --record`") from None
    lines = key_lines(text)

    def fail(key: str, message: str) -> ExpectedFileError:
        parts = key.split(".")
        line = next((lines[".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in lines),
                    None)
        return ExpectedFileError(f"{path}:{line}: {message}" if line else f"{path}: {message}")

    if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
        raise fail("cells", "expected a mapping with a 'cells' list (as `qac check --record` writes it)")
    unknown = set(document) - _DOCUMENT_FIELDS
    if unknown:
        raise fail(sorted(unknown)[0], f"unknown fields {sorted(unknown)} (an expected file holds "
                                       f"{', '.join(sorted(_DOCUMENT_FIELDS))})")
    kind = document.get("kind", RERUN)
    if kind not in KINDS:
        raise fail("kind", f"field 'kind' must be {' or '.join(KINDS)}, got {kind!r}")
    if "slack_queries" in document and not _positive_number(document["slack_queries"]):
        raise fail("slack_queries", f"field 'slack_queries' must be a positive number, got "
                                    f"{document['slack_queries']!r}")
    cells = []
    seen: dict[tuple[str, str, str], int] = {}
    for index, entry in enumerate(document["cells"]):
        key = f"cells.{index}"
        where = f"cells[{index}]"
        if not isinstance(entry, dict):
            raise fail(key, f"{where}: not a mapping")
        unknown = set(entry) - _CELL_FIELDS
        if unknown:
            raise fail(f"{key}.{sorted(unknown)[0]}", f"{where}: unknown fields {sorted(unknown)}")
        for name in ("table", "row", "column", "value", "unit"):
            if name not in entry:
                raise fail(key, f"{where}: field '{name}' missing")
        if entry["unit"] not in (PERCENT, FRACTION, COUNT):
            raise fail(f"{key}.unit",
                       f"{where}: field 'unit' must be percent, fraction or count, got {entry['unit']!r}")
        numbers = {}
        for name in ("value", "tolerance", "rounding"):
            number = entry.get(name)
            if number is None and name != "value":
                continue
            # a bool reads as 0 or 1 and NaN compares false with everything: neither is a figure to check
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise fail(f"{key}.{name}", f"{where}: field '{name}' must be a finite number, got {number!r}")
            numbers[name] = float(number)
        value, limit, rounding = numbers["value"], numbers.get("tolerance"), numbers.get("rounding", 0.0)
        if limit is not None and limit < 0:
            raise fail(f"{key}.tolerance", f"{where}: a tolerance cannot be negative")
        if rounding < 0:
            raise fail(f"{key}.rounding", f"{where}: a rounding cannot be negative")
        if kind == REPRODUCTION and entry["unit"] == COUNT:
            raise fail(f"{key}.unit", f"{where}: a reproduction check compares means, not counts")
        if "n" in entry and not (_positive_number(entry["n"]) and float(entry["n"]).is_integer()):
            raise fail(f"{key}.n", f"{where}: field 'n' (the queries behind the cell) must be a positive whole "
                                   f"number, got {entry['n']!r}")
        cell_key = (str(entry["table"]), str(entry["row"]), str(entry["column"]))
        if cell_key in seen:
            raise fail(key, f"{where}: the cell {' / '.join(cell_key)} is listed twice (first as "
                            f"cells[{seen[cell_key]}]): each cell is checked once")
        seen[cell_key] = index
        cells.append(Expected(str(entry["table"]), str(entry["row"]), str(entry["column"]), value,
                              entry["unit"], limit, rounding))
    return str(document.get("profile", "")), kind, cells


def _our_cell(tables: Sequence[Table], expected: Expected):
    """Our cell of an expected one and, where it holds no value, why (None, reason)."""
    table = next((table for table in tables if table.key == expected.table), None)
    cell = table.cells.get((expected.row, expected.column)) if table else None
    if cell is None:
        return None, "no such cell in the tables"
    return (cell, None) if cell.value is not None else (None, cell.note)


def compare(tables: Sequence[Table], expected: Sequence[Expected]) -> list[Outcome]:
    """Rerun check: our value of every expected cell and the tolerance it is held to."""
    outcomes = []
    for cell_expected in expected:
        cell, why = _our_cell(tables, cell_expected)
        if cell is None:
            outcomes.append(Outcome(cell_expected, None, None, why))
            continue
        limit = cell_expected.tolerance
        if limit is None:
            limit = tolerance(cell_expected.unit, cell.n_queries, cell_expected.rounding)
        outcomes.append(Outcome(cell_expected, float(cell.value), limit))
    return outcomes


def judge(tables: Sequence[Table], expected: Sequence[Expected]) -> list[Judgement]:
    """Reproduction check: every expected (published) cell against ours, with our sampling error and seed spread."""
    judgements = []
    for cell_expected in expected:
        cell, why = _our_cell(tables, cell_expected)
        if cell is None:
            judgements.append(Judgement(cell_expected, None, why=why))
            continue
        judgements.append(Judgement(cell_expected, float(cell.value), cell.std_error, tuple(cell.seed_values or ()),
                                    cell.n_queries))
    return judgements


def summary_line(outcomes: Sequence[Outcome], path: str | os.PathLike) -> str:
    passed = sum(outcome.ok for outcome in outcomes)
    missing = sum(outcome.ours is None for outcome in outcomes)
    outside = len(outcomes) - passed - missing
    verdict = "reproduced" if passed == len(outcomes) and outcomes else "NOT reproduced"
    return (f"check: {verdict}: {passed} of {len(outcomes)} cells within tolerance, {outside} outside, "
            f"{missing} missing ({Path(path).as_posix()})")


def reproduction_summary(judgements: Sequence[Judgement], path: str | os.PathLike) -> str:
    counts = {verdict: sum(j.verdict == verdict for j in judgements)
              for verdict in (REPRODUCED, WITHIN_NOISE, DIFFERS, MISSING)}
    verdict = "reproduced" if judgements and all(j.ok for j in judgements) else "NOT reproduced"
    return (f"check (reproduction of published figures): {verdict}: {counts[REPRODUCED]} reproduced, "
            f"{counts[WITHIN_NOISE]} within noise, {counts[DIFFERS]} differ, {counts[MISSING]} missing "
            f"of {len(judgements)} cells ({Path(path).as_posix()})")
