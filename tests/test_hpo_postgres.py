"""`qac hpo` on a real PostgreSQL server, with workers on two machines, one of which is lost mid-trial.

The two machines are two `qac hpo --workers 1` drivers on this one, the second
started in a UTS namespace of its own (``unshare --uts``) under the host name
``qac-node-b``: its trials carry that host, so the first machine cannot look
its worker up by pid, exactly as across real machines. The second machine is
then killed outright (driver and worker, SIGKILL) while its trial runs. Only
Optuna's heartbeat can tell: after ``hpo.grace_period`` seconds of silence the
trial is failed and the stale-trial callback queues a retry with the same
parameters, which the first machine runs; the study completes its budget.

The trials run the stand-in job of tests/hpo_stand_in.py (a fixed score
of the learning rate); a job on ``qac-node-b`` hangs.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hpo_stand_in import stand_in_study

REPO = Path(__file__).resolve().parent.parent
LOST_HOST = "qac-node-b"


def _own_host_name_possible() -> str | None:
    """Why a process cannot get a host name of its own here, or None when it can."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not found"
    probe = subprocess.run(["unshare", "--uts", "hostname", LOST_HOST], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare --uts` is refused ({probe.stderr.strip()}): it needs root or CAP_SYS_ADMIN"
    return None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_lost_machine_is_noticed_by_heartbeat_and_its_trial_retried(postgres_url, tmp_path, mlflow_store):
    missing = _own_host_name_possible()
    if missing:
        pytest.skip(f"the second machine needs a host name of its own: {missing}")
    password = postgres_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    study_name = f"pg-{tmp_path.name[-12:]}-{os.getpid()}"
    params_path = stand_in_study(tmp_path, study_name, hang_when=f"socket.gethostname() == {LOST_HOST!r}",
                                 hang_seconds=300, heartbeat_interval=1, grace_period=4)
    command = [sys.executable, "-m", "qac.cli", "hpo", "--params", str(params_path), "--workers", "1",
               "--storage", postgres_url]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    storage = optuna.storages.RDBStorage(postgres_url)

    lost_machine = subprocess.Popen(["unshare", "--uts", "sh", "-c", f'hostname {LOST_HOST} && exec "$@"', "sh",
                                     *command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
    machine = None
    try:
        # Once the lost machine's trial runs its job, start the other machine, then kill the lost one.
        trials_dir = tmp_path / "data" / "smoke" / "hpo" / study_name / "trials"
        deadline = time.monotonic() + 120
        while not any((d / "host").exists() and (d / "host").read_text() == LOST_HOST
                      for d in (trials_dir.iterdir() if trials_dir.exists() else [])):
            assert time.monotonic() < deadline and lost_machine.poll() is None, "the lost machine started no job"
            time.sleep(0.2)
        machine = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        study = optuna.load_study(study_name=study_name, storage=storage)
        victim = next(t for t in study.get_trials() if t.state == TrialState.RUNNING
                      and t.user_attrs.get("qac.worker", {}).get("host") == LOST_HOST)
        os.kill(lost_machine.pid, signal.SIGKILL)             # the driver first: it would fail the trial itself
        os.kill(victim.user_attrs["qac.worker"]["pid"], signal.SIGKILL)
        lost_output = lost_machine.communicate(timeout=30)[0]
        output, _ = machine.communicate(timeout=240)
    finally:
        for process in (lost_machine, machine):
            if process is not None and process.poll() is None:
                process.kill()
    assert machine.returncode == 0, output

    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials()
    by_number = {trial.number: trial for trial in trials}
    lost = by_number[victim.number]
    assert lost.state == TrialState.FAIL
    assert "qac.fail_reason" not in lost.user_attrs, "failed by its silence, not by a pid check"
    retries = [trial for trial in trials if trial.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1, "the lost trial is retried exactly once"
    assert retries[0].state == TrialState.COMPLETE and retries[0].params == victim.params
    others = [trial for trial in trials if trial.number != victim.number]
    assert [trial.state for trial in others] == [TrialState.COMPLETE] * 4, "the budget of 4 is met"
    for trial in others:
        assert trial.user_attrs["qac.worker"]["host"] != LOST_HOST
        assert trial.value == pytest.approx(-(math.log10(trial.params["pretrain.lr"]) + 4) ** 2)

    import mlflow

    client = mlflow.MlflowClient(mlflow_store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parent = [run for run in runs if run.info.run_name == f"hpo/{study_name}"]
    assert len(parent) == 1 and parent[0].data.tags["qac.hpo.storage"] == "database"
    children = {run.data.tags["qac.trial"]: run for run in runs
                if run.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert set(children) == {str(trial.number) for trial in trials}
    assert children[str(victim.number)].info.status == "FAILED"
    assert children[str(victim.number)].data.tags["qac.trial_state"] == "failed"
    assert children[str(retries[0].number)].data.tags["qac.retry_of"] == str(victim.number)
    assert all(run.info.status == "FINISHED" for number, run in children.items() if number != str(victim.number))

    # The database password is nowhere: consoles, the study's params copy, reports, MLflow params and tags.
    assert parent[0].data.params["hpo.storage"].startswith("postgresql+psycopg2://***@127.0.0.1:")
    written = [output, lost_output, (tmp_path / "data" / "smoke" / "hpo" / study_name / "params.yaml").read_text()]
    written += [path.read_text() for path in (tmp_path / "reports").rglob("*") if path.suffix in (".json", ".md")]
    for run in runs:
        written += [*map(str, run.data.params.values()), *map(str, run.data.tags.values())]
    assert not [text for text in written if password in text]


def test_a_machine_without_the_server_binaries_is_told_which_are_missing(monkeypatch):
    import postgres_server

    monkeypatch.setattr(postgres_server.shutil, "which", lambda name: None)
    monkeypatch.setattr(postgres_server.glob, "glob", lambda pattern: [])
    with pytest.raises(postgres_server.Unavailable, match=r"initdb, pg_ctl, postgres\) not found .*apt-get install postgresql"):
        postgres_server.find_bindir()


def test_as_root_the_server_runs_as_an_unprivileged_user_or_says_why_not(monkeypatch):
    import postgres_server

    monkeypatch.setattr(postgres_server.os, "geteuid", lambda: 0)
    users = {"postgres", "nobody"}

    def lookup(name):
        if name not in users:
            raise KeyError(name)
        return name

    monkeypatch.setattr(postgres_server.pwd, "getpwnam", lookup)
    assert postgres_server._server_user() == "postgres"
    users.discard("postgres")
    assert postgres_server._server_user() == "nobody"
    users.clear()
    with pytest.raises(postgres_server.Unavailable, match="PostgreSQL refuses root: no 'postgres' or 'nobody' user"):
        postgres_server._server_user()
    monkeypatch.setattr(postgres_server.os, "geteuid", lambda: 1000)
    assert postgres_server._server_user() is None
