"""What a profile's runs cost, as they measured it (:mod:`qac.tracking.cost`): per stage and per table cell.

``qac runs cost PROFILE`` reads the MLflow store and sums, for each DVC stage,
the figures its runs logged: device-seconds, CPU seconds, peak memory (the
largest of the runs) and energy where it was read; then the same for each
numeric cell of Tables 1-5 that a run of the profile produces, over the
stages :mod:`qac.reporting.cell_plan` names for it (the variant's
pre-training, fine-tuning and evaluation, of every seed the cell averages).
It writes the same as ``reports/cost/<profile>.md``, outside the ``tables``
stage's output: the figures differ on every run and no DVC output holds them.

The runs counted: per stage and run name, the latest FINISHED run, and the
interrupted runs whose work it resumed (``qac.resumes_run``), as their work
is part of its result. Older reruns and work a run replaced are left out.
Evaluation's time is the ``eval/seconds`` the ``evaluate`` stage logs into
each retriever's run (counted under that stage, at one device), as its runs
open only after the work. A run without figures (logged before they were
measured, or killed) is counted as unmeasured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from qac.benchmarking import markdown_table
from qac.redaction import redact_url
from qac.reporting.cell_plan import PRODUCED, plan_cells, plan_reference_cells, plan_unpublished_cells
from qac.tracking import tracking_uri

if TYPE_CHECKING:
    from qac.params.sections import Params
    from qac.reporting.cell_plan import PlannedCell

RESUMES = "qac.resumes_run"


@dataclass
class Figures:
    """Summed cost of some runs; peaks are the largest, energy the sum over the runs that read it."""

    run_ids: set[str] = field(default_factory=set)
    unmeasured: set[str] = field(default_factory=set)   # runs without figures
    metered: int = 0                                     # runs whose figures a CostMeter took
    wall_seconds: float = 0.0
    device_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_mb: float | None = None
    peak_gpu_mb: float | None = None
    energy_j: float = 0.0
    energy_runs: int = 0
    devices: set[str] = field(default_factory=set)

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    def add(self, other: "Figures") -> None:
        self.run_ids |= other.run_ids
        self.unmeasured |= other.unmeasured
        self.metered += other.metered
        self.wall_seconds += other.wall_seconds
        self.device_seconds += other.device_seconds
        self.cpu_seconds += other.cpu_seconds
        self.peak_rss_mb = _larger(self.peak_rss_mb, other.peak_rss_mb)
        self.peak_gpu_mb = _larger(self.peak_gpu_mb, other.peak_gpu_mb)
        self.energy_j += other.energy_j
        self.energy_runs += other.energy_runs
        self.devices |= other.devices

    def row(self) -> dict[str, str]:
        energy = "not read" if not self.energy_runs else f"{self.energy_j:,.0f}"
        if self.energy_runs and self.energy_runs < self.metered:
            energy += f" ({self.energy_runs} of {self.metered} runs)"
        unmeasured = len(self.unmeasured)
        timed = self.metered or self.device_seconds     # evaluation has its seconds only, an unmeasured run none
        return {"runs": f"{self.runs}" + (f" ({unmeasured} unmeasured)" if unmeasured else ""),
                "device": ", ".join(sorted(self.devices)) or "–",
                "device-hours": f"{self.device_seconds / 3600:,.3f}" if timed else "–",
                "device s": f"{self.device_seconds:,.1f}" if timed else "–",
                "CPU s": f"{self.cpu_seconds:,.1f}" if self.metered else "–",
                "peak RSS MB": _megabytes(self.peak_rss_mb),
                "peak GPU MB": _megabytes(self.peak_gpu_mb), "energy J": energy}


def _larger(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _megabytes(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


@dataclass
class Entry:
    """One counted run's figures under the stage they belong to."""

    stage: str
    variant: str | None
    figures: Figures


def run_entries(run) -> list[Entry]:
    """A run's figures: its own stage's, and the evaluation time logged into it (``eval/seconds``)."""
    tags, metrics, ids = run.data.tags, run.data.metrics, {run.info.run_id}
    variant = tags.get("qac.variant")
    entries = []
    if "cost/device_seconds" in metrics:
        energy = metrics.get("cost/energy_j")
        figures = Figures(run_ids=ids, metered=1, wall_seconds=metrics.get("cost/wall_seconds", 0.0),
                          device_seconds=metrics["cost/device_seconds"],
                          cpu_seconds=metrics.get("cost/cpu_seconds", 0.0),
                          peak_rss_mb=metrics.get("cost/peak_rss_mb"), peak_gpu_mb=metrics.get("cost/peak_gpu_mb"),
                          energy_j=energy or 0.0, energy_runs=int(energy is not None),
                          devices={tags.get("qac.cost.device", "?")})
        entries.append(Entry(tags["qac.stage"], variant, figures))
    if "eval/seconds" in metrics:
        seconds = metrics["eval/seconds"]
        entries.append(Entry(tags.get("qac.eval.stage", tags["qac.stage"]), variant,
                             Figures(run_ids=ids, wall_seconds=seconds, device_seconds=seconds)))
    if not entries:
        entries.append(Entry(tags["qac.stage"], variant, Figures(run_ids=ids, unmeasured=ids)))
    return entries


def profile_runs(client, profile: str) -> list[Any]:
    """Every stage run of ``profile`` in the store (every experiment), the study runs left out."""
    from mlflow.entities import ViewType

    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not experiments:
        return []
    runs, token = [], None
    while True:
        page = client.search_runs(experiments, filter_string=f"tags.`qac.profile` = '{profile}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        runs += [run for run in page if "qac.stage" in run.data.tags and run.data.tags.get("qac.role") != "study"]
        token = page.token
        if not token:
            return runs


def counted_runs(runs: Iterable[Any]) -> list[Any]:
    """Per (stage, run name) the latest FINISHED run, and the runs whose work it resumed."""
    runs = list(runs)
    by_id = {run.info.run_id: run for run in runs}
    latest: dict[tuple[str, str], Any] = {}
    for run in runs:
        if run.info.status != "FINISHED":
            continue
        key = (run.data.tags["qac.stage"], run.info.run_name)
        if key not in latest or run.info.start_time > latest[key].info.start_time:
            latest[key] = run
    counted, seen = [], set()
    for run in latest.values():
        while run is not None and run.info.run_id not in seen:
            seen.add(run.info.run_id)
            counted.append(run)
            run = by_id.get(run.data.tags.get(RESUMES, ""))
    return counted


def stage_figures(entries: Iterable[Entry]) -> dict[str, Figures]:
    totals: dict[str, Figures] = {}
    for entry in entries:
        totals.setdefault(entry.stage, Figures()).add(entry.figures)
    return dict(sorted(totals.items()))


def cell_figures(cell: PlannedCell, entries: Iterable[Entry]) -> Figures:
    """The cell's stages summed; a stage of all variants (``beir_retriever``) counts the cell's variant's runs."""
    total = Figures()
    for entry in entries:
        if entry.stage not in cell.stages:
            continue
        if "@" not in entry.stage and cell.variant and entry.variant not in (None, cell.variant):
            continue
        total.add(entry.figures)
    return total


def produced_cells(params: Params) -> list[PlannedCell]:
    cells = plan_cells(params) + plan_unpublished_cells(params) + plan_reference_cells(params)
    return [cell for cell in cells if cell.status == PRODUCED and cell.stages]


def cell_rows(cells: list[PlannedCell], entries: list[Entry]) -> list[dict[str, str]]:
    """One row per table row and retriever: its cells (the columns) share their runs."""
    groups: dict[tuple, list[PlannedCell]] = {}
    for cell in cells:
        groups.setdefault((cell.table, cell.row, cell.variant, cell.retriever, tuple(cell.stages)), []).append(cell)
    rows = []
    for (table, row, variant, retriever, _), members in groups.items():
        figures = cell_figures(members[0], entries)
        what = " ".join(part for part in (variant, retriever) if part) or ", ".join(members[0].stages)
        rows.append({"table": table, "row": row, "cells": ", ".join(cell.column for cell in members), "run": what,
                     **(figures.row() if figures.runs else {"runs": "no runs"})})
    return rows


STAGE_COLUMNS = ["stage", "runs", "device", "device-hours", "device s", "CPU s", "peak RSS MB", "peak GPU MB",
                 "energy J"]
CELL_COLUMNS = ["table", "row", "cells", "run", *STAGE_COLUMNS[1:]]


@dataclass
class MeasuredCost:
    profile: str
    store: str
    stages: dict[str, Figures]
    cells: list[dict[str, str]]

    def markdown(self) -> str:
        total = Figures()
        for figures in self.stages.values():
            total.add(figures)
        head = (f"# Measured cost of profile {self.profile}\n\nFrom the MLflow store {self.store}: per stage and run "
                "name the latest finished run and the interrupted runs it resumed (qac/reporting/measured_cost.py). "
                "Device-seconds are wall seconds x the devices of the run; peaks are the largest of the runs; energy "
                "is what RAPL and NVML could read. Evaluation counts its `eval/seconds` at one device.")
        if not self.stages:
            return f"{head}\n\nNo run of profile {self.profile} in the store.\n"
        stages = markdown_table([{"stage": stage, **figures.row()} for stage, figures in self.stages.items()],
                                STAGE_COLUMNS)
        cells = (markdown_table(self.cells, CELL_COLUMNS) if self.cells
                 else "No numeric cell of Tables 1-5 is produced by this profile.")
        return (f"{head}\n\n## Per stage\n\n{stages}\n\nAll stages: {total.device_seconds / 3600:,.3f} device-hours, "
                f"{total.runs} runs.\n\n## Per table cell\n\nA cell's figures sum the stages that produce it "
                f"(`qac profile plan {self.profile} --cells`); cells of one row and retriever share them.\n\n{cells}\n")


def measured_cost(params: Params, client, store: str) -> MeasuredCost:
    """The measured cost of ``params``'s profile from the store ``client`` reads (``store``: its redacted URI)."""
    entries = [entry for run in counted_runs(profile_runs(client, params.profile)) for entry in run_entries(run)]
    return MeasuredCost(params.profile, store, stage_figures(entries), cell_rows(produced_cells(params), entries))


def projection_column(rows: list[dict[str, Any]], stages: dict[str, Figures]) -> list[str]:
    """For each row of ``qac profile plan --cost``'s projection, the device-hours measured for it (or ``–``)."""
    def measured(row: dict[str, Any]) -> str:
        if row["stage"] == "pretrain":
            names = [f"pretrain@{row['variant']}"]
        elif row["stage"].startswith("finetune"):
            names = [f"finetune@{row['variant']}"]
        elif row["stage"].startswith("beir_retriever"):
            names = ["beir_retriever"]
        elif row["stage"] == "generate queries":
            names = ["generate_queries"]
        else:
            names = []
        total = Figures()
        for name in names:
            if name in stages:
                total.add(stages[name])
        if not total.runs:
            return "–"
        hours = f"{total.device_seconds / 3600:,.3f} {'/'.join(sorted(total.devices)) or 'device'}-h"
        return hours + (" (all passages)" if row["stage"] == "generate queries" else "")
    return [measured(row) for row in rows]


def store_client(uri: str | None = None):
    """``(client, redacted URI)`` of the stages' MLflow store, or None where it does not exist (none is made) or
    cannot be used (said on stderr)."""
    from pathlib import Path

    # looked up when called: tests stand in for it
    from qac.tracking.store import usable_store

    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    if not usable_store("the cost report", uri):
        return None
    import mlflow

    return mlflow.MlflowClient(uri), redact_url(uri)


def measured_beside(params: Params):
    """For ``qac profile plan --cost``: ``(the column beside the projection, a note)``, or None where the store
    holds no run of the profile."""
    opened = store_client()
    if opened is None:
        return None
    cost = measured_cost(params, *opened)
    if not cost.stages:
        return None
    total = Figures()
    for figures in cost.stages.values():
        total.add(figures)
    note = (f"measured: device-hours (wall seconds x devices, on cuda or cpu) of the runs of profile {params.profile} "
            f"in the MLflow store {cost.store}, {total.device_seconds / 3600:,.3f} over all {len(cost.stages)} "
            f"stages; `qac runs cost {params.profile}` for each stage, memory, energy and the table cells.")
    return (lambda rows: projection_column(rows, cost.stages)), note
