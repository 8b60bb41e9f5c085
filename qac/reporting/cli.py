"""Build Tables 1-5 and the figures of a profile from its MLflow runs.

Reads the runs of experiment qac-<profile> (tracking URI from
MLFLOW_TRACKING_URI, else sqlite:///mlflow.db) and writes
<out>/<profile>/tables.md, table<N>.csv (one line per cell, with the MLflow
run id of every number), table<N>.tex and figures/. Prints tables.md.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default=None, help="params file (default: params.yaml or $QAC_PARAMS)")
    parser.add_argument("--out", default=None, help="report folder (default: params tables.out_dir)")
    parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI "
                                                              "or sqlite:///mlflow.db)")
    parser.add_argument("--quiet", action="store_true", help="do not print tables.md")


def run(args: argparse.Namespace) -> int:
    from qac.config import load_params
    from qac.reporting.report import write_report

    params = load_params(args.params)
    try:
        report = write_report(params, args.out, args.tracking_uri)
    except LookupError as error:   # no experiment for this profile yet: nothing has been run
        print(f"qac tables: {error}; run the pipeline (dvc repro) first", file=sys.stderr)
        return 1
    if not args.quiet:
        print((report.directory / "tables.md").read_text(encoding="utf-8"))
    print(f"wrote {report.directory}")
    return 0
