"""Worker processes: each runs trials one after another, each trial as a separate job.

A trial is a real training job in a child process (``python -m qac.cli.hpo_trial_command``
or the same under ``torchrun``), started in its own process group so that
pruning can stop it and everything it spawned at once. The job prints its dev
metric at intervals (see :mod:`qac.hpo.trial_job`); the worker reports each
value to Optuna and to the trial's MLflow run, and kills the job when the
pruner says so.

``run_worker_pool`` is the driver side: it starts ``--workers`` worker
processes, each pinned to its own ``CUDA_VISIBLE_DEVICES`` slot, watches them,
fails the trial of a worker that died and starts a replacement while work is
left.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from qac.hpo.study import (FAIL_REASON_ATTR, MLFLOW_RUN_ATTR, WORKER_ATTR, HpoSettings,
                           ensure_study_mlflow_run, fail_orphaned_trials, has_work, open_study, storage_location,
                           study_dir, this_process_owner, trials_on_other_hosts)
from qac.threads import shared_cores_environment
from qac.config import write_params
from qac.console import verbose_requested
from qac.hpo.space import apply_values, suggest_values
from qac.hpo.trial_job import STOP_ON_EOF_ENV, parse_event
from qac.tracking import log_metrics, metric_key, stage_run

log = logging.getLogger("qac.hpo")
KILL_GRACE_SECONDS = 5.0


class TrialJobFailed(RuntimeError):
    """The trial's job exited without a result (crash, bad parameters, timeout)."""


# --- GPU slots ------------------------------------------------------------------

def gpu_slots(gpus: list[str], workers: int) -> list[str | None]:
    """One ``CUDA_VISIBLE_DEVICES`` value per worker.

    With at least as many GPUs as workers the GPUs are dealt out in equal
    contiguous groups (``0,1,2,3`` for 2 workers: ``0,1`` and ``2,3``; a
    remainder stays unused); with fewer, workers share them round robin. No GPUs:
    the variable is left alone.
    """
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if not gpus:
        return [None] * workers
    if len(gpus) >= workers:
        size = len(gpus) // workers
        return [",".join(gpus[i * size:(i + 1) * size]) for i in range(workers)]
    return [gpus[i % len(gpus)] for i in range(workers)]


# --- one trial job ----------------------------------------------------------------

def job_command(settings: HpoSettings, params_file: Path, trial_dir: Path) -> list[str]:
    """The command line of a trial job (``hpo.job`` is a module name or a ``.py`` script)."""
    target = [settings.job] if settings.job.endswith(".py") else ["-m", settings.job]
    args = ["--params", str(params_file), "--out", str(trial_dir)]
    if settings.launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={settings.nproc_per_node}", *target, *args]
    return [sys.executable, *target, *args]


@dataclass
class JobOutcome:
    value: float
    metrics: dict[str, float]


def run_job(command: list[str], *, env: Mapping[str, str], log_path: Path,
            on_intermediate: Callable[[int, float], bool], timeout: float | None = None,
            cwd: str | os.PathLike | None = None) -> JobOutcome | None:
    """Run a trial job, feed its intermediate values to ``on_intermediate``, return its result.

    ``on_intermediate(step, value)`` returns True to stop the job (pruning); the
    job's process group is then killed and None is returned. A job that exits
    non-zero, ends without a result line or runs past ``timeout`` raises
    :class:`TrialJobFailed`. The job's stdin is a pipe that this process never
    writes to: if this process dies, the job reads end-of-file and stops itself,
    so a killed worker leaves no orphaned training behind.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as job_log:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=job_log,
                                   env=dict(env), cwd=cwd, text=True, bufsize=1, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=_pump_lines, args=(process.stdout, lines), daemon=True)
        reader.start()
        started = time.monotonic()
        result: JobOutcome | None = None
        try:
            while True:
                try:
                    line = lines.get(timeout=1.0)
                except queue.Empty:
                    if timeout is not None and time.monotonic() - started > timeout:
                        raise TrialJobFailed(f"trial job ran past hpo.trial_timeout ({timeout:g} s)") from None
                    continue
                if line is None:  # stdout closed: the job is ending
                    break
                try:
                    event = parse_event(line)
                except ValueError as error:
                    raise TrialJobFailed(str(error)) from None
                if event is None:
                    job_log.write(line)
                    job_log.flush()
                    continue
                if event["kind"] == "intermediate":
                    if on_intermediate(int(event["step"]), float(event["value"])):
                        return None
                elif event["kind"] == "result":
                    result = JobOutcome(value=float(event["value"]), metrics=dict(event.get("metrics", {})))
            returncode = process.wait()
        finally:
            stop_job(process)
    if returncode != 0:
        raise TrialJobFailed(f"trial job exited with status {returncode}; see {log_path}")
    if result is None:
        raise TrialJobFailed(f"trial job ended without a result line; see {log_path}")
    return result


def _pump_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def stop_job(process: subprocess.Popen) -> None:
    """Stop a job and everything it started (its process group): TERM, then KILL after a grace period."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
    # Even after the leader exited, ranks it started may linger in the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    if process.stdin:
        process.stdin.close()


# --- the objective ------------------------------------------------------------------

class TrialRunner:
    """The objective Optuna calls: one trial = one job, logged as a nested MLflow run."""

    def __init__(self, params: Mapping[str, Any], settings: HpoSettings, parent_run_id: str,
                 gpu_slot: str | None = None, on_trial_start: Callable[[], None] | None = None):
        self.params = params
        self.settings = settings
        self.parent_run_id = parent_run_id
        self.gpu_slot = gpu_slot
        self.on_trial_start = on_trial_start
        self.root = study_dir(params, settings)

    def __call__(self, trial) -> float:
        import optuna

        trial.set_user_attr(WORKER_ATTR, this_process_owner())
        if self.on_trial_start:
            self.on_trial_start()
        values = suggest_values(trial, self.settings.dimensions)
        trial_params = apply_values(self.params, values, self.settings.variant)
        trial_dir = self.root / "trials" / f"{trial.number:04d}"
        params_file = trial_dir / "params.yaml"
        trial_dir.mkdir(parents=True, exist_ok=True)
        write_params(trial_params, params_file)
        # Optuna marks a retried trial in its system attributes, which only the frozen trial exposes.
        retry_of = trial.study.get_trials(deepcopy=False)[trial.number].system_attrs.get("failed_trial")
        tags = {"qac.study": self.settings.study_name, "qac.trial": trial.number, "qac.variant": self.settings.variant}
        if retry_of is not None:
            tags["qac.retry_of"] = retry_of
        metric_name = metric_key("dev", self.settings.metric)
        state, reported = "failed", {}

        def on_intermediate(step: int, value: float) -> bool:
            trial.report(value, step)
            reported[step] = value
            log_metrics({metric_name: value}, step=step)
            return trial.should_prune()

        env = dict(os.environ)
        env[STOP_ON_EOF_ENV] = "1"
        if self.gpu_slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_slot
        started = time.monotonic()
        with stage_run(self.params, stage="hpo", run_name=f"hpo/{self.settings.study_name}/trial-{trial.number}",
                       kind="hpo-trial", stage_params=values, tags=tags, parent_run_id=self.parent_run_id) as run:
            import mlflow

            trial.set_user_attr(MLFLOW_RUN_ATTR, run.info.run_id)
            try:
                outcome = run_job(job_command(self.settings, params_file, trial_dir), env=env,
                                  log_path=trial_dir / "job.log", on_intermediate=on_intermediate,
                                  timeout=self.settings.trial_timeout)
                state = "complete" if outcome is not None else "pruned"
            except TrialJobFailed as error:
                trial.set_user_attr(FAIL_REASON_ATTR, str(error))
                mlflow.set_tag(FAIL_REASON_ATTR, str(error)[:5000])
                log.warning("trial %d failed: %s", trial.number, error)
                raise
            except KeyboardInterrupt:
                trial.set_user_attr(FAIL_REASON_ATTR, "worker stopped (Ctrl-C or SIGTERM)")
                raise
            finally:
                mlflow.set_tag("qac.trial_state", state)
                mlflow.log_metric("trial_seconds", time.monotonic() - started)
                if not self.settings.keep_models:
                    shutil.rmtree(trial_dir / "work", ignore_errors=True)
            if outcome is not None:
                log_metrics({metric_key("objective"): outcome.value})
                log_metrics({metric_key("final", name): value for name, value in outcome.metrics.items()})
        if outcome is None:
            step = max(reported)
            log.info("trial %d pruned at step %d (%s %.4f)", trial.number, step, self.settings.metric, reported[step])
            raise optuna.TrialPruned(f"pruned at step {step}")
        log.info("trial %d complete: %s %.4f", trial.number, self.settings.metric, outcome.value)
        return outcome.value


# --- a worker process ------------------------------------------------------------------

@contextlib.contextmanager
def budget_lock(root: Path) -> Iterator[Callable[[], None]]:
    """Serialise 'is there work? then create a trial' among the workers of this machine.

    Without it two workers could both see one trial left and both start one.
    The lock is released as soon as the new trial exists (the callable yielded).
    Workers on other machines (database storage) are not covered: there a
    study can run up to workers - 1 trials past ``n_trials``.
    """
    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / "budget.lock", "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            fcntl.flock(handle, fcntl.LOCK_UN)
            released = True

    try:
        yield release
    finally:
        release()
        handle.close()


def quiet_failed_trials() -> None:
    """Leave a failed trial to this module's one line: Optuna logs it with the traceback of the worker,
    which says nothing about the trial (its job's own log does), unless verbose."""
    if not verbose_requested():
        logging.getLogger("optuna.study._optimize").setLevel(logging.ERROR)


def run_worker(params: Mapping[str, Any], settings: HpoSettings, index: int = 0, gpu_slot: str | None = None) -> int:
    """Run trials until the study's budget is used up; returns the number of trials this worker ran."""
    study = open_study(params, settings, worker_index=index)
    quiet_failed_trials()
    parent_run_id = ensure_study_mlflow_run(params, study, settings)
    root = study_dir(params, settings)
    location = storage_location(params, settings)
    ran = 0
    while True:
        fail_orphaned_trials(study, settings)
        with budget_lock(root) as release:
            if has_work(study, settings.n_trials):
                runner = TrialRunner(params, settings, parent_run_id, gpu_slot, on_trial_start=release)
                study.optimize(runner, n_trials=1, catch=(TrialJobFailed,), gc_after_trial=False)
                ran += 1
                continue
        elsewhere = trials_on_other_hosts(study, settings, location)
        if not elsewhere:
            break
        log.info("waiting for trial(s) %s on other machines (failed after %d s without a heartbeat)",
                 elsewhere, settings.grace_period)
        time.sleep(settings.heartbeat_interval)
        import optuna

        optuna.storages.fail_stale_trials(study)
    log.info("no work left after %d trial(s) of this worker", ran)
    return ran


# --- the driver's pool -------------------------------------------------------------------

def run_worker_pool(params_file: Path, params: Mapping[str, Any], settings: HpoSettings,
                    workers: int, gpus: list[str]) -> dict[str, Any]:
    """Start ``workers`` worker processes and watch them until the study's budget is used up.

    A worker that dies from a signal has its running trial failed (and queued
    again, ``hpo.retry_failed``) and is replaced while work is left, at most
    ``workers`` times in all. Returns what happened: trials failed because
    their worker died, and the exit statuses of the workers.
    """
    slots = gpu_slots(gpus, workers)
    study = open_study(params, settings)
    processes: dict[int, subprocess.Popen] = {}
    exits: list[dict[str, Any]] = []
    orphaned: list[int] = []
    replacements_left = workers

    def start(index: int) -> None:
        command = [sys.executable, "-m", "qac.cli.hpo_worker_command", "--params", str(params_file), "--index", str(index)]
        if slots[index] is not None:
            command += ["--gpus", slots[index]]
        # The workers' trial jobs share the machine's cores (and its GPUs' host threads): idle threads sleep.
        processes[index] = subprocess.Popen(command, env=shared_cores_environment(workers))
        log.info("worker %d started (pid %d%s)", index, processes[index].pid,
                 f", CUDA_VISIBLE_DEVICES={slots[index]}" if slots[index] is not None else "")

    orphaned += fail_orphaned_trials(study, settings)
    for index in range(workers):
        start(index)
    try:
        while processes:
            time.sleep(0.5)
            for index, process in list(processes.items()):
                returncode = process.poll()
                if returncode is None:
                    continue
                del processes[index]
                exits.append({"worker": index, "pid": process.pid, "returncode": returncode})
                if returncode == 0:
                    continue
                failed = fail_orphaned_trials(study, settings, pids={process.pid})
                orphaned += failed
                log.warning("worker %d (pid %d) exited with status %d; failed trials: %s", index, process.pid,
                            returncode, failed or "none")
                if returncode < 0 and replacements_left > 0 and has_work(study, settings.n_trials):
                    replacements_left -= 1
                    start(index)
    except KeyboardInterrupt:
        log.warning("interrupted: stopping workers (their running trials end as failed)")
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            process.wait()
        raise
    finally:
        orphaned += fail_orphaned_trials(study, settings)
    return {"orphaned_trials": orphaned, "worker_exits": exits}
