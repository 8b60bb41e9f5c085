"""End the MLflow runs that killed stages left RUNNING (``qac runs sweep``).

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    commands.add_parser("sweep", help="end as KILLED the RUNNING runs of this host whose process is gone")


def sweep_store(uri: str | None = None) -> list[str]:
    """Sweep every experiment of the store at ``uri`` (default: the stages' store); returns the runs ended."""
    from pathlib import Path

    from qac.tracking import tracking_uri

    from qac.tracking.store import usable_store

    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    if not usable_store("the pipeline", uri):   # said why in one paragraph; the stages go on without the store
        return []
    import mlflow
    from mlflow.entities import ViewType

    from qac.tracking.interrupted import sweep_orphaned_runs

    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    return sweep_orphaned_runs(client, experiments) if experiments else []


def run(args: argparse.Namespace) -> int:
    from qac.console import setup_console

    setup_console(False)
    swept = sweep_store()
    print(f"runs: {len(swept)} orphaned run(s) ended as KILLED" if swept else "runs: no orphaned runs")
    return 0
