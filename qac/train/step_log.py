"""Per-step training losses as a small TSV inside the stage's DVC output (``losses.tsv``).

MLflow shows the same numbers, but the tables and ``dvc plots`` read them from
the file DVC tracks, so a figure needs no tracking store. Interruptions need no
bookkeeping here: a resumed pre-training run replays the loss history kept in
its checkpoint through the same log callback (qac.train.pretrain), so the rows
collected by one process are the whole curve.
"""

from __future__ import annotations

import csv
import os
from typing import Mapping

from qac.io import atomic_path

LOSSES_FILE = "losses.tsv"
# Wall-clock throughput and the schedule are not losses: they stay in MLflow.
THROUGHPUT = frozenset({"samples_per_second", "tokens_per_second", "padding_efficiency", "data_wait_share", "mfu",
                        "hfu"})
NOT_LOSSES = frozenset({"lr"}) | THROUGHPUT


class StepLog:
    """Collects ``(step, losses)`` from a training loop's log callback and writes them as ``losses.tsv``."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        self.rows.append({"step": int(step),
                          **{key: float(value) for key, value in metrics.items() if key not in NOT_LOSSES}})

    def write(self, path: str | os.PathLike) -> int:
        """Write ``losses.tsv`` (``step``, ``loss``, then the parts, in step order); returns the row count."""
        rows = sorted(self.rows, key=lambda row: row["step"])
        keys = sorted({key for row in rows for key in row} - {"step", "loss"})
        fields = ["step"] + (["loss"] if any("loss" in row for row in rows) else []) + keys
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, delimiter="\t", lineterminator="\n")
            writer.writeheader()
            for row in rows:
                writer.writerow({key: (int(row[key]) if key == "step" else repr(row[key])) if key in row else ""
                                 for key in fields})
        return len(rows)
