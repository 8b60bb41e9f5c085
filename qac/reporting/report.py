"""The whole report of a profile: MLflow runs in, ``reports/<profile>/`` out.

``reports/<profile>/`` holds ``tables.md`` (header block, Tables 1-5,
figures), ``table<N>.csv`` (one line per cell, with run ids) and
``table<N>.tex`` per table, and ``figures/``. It is written into a temporary
folder and renamed into place, so a failure leaves the previous report intact.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from qac.reporting.runs import StudyRuns, load_runs
from qac.reporting.tables import Table, build_tables


def experiment_name(params: Mapping[str, Any]) -> str:
    """``qac-<profile>`` unless params name another experiment (as :mod:`qac.tracking` does)."""
    return (params.get("mlflow") or {}).get("experiment") or f"qac-{params['profile']}"


def load_study(params: Mapping[str, Any], tracking_uri: str | None = None) -> StudyRuns:
    """The finished runs of the profile's experiment, restricted to runs tagged with this profile."""
    from qac.tracking import tracking_uri as default_uri

    uri = tracking_uri or default_uri()
    runs = [run for run in load_runs(experiment_name(params), uri)
            if run.tags.get("qac.profile", params["profile"]) == params["profile"]]
    return StudyRuns(runs, tracking_uri=uri)


@dataclass
class Report:
    tables: list[Table]
    header: list[tuple[str, str]]
    figures: dict[str, str | None]   # file name -> None if drawn, else why not
    directory: Path


def write_report(params: Mapping[str, Any], out_dir: str | os.PathLike | None = None,
                 tracking_uri: str | None = None) -> Report:
    """Build Tables 1-5 and the figures from MLflow and write them to ``<out_dir>/<profile>/``."""
    from qac.io import atomic_path
    from qac.reporting import render
    from qac.reporting.figures import DEFAULT_LOSS_METRICS, draw_figures
    from qac.tracking import tracking_uri as default_uri

    uri = tracking_uri or default_uri()
    settings = params.get("tables", {})
    target = Path(out_dir or settings.get("out_dir", "reports")) / params["profile"]
    study = load_study(params, uri)
    tables = build_tables(study, params)
    header = render.header_block(params, study, tables, experiment_name(params), uri)
    with atomic_path(target, directory=True) as tmp:
        figures = draw_figures(study, tables, Path(tmp) / "figures",
                               settings.get("loss_metrics") or DEFAULT_LOSS_METRICS)
        drawn = [name for name, reason in figures.items() if reason is None]
        text = render.report_markdown(tables, header, drawn)
        missing = [f"- {name}: not drawn ({reason})" for name, reason in figures.items() if reason]
        if missing:
            text += "\n" + "\n".join(missing) + "\n"
        (Path(tmp) / "tables.md").write_text(text, encoding="utf-8")
        for table in tables:
            (Path(tmp) / f"{table.key}.csv").write_text(render.to_csv(table), encoding="utf-8")
            (Path(tmp) / f"{table.key}.tex").write_text(render.to_latex(table, header), encoding="utf-8")
    return Report(tables=tables, header=header, figures=figures, directory=target)
