"""Figures of the report (matplotlib, Agg backend), drawn from the tables and MLflow runs.

- ``query_count.png``: Table 3's MRR@10 and R@50 against the number C of
  generated queries per passage, one line per method;
- ``zero_shot.png``: Table 2's per-dataset nDCG@10, without and with query context;
- ``pretrain_loss.png``: each pre-training run's loss over steps, from its
  MLflow metric history.

Each function returns the path it wrote, or None when the runs hold nothing to
draw (the report then says so instead of showing an empty plot).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from qac.reporting.runs import StudyRuns
from qac.reporting.tables import Table

QUERY_COUNT = "query_count.png"
ZERO_SHOT = "zero_shot.png"
PRETRAIN_LOSS = "pretrain_loss.png"
DEFAULT_LOSS_METRICS = ("loss", "loss/total")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_query_count(table3: Table, path: str | os.PathLike) -> Path | None:
    """Table 3 as lines: one panel per measure, x = queries per passage."""
    measures = [column for column in table3.columns if not column.startswith("Δ")]
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for row, info in table3.row_info.items():
        for column in measures:
            cell = table3.cell(row, column)
            if cell.value is not None:
                series.setdefault(column, {}).setdefault(info["method"], []).append((info["query_count"], cell.value))
    if not series:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(measures), figsize=(4.5 * len(measures), 3.5), squeeze=False)
    from qac.reporting.paper import METHOD_NAMES

    counts = sorted({info["query_count"] for info in table3.row_info.values()})
    for axis, column in zip(axes[0], measures):
        for method, points in sorted(series.get(column, {}).items()):
            points.sort()
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=METHOD_NAMES.get(method, method))
        axis.set_xlabel("generated queries per passage (C)")
        axis.set_ylabel(column.split(" [")[0] + " (%)")
        axis.set_xscale("log")   # the paper's C = 1, 5, 10, 20 spread evenly
        axis.set_xticks(counts, [str(c) for c in counts])
        axis.minorticks_off()
        axis.legend()
    figure.suptitle("Retriever 1 against the number of generated queries (Table 3)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)


def plot_zero_shot(table2: Table, path: str | os.PathLike) -> Path | None:
    """Table 2 as grouped bars: a group per dataset, a bar per (method, context)."""
    import numpy as np

    columns = [column for column in table2.columns if not column.endswith("Δ")]
    datasets = [row for row in table2.rows if row != "average"]
    if not datasets or not any(table2.cell(d, c).value is not None for d in datasets for c in columns):
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(max(5.0, 1.4 * len(datasets) + 2), 3.8))
    width = 0.8 / max(1, len(columns))
    positions = np.arange(len(datasets))
    for index, column in enumerate(columns):
        values = [table2.cell(d, column).value for d in datasets]
        axis.bar(positions + index * width, [np.nan if v is None else v for v in values], width, label=column)
    axis.set_xticks(positions + width * (len(columns) - 1) / 2, datasets, rotation=20, ha="right")
    axis.set_ylabel("nDCG@10")
    axis.set_title("Zero-shot retrieval (Table 2)")
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)


def loss_key(metrics: Sequence[str], candidates: Sequence[str] = DEFAULT_LOSS_METRICS) -> str | None:
    """The total-loss metric a pre-training run logged.

    The first of ``candidates`` present, else a key whose last part is
    ``loss`` (``train/loss``), else one whose first part is (``loss/mlm``).
    qac.train.pretrain reports the total as ``loss`` beside its parts.
    """
    for key in candidates:
        if key in metrics:
            return key
    for matches in (lambda key: key.split("/")[-1] == "loss", lambda key: key.split("/")[0] == "loss"):
        found = sorted(key for key in metrics if matches(key))
        if found:
            return found[0]
    return None


def plot_pretrain_losses(study: StudyRuns, path: str | os.PathLike,
                         candidates: Sequence[str] = DEFAULT_LOSS_METRICS) -> Path | None:
    """The loss curve of the latest pre-training run of every variant, a panel per method.

    coCondenser (MLM + contrastive) and CoT-MAE (encoder + decoder MLM) losses
    are on different scales, so each method gets its own axis.
    """
    from qac.reporting.paper import METHOD_NAMES

    curves: dict[str, dict[str, tuple[str, list]]] = {}
    seen = set()
    for run in study.runs:   # newest first: the first run of a variant is its latest
        if run.tags.get("qac.kind") != "pretrain":
            continue
        variant = run.tags.get("qac.variant", run.name)
        key = loss_key(list(run.metrics), candidates)
        if variant in seen or key is None:
            continue
        seen.add(variant)
        history = study.metric_history(run, key)
        if history:
            curves.setdefault(run.tags.get("qac.method", "other"), {})[variant] = (key, history)
    if not curves:
        return None
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4), squeeze=False)
    for axis, (method, by_variant) in zip(axes[0], sorted(curves.items())):
        for variant, (key, history) in sorted(by_variant.items()):
            axis.plot([step for step, _ in history], [value for _, value in history], label=f"{variant} ({key})")
        axis.set_xlabel("step")
        axis.set_ylabel("pre-training loss")
        axis.set_title(METHOD_NAMES.get(method, method))
        axis.legend(fontsize="x-small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)


def draw_figures(study: StudyRuns, tables: Sequence[Table], directory: str | os.PathLike,
                 loss_metrics: Sequence[str] = DEFAULT_LOSS_METRICS) -> dict[str, str | None]:
    """Draw every figure into ``directory``; ``{file name: None or why it is missing}``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    by_key = {table.key: table for table in tables}
    drawn = {
        QUERY_COUNT: plot_query_count(by_key["table3"], directory / QUERY_COUNT) if "table3" in by_key else None,
        ZERO_SHOT: plot_zero_shot(by_key["table2"], directory / ZERO_SHOT) if "table2" in by_key else None,
        PRETRAIN_LOSS: plot_pretrain_losses(study, directory / PRETRAIN_LOSS, loss_metrics),
    }
    reasons = {QUERY_COUNT: "no Table 3 values", ZERO_SHOT: "no Table 2 values",
               PRETRAIN_LOSS: "no pre-training run logged a loss metric"}
    return {name: None if path else reasons[name] for name, path in drawn.items()}
