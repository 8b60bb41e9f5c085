"""How many digits a number of the report carries, and the report's numbers rounded to them.

A tracked report must change only when a value changes at the precision it is
printed with: two machines that reproduce every cell (float noise in the last
bits of a trained model's scores) must write byte-identical files. So the
tables are rounded once, before anything is written (:func:`rounded_tables`),
and the Markdown, CSV, LaTeX, figures and DVC plot data all read the same
rounded numbers.

- a value: percent to 0.1, a fraction to 0.001, a count to 1;
- a difference Δ and its MDE: one digit more than the values (``-0.06 (p=0.26;
  MDE 0.14)``, not ``-0.1 ... MDE 0.1``, which would read as a difference at
  its MDE); a difference that rounds to zero prints ``0.00``, without a sign;
- one precision per row: a row that prints a finer number of ours (a Δ, an
  MDE, a spread across seeds) prints its values at that precision too, so a
  value and its Δ (Tables 2 and 3) or its seed spread never differ in digits
  within a row; the paper's figures stay as the paper printed them;
- a p-value: two significant digits (as printed: ``p=0.26``, ``p<0.001``);
- a pre-training loss, drawn and written for DVC plots: 0.001.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from qac.reporting.tables import FRACTION, Cell, Table

VALUE_DECIMALS = {FRACTION: 3}
DEFAULT_DECIMALS = 1     # percent and other units of the tables
DIFFERENCE_EXTRA = 1     # a difference and its MDE carry one digit more than the values
P_DIGITS = 2             # significant digits of a p-value
LOSS_DECIMALS = 3        # a pre-training loss in the figures and plot data (never printed as a number)


def fine_row(table: Table, row: str | None) -> bool:
    """Whether ``row`` prints a number of ours finer than a value: a Δ (and its MDE) or a spread across seeds."""
    return row is not None and any(
        name == row and cell.value is not None and (cell.difference or bool(cell.seed_values))
        for (name, _), cell in table.cells.items())


def decimals(table: Table, column: str, difference: bool = False, row: str | None = None) -> int:
    """Decimals of a number of ours in ``column`` of ``table`` (a count: 0; a difference or MDE: one more,
    and so a value in a row that prints one: :func:`fine_row`)."""
    if column in table.count_columns:
        return 0
    finer = difference or fine_row(table, row)
    return VALUE_DECIMALS.get(table.unit, DEFAULT_DECIMALS) + (DIFFERENCE_EXTRA if finer else 0)


def rounded(value: float | None, places: int) -> float | None:
    """``value`` to ``places`` decimals, as printed; a rounded zero is +0.0 (no "-0.0")."""
    if value is None or not math.isfinite(value):
        return value
    result = round(float(value), places)
    return 0.0 if result == 0 else result


def rounded_p(p: float | None) -> float | None:
    if p is None or not math.isfinite(p) or p == 0:
        return p
    return float(f"{p:.{P_DIGITS}g}")


def rounded_cell(table: Table, column: str, cell: Cell, row: str | None = None) -> Cell:
    """The cell of ``row`` with every number at its printed precision (texts, sources and notes as they are)."""
    value_places = decimals(table, column, cell.difference, row)
    places = decimals(table, column)
    return dataclasses.replace(
        cell, value=rounded(cell.value, value_places), mde=rounded(cell.mde, decimals(table, column, True)),
        p_value=rounded_p(cell.p_value), std_error=rounded(cell.std_error, places + DIFFERENCE_EXTRA),
        published=rounded(cell.published, places), cited=rounded(cell.cited, places),
        p_holm=rounded_p(cell.p_holm), ci=None if cell.ci is None else
        tuple(rounded(bound, decimals(table, column, True)) for bound in cell.ci))


def rounded_table(table: Table) -> Table:
    cells = {(row, column): rounded_cell(table, column, cell, row) for (row, column), cell in table.cells.items()}
    baselines = {method: {column: rounded(value, decimals(table, column)) for column, value in columns.items()}
                 for method, columns in table.baselines.items()}
    return dataclasses.replace(table, cells=cells, baselines=baselines)


def rounded_tables(tables: Sequence[Table]) -> list[Table]:
    """Every table of the report at its printed precision (the input is left as it is)."""
    return [rounded_table(table) for table in tables]


def rounded_losses(rows: Sequence[dict[str, float]] | None) -> list[dict[str, float]]:
    """Rows of a ``losses.tsv`` with every loss at :data:`LOSS_DECIMALS` (steps as they are); none: []."""
    return [{key: value if key == "step" else rounded(value, LOSS_DECIMALS) for key, value in row.items()}
            for row in rows or []]
