"""MLflow runs for pipeline stages: one place that names, tags and nests them.

Every stage opens its run through :func:`stage_run`. Runs form a tree that
mirrors the study: a study run per (profile, git commit) is the parent of the
pre-training runs, and each fine-tuning run is a child of the pre-training run
whose checkpoint it started from. A stage finds its parent through the run
record (``mlflow_run.json``) that the upstream stage left for its output, so
the tree survives stages running in separate processes (and on separate
machines, with a tracking server).

Run records are bookkeeping, not results: they live in
``data/<profile>/.runs/<output>/mlflow_run.json``, outside every DVC output,
so a byte-identical result keeps its hash and nothing reruns downstream of it.
A record that is absent (DVC restored the output from its cache, or pulled
it) or names a run the tracking store lacks (a new ``mlflow.db``, another
``MLFLOW_TRACKING_URI``) is a link left out: the stage runs, its run nests
under the study run instead, and a line on stderr says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from qac.tracking.store import is_store_error, store_failed, tracking_uri
from qac.io import path_md5, write_json
from qac.redaction import redact_url
from qac.tracking.interrupted import link_killed_predecessors, process_tags, sweep_orphaned_runs
from qac.tracking.naming import run_name
from qac.tracking.record import (CODE_ARTIFACT, describe_study_run, loaded_code, log_stage_config,
                                 mark_training_experiment)

if TYPE_CHECKING:
    from qac.params.sections import Params

RUN_RECORD = "mlflow_run.json"
RECORDS_DIR = ".runs"   # under data/<profile>/: beside the DVC outputs, inside none
# Files DVC itself rewrites when it runs a profile: not a change to the code a run used.
DVC_WRITTEN = (":(exclude)profiles/*/dvc.lock",)
_INVALID_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def metric_key(*parts: str) -> str:
    """Join parts into an MLflow metric key; ``@`` (not allowed by MLflow) becomes ``_at_``.

    ``metric_key("scifact", "test", "nDCG@10") == "scifact/test/nDCG_at_10"``.
    """
    key = "/".join(str(part) for part in parts).replace("@", "_at_")
    return _INVALID_KEY_CHARS.sub("_", key)


def measure_from_key(key: str) -> str:
    """Inverse of the ``@`` mangling in :func:`metric_key` for the last component."""
    return key.rsplit("/", 1)[-1].replace("_at_", "@")


def git_state(cwd: str | os.PathLike | None = None) -> tuple[str, bool]:
    """Current commit (or ``unknown``) and whether the work tree has uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        # The profile's dvc.lock is DVC's bookkeeping, rewritten by every `dvc repro`.
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *DVC_WRITTEN],
            cwd=cwd, capture_output=True, text=True, check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True


def _setup(params: Params):
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    name = params.mlflow.experiment or f"qac-{params.profile}"
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is None:
        artifact_root = None
        if tracking_uri().startswith("sqlite:"):
            # Keep artifacts beside the SQLite store rather than wherever the
            # process happened to start.
            db_path = Path(tracking_uri().removeprefix("sqlite:///"))
            artifact_root = (db_path.parent / "mlartifacts").resolve().as_uri()
        try:
            mlflow.create_experiment(name, artifact_location=artifact_root)
        except Exception:  # created concurrently by another stage
            pass
        experiment = mlflow.get_experiment_by_name(name)

    mark_training_experiment(mlflow.MlflowClient(), experiment)
    mlflow.set_experiment(experiment_id=experiment.experiment_id)
    return mlflow, experiment


def study_run_id(params: Params) -> str:
    """The study (parent) run of this profile at this git commit, created on first use."""
    mlflow, experiment = _setup(params)
    commit, _ = git_state()
    query = (
        "tags.`qac.role` = 'study' and "
        f"tags.`qac.profile` = '{params.profile}' and tags.`qac.git_commit` = '{commit}'"
    )
    found = mlflow.search_runs([experiment.experiment_id], filter_string=query,
                               order_by=["start_time ASC"], max_results=1, output_format="list")
    if found:
        return found[0].info.run_id

    client = mlflow.MlflowClient()
    run = client.create_run(
        experiment.experiment_id,
        run_name=run_name("study", params.profile, commit[:7]),
        tags={"qac.role": "study", "qac.profile": params.profile, "qac.git_commit": commit},
    )
    describe_study_run(client, run.info.run_id, params, commit, git_state()[1])
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def record_path(root: str | os.PathLike, output: str | os.PathLike) -> Path:
    """Where the run record of ``output`` (a path under the profile folder ``root``) lives.

    ``record_path("data/smoke", "finetune/none/r1") == data/smoke/.runs/finetune/none/r1/mlflow_run.json``.
    """
    root, output = Path(root), Path(output)
    inside = output.is_absolute() or output.parts[:len(root.parts)] == root.parts
    relative = output.resolve().relative_to(root.resolve()) if inside else output
    return root / RECORDS_DIR / relative / RUN_RECORD


def read_run_record(root: str | os.PathLike, output: str | os.PathLike) -> dict[str, Any] | None:
    """The run record an upstream stage left for ``output``, or None (no record: a link left out)."""
    path = record_path(root, output)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None   # bookkeeping only: a damaged record is a missing link, never a failed stage
    return record if isinstance(record, dict) and isinstance(record.get("run_id"), str) else None


def write_run_record(root: str | os.PathLike, output: str | os.PathLike, run_id: str, **extra: Any) -> Path:
    """Record the run that produced ``output`` (under ``root``), so downstream stages can nest under it.

    The git commit rides along so the reports can cite the code behind each
    output without the MLflow store. Not a DVC output: written beside them.
    """
    commit, dirty = git_state()
    path = record_path(root, output)
    # The store's address without its credentials.
    write_json(path, {"run_id": run_id, "tracking_uri": redact_url(tracking_uri()),
                      "git_commit": commit, "git_dirty": dirty, **extra})
    return path


def linked_run_id(record: Mapping[str, Any] | None, what: str) -> str | None:
    """The run id of ``record`` if this tracking store holds that run, else None with a line saying so.

    ``what`` names the upstream output for the message (``pretrain@none``).
    """
    if not record:
        print(f"note: no run record for {what}: its MLflow run is not linked", file=sys.stderr)
        return None
    # looked up when called: tests stand in for it
    from qac.tracking.store import usable_store

    if not usable_store():
        return None
    import mlflow

    try:
        mlflow.MlflowClient(tracking_uri()).get_run(record["run_id"])
    except Exception as error:
        if not is_store_error(error):
            raise
        if _run_not_found(error):
            print(f"note: run {record['run_id']} of {what} is not in this tracking store: not linked",
                  file=sys.stderr)
        else:    # the store itself failed (locked, damaged since the probe): said once, the stage goes on
            store_failed(error)
        return None
    return record["run_id"]


def _run_not_found(error: BaseException) -> bool:
    """Whether the store answered that it has no such run (as opposed to failing to answer)."""
    return getattr(error, "error_code", None) in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """Flatten nested params into ``a.b.c`` keys for ``mlflow.log_params``."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, child in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), child))
        return out
    return {prefix: value}


@contextlib.contextmanager
def stage_run(
    params: Params,
    stage: str,
    run_name: str,
    *,
    kind: str,
    stage_params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, str | os.PathLike] | None = None,
    tags: Mapping[str, Any] | None = None,
    parent_run_id: str | None = None,
) -> Iterator[Any]:
    """Open the MLflow run of one stage and yield the active run.

    ``run_name`` says what ran, leading with what differs (``C=5 · query · cocondenser · pretrain``,
    :mod:`qac.tracking.naming`); ``stage`` is the DVC stage (tag ``qac.stage``); ``kind`` is the
    kind of stage (``split``, ``pretrain``, ``finetune``, ...). Tags record the git
    commit and dirty flag, the DVC stage, the profile and the MD5 of every input
    (the hash DVC uses), so a run can be traced to exact data; the resolved
    parameters are logged as ``config/params.yaml`` and, when the stage's work is done, the qac
    source files it ran as ``code/qac_modules.json``. ``parent_run_id``
    defaults to the study run. Only rank 0 of a distributed job should call this.
    """
    mlflow, experiment = _setup(params)

    # Runs whose process is gone (killed) end as KILLED before this one starts.
    sweep_orphaned_runs(mlflow.MlflowClient(), [experiment.experiment_id])

    commit, dirty = git_state()
    all_tags = {
        "qac.kind": kind,
        "qac.stage": stage,
        "qac.profile": params.profile,
        "qac.git_commit": commit,
        "qac.git_dirty": str(dirty).lower(),
        "mlflow.source.git.commit": commit,
        **process_tags(),
    }
    for name, path in (inputs or {}).items():
        if Path(path).exists():
            all_tags[f"qac.input.{name}"] = str(path)
            all_tags[f"qac.input_md5.{name}"] = path_md5(path)
    all_tags.update({key: str(value) for key, value in (tags or {}).items()})
    parent = parent_run_id or study_run_id(params)
    system_metrics = params.mlflow.system_metrics
    with mlflow.start_run(run_name=run_name, parent_run_id=parent, tags=all_tags,
                          log_system_metrics=system_metrics) as run:
        link_killed_predecessors(mlflow.MlflowClient(), experiment.experiment_id, run.info.run_id,
                                 stage, params.profile)
        if stage_params:
            flat = {k: v for k, v in flatten("", stage_params).items()}

            mlflow.log_params({k: redact_url(str(v))[:6000] for k, v in flat.items()})
        log_stage_config(params)
        yield run
        mlflow.log_dict(loaded_code(), CODE_ARTIFACT)


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log metrics to the active run, mangling keys MLflow would reject."""
    import mlflow

    mlflow.log_metrics({metric_key(key): float(value) for key, value in metrics.items()}, step=step)


def log_evaluation(result, dataset_name: str, split: str) -> dict[str, float]:
    """Log an evaluation result (``aggregate`` and ``per_query``) to the active run; the metrics as logged.

    Measures go in as ``<dataset>/<split>/<measure>`` and the per-query values as the artifact
    ``per_query/<dataset>/<split>.json``, the one layout the tables and significance tests read.
    """
    import mlflow

    metrics = {metric_key(dataset_name, split, measure): value for measure, value in result.aggregate.items()}
    mlflow.log_metrics(metrics)
    mlflow.log_dict(result.per_query, f"per_query/{dataset_name}/{split}.json")
    return metrics
