"""Build Tables 1-5 and the figures of a profile from its DVC outputs.

Reads data/<profile>/ (per-query metrics, run records, loss files,
annotation labels; no MLflow store needed) and writes
<out>/<profile>/tables.md, table<N>.csv (one line per cell, with the file and
MLflow run id behind every number), table<N>.tex, figures/ and plots/.
When the MLflow store holds the study run the records lead to, the report is
also logged to it as artifacts. Prints tables.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qac.errors import UserError
from qac.names import output_option_problem


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default=None, help="params file (default: $QAC_PARAMS, else "
                        "profiles/$QAC_PROFILE/params.yaml, else the default profile)")
    parser.add_argument("--out", default=None, help="report folder (default: params tables.out_dir)")
    parser.add_argument("--data", default=None, help="the profile's DVC outputs (default: data/<profile>)")
    parser.add_argument("--no-mlflow", action="store_true", help="do not log the report to the MLflow study run")
    parser.add_argument("--quiet", action="store_true", help="do not print tables.md")


def folder_problem(folder: Path) -> str | None:
    """Why a report folder cannot be made or written at ``folder``, or None."""
    if folder.exists() and not folder.is_dir():
        return "is a file, not a folder"
    ancestor = next(path for path in (folder, *folder.parents) if path.exists())
    if not ancestor.is_dir():
        return f"{ancestor} is a file, so no folder can be made under it"
    return None     # a folder it may not write (no permission, a read-only disk) is said when writing starts


def check_out_option(value: str | None, option: str = "--out") -> None:
    """A folder given on the command line to write into follows the project's rule for one: relative and
    inside the working folder, or absolute (``../x`` would write beside the checkout)."""
    problem = None if value is None else output_option_problem(value)
    if problem:
        raise UserError(f"{option} {value!r}: {problem}")


def run(args: argparse.Namespace) -> int:
    # here, not at the top: it loads pydantic
    from qac.params import load_params
    # here, not at the top: it loads numpy
    from qac.reporting.profile_report import log_to_study_run, write_report

    check_out_option(args.out)
    params = load_params(args.params, running=False)
    out = Path(args.out or params.tables.out_dir)
    problem = folder_problem(out)
    if problem:            # before any table is built: the report would have nowhere to go
        raise UserError(f"{'--out' if args.out else 'tables.out_dir'} {out}: {problem}")
    report = write_report(params, args.out, args.data)
    if not args.quiet:
        print((report.directory / "tables.md").read_text(encoding="utf-8"))
    print(f"wrote {report.directory}")
    if not args.no_mlflow:
        # here, not at the top: it loads numpy
        from qac.reporting.lineage import load_study

        print(log_to_study_run(load_study(params, args.data), report.directory))
    return 0
