"""The pieces of `qac hpo`: settings, GPU slots, the trial budget, recovery of dead workers,
the job protocol and process handling, the dev split and the report."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from qac.config import render_profile
from qac.params import ParamsError, validate_params
from qac.hpo.study_report import study_summary, write_study_report
from qac.hpo.study import (WORKER_ATTR, HpoSettings, SettingsError, counted_trials, fail_orphaned_trials,
                           has_work, make_pruner, retry_trial)
from qac.hpo.trial_job import carve_dev_queries, parse_event, split_train_dev
from qac.hpo.worker import TrialJobFailed, gpu_slots, job_command, run_job

optuna.logging.set_verbosity(optuna.logging.WARNING)


def smoke_settings(**hpo) -> HpoSettings:
    params = render_profile("smoke")
    params["hpo"].update(hpo)
    return HpoSettings.from_params(params)


# --- settings -------------------------------------------------------------------------

def test_the_smoke_profile_declares_a_usable_study():
    settings = smoke_settings()
    assert settings.study_name == "smoke-cocondenser-query-q4"
    assert settings.n_trials == 4 and settings.direction == "maximize" and settings.seed == 42
    assert [d.key for d in settings.dimensions] == ["pretrain.lr", "pretrain.warmup_ratio", "pretrain.query_count",
                                                    "pretrain.temperature"]
    pruner = make_pruner(settings)
    assert isinstance(pruner, optuna.pruners.MedianPruner)
    assert isinstance(make_pruner(smoke_settings(pruner={"type": "hyperband", "min_resource": 2})),
                      optuna.pruners.HyperbandPruner)
    assert isinstance(make_pruner(smoke_settings(pruner={"type": "none"})), optuna.pruners.NopPruner)


@pytest.mark.parametrize("override, message", [
    ({"variant": None}, "parameter hpo.variant: expected a string, found None"),
    ({"variant": "nope"}, "parameter hpo.variant: 'nope' is not a key of pretrain.variants"),
    ({"pruner": {"type": "sha"}}, "parameter hpo.pruner.type: expected one of 'median', 'hyperband' or 'none'"),
    ({"direction": "up"}, "parameter hpo.direction: expected one of 'maximize' or 'minimize'"),
    ({"n_trials": 0}, "parameter hpo.n_trials: must be >= 1, found 0"),
    ({"launcher": "mpirun"}, "parameter hpo.launcher: expected one of 'python' or 'torchrun'"),
    ({"dev": {"queries": 0, "max_documents": None}}, "parameter hpo.dev.queries: must be >= 1, found 0"),
    ({"trial_timeout": -1}, "parameter hpo.trial_timeout: must be > 0"),
    ({"metric": "MRR@10"}, "parameter hpo.metric: unknown measure 'MRR@10'"),
    ({"space": {"pretrain.lr": {"type": "float", "low": 1, "high": 0}}}, "hpo.space.pretrain.lr: 'low' (1) is above"),
])
def test_bad_settings_fail_with_the_key_named(override, message):
    """The study's settings are the schema's: a bad one stops the study when its params are read."""
    params = render_profile("smoke")
    params["hpo"].update(override)
    with pytest.raises(ParamsError) as error:
        validate_params(params, "params.yaml")
    assert message in str(error.value)
    assert str(error.value).startswith("params.yaml")


def test_the_command_refuses_bad_settings_before_starting_anything(tmp_path, capsys):
    from qac.cli import main
    from qac.config import write_params

    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["hpo"]["space"]["pretrain.query_count"] = {"type": "int", "low": 1, "high": 9}
    write_params(params, tmp_path / "params.yaml")
    assert main(["hpo", "--params", str(tmp_path / "params.yaml")]) == 2
    # The params schema refuses it when the file is read (qac.params), as one paragraph on stderr.
    assert "hpo.space.pretrain.query_count: 'high' (9) exceeds querygen.queries_per_passage (4)" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_the_command_names_missing_inputs_and_the_stage_that_writes_them(tmp_path, capsys):
    from qac.cli import main
    from qac.config import write_params

    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    write_params(params, tmp_path / "params.yaml")
    assert main(["hpo", "--params", str(tmp_path / "params.yaml")]) == 2
    out = capsys.readouterr().out
    root = tmp_path / "data" / "smoke"
    for path, stage in ((root / "datasets" / "scifact", "prepare@scifact"), (root / "bm25" / "negatives.jsonl", "bm25"),
                        (root / "passages.arrow", "split_passages"), (root / "queries.arrow", "generate_queries")):
        assert f"  {path}: missing (written by the DVC stage {stage}" in out


@pytest.mark.parametrize("storage, reason", [
    ("postgresql+psycopg2://qac:s3cret@127.0.0.1:{port}/optuna", "cannot be reached"),
    ("postgresql+nosuchdriver://qac:s3cret@127.0.0.1:{port}/optuna", "not a database URL SQLAlchemy can use"),
    ("sqlite:///{tmp}/no-such-folder/study.db", "cannot be reached"),
])
def test_a_study_database_that_cannot_be_used_is_one_paragraph_within_seconds(tmp_path, capsys, storage, reason):
    """Optuna's engine would retry a database for minutes, or end a missing driver in a traceback."""
    import socket

    from test_hpo_preflight import write_trial_inputs

    from qac.cli import main
    from qac.config import write_params

    with socket.socket() as probe:     # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    root = tmp_path / "data" / "smoke"
    write_trial_inputs(root)      # inputs in place, so the storage is what stops the command
    write_params(params, tmp_path / "params.yaml")
    started = time.monotonic()
    code = main(["hpo", "--params", str(tmp_path / "params.yaml"),
                 "--storage", storage.format(port=port, tmp=tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - started < 30, err
    assert "hpo.storage " in err and reason in err and "s3cret" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1 and "Traceback" not in err
    assert not (root / "hpo").exists() or not any((root / "hpo").rglob("trial-*"))


def test_a_bad_pruner_option_names_the_pruner():
    with pytest.raises(SettingsError, match="hpo.pruner: bad option for the median pruner"):
        make_pruner(smoke_settings(pruner={"type": "median", "n_startup": 1}))


# --- GPU slots and job commands ----------------------------------------------------------

def test_gpus_are_dealt_out_in_equal_groups_or_shared_round_robin():
    assert gpu_slots([], 3) == [None, None, None]
    assert gpu_slots(["0", "1"], 2) == ["0", "1"]
    assert gpu_slots(["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    assert gpu_slots(["0", "1", "2"], 2) == ["0", "1"]          # the remainder stays idle
    assert gpu_slots(["0", "1"], 3) == ["0", "1", "0"]
    with pytest.raises(ValueError, match="--workers must be at least 1"):
        gpu_slots(["0"], 0)


def test_a_torchrun_trial_needs_as_many_gpus_in_its_slot_as_processes():
    from qac.cli.hpo_command import check_gpus

    settings = smoke_settings(launcher="torchrun", nproc_per_node=2)
    check_gpus(["0", "1", "2", "3"], 2, settings)
    check_gpus([], 2, settings)                        # no pinning: nothing to check
    with pytest.raises(SettingsError, match="gives each of 2 workers only 1"):
        check_gpus(["0", "1"], 2, settings)


def test_job_commands_for_each_launcher(tmp_path):
    params, out = tmp_path / "p.yaml", tmp_path / "t"
    assert job_command(smoke_settings(), params, out) == [
        sys.executable, "-m", "qac.cli.hpo_trial_command", "--params", str(params), "--out", str(out)]
    assert job_command(smoke_settings(launcher="torchrun", nproc_per_node=2), params, out) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "qac.cli.hpo_trial_command", "--params", str(params), "--out", str(out)]
    assert job_command(smoke_settings(job="jobs/score.py"), params, out)[1:3] == ["jobs/score.py", "--params"]


# --- budget and retries ----------------------------------------------------------------

def _add(study, state, value=None, **system_attrs):
    study.add_trial(create_trial(state=state, value=value, params={"x": 0.5},
                                 distributions={"x": FloatDistribution(0, 1)}, system_attrs=system_attrs))


def test_a_failed_trial_that_is_retried_does_not_use_the_budget():
    study = optuna.create_study()
    _add(study, TrialState.COMPLETE, 1.0)
    _add(study, TrialState.FAIL)
    assert counted_trials(study) == 2 and has_work(study, 3) and not has_work(study, 2)
    assert retry_trial(study, study.trials[1], max_retry=1)
    retry = study.trials[2]
    assert retry.state == TrialState.WAITING and retry.params == {"x": 0.5}
    assert retry.system_attrs == {"failed_trial": 1, "retry_history": [1]}
    assert counted_trials(study) == 2
    assert has_work(study, 2), "a queued retry is work even when the budget is used"


def test_retries_stop_after_max_retry_and_keep_the_first_trial_of_the_chain():
    study = optuna.create_study()
    _add(study, TrialState.FAIL)
    _add(study, TrialState.FAIL, failed_trial=0, retry_history=[0])
    assert not retry_trial(study, study.trials[1], max_retry=1)
    assert retry_trial(study, study.trials[1], max_retry=2)
    assert study.trials[2].system_attrs == {"failed_trial": 0, "retry_history": [0, 1]}


def _dead_pid_owner() -> dict:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(process.pid).create_time()
    process.wait()
    return {"host": os.uname().nodename, "pid": process.pid, "started": started}


def test_trials_of_dead_workers_fail_once_and_are_queued_again(tmp_path):
    from optuna.storages.journal import JournalFileBackend

    import socket

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "journal.log")))
    study = optuna.create_study(study_name="s", storage=storage)
    me = psutil.Process()
    owners = {
        "dead": {**_dead_pid_owner(), "host": socket.gethostname()},
        "alive": {"host": socket.gethostname(), "pid": os.getpid(), "started": me.create_time()},
        "reused pid": {"host": socket.gethostname(), "pid": os.getpid(), "started": me.create_time() - 100},
        "elsewhere": {"host": "another-machine", "pid": 1, "started": 0.0},
    }
    numbers = {}
    for name, owner in owners.items():
        trial = study.ask({"x": FloatDistribution(0, 1)})
        trial.set_user_attr(WORKER_ATTR, owner)
        numbers[name] = trial.number

    settings = smoke_settings(retry_failed=1)
    failed = fail_orphaned_trials(study, settings)
    assert sorted(failed) == sorted([numbers["dead"], numbers["reused pid"]])
    assert fail_orphaned_trials(study, settings) == [], "a failed trial is not failed (or retried) twice"
    states = {name: study.trials[n].state for name, n in numbers.items()}
    assert states == {"dead": TrialState.FAIL, "alive": TrialState.RUNNING, "reused pid": TrialState.FAIL,
                      "elsewhere": TrialState.RUNNING}
    retries = [t for t in study.trials if t.state == TrialState.WAITING]
    assert sorted(t.system_attrs["failed_trial"] for t in retries) == sorted(failed)
    for retry in retries:
        original = study.trials[retry.system_attrs["failed_trial"]]
        assert retry.params == original.params
        assert WORKER_ATTR not in retry.user_attrs, "the copy does not claim the dead worker"
    assert study.trials[numbers["dead"]].user_attrs["qac.fail_reason"] == "worker process died"


def test_a_database_storage_fails_silent_trials_by_heartbeat_and_queues_the_same_retry(tmp_path):
    from qac.hpo.study import make_storage, open_study

    params = render_profile("smoke")
    params["hpo"].update(storage=f"sqlite:///{tmp_path / 'hpo.db'}", heartbeat_interval=1, grace_period=1)
    settings = HpoSettings.from_params(params)
    assert isinstance(make_storage(settings.storage, settings), optuna.storages.RDBStorage)
    study = open_study(params, settings)
    trial = study.ask({"x": FloatDistribution(0, 1)})
    study._storage.record_heartbeat(trial._trial_id)   # what a worker's heartbeat thread does
    time.sleep(2.5)                                    # ...and then nothing: the worker is gone
    optuna.storages.fail_stale_trials(study)
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.WAITING]
    assert study.trials[1].params == trial.params
    assert study.trials[1].system_attrs == {"failed_trial": 0, "retry_history": [0]}


# --- the job protocol and process handling ---------------------------------------------------

def test_event_lines_are_parsed_and_other_lines_are_log_output():
    assert parse_event("pretrain step 3: loss 2.0\n") is None
    assert parse_event('@qac-hpo {"kind": "intermediate", "step": 4, "value": 0.5}\n') == {
        "kind": "intermediate", "step": 4, "value": 0.5}
    for bad in ('@qac-hpo {"kind": "intermediate", "value": 0.5}', '@qac-hpo {"kind": "other", "value": 1}',
                '@qac-hpo {"kind": "result", "value": "high"}', "@qac-hpo {not json",
                '@qac-hpo {"kind": "intermediate", "step": 1, "value": NaN}'):
        with pytest.raises(ValueError):
            parse_event(bad)


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "job.py"
    path.write_text("import os, subprocess, sys, time\nfrom qac.hpo.trial_job import emit_event\n"
                    + textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_pruning_kills_the_job_and_everything_it_started(tmp_path):
    command = _script(tmp_path, """
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("child", child.pid, flush=True)
        for step in range(100):
            emit_event("intermediate", step=step, value=1.0 / (step + 1))
            time.sleep(0.05)
        emit_event("result", value=0.0)
    """)
    seen = []

    def on_intermediate(step, value):
        seen.append((step, value))
        return step == 2

    outcome = run_job(command, env=os.environ, log_path=tmp_path / "job.log", on_intermediate=on_intermediate)
    assert outcome is None
    assert seen == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    child = int((tmp_path / "job.log").read_text().split("child ")[1].split()[0])
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the job's child survived pruning"
        time.sleep(0.1)


@pytest.mark.parametrize("body, message", [
    ("sys.exit(3)", "trial job exited with status 3"),
    ("print('no events')", "ended without a result line"),
    ("print('@qac-hpo {oops', flush=True); time.sleep(30)", "malformed trial event"),
    ("time.sleep(30)", "ran past hpo.trial_timeout (1 s)"),
])
def test_a_job_without_a_result_fails_the_trial(tmp_path, body, message):
    with pytest.raises(TrialJobFailed, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_job(_script(tmp_path, body), env=os.environ, log_path=tmp_path / "job.log",
                on_intermediate=lambda step, value: False, timeout=1.0)


def test_a_result_comes_back_with_its_metrics(tmp_path):
    command = _script(tmp_path, """
        emit_event("intermediate", step=5, value=0.25)
        emit_event("result", value=0.5, metrics={"RR@10": 0.4})
    """)
    outcome = run_job(command, env=os.environ, log_path=tmp_path / "job.log",
                      on_intermediate=lambda step, value: False)
    assert (outcome.value, outcome.metrics) == (0.5, {"RR@10": 0.4})


# --- the dev split ---------------------------------------------------------------------------

def test_dev_queries_are_the_smallest_seeded_hashes_among_queries_with_a_relevant_document():
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(20)}
    qrels["q_unjudged"] = {"d0": 0}
    dev = carve_dev_queries(qrels, 5, seed=42)
    expected = sorted(sorted((q for q in qrels if q != "q_unjudged"),
                             key=lambda q: hashlib.md5(f"42:{q}".encode()).hexdigest())[:5])
    assert dev == expected
    assert carve_dev_queries(dict(reversed(qrels.items())), 5, seed=42) == dev, "file order does not matter"
    assert carve_dev_queries(qrels, 5, seed=7) != dev
    grown = carve_dev_queries({**qrels, "q_new": {"d1": 1}}, 5, seed=42)
    assert set(grown) - {"q_new"} <= set(dev), "a new query can only displace, never move others in"
    train, dev_qrels = split_train_dev(qrels, dev)
    assert set(train) | set(dev_qrels) == set(qrels) and not set(train) & set(dev_qrels)
    with pytest.raises(ValueError, match="only 20 queries with a relevant document"):
        carve_dev_queries(qrels, 19, seed=42)


def test_a_dev_pool_keeps_judged_documents_then_hard_negatives_then_a_sample():
    from qac.hpo.trial_job import dev_corpus_ids

    corpus = [f"d{i}" for i in range(10)]
    dev_qrels = {"q1": {"d7": 1, "d2": 0}, "q2": {"d9": 2}}
    negatives = {"q1": ["d5", "d3"], "q2": ["d3", "d0"], "q_train": ["d1"]}
    assert dev_corpus_ids(corpus, dev_qrels, negatives, None, seed=1) == corpus
    assert dev_corpus_ids(corpus, dev_qrels, negatives, 10, seed=1) == corpus
    assert dev_corpus_ids(corpus, dev_qrels, negatives, 3, seed=1) == ["d2", "d7", "d9"]
    assert dev_corpus_ids(corpus, dev_qrels, negatives, 5, seed=1) == ["d2", "d3", "d5", "d7", "d9"]
    assert dev_corpus_ids(corpus, dev_qrels, negatives, 6, seed=1) == ["d0", "d2", "d3", "d5", "d7", "d9"]
    pool = dev_corpus_ids(corpus, dev_qrels, negatives, 8, seed=1)
    assert len(pool) == 8 and {"d0", "d2", "d3", "d5", "d7", "d9"} < set(pool) and pool == sorted(pool, key=corpus.index)
    assert dev_corpus_ids(corpus, dev_qrels, negatives, 8, seed=1) == pool


# --- the report ------------------------------------------------------------------------------

def test_the_report_names_the_best_trial_and_explains_missing_figures(tmp_path):
    study = optuna.create_study(direction="maximize", study_name="r")
    summary = write_study_report(study, "nDCG@10", tmp_path / "empty")
    assert summary["best"] is None and summary["trials"] == 0
    assert summary["figures"]["optimization_history"] == "no complete trial"
    assert "No trial has completed yet." in (tmp_path / "empty" / "summary.md").read_text()

    for x, value in ((0.1, 0.2), (0.5, 0.9), (0.9, 0.4), (0.3, 0.5)):
        study.add_trial(create_trial(value=value, params={"x": x}, distributions={"x": FloatDistribution(0, 1)},
                                     intermediate_values={1: value / 2, 2: value}))
    _add(study, TrialState.PRUNED)
    summary = write_study_report(study, "nDCG@10", tmp_path / "full")
    assert summary["best"]["number"] == 1 and summary["best"]["params"] == {"x": 0.5}
    assert summary["best"]["value"] == 0.9
    assert summary["states"]["complete"] == 4 and summary["states"]["pruned"] == 1
    assert set(summary["figures"].values()) == {"written"}
    for name in ("optimization_history", "intermediate_values", "param_importances"):
        assert (tmp_path / "full" / f"{name}.png").stat().st_size > 1000
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["best"]["number"] == 1
    assert summary["best"]["tied_with"] == [] and "Best: trial 1" in (tmp_path / "full" / "summary.md").read_text()
    assert study_summary(study, "nDCG@10")["states"]["pruned"] == 1


def test_tied_trials_are_reported_as_a_tie_without_importances(tmp_path):
    """Four trials with the same dev score: no trial is called best, and no importance is drawn."""
    study = optuna.create_study(direction="maximize", study_name="tied")
    for x in (0.1, 0.5, 0.9, 0.3):
        study.add_trial(create_trial(value=0.25, params={"x": x}, distributions={"x": FloatDistribution(0, 1)}))
    study.add_trial(create_trial(value=0.125, params={"x": 0.7}, distributions={"x": FloatDistribution(0, 1)}))
    summary = write_study_report(study, "nDCG@10", tmp_path / "tied")
    assert [summary["best"]["number"], *summary["best"]["tied_with"]] == [0, 1, 2, 3]
    text = (tmp_path / "tied" / "summary.md").read_text()
    assert "Tie: trials 0, 1, 2, 3 all reach nDCG@10 = 0.2500; none is better." in text and "Best:" not in text
    assert summary["figures"]["param_importances"] == "written"   # values differ: trial 4 is worse

    flat = optuna.create_study(direction="maximize", study_name="flat")
    for x in (0.1, 0.5, 0.9):
        flat.add_trial(create_trial(value=0.25, params={"x": x}, distributions={"x": FloatDistribution(0, 1)}))
    summary = write_study_report(flat, "nDCG@10", tmp_path / "flat")
    assert summary["figures"]["param_importances"].endswith("values all tie")
    assert not (tmp_path / "flat" / "param_importances.png").exists()
