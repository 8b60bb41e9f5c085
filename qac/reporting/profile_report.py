"""The whole report of a profile: DVC outputs in, ``reports/<profile>/`` out.

``reports/<profile>/`` holds ``tables.md`` (header block, Tables 1-5,
figures), ``table<N>.csv`` (one line per cell, with its source file and run
id), ``table<N>.tex`` per table, ``generator.csv`` (the query generator's
quality, when its stages ran), ``figures/`` and ``plots/`` (the data series
that dvc.yaml declares as DVC plots). ``reports/headline/<profile>.json``
beside it holds the headline cells, the profile's DVC metrics
(:mod:`qac.reporting.headline`). It is written into a temporary folder
and renamed into place, so a failure leaves the previous report intact. The
same DVC outputs give byte-identical tables: nothing in them depends on the
clock, the checkout or the MLflow store. A committed report is never replaced
by one built from outputs that are missing (:mod:`qac.reporting.guard`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qac.reporting.lineage import Study, load_study
from qac.reporting.table_set import build_tables
from qac.reporting.tables import Table
from qac.io import atomic_path
from qac.reporting import generator_report, plot_data, render
from qac.reporting.figures import draw_figures
from qac.reporting.guard import check_replaceable
from qac.reporting.headline import HEADLINE_DIR, write_headline
from qac.reporting.precision import rounded_tables
from qac.tracking import RECORDS_DIR, tracking_uri as default_uri

if TYPE_CHECKING:
    from qac.params.sections import Params

__all__ = ["Report", "load_study", "write_report", "log_to_study_run"]
RUNS_FILE = "report_runs.csv"


@dataclass
class Report:
    tables: list[Table]
    header: list[tuple[str, str]]
    figures: dict[str, str | None]   # file name -> None if drawn, else why not
    directory: Path


def write_report(params: Params, out_dir: str | os.PathLike | None = None,
                 data_root: str | os.PathLike | None = None) -> Report:
    """Build Tables 1-5, figures and plot data from the DVC outputs and write them to ``<out_dir>/<profile>/``."""
    target = Path(out_dir or params.tables.out_dir) / params.profile
    study = load_study(params, data_root)
    # Every number at its printed precision: equal values at that precision write equal files.
    tables = rounded_tables(build_tables(study, params))
    header = render.header_block(params, study, tables)
    check_replaceable(target, study.root, params.profile,
                      {(table.key, row, column): cell.value
                       for table in tables for (row, column), cell in table.cells.items()})
    with atomic_path(target, directory=True) as tmp:
        figures = draw_figures(study, tables, Path(tmp) / "figures", params)
        drawn = [name for name, reason in figures.items() if reason is None]
        generator = generator_report.generator_rows(study)
        text = render.report_markdown(tables, header, drawn,
                                      [generator_report.to_markdown(generator)] if generator else [])
        missing = [f"- {name}: not drawn ({reason})" for name, reason in figures.items() if reason]
        if missing:
            text += "\n" + "\n".join(missing) + "\n"
        (Path(tmp) / "tables.md").write_text(text, encoding="utf-8")
        for table in tables:
            (Path(tmp) / f"{table.key}.csv").write_text(render.to_csv(table), encoding="utf-8")
            (Path(tmp) / f"{table.key}.tex").write_text(render.to_latex(table, header), encoding="utf-8")
        if generator:
            (Path(tmp) / "generator.csv").write_text(generator_report.to_csv(generator), encoding="utf-8")
        plot_data.write_plot_data(study, tables, Path(tmp) / "plots")
    # The headline cells beside the report, the file dvc.yaml declares as the profile's metrics.
    write_headline(tables, target.parent / HEADLINE_DIR / f"{params.profile}.json")
    # Which MLflow runs the cells came from: bookkeeping, beside the DVC outputs, not in the report.
    from qac.tracking import RECORDS_DIR

    with atomic_path(study.root / RECORDS_DIR / RUNS_FILE) as tmp:
        Path(tmp).write_text(render.runs_csv(tables, study), encoding="utf-8")
    return Report(tables=tables, header=header, figures=figures, directory=target)


def redacted_uri(uri: str) -> str:
    """A tracking URI fit to print: scheme and host only (no credentials, no local paths)."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme in ("", "file") or parts.scheme.startswith("sqlite"):
        return f"{parts.scheme or 'file'} store"
    return f"{parts.scheme}://{parts.hostname or ''}"


def _study_runs(client, study: Study) -> list[str]:
    """Study run ids found in the store by walking up from the runs the DVC records name."""
    from mlflow.exceptions import MlflowException

    found: list[str] = []
    for record in study.records():
        run_id = record.get("run_id") if isinstance(record, dict) else None
        for _ in range(4):   # study -> pretrain -> finetune: the study run is at most three levels up
            if not run_id:
                break
            try:
                run = client.get_run(run_id)
            except MlflowException:
                break
            if run.data.tags.get("qac.role") == "study":
                if run_id not in found:
                    found.append(run_id)
                break
            run_id = run.data.tags.get("mlflow.parentRunId")
    return found


def log_to_study_run(study: Study, directory: str | os.PathLike, tracking_uri: str | None = None) -> str:
    """Log the report folder as artifacts of the study run(s) the records lead to; returns one line to print.

    The tables never need the store: when it is absent or holds none of the
    recorded runs (a fresh clone, another machine), the line says so and the
    caller goes on.
    """
    uri = tracking_uri or default_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return f"tables: no MLflow store ({redacted_uri(uri)}): report not logged to MLflow"
    # looked up when called: tests stand in for it
    from qac.tracking.store import usable_store

    if not usable_store("the report", uri):
        return "tables: report not logged to MLflow"
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = _study_runs(client, study)
    if not runs:
        return (f"tables: the MLflow store ({redacted_uri(uri)}) holds none of the runs the DVC records name: "
                "report not logged to MLflow")

    lineage = study.root / RECORDS_DIR / RUNS_FILE
    for run_id in runs:
        client.log_artifacts(run_id, str(directory))
        if lineage.is_file():
            client.log_artifact(run_id, str(lineage))
    return f"tables: report logged to MLflow study run {', '.join(runs)}"
