"""MLflow runs: end those that killed stages left RUNNING (``sweep``); show how two runs differ (``diff``);
what a profile's runs cost (``cost``).

``qac runs diff A B`` takes two MLflow run ids, or two outputs of a profile
(``finetune/<variant>/r1``, the path under data/<profile>/ whose run record
names the run), and prints only what differs in parameters, code, data hashes
and environment, then the metrics with the paired test of each evaluation
metric (qac.reporting.run_diff); ``--json`` for scripts.

``qac runs cost PROFILE`` prints the device-seconds, CPU seconds, peak memory
and energy the profile's runs measured, per stage and per table cell
(qac.reporting.measured_cost), and writes them to reports/cost/PROFILE.md:
outside the tables stage's output, as no DVC output holds a figure that
differs on every run.

A stage killed with SIGKILL cannot end its own run. Every stage ends such runs
when it opens its own (qac.tracking.interrupted), but when DVC restores every
stage from its cache no stage opens a run, so ``make smoke`` and ``make repro``
sweep first. A run counts as orphaned when it is RUNNING, was started on this
host and its process (tags ``qac.host``, ``qac.pid``) no longer runs; it ends
as KILLED with the tag ``qac.swept``. Runs of other hosts are left alone.
Without an MLflow store there is nothing to sweep, and none is created.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qac.params import PROFILE_NAMES
from qac.config import profile_dir, render_profile
from qac.console import setup_console
from qac.errors import UserError
from qac.io import atomic_path
from qac.redaction import redact_url
from qac.reporting.measured_cost import measured_cost, store_client
from qac.tracking import tracking_uri
from qac.tracking.interrupted import sweep_orphaned_runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    commands.add_parser("sweep", help="end as KILLED the RUNNING runs of this host whose process is gone")
    diff = commands.add_parser("diff", help="what differs between two runs, and whether a metric's difference "
                                            "is more than the noise of the queries")
    diff.add_argument("a", help="an MLflow run id, or an output of the profile (finetune/<variant>/r1)")
    diff.add_argument("b", help="the other run, given the same way")
    diff.add_argument("--data", default=None, help="the profile's DVC outputs, for outputs given by path "
                                                    "(default: data/<profile> of the params)")
    diff.add_argument("--params", default=None, help="params file (default: as every command reads it)")
    diff.add_argument("--json", action="store_true", help="print the differences as JSON")
    diff.add_argument("--width", type=int, default=120, help="the widest line printed (default 120)")
    cost = commands.add_parser("cost", help="what a profile's runs measured (device-seconds, peak memory, energy), "
                                            "per stage and per table cell; written to reports/cost/PROFILE.md")
    cost.add_argument("profile", choices=PROFILE_NAMES)
    cost.add_argument("--out", default=None, help="where to write the report (default: reports/cost/PROFILE.md)")


def sweep_store(uri: str | None = None) -> list[str]:
    """Sweep every experiment of the store at ``uri`` (default: the stages' store); returns the runs ended."""
    from pathlib import Path

    # looked up when called: tests stand in for it
    from qac.tracking.store import usable_store

    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    if not usable_store("the pipeline", uri):   # said why in one paragraph; the stages go on without the store
        return []
    import mlflow
    from mlflow.entities import ViewType

    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    return sweep_orphaned_runs(client, experiments) if experiments else []


def resolve_run(name: str, data: Path | None) -> tuple[str, str | None]:
    """``(run id, tracking URI or None)`` of a run id, or of an output whose run record names its run."""
    import re

    # here, not at the top: it loads numpy
    from qac.reporting.lineage import read_record

    if re.fullmatch(r"[0-9a-f]{32}", name):
        return name, None
    if data is not None:
        record = read_record(data, data / name)
        if record and record.get("run_id"):
            return record["run_id"], record.get("tracking_uri")
    raise UserError(f"{name!r} is neither an MLflow run id (32 hex digits) nor an output of the profile with a "
                    f"run record under {data}/.runs/ (such as finetune/<variant>/r1)")


def run_diff(args: argparse.Namespace) -> int:
    import json

    import mlflow

    # here, not at the top: it loads numpy
    from qac.reporting.run_diff import diff_runs, format_diff

    data = Path(args.data) if args.data else None
    if data is None and not all(len(name) == 32 for name in (args.a, args.b)):
        # here, not at the top: it loads pydantic
        from qac.params import load_params

        data = profile_dir(load_params(args.params, running=False))
    (run_a, uri), (run_b, _) = resolve_run(args.a, data), resolve_run(args.b, data)
    diff = diff_runs(mlflow.MlflowClient(uri or tracking_uri()), run_a, run_b)
    print(json.dumps(diff.as_dict(), indent=2) if args.json else format_diff(diff, args.width), end="")
    return 0


def run_cost(args: argparse.Namespace) -> int:
    # here, not at the top: it loads pydantic
    from qac.params import validate_params

    out = Path(args.out or Path("reports") / "cost" / f"{args.profile}.md")
    if out.is_dir():     # the report replaces a file, never a folder and what it holds
        raise UserError(f"--out {out}: a folder; give the report's file name (default reports/cost/PROFILE.md)")
    opened = store_client()
    if opened is None:
        raise UserError(f"no usable MLflow store at {redact_url(tracking_uri())}: no run has measured a cost there")
    text = measured_cost(validate_params(render_profile(args.profile)), *opened).markdown()
    with atomic_path(out) as staging:
        staging.write_text(text, encoding="utf-8")
    print(text, end="")
    print(f"written to {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    setup_console(False)
    if args.action == "diff":
        return run_diff(args)
    if args.action == "cost":
        return run_cost(args)
    swept = sweep_store()
    print(f"runs: {len(swept)} orphaned run(s) ended as KILLED" if swept else "runs: no orphaned runs")
    return 0
