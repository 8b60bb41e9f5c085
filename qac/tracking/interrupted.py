"""Runs that a killed stage left RUNNING, and the run that resumes their work.

MLflow marks a run finished only when its process ends it; a stage killed with
SIGKILL (or by a lost machine) leaves its run RUNNING forever. The stage that
resumes the work knows which run that was (its work state records the run id),
so it ends that run as KILLED and links both ways:

- the resumed run gets ``qac.resumes_run`` (its work continued) or
  ``qac.replaces_run`` (its work was discarded, e.g. its inputs changed);
- the killed run gets ``qac.continued_by``.
"""

from __future__ import annotations

import sys

RESUMES = "qac.resumes_run"
REPLACES = "qac.replaces_run"
CONTINUED_BY = "qac.continued_by"


def end_interrupted_run(previous_run_id: str | None, current_run_id: str, *, resumed: bool) -> bool:
    """End ``previous_run_id`` as KILLED if it is still RUNNING and link it to ``current_run_id``.

    Returns whether the earlier run was found in this tracking store. A run of
    another store (the tracking URI changed since) cannot be reached: the link
    tag is still set on the current run, and a warning says why.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    if not previous_run_id or previous_run_id == current_run_id:
        return False
    client = mlflow.MlflowClient()
    client.set_tag(current_run_id, RESUMES if resumed else REPLACES, previous_run_id)
    try:
        previous = client.get_run(previous_run_id)
    except MlflowException:
        print(f"warning: run {previous_run_id} (interrupted earlier) is not in this tracking store",
              file=sys.stderr)
        return False
    if previous.info.status == "RUNNING":
        client.set_terminated(previous_run_id, status="KILLED")
    client.set_tag(previous_run_id, CONTINUED_BY, current_run_id)
    return True
