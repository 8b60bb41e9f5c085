"""Runs that a killed stage left RUNNING, and the run that continues their work.

MLflow marks a run finished only when its process ends it; a stage killed with
SIGKILL (or by a lost machine) leaves its run RUNNING forever. Every run a
stage opens carries the host and process id that run it (``qac.host``,
``qac.pid``), so whoever comes next can tell a run in progress from an
orphan:

- :func:`sweep_orphaned_runs` ends as KILLED every RUNNING run of this host
  whose process is gone (tag ``qac.swept``). It runs when any stage opens its
  run, and on its own as ``qac runs sweep`` (``make smoke`` and ``make repro``
  start with it, so a killed run is ended even when DVC then restores every
  stage from its cache and opens no run). Runs of other hosts are left alone:
  their processes cannot be seen from here.
- :func:`link_killed_predecessors`: a stage's new run links the KILLED runs of
  the same stage and profile that no run continued yet (``qac.replaces_run``
  on the new run, ``qac.continued_by`` on the killed one).
- :func:`end_interrupted_run`: a stage that resumed the killed run's work (its
  work state records that run's id) says so instead: ``qac.resumes_run``.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Iterable

RESUMES = "qac.resumes_run"
REPLACES = "qac.replaces_run"
CONTINUED_BY = "qac.continued_by"
HOST = "qac.host"
PID = "qac.pid"
SWEPT = "qac.swept"


def process_tags() -> dict[str, str]:
    """The tags that name the process running a run: ``qac.host`` and ``qac.pid``."""
    return {HOST: socket.gethostname(), PID: str(os.getpid())}


def process_alive(pid: int, started_ms: int | None) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``started_ms`` (not a reused id)."""
    import psutil

    try:
        created = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False
    # A process created after the run began is another process that got the same id.
    return started_ms is None or created <= started_ms / 1000 + 2.0


def sweep_orphaned_runs(client, experiment_ids: Iterable[str], profile: str | None = None) -> list[str]:
    """End as KILLED the RUNNING runs of this host whose process no longer runs; returns their ids."""
    host = socket.gethostname()
    query = "attributes.status = 'RUNNING'"
    if profile:
        query += f" and tags.`qac.profile` = '{profile}'"
    swept = []
    for run in client.search_runs(list(experiment_ids), filter_string=query, max_results=5000):
        tags = run.data.tags
        if tags.get(HOST) != host or not str(tags.get(PID, "")).isdigit():
            continue
        if process_alive(int(tags[PID]), run.info.start_time):
            continue
        client.set_tag(run.info.run_id, SWEPT, f"process {tags[PID]} on {host} had ended")
        client.set_terminated(run.info.run_id, status="KILLED")
        swept.append(run.info.run_id)
    if swept:
        print(f"note: {len(swept)} run(s) left RUNNING by killed processes ended as KILLED: {', '.join(swept)}",
              file=sys.stderr)
    return swept


def link_killed_predecessors(client, experiment_id: str, run_id: str, stage: str, profile: str) -> list[str]:
    """Link ``run_id`` to the KILLED runs of ``stage`` and ``profile`` that no run continued yet."""
    query = (f"attributes.status = 'KILLED' and tags.`qac.stage` = '{stage}' "
             f"and tags.`qac.profile` = '{profile}'")
    killed = [run.info.run_id for run in client.search_runs([experiment_id], filter_string=query,
                                                             order_by=["attributes.start_time ASC"],
                                                             max_results=1000)
              if CONTINUED_BY not in run.data.tags and run.info.run_id != run_id]
    for previous in killed:
        client.set_tag(previous, CONTINUED_BY, run_id)
    if killed:
        client.set_tag(run_id, REPLACES, ",".join(killed))
    return killed


def end_interrupted_run(previous_run_id: str | None, current_run_id: str, *, resumed: bool) -> bool:
    """End ``previous_run_id`` as KILLED if it is still RUNNING and link it to ``current_run_id``.

    ``resumed``: the current run continued the earlier run's work (``qac.resumes_run``), else it
    discarded it (``qac.replaces_run``). Returns whether the earlier run was found in this tracking
    store. A run of another store (the tracking URI changed since) cannot be reached: the link tag
    is still set on the current run, and a line says why.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    if not previous_run_id or previous_run_id == current_run_id:
        return False
    client = mlflow.MlflowClient()
    client.set_tag(current_run_id, RESUMES if resumed else REPLACES, previous_run_id)
    if resumed:
        replaced = client.get_run(current_run_id).data.tags.get(REPLACES, "")
        rest = [run for run in replaced.split(",") if run and run != previous_run_id]
        if replaced and rest:
            client.set_tag(current_run_id, REPLACES, ",".join(rest))
        elif replaced:
            client.delete_tag(current_run_id, REPLACES)
    try:
        previous = client.get_run(previous_run_id)
    except MlflowException:
        print(f"note: run {previous_run_id} (interrupted earlier) is not in this tracking store",
              file=sys.stderr)
        return False
    if previous.info.status == "RUNNING":
        client.set_terminated(previous_run_id, status="KILLED")
    client.set_tag(previous_run_id, CONTINUED_BY, current_run_id)
    return True
