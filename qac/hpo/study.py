"""The Optuna study: settings from ``params.yaml``, storage, sampler, pruner, trial budget, recovery.

Storage
    A journal file (``JournalStorage`` over ``JournalFileBackend``) by default:
    an append-only log with file locking, safe for several worker processes on
    one machine and needing no server. Any database URL (``sqlite:///...``,
    ``postgresql://...``, ``mysql://...``) selects ``RDBStorage`` instead, for
    workers on several machines.

Workers that die
    A worker killed mid-trial (``kill -9``, out of memory, a lost machine)
    leaves its trial RUNNING. With a database, Optuna's heartbeat notices the
    silence after ``grace_period`` seconds, fails the trial and (``retry_failed``)
    queues a copy with the same parameters; a worker without work waits for
    the running trials of other machines to end, so that a lost machine's
    trial is retried even after every other trial is done. The journal storage has no
    heartbeat, so every trial records the worker that runs it (host, pid and the
    process's start time, which a reused pid does not share) and the workers
    and the driver fail the trials of dead workers on their own host, queueing
    the same retry. Either way the study stays consistent: a trial is failed by
    one state change, which the storage refuses a second time.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from qac.config import profile_dir
from qac.errors import UserError
from qac.hpo.space import Dimension, parse_space
from qac.console import quiet_optuna
from qac.redaction import redact_url
from qac.tracking import flatten, stage_run, tracking_uri
from qac.tracking.store import database_problem

WORKER_ATTR = "qac.worker"
MLFLOW_RUN_ATTR = "qac.mlflow_run_id"
FAIL_REASON_ATTR = "qac.fail_reason"
DEFAULT_JOB = "qac.cli.hpo_trial_command"


class SettingsError(ValueError):
    """A bad ``hpo`` setting; the message names the key."""


@dataclass(frozen=True)
class HpoSettings:
    """The ``hpo`` section of ``params.yaml``, checked."""

    study_name: str
    variant: str
    storage: str | None
    n_trials: int
    direction: str
    metric: str
    seed: int
    tpe_startup_trials: int
    pruner: dict
    retry_failed: int
    heartbeat_interval: int
    grace_period: int
    launcher: str
    nproc_per_node: int
    trial_timeout: float | None
    job: str
    dev_queries: int
    dev_max_documents: int | None
    eval_every: int
    finetune_epochs: int | None
    pretrain_steps: int | None
    keep_models: bool
    dimensions: list[Dimension]

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "HpoSettings":
        """The ``hpo`` section of a params file the schema has checked (``qac.params``), the space parsed."""
        section, dev = params["hpo"], params["hpo"]["dev"]
        return cls(
            study_name=section["study_name"] or f"{params['profile']}-{section['variant']}",
            variant=section["variant"],
            storage=storage_with_credentials(section["storage"]),
            n_trials=section["n_trials"],
            direction=section["direction"],
            metric=section["metric"],
            seed=params["seed"] if section["seed"] is None else section["seed"],
            tpe_startup_trials=section["tpe_startup_trials"],
            pruner=dict(section["pruner"]),
            retry_failed=section["retry_failed"],
            heartbeat_interval=section["heartbeat_interval"],
            grace_period=section["grace_period"],
            launcher=section["launcher"],
            nproc_per_node=section["nproc_per_node"],
            trial_timeout=None if section["trial_timeout"] is None else float(section["trial_timeout"]),
            job=section["job"],
            dev_queries=dev["queries"],
            dev_max_documents=dev["max_documents"],
            eval_every=section["eval_every"],
            finetune_epochs=section["finetune_epochs"],
            pretrain_steps=section["pretrain_steps"],
            keep_models=section["keep_models"],
            dimensions=parse_space(section["space"]),
        )


def study_dir(params: Mapping[str, Any], settings: HpoSettings) -> Path:
    """``data/<profile>/hpo/<study>``: the journal, the study's params and one folder per trial."""
    return profile_dir(params) / "hpo" / settings.study_name


STORAGE_ENV = "QAC_HPO_STORAGE"


def storage_with_credentials(value: str | None) -> str | None:
    """``hpo.storage``, with the credentials that written copies of the params leave out.

    `qac hpo` writes the study's params for its workers with the storage URL
    redacted (qac.redaction) and hands the full URL to them in
    ``QAC_HPO_STORAGE``; a worker takes it from there when its redacted form is
    the one in the params. ``QAC_HPO_STORAGE`` is also how to give a database
    password without writing it in a params file.
    """
    full = os.environ.get(STORAGE_ENV)
    if full and (not value or redact_url(full) == value):
        return full
    return value


def storage_location(params: Mapping[str, Any], settings: HpoSettings) -> str:
    """The database URL, or the journal file's path."""
    return settings.storage or str(study_dir(params, settings) / "journal.log")


def is_database_url(location: str) -> bool:
    return "://" in location


class StorageUnavailable(UserError):
    """The study's database cannot be reached or opened."""


def make_storage(location: str, settings: HpoSettings):
    """``RDBStorage`` (with heartbeat and retries) for a URL, else a journal file."""
    import optuna

    if is_database_url(location):
        # once, briefly: Optuna's engine would retry, or raise a traceback
        problem = in_memory_problem(location) or database_problem(location)
        if problem is not None:
            raise StorageUnavailable(f"hpo.storage {redact_url(location)} {problem}. The search's trials live "
                                     "there: fix it or set hpo.storage (or --storage) to a database that answers, "
                                     "or leave it null for the study's journal file")
        return optuna.storages.RDBStorage(
            location,
            heartbeat_interval=settings.heartbeat_interval,
            grace_period=settings.grace_period,
            heartbeat_stale_trial_callback=heartbeat_retry(settings.retry_failed),
        )
    from optuna.storages.journal import JournalFileBackend

    problem = journal_problem(Path(location))
    if problem is not None:
        raise StorageUnavailable(journal_message(location, problem))
    Path(location).parent.mkdir(parents=True, exist_ok=True)
    try:
        return optuna.storages.JournalStorage(JournalFileBackend(str(location)))
    except (ValueError, KeyError):     # Optuna's replay of a line that is no record
        raise damaged_journal(location) from None


def in_memory_problem(url: str) -> str | None:
    """Why an in-memory SQLite URL cannot hold a study (it ends with the process), or None for any other URL."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.scheme.lower().startswith("sqlite"):
        return None
    database = parts.path.removeprefix("/")
    if database in ("", ":memory:") or "mode=memory" in parts.query:
        return ("is an in-memory SQLite database, which ends with the process that opened it: the workers "
                "cannot share it and the study would be lost (give a file, sqlite:///hpo.db)")
    return None


def journal_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a study's journal before Optuna appends to it: a folder, or a file whose first
    line is no journal record (a file that is something else); None for a journal or no file yet."""
    if path.is_dir():
        return "is a folder, not a journal file"
    if not path.exists() or path.stat().st_size == 0:
        return None
    if not path.is_file():
        return "is not a regular file"
    with open(path, "rb") as journal:
        first = journal.readline()
    if not _is_journal_record(first):
        return "is not an Optuna journal (its first line is no journal record)"
    return None


def damaged_journal(location: str) -> StorageUnavailable:
    """The error for a journal Optuna could not replay, naming its first bad line."""
    return StorageUnavailable(journal_message(location, damaged_journal_problem(Path(location))))


def damaged_journal_problem(path: Path) -> str:
    """Which line of a journal Optuna could not replay; the last line may be torn (a write cut short),
    which Optuna skips, so it is named only when no earlier line is bad."""
    with open(path, "rb") as journal:
        lines = journal.readlines()
    for number, line in enumerate(lines, start=1):
        if not _is_journal_record(line):
            return f"is damaged: line {number} of {len(lines)} is no journal record"
    return "is damaged: Optuna cannot replay it"


def _is_journal_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except ValueError:               # not JSON, or not UTF-8
        return False
    return isinstance(record, dict) and "op_code" in record


def journal_message(location: str, problem: str) -> str:
    return (f"hpo.storage {location} {problem}. The search's trials live in an Optuna journal file (or a "
            "database): set hpo.storage (or --storage) to a journal file path, which is created when missing, or "
            "to a database URL, or leave it null for the study's own journal file; a damaged journal is "
            "best moved aside and the study run again")


def make_sampler(settings: HpoSettings, worker_index: int = 0):
    """TPE seeded per worker.

    Workers with one seed would draw the same startup points side by side, so
    worker ``i`` seeds with ``seed + i``; the constant liar makes a worker treat
    its neighbours' running trials as bad results instead of re-proposing them.
    """
    import optuna

    return optuna.samplers.TPESampler(seed=settings.seed + worker_index, n_startup_trials=settings.tpe_startup_trials,
                                      constant_liar=True)


def make_pruner(settings: HpoSettings):
    """The pruner ``hpo.pruner`` names, with its options passed through."""
    import optuna

    config = {key: value for key, value in settings.pruner.items() if key != "type"}
    kind = settings.pruner["type"]
    try:
        if kind == "median":
            return optuna.pruners.MedianPruner(**config)
        if kind == "hyperband":
            return optuna.pruners.HyperbandPruner(**config)
        return optuna.pruners.NopPruner()
    except TypeError as error:
        raise SettingsError(f"hpo.pruner: bad option for the {kind} pruner ({error})") from None


def open_study(params: Mapping[str, Any], settings: HpoSettings, worker_index: int = 0):
    """Create the study, or load it when it exists (a resumed study keeps its trials)."""
    import optuna

    quiet_optuna()
    location = storage_location(params, settings)
    storage = make_storage(location, settings)
    try:
        study = optuna.create_study(
            study_name=settings.study_name, storage=storage, sampler=make_sampler(settings, worker_index),
            pruner=make_pruner(settings), direction=settings.direction, load_if_exists=True,
        )
    except (ValueError, KeyError):
        # A line that became unreadable since the storage was opened (another writer): name it.
        if is_database_url(location):
            raise
        raise damaged_journal(location) from None
    if study.direction.name.lower() != settings.direction:
        raise SettingsError(f"hpo.direction is {settings.direction}, but the stored study {settings.study_name!r} "
                            f"{study.direction.name.lower()}s; choose another hpo.study_name")
    return study


class StudyNotFound(UserError):
    """``--report-only`` for a study its storage does not hold."""


def load_stored_study(params: Mapping[str, Any], settings: HpoSettings):
    """The stored study, to read (``--report-only``): one that does not exist is refused, never created."""
    import optuna

    quiet_optuna()
    location = storage_location(params, settings)
    if not is_database_url(location) and not Path(location).exists():
        raise StudyNotFound(f"no study {settings.study_name!r} to report on: its journal {location} does not exist"
                            f"{_other_journals(Path(location).parent.parent)}. Run `qac hpo` to start it, or "
                            "name a stored one with --study-name (or --storage)")
    storage = make_storage(location, settings)
    names = optuna.get_all_study_names(storage)
    if settings.study_name not in names:
        raise StudyNotFound(f"no study {settings.study_name!r} to report on in {redact_url(location)} (it holds "
                            f"{', '.join(map(repr, names)) or 'none'}); name one with --study-name")
    return optuna.load_study(study_name=settings.study_name, storage=storage)


def _other_journals(hpo_dir: Path) -> str:
    """``; data/<profile>/hpo holds the studies 'a', 'b'``: the journals beside the one that is missing."""
    names = sorted(path.parent.name for path in hpo_dir.glob("*/journal.log")) if hpo_dir.is_dir() else []
    return f"; {hpo_dir} holds the studies {', '.join(map(repr, names))}" if names else ""


# --- the trial budget ---------------------------------------------------------

def retried_trial_numbers(trials) -> set[int]:
    """Numbers of failed trials that a later trial re-runs."""
    retried: set[int] = set()
    for trial in trials:
        retried.update(trial.system_attrs.get("retry_history", []))
    return retried


def counted_trials(study) -> int:
    """Trials that use the budget: every trial except a failed one that a retry replaces."""
    trials = study.get_trials(deepcopy=False)
    return len(trials) - len(retried_trial_numbers(trials))


def has_work(study, n_trials: int) -> bool:
    """Whether a worker should start another trial: budget left, or a queued (retry) trial."""
    from optuna.trial import TrialState

    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return True
    return counted_trials(study) < n_trials


# --- who runs a trial, and recovery when that process died ---------------------

def this_process_owner() -> dict[str, Any]:
    import os

    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": psutil.Process().create_time()}


def owner_is_alive(owner: Mapping[str, Any]) -> bool | None:
    """True/False for a process on this host; None when it ran elsewhere (cannot tell)."""
    import psutil

    if owner.get("host") != socket.gethostname():
        return None
    try:
        process = psutil.Process(int(owner["pid"]))
        # A pid the kernel reused for a newer process is not our worker.
        return abs(process.create_time() - float(owner["started"])) < 1e-3 and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, KeyError, ValueError):
        return False


def fail_orphaned_trials(study, settings: HpoSettings, pids: set[int] | None = None) -> list[int]:
    """Fail RUNNING trials whose worker on this host is dead; queue retries. Returns the failed numbers.

    ``pids`` limits the check to trials of those worker processes (the driver
    knows which of its workers exited); otherwise every trial on this host is
    checked.
    """
    import optuna
    from optuna.trial import TrialState

    failed = []
    for trial in study.get_trials(deepcopy=True, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(WORKER_ATTR)
        if not owner or (pids is not None and owner.get("pid") not in pids):
            continue
        if owner_is_alive(owner) is not False:
            continue
        # Through the storage: Optuna's public API only lets a trial's own process change it. The
        # storage refuses the state change if another process finished the trial first.
        try:
            study._storage.set_trial_user_attr(trial._trial_id, FAIL_REASON_ATTR, "worker process died")
            changed = study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            changed = False  # another process failed it first
        if not changed:
            continue
        failed.append(trial.number)
        retry_trial(study, trial, settings.retry_failed)
        run_id = trial.user_attrs.get(MLFLOW_RUN_ATTR)
        if run_id:
            close_mlflow_run(run_id, state="failed")
    return failed


def retry_trial(study, trial, max_retry: int) -> bool:
    """Queue a WAITING copy of a failed trial (same parameters) unless it was retried ``max_retry`` times.

    The bookkeeping is Optuna's own (``RetryHeartbeatStaleTrialCallback``):
    system attributes ``failed_trial`` (the first trial of the chain) and
    ``retry_history``. Unlike Optuna's callback, the copy does not inherit the
    failed run's ``qac.*`` attributes (its worker, MLflow run, failure reason).
    """
    import optuna
    from optuna.trial import TrialState

    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > max_retry:
        return False
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=trial.params, distributions=trial.distributions,
        user_attrs={key: value for key, value in trial.user_attrs.items() if not key.startswith("qac.")},
        system_attrs={"failed_trial": history[0], "retry_history": history},
    ))
    return True


def heartbeat_retry(max_retry: int):
    """The stale-trial callback of a database storage: the same retry as for journal storages.

    The silent worker cannot end its trial's MLflow run, so this does, as failed.
    """
    def callback(study, trial) -> None:
        retry_trial(study, trial, max_retry)
        run_id = trial.user_attrs.get(MLFLOW_RUN_ATTR)
        if run_id:
            close_mlflow_run(run_id, state="failed")
    return callback


def trials_on_other_hosts(study, settings: HpoSettings, location: str) -> list[int]:
    """RUNNING trials of a database study whose worker this host cannot see (it runs on another machine).

    Only their heartbeat tells whether they are alive. A worker that has no
    work left waits for them to end (finished by their worker, or failed by
    Optuna's stale-trial check and queued again), so that the trial of a lost
    machine is retried even when every other trial is done.
    """
    from optuna.trial import TrialState

    if not is_database_url(location):
        return []
    return [trial.number for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if owner_is_alive(trial.user_attrs.get(WORKER_ATTR) or {}) is None]


def close_mlflow_run(run_id: str, state: str) -> None:
    """End a trial's MLflow run that its (dead) worker left open."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri())
    client.set_tag(run_id, "qac.trial_state", state)
    client.set_terminated(run_id, status="FAILED")


# --- the study's MLflow run ------------------------------------------------------

def ensure_study_mlflow_run(params: Mapping[str, Any], study, settings: HpoSettings) -> str:
    """The MLflow run ``hpo/<study>`` (a child of the profile's study run), created once per study.

    Its id is stored in the study itself, so a resumed study, and workers on
    other machines, log their trials under the same parent.
    """
    existing = study.user_attrs.get(MLFLOW_RUN_ATTR)
    if existing:
        import mlflow

        try:
            mlflow.MlflowClient(tracking_uri()).get_run(existing)
            return existing
        except mlflow.exceptions.MlflowException:
            pass  # the study moved to another tracking store: start a new parent run there

    with stage_run(params, stage="hpo", run_name=f"hpo/{settings.study_name}", kind="hpo",
                   tags={"qac.study": settings.study_name, "qac.variant": settings.variant,
                         "qac.hpo.storage": "database" if settings.storage and is_database_url(settings.storage) else "journal"}) as run:
        import mlflow

        flat = {key: redact_url(str(value))[:6000] for key, value in flatten("", {"hpo": dict(params["hpo"])}).items()}
        mlflow.log_params(flat)
        run_id = run.info.run_id
    study.set_user_attr(MLFLOW_RUN_ATTR, run_id)
    return run_id
