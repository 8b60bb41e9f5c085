"""No run left RUNNING: runs of killed processes are swept to KILLED and linked to the run that follows.

A real process opens a stage run and is killed with SIGKILL; the sweep (``qac
runs sweep``, and every stage opening its run) must end that run, leave runs
of live processes and of other hosts alone, and link the next run of the same
stage to it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from qac.params import validate_params
from qac.tracking import stage_run

REPO = Path(__file__).resolve().parent.parent
PARAMS = validate_params({"profile": "smoke", "mlflow": {"experiment": "qac-test", "system_metrics": False}},
                         complete=False)
OPEN_AND_HANG = """
import sys, time
from qac.params import validate_params
from qac.tracking import stage_run
params = validate_params({"profile": "smoke", "mlflow": {"experiment": "qac-test", "system_metrics": False}},
                         complete=False)
with stage_run(params, "finetune@none", "r1 · none", kind="finetune") as run:
    print(run.info.run_id, flush=True)
    time.sleep(600)
"""


def killed_run(tmp_path) -> str:
    """Start a process that opens the run of stage ``finetune@none``, SIGKILL it; returns the run id."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", OPEN_AND_HANG], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    run_id = process.stdout.readline().strip()
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL and len(run_id) == 32
    return run_id


def test_a_killed_stage_run_is_swept_and_linked_to_the_next_run(tmp_path, mlflow_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_id = killed_run(tmp_path)
    client = mlflow.MlflowClient(mlflow_store)
    assert client.get_run(run_id).info.status == "RUNNING"     # nobody ended it

    swept = subprocess.run([sys.executable, "-m", "qac.cli", "runs", "sweep"], cwd=tmp_path, text=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert swept.returncode == 0 and "1 orphaned run(s) ended as KILLED" in swept.stdout, swept.stderr
    killed = client.get_run(run_id)
    assert killed.info.status == "KILLED" and "had ended" in killed.data.tags["qac.swept"]
    assert killed.info.end_time is not None

    with stage_run(PARAMS, "finetune@none", "r1 · none", kind="finetune") as run:
        pass
    after = client.get_run(run.info.run_id)
    assert after.data.tags["qac.replaces_run"] == run_id
    assert client.get_run(run_id).data.tags["qac.continued_by"] == run.info.run_id
    with stage_run(PARAMS, "finetune@none", "r1 · none", kind="finetune") as again:
        pass   # a killed run is continued once: the next run links nothing
    assert "qac.replaces_run" not in client.get_run(again.info.run_id).data.tags


def test_a_stage_opening_its_run_sweeps_too(tmp_path, mlflow_store, monkeypatch):
    """DVC runs a later stage, not the killed one: its run still ends the orphan."""
    monkeypatch.chdir(tmp_path)
    run_id = killed_run(tmp_path)
    with stage_run(PARAMS, "evaluate@none", "r1 eval · none", kind="evaluate") as run:
        assert mlflow.MlflowClient().get_run(run_id).info.status == "KILLED"
        assert "qac.replaces_run" not in mlflow.MlflowClient().get_run(run.info.run_id).data.tags  # another stage


def test_runs_of_live_processes_and_other_hosts_are_left_alone(tmp_path, mlflow_store, monkeypatch):
    from qac.cli.runs_command import sweep_store
    from qac.tracking.interrupted import HOST, PID

    monkeypatch.chdir(tmp_path)
    client = mlflow.MlflowClient(mlflow_store)
    with stage_run(PARAMS, "bm25", "bm25 · baseline", kind="baseline") as live:
        experiment = live.info.experiment_id
        elsewhere = client.create_run(experiment, tags={HOST: socket.gethostname() + "-other", PID: "1"})
        no_process = client.create_run(experiment)   # a run of another program: no process tags
        assert sweep_store(mlflow_store) == []
        assert client.get_run(live.info.run_id).info.status == "RUNNING"
    assert client.get_run(elsewhere.info.run_id).info.status == "RUNNING"
    assert client.get_run(no_process.info.run_id).info.status == "RUNNING"


def test_a_reused_process_id_is_not_the_process_that_started_the_run():
    from qac.tracking.interrupted import process_alive

    now_ms = int(time.time() * 1000)
    assert process_alive(os.getpid(), now_ms)
    assert not process_alive(os.getpid(), 0)   # this process started long after such a run
    assert not process_alive(2 ** 22 + 12345, None)


def test_without_a_store_the_sweep_creates_none(tmp_path, monkeypatch):
    from qac.cli.runs_command import sweep_store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sweep_store() == [] and not (tmp_path / "mlflow.db").exists()
