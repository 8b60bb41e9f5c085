"""Stage `tables`: Tables 1-5, figures and plot data of the active profile, from its DVC outputs.

Writes reports/<profile>/ (tables.md, table<N>.csv, table<N>.tex, figures/,
plots/); then logs that folder to the MLflow study run when the store holds it.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

import sys

from qac.params import load_params
from qac.stages.arguments import stage_arguments
from qac.reporting.lineage import load_study
from qac.reporting.profile_report import log_to_study_run, write_report


def main(argv: list[str] | None = None) -> int:
    stage_arguments(__doc__.splitlines()[0], argv)
    params = load_params()
    report = write_report(params, params.tables.out_dir)
    print(f"tables: wrote {report.directory}/tables.md ({len(report.tables)} tables, "
          f"{sum(reason is None for reason in report.figures.values())} figures)")
    print(log_to_study_run(load_study(params), report.directory))
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
