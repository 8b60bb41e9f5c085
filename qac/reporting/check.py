"""Expected-score checks, in two kinds (Pyserini's two-click reproductions), each on a stated basis.

Each profile carries its expected cells in a YAML file (``check.expected`` in
params: ``profiles/expected/<profile>.yaml``): for every number of Tables 1-5
that averages per-query (or per-document) values, and for the query
generator's figures that average over candidates, held-out pairs or judged
documents (:func:`qac.reporting.generator_report.checked_table`), the
expected value. ``qac check`` rebuilds the tables from the DVC outputs (no
MLflow store) and prints one line per cell, then the family's verdict. The
file's ``kind`` says which of two questions it answers; the bands and their
bases are :mod:`qac.reporting.noise`'s.

*Rerun* (``kind: rerun``; the smoke and default profiles against their own
recorded run). Three outcomes are kept apart:

- ``same bytes``: every evaluation output hashes as the recorded run's did
  (``sources``), which a second run on the same machine gives;
- ``within the noise of another machine``: the bytes differ, but every cell
  (or all but the misses a faithful family has by chance) lies within the
  spread that other CPUs and kernel sets were measured to give: each cell's
  band is the t interval of the machine spread of its measure, pooled over the
  cells of that measure (``machine_runs``: the same profile rerun under other
  kernel sets, ``benchmarks/bench_kernel_sets.py``), and never under two
  queries' worth. The recorded machine and this one are both named;
- ``differs``: more cells outside than a faithful rerun misses, or a count
  changed: a change of code, data or parameters.

*Reproduction* (``kind: reproduction``; the paper profile against the
published figures). A trained cell gets the figure's rounding plus training
noise (the profile's seeds where it ran three or more, else the prior in
``check.training_noise``); a deterministic cell (BM25, a published checkpoint
evaluated by our code, the untuned start encoder) the rounding plus float
noise only. The family verdict allows the misses a faithful run has at
:data:`qac.reporting.noise.FAMILY_LEVEL` and fails a shift shared by the cells
of one measure (Stouffer's z over independent runs). A published figure that is
not the same configuration as ours is never in the file: the tables show it
beside ours as cited (:mod:`qac.reporting.paper`).

The paper's claims, which are differences, are judged separately
(:mod:`qac.reporting.claims`).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from qac.errors import UserError
from qac.reporting import noise
from qac.reporting.noise import SLACK_QUERIES, Band
from qac.reporting.tables import FRACTION, PERCENT, Table, _SCALE, reference_row
from qac.tracking import measure_from_key
from qac.io import atomic_path
from qac.params.yaml_io import key_lines, read_yaml

PAPER_ROUNDING = {PERCENT: 0.05, FRACTION: 0.0005}
COUNT = "count"
RERUN, REPRODUCTION = "rerun", "reproduction"
KINDS = (RERUN, REPRODUCTION)
REPRODUCED, WITHIN_NOISE, DIFFERS, MISSING = "reproduced", "within noise", "differs", "missing"
SAME_BYTES, MACHINE_NOISE = "same bytes", "within the noise of another machine"
TRAINED, DETERMINISTIC = "trained", "deterministic"
_CELL_FIELDS = {"table", "row", "column", "value", "unit", "tolerance", "rounding", "n", "published", "noise",
                "machine_values"}
# Rows no training run stands behind: the same code on the same inputs gives them up to float noise.
UNTUNED_ROW = "start encoder, not fine-tuned"


def deterministic_row(row: str) -> bool:
    return row in ("BM25", UNTUNED_ROW) or row.startswith(reference_row(""))


@dataclass(frozen=True)
class Expected:
    """One expected cell. ``tolerance`` None: derived at check time (machine spread, or two queries' worth)."""

    table: str
    row: str
    column: str
    value: float
    unit: str
    tolerance: float | None = None
    rounding: float = 0.0
    noise: str = TRAINED
    machine_values: tuple[float | None, ...] = ()
    n: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.table, self.row, self.column

    @property
    def group(self) -> tuple[str, str, bool]:
        """Cells whose machine spread is pooled: one measure on one dataset (a table's column), trained rows
        apart from deterministic ones (another machine moves a trained model more than a BM25 ranking)."""
        return self.table, self.column, deterministic_row(self.row)


def _slack(value: float) -> float:
    """The slack of one float64 rounding of a subtraction, at the values' scale."""
    return 4 * math.ulp(max(abs(value), 1.0))


def _where(expected: Expected) -> str:
    return f"{expected.table} | {expected.row} | {expected.column}"


@dataclass(frozen=True)
class Outcome:
    """A rerun check of one cell: ours against the recorded value, within its band or outside."""

    expected: Expected
    ours: float | None
    tolerance: float | None
    why: str | None = None   # for a missing cell: the table's note
    basis: str = "float noise"
    how: str = ""

    @property
    def ok(self) -> bool:
        if self.ours is None or self.tolerance is None:
            return False
        return abs(self.ours - self.expected.value) <= self.tolerance + _slack(self.ours)

    @property
    def strict(self) -> bool:
        """No miss is allowed for a count, a cell without a value, or a deterministic row (BM25, a published
        checkpoint, the untuned encoder) that no measured machine moved: no training run stands behind it, so
        its band is all it may move. A deterministic row other machines did move (an encoder's float sums in
        another order flip a near tie at a cut-off) is machine noise and may miss as a trained cell may."""
        if self.expected.unit == COUNT or self.ours is None or self.tolerance is None:
            return True
        moved_elsewhere = any(v is not None and v != self.expected.value for v in self.expected.machine_values)
        return deterministic_row(self.expected.row) and not moved_elsewhere

    @property
    def verdict(self) -> str:
        return MISSING if self.ours is None else (REPRODUCED if self.ok else DIFFERS)

    def line(self) -> str:
        e = self.expected
        if self.ours is None:
            return f"FAIL {_where(e)}: missing ({self.why or 'no value'}); expected {e.value:.4g}"
        if self.tolerance is None:
            return f"FAIL {_where(e)}: {self.ours:.4g}, but the number of queries is unknown: no tolerance"
        status = "OK  " if self.ok else ("FAIL" if self.strict else "OUT ")
        basis = f"; basis: {self.basis} ({self.how})" if self.how and not self.ok else ""
        return f"{status} {_where(e)}: {self.ours:.4g} (expected {e.value:.4g} ± {self.tolerance:.3g}){basis}"


@dataclass(frozen=True)
class Judgement:
    """A reproduction check of one cell: ours against a published figure, three levels, the deciding basis named.

    ``band`` is the cell's noise band (:mod:`qac.reporting.noise`); None: no
    seeds and no prior, so only the rounding.
    """

    expected: Expected
    ours: float | None
    band: Band | None = None
    n: int | None = None
    why: str | None = None
    source: str | None = None     # our per-query file: cells of one run are one observation in the family
    metric: str | None = None     # our cell's dataset/split/measure: the shared-shift test's group

    @property
    def rounding(self) -> float:
        return self.expected.rounding

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
        if self.band is not None and gap <= self.band.size + _slack(self.ours):
            return WITHIN_NOISE
        return DIFFERS

    @property
    def ok(self) -> bool:
        return self.verdict in (REPRODUCED, WITHIN_NOISE)

    @property
    def deterministic(self) -> bool:
        return self.expected.noise == DETERMINISTIC

    @property
    def basis(self) -> str:
        if self.verdict == REPRODUCED or self.band is None:
            return "rounding"
        return self.band.basis

    def line(self) -> str:
        e = self.expected
        printed = ".3f" if e.unit == FRACTION else ".1f"
        if self.ours is None:
            return f"MISSING      {_where(e)}: {self.why or 'no value'}; published {e.value:{printed}}"
        digits = ".4f" if e.unit == FRACTION else ".2f"
        gap = abs(self.difference)
        head = (f"{self.verdict.upper():12} {_where(e)}: {self.ours:{digits}} (published {e.value:{printed}}, "
                f"|Δ| {gap:{digits}}")
        if self.verdict == REPRODUCED or self.band is None:
            relation = "≤" if self.verdict == REPRODUCED else ">"
            extra = "" if self.band is not None else "; no seeds and no training-noise prior: no noise band"
            return f"{head} {relation} {self.rounding:g} rounding){extra}; basis: rounding"
        relation = "≤" if self.verdict == WITHIN_NOISE else ">"
        return f"{head} {relation} band {self.band.size:{digits}}); basis: {self.band.basis} ({self.band.how})"


def _unit(table: Table, column: str) -> str:
    return COUNT if column in table.count_columns else table.unit


def checkable_cells(tables: Sequence[Table]) -> Iterator[tuple[Table, str, str]]:
    """``(table, row, column)`` of every cell that reads one measure (a mean over queries or a count).

    Differences are the paper's claims (:mod:`qac.reporting.claims`), and
    Table 2's average follows from its rows, so neither is checked as a cell.
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


def source_hashes(tables: Sequence[Table], root: str | os.PathLike) -> dict[str, str]:
    """sha256 of every evaluation output the tables read (per-query files, annotation labels), by path under
    ``root`` (``data/<profile>/``): equal hashes are the same bytes, whatever the floats print as."""
    root = Path(root)
    paths = {path.relative_to(root).as_posix() for path in root.glob("**/*.per_query.json")
             if ".runs" not in path.relative_to(root).parts}
    for table in tables:
        for cell in table.cells.values():
            for name in (cell.source, cell.compared_source):
                if name and (root / name).is_file():
                    paths.add(name)
    return {name: _sha256(root / name) for name in sorted(paths)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def figure_rounding(value: float, unit: str) -> float:
    """Half the last printed digit of a published figure: the paper's usual precision for ``unit``, or finer
    where the figure carries more digits (a released retriever's 39.44 is known to 0.005, not 0.05)."""
    decimals = len(f"{value:.6f}".rstrip("0").partition(".")[2])
    return min(PAPER_ROUNDING[unit], 0.5 * 10.0 ** -decimals)


def record(tables: Sequence[Table], profile: str, from_paper: bool = False, *,
           environment: Mapping[str, Any] | None = None, sources: Mapping[str, str] | None = None,
           machine_runs: Sequence["MachineRun"] = ()) -> dict[str, Any]:
    """The expected-values document: our current cells (a rerun check), or (``from_paper``) the paper's values
    of those cells (a reproduction check). A rerun record carries this machine (``environment``), the hashes
    of the outputs (``sources``) and, per cell, the values of ``machine_runs`` (other machines' records)."""
    cells = []
    for table, row, column in checkable_cells(tables):
        cell = table.cells[(row, column)]
        unit = _unit(table, column)
        if from_paper:
            if cell.paper is None or unit == COUNT:
                continue
            entry = {"table": table.key, "row": row, "column": column, "value": float(cell.paper), "unit": unit,
                     "rounding": figure_rounding(float(cell.paper), unit),
                     "noise": DETERMINISTIC if deterministic_row(row) else TRAINED}
        else:
            if cell.value is None:
                continue
            entry = {"table": table.key, "row": row, "column": column, "value": float(cell.value), "unit": unit}
            if cell.n_queries is not None:
                entry["n"] = cell.n_queries
            if cell.published is not None:
                entry["published"] = float(cell.published)   # the model's published figure, for the reader
            if machine_runs:
                entry["machine_values"] = [run.values.get((table.key, row, column)) for run in machine_runs]
            elif unit == COUNT:
                entry["tolerance"] = 0.0
        cells.append(entry)
    if from_paper:
        return {"profile": profile, "kind": REPRODUCTION, "source": "the paper (qac/reporting/paper_results.yaml)",
                "cells": cells}
    document: dict[str, Any] = {"profile": profile, "kind": RERUN, "source": "this profile's DVC outputs",
                                "slack_queries": SLACK_QUERIES}
    if environment is not None:
        document["environment"] = dict(environment)
    if machine_runs:
        document["machine_runs"] = [dict(run.environment) for run in machine_runs]
    if sources is not None:
        document["sources"] = dict(sources)
    document["cells"] = cells
    return document


def _header(document: Mapping[str, Any]) -> str:
    if document.get("kind") == REPRODUCTION:
        rule = ("# reproduction check: a cell is 'reproduced' within the published figure's rounding, 'within noise' "
                "within its band:\n# trained cells: rounding + training noise (our seeds where three or more ran, "
                "else params check.training_noise);\n# deterministic cells (BM25, published checkpoints): rounding + "
                "float noise; the family allows the misses a faithful\n# run has by chance and fails a shift shared "
                "by one measure's cells; see qac/reporting/check.py and noise.py.\n")
    else:
        rule = ("# rerun check: 'same bytes' when every output hashes as recorded (sources); else each cell's band is "
                "the t interval\n# of the spread other machines and kernel sets gave its measure (machine_runs), at "
                f"least {document.get('slack_queries', SLACK_QUERIES)} queries' worth; counts\n# exactly; see "
                "qac/reporting/check.py and noise.py.\n")
    return (f"# Expected cells of profile '{document['profile']}' from {document['source']}.\n"
            "# Written by `qac check --record`; `qac check` compares the current DVC outputs with it.\n" + rule)


def write_expected(document: Mapping[str, Any], path: str | os.PathLike) -> None:
    import yaml

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
                    "seed_spread_deviations", "cells", "environment", "machine_runs", "sources"}


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _finite(number: Any) -> bool:
    # a bool reads as 0 or 1 and NaN compares false with everything: neither is a figure to check
    return not isinstance(number, bool) and isinstance(number, (int, float)) and math.isfinite(number)


@dataclass(frozen=True)
class ExpectedDocument:
    """An expected file as read: its kind, cells, the machine that recorded it, the outputs' hashes, and the
    environments of the other machines whose values each cell carries."""

    path: Path
    profile: str
    kind: str
    cells: list[Expected]
    environment: dict[str, Any] = field(default_factory=dict)
    machine_runs: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)


def load_expected_document(path: str | os.PathLike) -> tuple[str, str, list[Expected]]:
    """``(profile, kind, cells)`` of an expected file. A file without ``kind`` is a rerun check."""
    document = read_document(path)
    return document.profile, document.kind, document.cells


def read_document(path: str | os.PathLike) -> ExpectedDocument:
    """An expected file, every field checked; a bad one raises naming the file, the line and the field."""
    import yaml

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
    for name in ("environment", "sources"):
        if not isinstance(document.get(name, {}), dict):
            raise fail(name, f"field '{name}' must be a mapping")
    runs = document.get("machine_runs", [])
    if not isinstance(runs, list) or not all(isinstance(run, dict) for run in runs):
        raise fail("machine_runs", "field 'machine_runs' must be a list of machine descriptions (mappings)")
    cells = [_read_cell(entry, index, kind, len(runs), fail) for index, entry in enumerate(document["cells"])]
    seen: dict[tuple[str, str, str], int] = {}
    for index, cell in enumerate(cells):
        if cell.key in seen:
            raise fail(f"cells.{index}", f"cells[{index}]: the cell {' / '.join(cell.key)} is listed twice (first "
                                         f"as cells[{seen[cell.key]}]): each cell is checked once")
        seen[cell.key] = index
    return ExpectedDocument(path, str(document.get("profile", "")), kind, cells, dict(document.get("environment", {})),
                            list(runs), {str(k): str(v) for k, v in document.get("sources", {}).items()})


def _read_cell(entry: Any, index: int, kind: str, runs: int, fail) -> Expected:
    key, where = f"cells.{index}", f"cells[{index}]"
    if not isinstance(entry, dict):
        raise fail(key, f"{where}: not a mapping")
    unknown = set(entry) - _CELL_FIELDS
    if unknown:
        raise fail(f"{key}.{sorted(unknown)[0]}", f"{where}: unknown fields {sorted(unknown)}")
    for name in ("table", "row", "column", "value", "unit"):
        if name not in entry:
            raise fail(key, f"{where}: field '{name}' missing")
    if entry["unit"] not in (PERCENT, FRACTION, COUNT):
        raise fail(f"{key}.unit", f"{where}: field 'unit' must be percent, fraction or count, got {entry['unit']!r}")
    numbers = {}
    for name in ("value", "tolerance", "rounding"):
        number = entry.get(name)
        if number is None and name != "value":
            continue
        if not _finite(number):
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
    cell_noise = entry.get("noise", TRAINED)
    if cell_noise not in (TRAINED, DETERMINISTIC):
        raise fail(f"{key}.noise", f"{where}: field 'noise' must be {TRAINED} or {DETERMINISTIC}, got {cell_noise!r}")
    others = entry.get("machine_values", [])
    if not isinstance(others, list) or len(others) != runs or not all(v is None or _finite(v) for v in others):
        raise fail(f"{key}.machine_values", f"{where}: field 'machine_values' must list one number (or null) per "
                                            f"entry of machine_runs ({runs}), got {others!r}")
    return Expected(str(entry["table"]), str(entry["row"]), str(entry["column"]), value, entry["unit"], limit,
                    rounding, cell_noise, tuple(None if v is None else float(v) for v in others),
                    int(entry["n"]) if "n" in entry else None)


def _our_cell(tables: Sequence[Table], expected: Expected):
    """Our cell of an expected one and, where it holds no value, why (None, reason)."""
    table = next((table for table in tables if table.key == expected.table), None)
    cell = table.cells.get((expected.row, expected.column)) if table else None
    if cell is None:
        return None, "no such cell in the tables"
    return (cell, None) if cell.value is not None else (None, cell.note)


# ---------------------------------------------------------------- rerun

def machine_spread(expected: Sequence[Expected]) -> dict[tuple[str, str, bool], tuple[float, int, int]]:
    """Per group (table, column): the pooled sd of other machines' deviations from the recorded values, the
    number of deviations behind it, and the number of runs."""
    deviations: dict[tuple[str, str, bool], list[float]] = {}
    runs: dict[tuple[str, str, bool], int] = {}
    for cell in expected:
        if cell.unit == COUNT or not cell.machine_values:
            continue
        values = [v - cell.value for v in cell.machine_values if v is not None]
        deviations.setdefault(cell.group, []).extend(values)
        runs[cell.group] = max(runs.get(cell.group, 0), len(values))
    return {group: (noise.pooled_machine_sd(values), len(values), runs[group]) for group, values in deviations.items()}


def compare(tables: Sequence[Table], expected: Sequence[Expected]) -> list[Outcome]:
    """Rerun check: our value of every expected cell and the band it is held to."""
    spread = machine_spread(expected)
    outcomes = []
    for cell_expected in expected:
        cell, why = _our_cell(tables, cell_expected)
        if cell is None:
            outcomes.append(Outcome(cell_expected, None, None, why))
            continue
        n = cell.n_queries
        if cell_expected.unit == COUNT:
            outcomes.append(Outcome(cell_expected, float(cell.value), 0.0, basis="count", how="counts match exactly"))
        elif cell_expected.group in spread and n:
            sd, df, runs = spread[cell_expected.group]
            band = noise.machine_band(cell_expected.unit, n, sd, df, runs)
            outcomes.append(Outcome(cell_expected, float(cell.value), band.size + cell_expected.rounding,
                                    basis=band.basis, how=band.how))
        else:
            limit = cell_expected.tolerance
            if limit is None:
                limit = tolerance(cell_expected.unit, n, cell_expected.rounding)
            outcomes.append(Outcome(cell_expected, float(cell.value), limit, basis="float noise",
                                    how=f"{SLACK_QUERIES} queries' worth; no other machine measured"))
    return outcomes


@dataclass(frozen=True)
class RerunVerdict:
    """The family verdict of a rerun: which of the three outcomes, and the counts behind it."""

    outcome: str
    cells: int
    outside: int
    allowed: int
    missing: int
    strict_failures: int
    moved: int

    @property
    def ok(self) -> bool:
        return self.outcome in (SAME_BYTES, MACHINE_NOISE)


def rerun_verdict(outcomes: Sequence[Outcome], same_bytes: bool | None) -> RerunVerdict:
    loose = [o for o in outcomes if not o.strict]
    outside = sum(not o.ok for o in loose)
    allowed = noise.allowed_misses(len(loose))
    strict_failures = sum(not o.ok for o in outcomes if o.strict)
    missing = sum(o.ours is None for o in outcomes)
    moved = sum(o.ours is not None and o.ours != o.expected.value for o in outcomes)
    if strict_failures or outside > allowed:
        outcome = DIFFERS
    elif same_bytes or (same_bytes is None and moved == 0):
        outcome = SAME_BYTES
    else:
        outcome = MACHINE_NOISE
    return RerunVerdict(outcome, len(outcomes), outside, allowed, missing, strict_failures, moved)


def same_bytes(document: ExpectedDocument, current: Mapping[str, str]) -> bool | None:
    """Whether the outputs hash as recorded (None: the file recorded no hashes)."""
    if not document.sources:
        return None
    return dict(current) == document.sources


def summary_line(outcomes: Sequence[Outcome], path: str | os.PathLike, verdict: RerunVerdict | None = None) -> str:
    verdict = verdict or rerun_verdict(outcomes, None)
    passed = sum(outcome.ok for outcome in outcomes)
    label = f"reproduced ({verdict.outcome})" if verdict.ok else "NOT reproduced (differs)"
    strict = verdict.strict_failures - verdict.missing
    return (f"check: {label}: {passed} of {len(outcomes)} cells within tolerance; trained cells outside "
            f"{verdict.outside} (a faithful rerun may miss {verdict.allowed}), counts and deterministic rows outside "
            f"{strict}, missing {verdict.missing} ({Path(path).as_posix()})")


def _machine(environment: Mapping[str, Any]) -> str:
    if not environment:
        return "an unrecorded machine"
    libraries = environment.get("libraries") or {}
    return (f"{environment.get('cpu', '?')} ({environment.get('torch_kernels', '?')} kernels, MKL "
            f"{environment.get('mkl_instructions') or 'its own choice'}, {environment.get('threads', '?')} threads; "
            f"torch {libraries.get('torch', '?')})")


def _comparable(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = ("cpu", "cpu_flags", "torch_kernels", "mkl_instructions", "threads", "libraries", "python")
    return bool(a) and all(a.get(key) == b.get(key) for key in keys)


def rerun_advice(verdict: RerunVerdict, document: ExpectedDocument, environment: Mapping[str, Any]) -> str:
    """What the outcome means and what the user should do, naming both machines."""
    recorded, here = _machine(document.environment), _machine(environment)
    profile = document.profile or "<profile>"
    if verdict.outcome == SAME_BYTES:
        return "check: every output has the recorded bytes: nothing to do."
    if verdict.outcome == MACHINE_NOISE:
        same = _comparable(document.environment, environment)
        why = ("this machine matches the recording's CPU, kernels and libraries, so a change of code, data or "
               "parameters is the likelier cause of the moved bytes; " if same else "")
        moved = f"{verdict.moved} cell{'s' if verdict.moved != 1 else ''} moved"
        return (f"check: the outputs differ from the recorded run's bytes ({moved}) but stay "
                f"within what other machines were measured to move them. Recorded on {recorded}; this run on {here}. "
                f"{why}The tracked report and lock now hold this machine's numbers: keep the recorded ones with "
                f"`git checkout -- reports/{profile} profiles/{profile}/dvc.lock`.")
    strict = (f"; {verdict.strict_failures} cells that may not miss (counts, deterministic rows, missing cells) "
              "fail" if verdict.strict_failures else "")
    return (f"check: {verdict.outside} trained cells outside their bands (a faithful rerun on another machine misses "
            f"at most {verdict.allowed}){strict}"
            f": more than another machine moves them. Recorded on {recorded}; this run on {here}. A change of code, "
            f"data or parameters is the likely cause: `dvc status profiles/{profile}/dvc.yaml` and `git diff` show "
            "what changed; record a new baseline only after a run you trust (`qac check --record`).")


@dataclass(frozen=True)
class MachineRun:
    """Another machine's record of the same profile: its environment and its value of each cell."""

    path: Path
    environment: dict[str, Any]
    values: dict[tuple[str, str, str], float]


def read_machine_run(path: str | os.PathLike) -> MachineRun:
    document = read_document(path)
    if document.kind != RERUN:
        raise ExpectedFileError(f"{Path(path)}: a machine run is a rerun record (`qac check --record` on that "
                                f"machine), not a {document.kind} file")
    return MachineRun(Path(path), document.environment, {cell.key: cell.value for cell in document.cells})


def judge_machine_run(document: ExpectedDocument, run: MachineRun) -> RerunVerdict:
    """A recorded run of another machine judged as a rerun against ``document`` (for the kernel-set benchmark)."""
    outcomes = []
    spread = machine_spread(document.cells)
    for cell in document.cells:
        ours = run.values.get(cell.key)
        if ours is None:
            outcomes.append(Outcome(cell, None, None, "not in the run"))
        elif cell.unit == COUNT:
            outcomes.append(Outcome(cell, ours, 0.0))
        elif cell.group in spread:
            sd, df, runs = spread[cell.group]
            outcomes.append(Outcome(cell, ours, noise.machine_band(cell.unit, cell.n, sd, df, runs).size))
        else:
            outcomes.append(Outcome(cell, ours, cell.tolerance))
    return rerun_verdict(outcomes, None)


def leave_out(document: ExpectedDocument, run: MachineRun) -> ExpectedDocument:
    """``document`` without ``run``'s values in its machine spread (matched by environment)."""
    keep = [i for i, environment in enumerate(document.machine_runs) if environment != run.environment]
    cells = [Expected(c.table, c.row, c.column, c.value, c.unit, c.tolerance, c.rounding, c.noise,
                      tuple(c.machine_values[i] for i in keep), c.n) for c in document.cells]
    return ExpectedDocument(document.path, document.profile, document.kind, cells, document.environment,
                            [document.machine_runs[i] for i in keep], document.sources)


# ---------------------------------------------------------------- reproduction

def _parts(metric: str | None) -> tuple[str | None, str | None, str | None]:
    """(dataset, split, measure) of a cell's metric key (``dataset/split/measure``)."""
    if not metric:
        return None, None, None
    parts = metric.split("/")
    if len(parts) < 3:
        return None, None, measure_from_key(metric)
    return "/".join(parts[:-2]), parts[-2], measure_from_key(metric)


def noise_prior(priors: Sequence[Any], metric: str | None):
    """The most specific prior (dataset and split, then split, then measure alone) for a cell's metric."""
    dataset, split, measure = _parts(metric)
    measure = measure.replace("_at_", "@") if measure else measure
    best, best_rank = None, -1
    for prior in priors:
        if prior.measure != measure:
            continue
        if prior.split is not None and prior.split != split:
            continue
        if prior.dataset is not None and prior.dataset != dataset:
            continue
        rank = (prior.split is not None) + 2 * (prior.dataset is not None)
        if rank > best_rank:
            best, best_rank = prior, rank
    return best


def judge(tables: Sequence[Table], expected: Sequence[Expected], priors: Sequence[Any] = ()) -> list[Judgement]:
    """Reproduction check: every expected (published) cell against ours, with the band its basis gives."""
    judgements = []
    for cell_expected in expected:
        cell, why = _our_cell(tables, cell_expected)
        if cell is None:
            judgements.append(Judgement(cell_expected, None, why=why))
            continue
        if cell_expected.noise == DETERMINISTIC:
            band = noise.deterministic_band(cell_expected.unit, cell_expected.rounding, cell.n_queries)
        else:
            prior = noise_prior(priors, cell.metric)
            band = noise.training_band(cell_expected.unit, cell_expected.rounding, tuple(cell.seed_values or ()),
                                       prior.sd if prior else None, prior.source if prior else None)
        judgements.append(Judgement(cell_expected, float(cell.value), band, cell.n_queries,
                                    source=f"{cell.source}#{cell.metric}" if cell.source else None,
                                    metric=cell.metric))
    return judgements


@dataclass(frozen=True)
class ReproductionVerdict:
    counts: dict[str, int]
    trained: int
    trained_misses: int
    allowed: int
    deterministic_misses: int
    shifts: list[noise.SharedShift]

    @property
    def ok(self) -> bool:
        return (self.counts[MISSING] == 0 and self.deterministic_misses == 0
                and self.trained_misses <= self.allowed and not any(shift.fails for shift in self.shifts))


def _one_per_run(judgements: Sequence[Judgement]) -> list[Judgement]:
    """One judgement per (our per-query file, measure): a run shown in two tables is one observation."""
    seen, unique = set(), []
    for judgement in judgements:
        key = judgement.source or id(judgement)
        if key not in seen:
            seen.add(key)
            unique.append(judgement)
    return unique


def reproduction_verdict(judgements: Sequence[Judgement]) -> ReproductionVerdict:
    counts = {verdict: sum(j.verdict == verdict for j in judgements)
              for verdict in (REPRODUCED, WITHIN_NOISE, DIFFERS, MISSING)}
    present = [j for j in judgements if j.ours is not None]
    trained = _one_per_run([j for j in present if not j.deterministic])
    groups: dict[str, list[Judgement]] = {}
    for j in trained:
        if j.band is not None and j.band.sd:
            dataset, split, measure = _parts(j.metric)
            groups.setdefault(" ".join(part for part in (dataset, split, measure) if part), []).append(j)
    tested = {name: members for name, members in groups.items() if len(members) >= 2}
    shifts = [noise.shared_shift(name, [j.difference for j in members], [j.band.sd for j in members], len(tested))
              for name, members in sorted(tested.items())]
    return ReproductionVerdict(counts, len(trained), sum(not j.ok for j in trained),
                               noise.allowed_misses(len(trained)),
                               sum(not j.ok for j in present if j.deterministic), shifts)


def reproduction_summary(judgements: Sequence[Judgement], path: str | os.PathLike,
                         verdict: ReproductionVerdict | None = None) -> str:
    verdict = verdict or reproduction_verdict(judgements)
    counts = verdict.counts
    label = "reproduced" if judgements and verdict.ok else "NOT reproduced"
    shifted = sum(shift.fails for shift in verdict.shifts)
    return (f"check (reproduction of published figures): {label}: {counts[REPRODUCED]} reproduced, "
            f"{counts[WITHIN_NOISE]} within noise, {counts[DIFFERS]} differ, {counts[MISSING]} missing "
            f"of {len(judgements)} cells; trained runs outside their band {verdict.trained_misses} of "
            f"{verdict.trained} (a faithful run misses up to {verdict.allowed}), deterministic cells outside "
            f"{verdict.deterministic_misses}, measures with a shared shift {shifted} of {len(verdict.shifts)} "
            f"({Path(path).as_posix()})")
