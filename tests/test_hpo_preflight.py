"""Bad input to `qac hpo` ends in one paragraph, before a study, journal, MLflow run or worker exists.

Each case names what is wrong where the user wrote it (the params file and
line, the parameter key, the command-line option or the storage) and leaves
nothing behind: no study folder, no journal, no params copy, no report.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from qac.config import render_profile, write_params
from qac.params.yaml_io import key_lines

from hpo_stand_in import stand_in_study

REPO = Path(__file__).resolve().parent.parent
N_TRAIN_QUERIES = 10


def write_trial_inputs(root: Path) -> None:
    """The trial job's inputs under ``root`` (data/smoke): a prepared dataset of 10 judged training queries,
    and stand-ins for the other files, which the checks here only need to exist."""
    from qac.data.dataset import Dataset, Document
    from qac.data.prepared import write_prepared

    corpus = {f"d{i}": Document(f"d{i}", "", f"document number {i}") for i in range(N_TRAIN_QUERIES)}
    queries = {f"q{i}": f"query number {i}" for i in range(N_TRAIN_QUERIES)}
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(N_TRAIN_QUERIES)}
    write_prepared(Dataset("scifact", corpus, queries, {"train": qrels}, meta={"rel_threshold": {"train": 1}}),
                   root / "datasets" / "scifact")
    for path in (root / "bm25" / "negatives.jsonl", root / "passages.arrow", root / "queries.arrow"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def smoke_params_file(tmp_path: Path, inputs: bool = True, **hpo) -> Path:
    """The smoke profile's params with data under ``tmp_path/data`` (trial inputs there unless not
    ``inputs``) and reports under ``tmp_path/reports``; ``hpo`` sets hpo keys."""
    params = render_profile("smoke")
    params["data_dir"] = str(tmp_path / "data")
    params["hpo"]["report_dir"] = str(tmp_path / "reports")
    params["hpo"].update(hpo)
    if inputs:
        write_trial_inputs(tmp_path / "data" / "smoke")
    path = tmp_path / "params.yaml"
    write_params(params, path)
    return path


def line_of(path: Path, key: str) -> int:
    return key_lines(path.read_text())[key]


def assert_nothing_started(tmp_path: Path) -> None:
    assert not (tmp_path / "data" / "smoke" / "hpo").exists(), "a study folder was created"
    assert not (tmp_path / "reports").exists(), "a report was written"


def paragraph(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- 1. search-space values the searched key does not take ------------------------------------------

@pytest.mark.parametrize("key, entry, message", [
    ("finetune.lr", {"type": "categorical", "choices": ["abc", "def"]},
     "choice 'abc' is not a value finetune.lr takes (expected a number, found 'abc')"),
    ("pretrain.cotmae_decoder", {"type": "categorical", "choices": ["paper", "bogus"]},
     "choice 'bogus' is not a value pretrain.cotmae_decoder takes (expected one of 'paper' or 'release'"),
    ("pretrain.dropout", {"type": "float", "low": 0.1, "high": 1.5},
     "'high' (1.5) is not a value pretrain.dropout takes (must be < 1, found 1.5)"),
    ("finetune.epochs", {"type": "int", "low": 0, "high": 3},
     "'low' (0) is not a value finetune.epochs takes (must be >= 1, found 0)"),
])
def test_a_space_value_its_key_does_not_take_is_refused_before_the_study(tmp_path, capsys, key, entry, message):
    from qac.cli import main

    path = smoke_params_file(tmp_path, space={"pretrain.lr": {"type": "float", "low": 1e-5, "high": 1e-3},
                                              key: entry})
    assert main(["hpo", "--params", str(path)]) == 2
    err = paragraph(capsys.readouterr().err)
    assert f"{path}:{line_of(path, f'hpo.space.{key}')}: parameter hpo.space.{key}: {message}" in err
    assert_nothing_started(tmp_path)


def test_the_study_s_own_settings_cannot_be_searched(tmp_path, capsys):
    from qac.cli import main

    path = smoke_params_file(tmp_path, space={"hpo.n_trials": {"type": "int", "low": 1, "high": 4}})
    assert main(["hpo", "--params", str(path)]) == 2
    err = paragraph(capsys.readouterr().err)
    assert f"{path}:{line_of(path, 'hpo.space.hpo.n_trials')}: parameter hpo.space.hpo.n_trials: the study's own " \
           "settings (hpo.*) cannot be searched" in err
    assert_nothing_started(tmp_path)


# --- 2. dev queries the training queries cannot spare; a run whose every trial failed -------------------

def test_more_dev_queries_than_the_training_queries_spare_is_refused_before_the_study(tmp_path, capsys):
    from qac.cli import main

    path = smoke_params_file(tmp_path, dev={"queries": N_TRAIN_QUERIES - 1, "max_documents": None})
    assert main(["hpo", "--params", str(path)]) == 2
    err = paragraph(capsys.readouterr().err)
    assert (f"{path}:{line_of(path, 'hpo.dev.queries')}: parameter hpo.dev.queries: 9 dev queries, but the train "
            f"split of {tmp_path / 'data' / 'smoke' / 'datasets' / 'scifact'} has only 10 queries with a relevant "
            "document and fine-tuning keeps at least 2: at most 8") in err
    assert_nothing_started(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_run_whose_every_trial_failed_exits_non_zero_and_says_so_last(tmp_path, mlflow_store):
    job = tmp_path / "failing_job.py"
    job.write_text("import sys\nsys.exit(3)\n")
    params_path = stand_in_study(tmp_path, "all-fail", hang_when="False", hang_seconds=0,
                                 job=str(job), n_trials=2, retry_failed=0)
    result = subprocess.run([sys.executable, "-m", "qac.cli", "hpo", "--params", str(params_path)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=150)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert result.stdout.strip().splitlines()[-1].startswith(
        "error: every trial of this run failed (2 of 2); trial 0: trial job exited with status 3"), output
    assert "Traceback" not in output


# --- 3. a storage that is not an Optuna journal -----------------------------------------------------------

def _damaged_journal(path: Path) -> None:
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    optuna.create_study(study_name="other", storage=storage).add_trial(
        optuna.trial.create_trial(value=1.0))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "not a record\n" + "".join(lines[1:]))


@pytest.mark.parametrize("make, problem", [
    (lambda path: path.write_text("# notes\nnot a journal\n"), "is not an Optuna journal (its first line is no "
                                                              "journal record)"),
    (lambda path: path.write_text("just one line"), "is not an Optuna journal"),
    (lambda path: path.mkdir(), "is a folder, not a journal file"),
    (_damaged_journal, "is damaged: line 2 of"),
])
def test_a_storage_that_is_no_journal_is_one_paragraph_and_stays_as_it_was(tmp_path, capsys, make, problem):
    from qac.cli import main

    params_path = smoke_params_file(tmp_path)
    storage = tmp_path / "storage"
    make(storage)
    before = storage.read_bytes() if storage.is_file() else None
    assert main(["hpo", "--params", str(params_path), "--storage", str(storage)]) == 2
    err = paragraph(capsys.readouterr().err)
    assert f"hpo.storage {storage} {problem}" in err
    assert (storage.read_bytes() if storage.is_file() else None) == before, "the file was written to"
    assert_nothing_started(tmp_path)


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///:memory:"])
@pytest.mark.parametrize("report_only", [False, True])
def test_an_in_memory_database_cannot_hold_a_study(tmp_path, capsys, url, report_only):
    from qac.cli import main

    params_path = smoke_params_file(tmp_path)
    assert main(["hpo", "--params", str(params_path), "--storage", url]
                + (["--report-only"] if report_only else [])) == 2
    err = paragraph(capsys.readouterr().err)
    assert f"hpo.storage {url} is an in-memory SQLite database" in err
    assert_nothing_started(tmp_path)


# --- 4. GPU ids -----------------------------------------------------------------------------------------

def test_gpu_ids_are_indices_or_uuids():
    from qac.hpo.preflight import parse_gpu_ids
    from qac.hpo.study import SettingsError

    assert parse_gpu_ids("") == [] and parse_gpu_ids(" ") == []
    assert parse_gpu_ids("0, 1,12") == ["0", "1", "12"]
    uuid = "GPU-5e3a8c1f-2b4d-4e6f-8a9b-0c1d2e3f4a5b"
    assert parse_gpu_ids(f"{uuid},GPU-5e3a") == [uuid, "GPU-5e3a"]
    for value, bad in (("abc,-1, ,x", "'abc'"), ("0,-1", "'-1'"), ("0,,1", "an empty id"), ("0,1.5", "'1.5'"),
                       ("GPU-xyz", "'GPU-xyz'")):
        with pytest.raises(SettingsError) as error:
            parse_gpu_ids(value)
        assert str(error.value).startswith(f"--gpus {value!r}: {bad} is not a GPU id")


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_the_command_refuses_bad_gpu_ids_before_the_study(tmp_path, capsys, launcher):
    from qac.cli import main

    params_path = smoke_params_file(tmp_path, launcher=launcher, nproc_per_node=1)
    assert main(["hpo", "--params", str(params_path), "--gpus", "abc,-1, ,x"]) == 2
    out = paragraph(capsys.readouterr().out)
    assert out.startswith("error: --gpus 'abc,-1, ,x': 'abc' is not a GPU id")
    assert_nothing_started(tmp_path)


# --- 5. --report-only reads, and only reads ------------------------------------------------------------------

def test_report_only_refuses_a_study_that_does_not_exist_and_names_those_that_do(tmp_path, capsys, mlflow_store):
    import mlflow
    from optuna.storages.journal import JournalFileBackend

    from qac.cli import main

    params_path = smoke_params_file(tmp_path, inputs=False)
    assert main(["hpo", "--params", str(params_path), "--report-only", "--study-name", "nope"]) == 2
    err = paragraph(capsys.readouterr().err)
    assert f"no study 'nope' to report on: its journal {tmp_path / 'data' / 'smoke' / 'hpo' / 'nope' / 'journal.log'} " \
           "does not exist" in err
    assert_nothing_started(tmp_path)

    journal = tmp_path / "data" / "smoke" / "hpo" / "kept" / "journal.log"
    journal.parent.mkdir(parents=True)
    optuna.create_study(study_name="kept", storage=optuna.storages.JournalStorage(JournalFileBackend(str(journal))))
    assert main(["hpo", "--params", str(params_path), "--report-only", "--study-name", "nope"]) == 2
    assert f"{tmp_path / 'data' / 'smoke' / 'hpo'} holds the studies 'kept'" in paragraph(capsys.readouterr().err)

    database = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.create_study(study_name="in-db", storage=database)
    assert main(["hpo", "--params", str(params_path), "--report-only", "--study-name", "nope",
                 "--storage", database]) == 2
    assert f"no study 'nope' to report on in {database} (it holds 'in-db')" in paragraph(capsys.readouterr().err)
    assert sorted(path.name for path in (tmp_path / "data" / "smoke" / "hpo").iterdir()) == ["kept"]
    assert not (tmp_path / "reports").exists()
    client = mlflow.MlflowClient(mlflow_store)
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()]), "an MLflow run was made"


def test_report_only_leaves_the_study_s_params_copy_as_the_study_fixed_it(tmp_path, capsys, mlflow_store):
    from optuna.storages.journal import JournalFileBackend

    from qac.cli import main

    params_path = smoke_params_file(tmp_path, inputs=False, study_name="fixed")
    folder = tmp_path / "data" / "smoke" / "hpo" / "fixed"
    folder.mkdir(parents=True)
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(folder / "journal.log")))
    optuna.create_study(study_name="fixed", storage=storage, direction="maximize").add_trial(
        optuna.trial.create_trial(value=0.5))
    (folder / "params.yaml").write_text("# the params the study started with\n")
    assert main(["hpo", "--params", str(params_path), "--report-only"]) == 0
    assert (folder / "params.yaml").read_text() == "# the params the study started with\n"
    assert (tmp_path / "reports" / "fixed" / "summary.json").exists()
    assert "study fixed: 1 trials (1 complete)" in capsys.readouterr().out


# --- 6. qac hpo stopped by SIGTERM --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_to_the_command_ends_each_worker_in_one_paragraph(tmp_path, mlflow_store):
    """As `timeout` does: SIGTERM to the whole process group, the driver forwarding its own to its workers."""
    params_path = stand_in_study(tmp_path, "stopped", hang_when="True", hang_seconds=120)
    pid_file = tmp_path / "data" / "smoke" / "hpo" / "stopped" / "trials" / "0000" / "job.pid"
    driver = subprocess.Popen([sys.executable, "-m", "qac.cli", "hpo", "--params", str(params_path)], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and driver.poll() is None, "trial 0 did not start its job"
            time.sleep(0.2)
        os.killpg(driver.pid, signal.SIGTERM)
        output, _ = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "qac hpo worker: error: terminated (SIGTERM" in output
    from optuna.storages.journal import JournalFileBackend

    journal = pid_file.parent.parent.parent / "journal.log"
    trial = optuna.load_study(study_name="stopped", storage=optuna.storages.JournalStorage(
        JournalFileBackend(str(journal)))).trials[0]
    assert trial.state == TrialState.FAIL
