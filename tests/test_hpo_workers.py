"""Several workers on one journal: a worker killed with SIGKILL fails its trial, which is retried.

The trials here run a small stand-in job (a script that scores the trial's
learning rate with a fixed formula and sleeps between reports) so that the
test is about the driver: process handling, storage consistency, retries,
MLflow bookkeeping. tests/test_hpo_smoke.py runs real training jobs.
"""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from optuna.trial import TrialState

from hpo_stand_in import stand_in_study

REPO = Path(__file__).resolve().parent.parent


def _load(journal: Path) -> optuna.Study:
    from optuna.storages.journal import JournalFileBackend

    return optuna.load_study(study_name="kill-test",
                             storage=optuna.storages.JournalStorage(JournalFileBackend(str(journal))))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_killed_mid_trial_fails_that_trial_and_the_study_goes_on(tmp_path, mlflow_store):
    # The job of trial 1 first waits 60 s: that is the trial whose worker the test kills.
    params_path = stand_in_study(tmp_path, "kill-test", hang_when='Path(args.out).name == "0001"', hang_seconds=60)
    journal = tmp_path / "data" / "smoke" / "hpo" / "kill-test" / "journal.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, "-m", "qac.cli", "hpo", "--params", str(params_path), "--workers", "2"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Wait until trial 1 runs its job, then kill its worker outright.
        pid_file = journal.parent / "trials" / "0001" / "job.pid"
        deadline = time.monotonic() + 90
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and driver.poll() is None, "trial 1 did not start its job"
            time.sleep(0.2)
        victim = _load(journal).trials[1]
        killed_trial, worker_pid, job_pid = 1, victim.user_attrs["qac.worker"]["pid"], int(pid_file.read_text())
        killed_params = victim.params
        os.kill(worker_pid, signal.SIGKILL)
        output, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, output

    # The killed worker's job stopped itself (its stdin pipe closed).
    deadline = time.monotonic() + 10
    while psutil.pid_exists(job_pid) and psutil.Process(job_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the killed worker's job is still running"
        time.sleep(0.2)

    study = _load(journal)  # still loadable
    trials = study.get_trials()
    by_number = {trial.number: trial for trial in trials}
    assert by_number[killed_trial].state == TrialState.FAIL
    assert by_number[killed_trial].user_attrs["qac.fail_reason"] == "worker process died"
    retries = [trial for trial in trials if trial.system_attrs.get("failed_trial") == killed_trial]
    assert len(retries) == 1, "the killed trial is retried exactly once"
    assert retries[0].state == TrialState.COMPLETE and retries[0].params == killed_params
    others = [trial for trial in trials if trial.number != killed_trial]
    assert [trial.state for trial in others] == [TrialState.COMPLETE] * 4, "the budget of 4 is met without the failure"
    for trial in others:
        assert trial.value == pytest.approx(-(math.log10(trial.params["pretrain.lr"]) + 4) ** 2)

    summary = yaml.safe_load((tmp_path / "reports" / "kill-test" / "summary.json").read_text())
    assert summary["states"]["complete"] == 4 and summary["states"]["fail"] == 1
    assert summary["best"]["value"] == max(trial.value for trial in others)

    import mlflow

    client = mlflow.MlflowClient(mlflow_store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parent = [run for run in runs if run.info.run_name == "hpo/kill-test"]
    assert len(parent) == 1
    children = {run.data.tags["qac.trial"]: run for run in runs
                if run.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert set(children) == {str(trial.number) for trial in trials}
    assert children[str(killed_trial)].info.status == "FAILED"
    assert children[str(killed_trial)].data.tags["qac.trial_state"] == "failed"
    retry_run = children[str(retries[0].number)]
    assert retry_run.data.tags["qac.trial_state"] == "complete"
    assert retry_run.data.tags["qac.retry_of"] == str(killed_trial)
    history = client.get_metric_history(retry_run.info.run_id, "dev/nDCG_at_10")
    assert [m.step for m in history] == [0, 1, 2, 3]

    # Running the command again resumes: a larger budget adds one trial, under the same MLflow run.
    again = subprocess.run([sys.executable, "-m", "qac.cli", "hpo", "--params", str(params_path), "--n-trials", "5"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    trials = _load(journal).get_trials()
    assert len(trials) == 6 and trials[-1].state == TrialState.COMPLETE
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [run.info.run_id for run in runs if run.info.run_name == "hpo/kill-test"] == [parent[0].info.run_id]
