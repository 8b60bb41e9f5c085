"""`dvc repro` of a profile with independent stages side by side: ``qac repro --jobs 2 smoke``.

DVC runs a pipeline's stages one after the other. A smoke stage computes for a
second or two and spends the rest starting Python, torch, transformers and
MLflow on one core, so on a machine with more cores than that the stages that
do not depend on each other (the variants' pre-training, fine-tuning and
evaluation chains) can run at the same time.

Every stage still runs through DVC, one ``dvc --wait-for-lock repro
--single-item <pipeline>:<stage>`` each (DVC's own ``main`` in a forked copy
of this process when stages start warm, else the ``dvc`` command): DVC checks the stage, runs its
command, caches its outputs and writes its entry in the profile's
``dvc.lock``, exactly as a whole `dvc repro` would (the forked copy reads the
lock plainly before rewriting it: :func:`read_locks_plainly`). DVC lets go of its
repository lock while a stage's command runs and takes it again to record the
stage (``--wait-for-lock`` makes the other runs wait for it instead of
failing), and its per-stage read/write locks keep a stage from reading an
output another stage is writing. Nothing here decides what a stage does; it
only decides when it starts:

- the graph is DVC's own (:func:`qac.pipeline_plan.graph_in`); a stage
  starts when every stage it depends on has finished;
- the stages that can need to run are the ones DVC reports changed and every
  stage downstream of one (what `dvc repro` would look at); the rest are not
  started at all, and a started stage that turns out unchanged is skipped by
  DVC itself in about a second;
- each stage's command runs with the threads it has under `dvc repro` (so its
  outputs are the same bytes), and OpenMP's idle threads sleep instead of
  spinning on a core the other stage needs;
- the first stage that fails stops new starts; the stages already running
  finish, and the run ends with the failed stage's output and the stages left
  over. Outputs are what DVC left: a failed stage leaves none, the finished
  ones are cached and locked, and the next run starts from there.

The profile's study run is created before any stage starts, so that stages
starting together nest under one study run instead of each creating its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from qac.threads import shared_cores_environment
from qac.errors import UserError
from qac.launcher import SOCKET_ENV, Server, exit_status
from qac.pipeline_plan import graph_in

# DVC prints this while another stage holds its repository lock for the second it takes to record a stage.
_LOCK_WAIT = "Waiting to acquire lock"


@dataclass(frozen=True)
class StageJob:
    name: str                       # finetune@none
    upstream: tuple[str, ...]       # the stages whose outputs it reads


@dataclass
class Finished:
    name: str
    returncode: int
    seconds: float
    output: str


@dataclass
class ReproOutcome:
    finished: list[Finished] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Finished]:
        return [stage for stage in self.finished if stage.returncode != 0]


def stages_to_consider(graph: Sequence[tuple[str, str, tuple[str, ...]]], changed: Iterable[str],
                       force: bool = False) -> list[StageJob]:
    """The stages of ``graph`` (``(name, command, upstream)`` in run order) that may need to run: the changed
    ones and everything downstream of one (every stage when ``force``), with their upstream among them."""
    chosen = set(changed) if not force else {name for name, _, _ in graph}
    for name, _, upstream in graph:        # run order: an upstream stage is decided before its dependents
        if any(stage in chosen for stage in upstream):
            chosen.add(name)
    return [StageJob(name, tuple(stage for stage in upstream if stage in chosen))
            for name, _, upstream in graph if name in chosen]


def run_stages(jobs: Sequence[StageJob], start: Callable[[str, Path], subprocess.Popen], parallel: int,
               on_start: Callable[[str], None] = lambda name: None,
               on_finish: Callable[[Finished], None] = lambda done: None,
               poll_seconds: float = 0.05) -> ReproOutcome:
    """Run ``jobs`` (in run order) with at most ``parallel`` at once, each as ``start(name, log_path)``.

    A job starts when its upstream jobs have all finished with exit status 0; after the first failure no
    job starts. Each job's output goes to its own log file (read back into :class:`Finished`) so that
    stages running together do not interleave their lines. Ctrl-C ends the jobs that run and re-raises.
    """
    if parallel < 1:
        raise ValueError(f"jobs must be at least 1, not {parallel}")
    outcome = ReproOutcome()
    began = time.monotonic()
    waiting = list(jobs)
    done: set[str] = set()
    running: dict[str, tuple[subprocess.Popen, Path, float]] = {}
    with tempfile.TemporaryDirectory(prefix="qac-repro-") as logs:
        try:
            while waiting or running:
                stopped = bool(outcome.failed)
                ready = [job for job in waiting if all(stage in done for stage in job.upstream)]
                while ready and len(running) < parallel and not stopped:
                    job = ready.pop(0)
                    waiting.remove(job)
                    log = Path(logs) / f"{len(outcome.finished) + len(running)}.log"
                    on_start(job.name)
                    running[job.name] = (start(job.name, log), log, time.monotonic())
                if not running:
                    break                          # a failure stopped the rest, or nothing left can start
                time.sleep(poll_seconds)
                for name, (process, log, started) in list(running.items()):
                    if process.poll() is None:
                        continue
                    del running[name]
                    output = log.read_text(encoding="utf-8", errors="replace")
                    finished = Finished(name, process.returncode, time.monotonic() - started, output)
                    outcome.finished.append(finished)
                    if process.returncode == 0:
                        done.add(name)
                    on_finish(finished)
        except BaseException:
            for process, _, _ in running.values():
                if process.poll() is None:
                    process.terminate()
            for process, _, _ in running.values():
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            raise
    outcome.not_started = [job.name for job in waiting]
    outcome.seconds = time.monotonic() - began
    return outcome


def reproduce(pipeline: str | os.PathLike, repo_root: str | os.PathLike = ".", parallel: int = 2,
              force: bool = False, on_start: Callable[[str], None] = lambda name: None,
              on_finish: Callable[[Finished], None] = lambda done: None,
              before_first_start: Callable[[], None] = lambda: None, preload: bool = True
              ) -> tuple[ReproOutcome, int]:
    """Bring the DVC file ``pipeline`` up to date with up to ``parallel`` stages at once; the outcome and the
    number of stages in the pipeline. Nothing starts (``before_first_start`` is not called) when DVC reports
    every stage unchanged. ``preload``: stages start as forked copies of a server that has imported torch,
    transformers and MLflow once (qac/launcher.py) instead of importing them each (when ``HF_HUB_OFFLINE`` is
    set, as the make targets set it), and DVC runs each stage in a forked copy of this process, which has
    imported DVC once."""
    import contextlib

    root = Path(repo_root)
    # Each stage keeps the threads it has under `dvc repro` (the recorded smoke outputs are dvc repro's bytes);
    # side by side, their idle threads sleep (qac.threads).
    env = shared_cores_environment(parallel)
    with contextlib.ExitStack() as stack:
        # Some stages make the hub offline for themselves when the environment does not say
        # (os.environ.setdefault), after the server would have imported huggingface_hub: only a value set
        # beforehand is the same for both. The server starts first, so that it has imported its libraries
        # (on another core) by the time DVC's plan is read and the first stages start.
        if preload and "HF_HUB_OFFLINE" in env:
            env = {**env, SOCKET_ENV: stack.enter_context(Server(env))}
        graph, changed = planned(pipeline, root, force)
        jobs = stages_to_consider(graph, changed, force=force)
        if not jobs:
            return ReproOutcome(), len(graph)
        before_first_start()
        starter = forked_dvc_starter if preload and hasattr(os, "fork") else dvc_stage_starter
        start = starter(str(pipeline), root, env, force)
        return run_stages(jobs, start, parallel, on_start=on_start, on_finish=on_finish), len(graph)


def planned(pipeline: str | os.PathLike, repo_root: Path, force: bool
            ) -> tuple[list[tuple[str, str, tuple[str, ...]]], set[str]]:
    """DVC's graph of ``pipeline`` (:func:`qac.pipeline_plan.graph_in`) and the stages it reports changed (what
    `dvc status` lists; none asked when ``force``), read once under its lock, before any stage starts."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo, lock_repo

    try:
        with Repo(str(repo_root)) as repo, lock_repo(repo):
            stages = repo.stage.collect(str(pipeline))
            graph = graph_in(repo, pipeline, stages)
            changed = set() if force else {stage.name for stage in stages if stage.cmd and stage.changed()}
            return graph, changed
    except DvcException as error:         # a pipeline DVC cannot read, or no DVC project
        raise UserError(f"{pipeline}: DVC cannot plan this pipeline ({type(error).__name__}: "
                        f"{' '.join(str(error).split())})") from error


def dvc_arguments(pipeline: str, stage: str, force: bool) -> list[str]:
    """DVC's command line for one stage: ``--wait-for-lock repro --single-item [--force] <pipeline>:<stage>``."""
    return ["--wait-for-lock", "repro", "--single-item", *(["--force"] if force else []), f"{pipeline}:{stage}"]


def dvc_stage_starter(pipeline: str, repo_root: Path, env: dict[str, str], force: bool
                      ) -> Callable[[str, Path], subprocess.Popen]:
    """``start(stage, log)``: the ``dvc`` command beside this Python, as its own process."""
    dvc = str(Path(sys.executable).with_name("dvc"))
    if not Path(dvc).exists():
        dvc = "dvc"

    def start(stage: str, log: Path) -> subprocess.Popen:
        with open(log, "w", encoding="utf-8") as handle:
            return subprocess.Popen([dvc, *dvc_arguments(pipeline, stage, force)], cwd=repo_root, env=env,
                                    stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return start


def forked_dvc_starter(pipeline: str, repo_root: Path, env: dict[str, str], force: bool
                       ) -> Callable[[str, Path], "ForkedCommand"]:
    """``start(stage, log)``: the same DVC command run by a forked copy of this process, which has imported DVC
    once (about half a second of each stage's start-up: Python, then DVC's own imports).

    The copy is what ``dvc`` would be: DVC's own ``main`` with the command line, working directory and
    environment the command would have, its output and errors into ``log`` and no input; it exits with DVC's
    status, without running this process's exit handlers (those belong to the runner: its tracking run, its
    temporary folders).
    """
    import importlib

    from dvc.cli import main as dvc_main

    for module in ("dvc.commands.repro", "dvc.repo.reproduce"):   # what `repro` imports as it starts: once, here
        importlib.import_module(module)
    read_locks_plainly()

    def run(stage: str, log: Path) -> int:
        os.chdir(repo_root)
        os.environ.clear()
        os.environ.update(env)
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        nothing = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((nothing, 0), (output, 1), (output, 2)):
            os.dup2(source, target)
        os.close(output)
        os.close(nothing)
        _streams_on_descriptors()
        return dvc_main(dvc_arguments(pipeline, stage, force))

    def start(stage: str, log: Path) -> ForkedCommand:
        return ForkedCommand.fork(lambda: run(stage, log))
    return start


def read_locks_plainly() -> None:
    """Let DVC (in this process and its forks) read ``dvc.lock`` plainly when it rewrites it after a stage.

    DVC reads the lock back in ruamel.yaml's round-trip mode, which keeps comments and styles for a file
    people edit, in pure Python: of a `dvc repro` of a trivial smoke stage (4.1 s on 2 AVX2 cores) it took 1.4 s,
    then 1.0 s to dump it with the stage's entry replaced. DVC writes the lock itself, with no comment or
    style of anyone's to keep, and a plain read (libyaml: 0.25 s) dumps to the same bytes
    (tests/test_parallel_repro.py compares). Left alone where DVC's internals are not the ones this was
    written against; any other file DVC rewrites keeps the round trip.
    """
    from dvc import dvcfile
    from dvc.utils.serialize import _yaml

    round_trip = _yaml.modify_yaml
    if dvcfile.modify_yaml is not round_trip or not hasattr(_yaml, "_modify_data"):
        return

    def modify_yaml(path, fs=None):
        if os.path.basename(os.fspath(path)) != "dvc.lock":
            return round_trip(path, fs=fs)
        return _yaml._modify_data(path, _yaml.parse_yaml, _yaml._dump, fs=fs)

    dvcfile.modify_yaml = modify_yaml


def _streams_on_descriptors() -> None:
    """Python's standard streams, DVC's log handlers and its consoles anew on descriptors 0, 1 and 2, as a new
    ``dvc`` process would have them (the runner's may be other objects, or a terminal that colours)."""
    import logging

    import dvc.logger
    from dvc.ui import ui

    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    for name in ("dvc", "dvc_objects", "dvc_data"):
        logging.getLogger(name).handlers.clear()
    # The runner's own handlers (its console) would also print what DVC logs, its errors with their traceback:
    # a new process has none.
    logging.root.handlers.clear()
    dvc.logger.setup()
    for console in ("rich_console", "error_console"):
        ui.__dict__.pop(console, None)


class ForkedCommand:
    """A forked copy of this process that runs one function and exits with its status: the part of
    :class:`subprocess.Popen` that :func:`run_stages` uses (``poll``, ``wait``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def fork(cls, function: Callable[[], int]) -> "ForkedCommand":
        for stream in (sys.stdout, sys.stderr):
            stream.flush()                 # else the copy writes this process's buffered lines again
        pid = os.fork()
        if pid:
            return cls(pid)
        status = 1
        try:
            status = function()
        except SystemExit as exit_:
            status = exit_status(exit_.code)
        except BaseException:              # noqa: BLE001 - the copy must never go back into the runner's loop
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(status if isinstance(status, int) and 0 <= status < 256 else 1)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def shown_output(output: str) -> str:
    """A stage's DVC output as printed: without the lock-waiting notices, trailing blank lines dropped."""
    lines = [line for line in output.splitlines() if _LOCK_WAIT not in line]
    return "\n".join(lines).rstrip()
