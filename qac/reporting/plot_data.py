"""Data series for DVC plots: ``reports/<profile>/plots/``, declared under ``plots:`` in dvc.yaml.

DVC draws these with Vega-Lite templates, so ``dvc plots diff`` overlays two
experiments or commits in one chart (the PNG figures cannot be overlaid):

- ``pretrain_loss/<variant>.tsv``: ``step``, ``loss`` (the total) and each
  loss part, copied from ``data/<profile>/pretrain/<variant>/losses.tsv``;
- ``query_count/<method>.csv``: ``query_count`` and Table 3's measures, one
  line per C: retriever 1's (``RR_at_10``, ...), then retriever 2's (``r2_RR_at_10``, ...);
- ``in_domain.csv``: ``system`` and every in-domain measure of every
  retriever of Table 1 (bars).

Column names are the measures as MLflow keys (``RR@10`` -> ``RR_at_10``), so
dvc.yaml can name them in every profile. Values are in the tables' unit.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Sequence

from qac.reporting.lineage import Study
from qac.reporting.tables import Table
from qac.reporting.precision import rounded_losses


def _write_rows(path: Path, fields: list[str], rows: list[dict], delimiter: str = ",") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, delimiter=delimiter, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: repr(float(value)) if isinstance(value, float) else value
                             for key, value in row.items()})


def _measure_fields(table: Table, columns: Sequence[str]) -> dict[str, str]:
    """``{column: field name}``: the measure's key, prefixed by the split when two columns share a measure."""
    metrics = {column: next((cell.metric for (row, col), cell in table.cells.items()
                             if col == column and cell.metric and not cell.difference), None)
               for column in columns}
    metrics = {column: metric for column, metric in metrics.items() if metric}
    names = {column: metric.rsplit("/", 1)[-1] for column, metric in metrics.items()}
    clashes = {name for name in names.values() if list(names.values()).count(name) > 1}
    return {column: ("_".join(metrics[column].split("/")[-2:]) if name in clashes else name)
            for column, name in names.items()}


def write_in_domain(table1: Table, path: Path) -> bool:
    fields = _measure_fields(table1, table1.columns)
    rows = []
    for row in table1.rows:
        if row.startswith("Δ"):
            continue
        values = {fields[column]: table1.cell(row, column).value for column in fields}
        if any(value is not None for value in values.values()):
            rows.append({"system": row, **{key: "" if value is None else value for key, value in values.items()}})
    if rows:
        _write_rows(path, ["system", *fields.values()], rows)
    return bool(rows)


def write_query_count(table3: Table, directory: Path) -> int:
    measures = [column for column in table3.columns if not column.startswith("Δ")]
    fields = {}
    for retriever in ("r1", "r2"):
        # Retriever 2's measures share retriever 1's keys: theirs carry the prefix r2_.
        columns = [column for column in measures if table3.column_retrievers.get(column, "r1") == retriever]
        prefix = "" if retriever == "r1" else f"{retriever}_"
        fields.update({column: prefix + name for column, name in _measure_fields(table3, columns).items()})
    by_method: dict[str, list[dict]] = {}
    for row, info in table3.row_info.items():
        values = {fields[column]: table3.cell(row, column).value for column in fields}
        if any(value is not None for value in values.values()):
            by_method.setdefault(info["method"], []).append(
                {"query_count": info["query_count"], **{k: "" if v is None else v for k, v in values.items()}})
    for method, rows in by_method.items():
        rows.sort(key=lambda r: r["query_count"])
        _write_rows(directory / f"{method}.csv", ["query_count", *fields.values()], rows)
    return len(by_method)


def write_losses(study: Study, directory: Path) -> int:
    written = 0

    for variant in study.variants():
        rows = rounded_losses(study.pretrain_losses(variant.name))
        if not rows:
            continue
        fields = list(rows[0])
        _write_rows(directory / f"{variant.name}.tsv", fields,
                    [{key: (int(value) if key == "step" else value) for key, value in row.items()} for row in rows],
                    delimiter="\t")
        written += 1
    return written


def write_plot_data(study: Study, tables: Sequence[Table], directory: str | os.PathLike) -> None:
    """Every data series above that the outputs hold (a series with no data is not written)."""
    directory = Path(directory)
    by_key = {table.key: table for table in tables}
    if "table1" in by_key:
        write_in_domain(by_key["table1"], directory / "in_domain.csv")
    if "table3" in by_key:
        write_query_count(by_key["table3"], directory / "query_count")
    write_losses(study, directory / "pretrain_loss")

