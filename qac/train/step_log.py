"""Per-step training losses as a small TSV inside the stage's DVC output (``losses.tsv``).

MLflow shows the same numbers, but the tables and ``dvc plots`` read them from
the file DVC tracks, so a figure needs no tracking store. A run can be
interrupted and resumed from a checkpoint: the rows logged so far are kept in
a journal outside the output folder (which DVC deletes before a stage runs),
and :meth:`StepLog.write` keeps the earlier processes' rows up to the step
training resumed from, then this process's rows.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Mapping

LOSSES_FILE = "losses.tsv"
# Wall-clock throughput and the schedule are not losses: they stay in MLflow.
NOT_LOSSES = frozenset({"lr", "samples_per_second", "tokens_per_second"})


class StepLog:
    """Collects ``(step, losses)`` from a training loop's log callback; resumable through ``journal``."""

    def __init__(self, journal: str | os.PathLike):
        self.journal = Path(journal)
        self.previous = self._read_journal()
        self.current: list[dict[str, float]] = []
        self.journal.parent.mkdir(parents=True, exist_ok=True)

    def _read_journal(self) -> list[dict[str, float]]:
        """Rows of earlier processes; a step not above the one before marks a restart that replaces what followed."""
        rows: list[dict[str, float]] = []
        if not self.journal.is_file():
            return rows
        with open(self.journal, encoding="utf-8") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:   # a line cut short by the interruption
                    continue
                rows = [kept for kept in rows if kept["step"] < row["step"]] + [row]
        return rows

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": int(step), **{key: float(value) for key, value in metrics.items() if key not in NOT_LOSSES}}
        self.current.append(row)
        with open(self.journal, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    def rows(self, resumed_from_step: int) -> list[dict[str, float]]:
        """Earlier rows up to the checkpoint training resumed from, then this process's rows."""
        kept = [row for row in self.previous if row["step"] <= resumed_from_step]
        return kept + [row for row in self.current if row["step"] > resumed_from_step]

    def write(self, path: str | os.PathLike, resumed_from_step: int) -> int:
        """Write ``losses.tsv`` (``step``, ``loss``, then the parts) and drop the journal; returns the row count."""
        from qac.io import atomic_path

        rows = self.rows(resumed_from_step)
        keys = sorted({key for row in rows for key in row} - {"step", "loss"})
        fields = ["step"] + (["loss"] if any("loss" in row for row in rows) else []) + keys
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, delimiter="\t", lineterminator="\n")
            writer.writeheader()
            for row in rows:
                writer.writerow({key: (int(row[key]) if key == "step" else repr(row[key])) if key in row else ""
                                 for key in fields})
        self.journal.unlink(missing_ok=True)
        return len(rows)
