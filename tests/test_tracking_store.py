"""A tracking store that cannot be used costs seconds and one paragraph, and the work goes on without it."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qac.params import validate_params
from qac.tracking import store
from qac.tracking.store import store_problem

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_answers(monkeypatch):
    """Each test probes afresh (a process keeps its answer)."""
    monkeypatch.setattr(store, "_answers", {})
    monkeypatch.setattr(store, "_printed", set())


def closed_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]    # closed again when the block ends: nothing listens there


def real_store(path: Path) -> Path:
    """An MLflow SQLite store with an experiment and a run, made by MLflow."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{path}")
    experiment = client.create_experiment("probe")
    client.set_terminated(client.create_run(experiment).info.run_id)
    return path


def qac(args: list[str], cwd: Path, uri: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": uri}
    return subprocess.run([sys.executable, "-m", "qac.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_working_sqlite_store_and_one_not_made_yet_have_no_problem(tmp_path):
    assert store_problem(f"sqlite:///{real_store(tmp_path / 'mlflow.db')}") is None
    assert store_problem(f"sqlite:///{tmp_path / 'new.db'}") is None


def damaged(path: Path, how: str) -> Path:
    if how == "random bytes":
        path.write_bytes(os.urandom(8192))
    elif how == "text file":
        path.write_text("not a database\n")
    elif how == "empty tables of another program":
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE notes (text TEXT)")
    elif how == "truncated":
        data = real_store(path).read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif how == "header overwritten":
        data = bytearray(real_store(path).read_bytes())
        data[:100] = os.urandom(100)
        path.write_bytes(bytes(data))
    elif how == "a folder":
        path.mkdir()
    return path


HOW = ["random bytes", "text file", "empty tables of another program", "truncated", "header overwritten", "a folder"]


@pytest.mark.parametrize("how", HOW)
def test_a_damaged_or_foreign_sqlite_file_is_named(tmp_path, how):
    path = damaged(tmp_path / "mlflow.db", how)
    problem = store_problem(f"sqlite:///{path}")
    assert problem is not None and str(path) in problem


@pytest.mark.parametrize("how", ["random bytes", "truncated", "a folder"])
def test_runs_sweep_on_a_damaged_store_says_so_and_succeeds(tmp_path, how):
    """`qac runs sweep` is the first step of `make smoke`: a broken store must not stop the pipeline."""
    path = damaged(tmp_path / "mlflow.db", how)
    before = path.read_bytes() if path.is_file() else None
    result = qac(["runs", "sweep"], tmp_path, f"sqlite:///{path}")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    paragraph = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(paragraph) == 1 and "goes on without it" in paragraph[0]
    assert before is None or path.read_bytes() == before     # the store is reported, never "repaired"


def test_an_unreachable_server_is_reported_within_seconds(tmp_path):
    uri = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    result = qac(["runs", "sweep"], tmp_path, uri)
    assert time.monotonic() - started < 30   # MLflow's own retries take minutes
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "cannot be reached" in result.stderr and uri in result.stderr


def test_a_server_that_does_not_answer_in_time_is_reported(tmp_path, monkeypatch):
    """A listener that accepts and never answers: the probe's timeout, not MLflow's, decides."""
    monkeypatch.setenv(store.PROBE_TIMEOUT_ENV, "0.5")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        started = time.monotonic()
        problem = store_problem(f"http://127.0.0.1:{listener.getsockname()[1]}")
    assert problem is not None and "cannot be reached" in problem
    assert time.monotonic() - started < 5


def test_a_server_that_is_not_mlflow_is_reported(tmp_path):
    """An HTTP server without MLflow's REST API (a plain file server)."""
    port = closed_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        problem = store_problem(f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait()
    assert problem is not None and "not an MLflow tracking server" in problem


def test_an_unreachable_database_store_is_reported_within_seconds_without_its_password(tmp_path):
    """MLflow's SQLAlchemy engine retries a database for minutes; the probe connects once, briefly."""
    uri = f"postgresql+psycopg2://qac:s3cret-word@127.0.0.1:{closed_port()}/mlflow"
    started = time.monotonic()
    result = qac(["runs", "sweep"], tmp_path, uri)
    assert time.monotonic() - started < 30
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "cannot be reached" in result.stderr and "goes on without it" in result.stderr
    assert "s3cret-word" not in result.stderr + result.stdout


def test_a_database_store_whose_driver_is_missing_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)      # as if not installed: importing it fails
    store._answers.clear()
    problem = store_problem("postgresql+psycopg://qac:pw@127.0.0.1:5432/mlflow")
    assert problem is not None and "needs the database driver psycopg" in problem and "postgresql+" in problem
    problem = store_problem("postgresql+nosuchdriver://qac@127.0.0.1/mlflow")
    assert problem is not None and "not a database URL" in problem


def test_a_running_database_store_has_no_problem(postgres_url):
    """The database of the suite's PostgreSQL server (.ci/run starts one), through the driver installed here."""
    store._answers.clear()
    uri = "postgresql+psycopg2://" + postgres_url.split("://", 1)[1]
    assert store_problem(uri) is None


def test_the_report_is_built_and_not_logged_when_the_store_is_damaged(tmp_path, monkeypatch, capsys):
    from dvc_study import PARAMS, write_study
    from qac.reporting.lineage import load_study
    from qac.reporting.profile_report import log_to_study_run

    data = write_study(tmp_path / "data")
    path = damaged(tmp_path / "mlflow.db", "random bytes")
    line = log_to_study_run(load_study(PARAMS, data), tmp_path, f"sqlite:///{path}")
    assert line == "tables: report not logged to MLflow"
    assert "is damaged" in capsys.readouterr().err


PARAMS = validate_params({"profile": "smoke", "mlflow": {"experiment": "qac-test", "system_metrics": False}},
                         complete=False)


@pytest.mark.parametrize("store_kind", ["closed port", "random bytes", "truncated", "header overwritten"])
def test_a_stage_goes_on_without_an_unusable_store(tmp_path, monkeypatch, capsys, store_kind):
    """The stage lifecycle probes once, says why in one paragraph, and the stage's work runs untracked."""
    from qac.tracking.lifecycle import tracked_stage

    uri = (f"http://127.0.0.1:{closed_port()}" if store_kind == "closed port"
           else f"sqlite:///{damaged(tmp_path / 'mlflow.db', store_kind)}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    capsys.readouterr()    # MLflow's lines while the store was made, before it was damaged
    started = time.monotonic()
    ran = []
    with tracked_stage(PARAMS, "bm25", "bm25", kind="bm25", root=tmp_path / "data" / "smoke",
                       output=tmp_path / "data" / "smoke" / "bm25") as tracking:
        tracking.log_metrics({"x": 1.0})
        ran.append(tracking.active)
    assert ran == [False]
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "goes on without it" in err and len([line for line in err.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "data" / "smoke" / ".runs").exists()     # no record of a run that does not exist


def test_a_stage_with_a_working_store_is_tracked(tmp_path, monkeypatch):
    from qac.tracking.lifecycle import tracked_stage

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with tracked_stage(PARAMS, "bm25", "bm25", kind="bm25", root=tmp_path / "data" / "smoke") as tracking:
        assert tracking.active and tracking.run_id


def test_a_store_damaged_while_the_stage_runs_leaves_the_stage_running(tmp_path, monkeypatch, capsys):
    """The database is overwritten mid-stage: the next log call fails in the store, the stage finishes."""
    from qac.tracking.lifecycle import tracked_stage

    path = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
    finished = False
    with tracked_stage(PARAMS, "bm25", "bm25", kind="bm25", root=tmp_path / "data" / "smoke") as tracking:
        assert tracking.active
        capsys.readouterr()
        path.write_bytes(os.urandom(path.stat().st_size))
        for step in range(3):
            tracking.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        tracking.set_tags({"after": "damage"})
        finished = True
    assert finished and not tracking.active
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("goes on without it") == 1


@contextlib.contextmanager
def locked(path: Path):
    """Another process holding an exclusive transaction on the SQLite file ``path`` until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys\n"
        f"connection = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        "connection.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.parametrize("when", ["before the stage starts", "after the probe found the store usable"])
def test_a_locked_store_is_said_once_and_the_stage_goes_on_within_seconds(tmp_path, monkeypatch, capfd, when):
    """A store another process keeps locked: MLflow would wait 20 s on each call, then end the stage on its
    error. The stage says so in one paragraph and its work runs untracked; its upstream run is looked up (the
    run record names one), so every call the lifecycle makes on the store meets the lock."""
    from qac.tracking import write_run_record
    from qac.tracking.lifecycle import Upstream, tracked_stage

    path = real_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
    root = tmp_path / "data" / "smoke"
    import mlflow

    run_id = mlflow.MlflowClient(f"sqlite:///{path}").search_runs(["1"])[0].info.run_id
    write_run_record(root, root / "pretrain" / "none", run_id)
    monkeypatch.delenv("QAC_VERBOSE", raising=False)
    if when == "after the probe found the store usable":
        assert store.usable_store()
    capfd.readouterr()
    ran = []
    started = time.monotonic()
    with locked(path):
        with tracked_stage(PARAMS, "finetune", "finetune", kind="finetune", root=root,
                           parent=Upstream(root, root / "pretrain" / "none", "pretrain@none"),
                           output=root / "finetune" / "none") as tracking:
            tracking.log_metrics({"loss": 1.0})
            ran.append(tracking.active)
        with tracked_stage(PARAMS, "evaluate", "evaluate", kind="evaluate", root=root) as tracking:
            ran.append(tracking.active)     # the store is not asked again
    assert ran == [False, False]
    assert time.monotonic() - started < 15
    err = capfd.readouterr().err
    paragraphs = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(paragraphs) == 1, err
    assert "locked" in paragraphs[0] and "goes on without it" in paragraphs[0]
    assert not record_path_exists(root, "finetune/none")


def record_path_exists(root: Path, output: str) -> bool:
    from qac.tracking import record_path

    return record_path(root, root / output).exists()


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e308"])
def test_a_probe_timeout_out_of_range_still_gives_a_finite_wait(monkeypatch, value):
    """An endless wait for a server that never answers would hang every stage; a negative one, fail at once."""
    import math

    monkeypatch.setenv(store.PROBE_TIMEOUT_ENV, value)
    assert math.isfinite(store._timeout()) and 0.1 <= store._timeout() <= 600


def test_a_store_failure_paragraph_names_the_store_and_cuts_its_reason_at_a_word(tmp_path, monkeypatch, capsys):
    """SQLite's own message, a table name of many words, longer than a paragraph should quote."""
    import sqlite3

    from qac.console import call_main

    database = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{database}")
    table = " ".join(f"word{index}" for index in range(80))

    def main(argv):
        with sqlite3.connect(database) as connection:
            connection.execute(f'SELECT * FROM "{table}"')

    assert call_main(main, [], prog="qac") == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"(MLFLOW_TRACKING_URI, else mlflow.db; here sqlite:///{database})" in err
    reason = err.split("(OperationalError: ", 1)[1].split("): the MLflow store", 1)[0]
    assert reason.startswith("no such table: word0 word1 ") and reason.endswith(" ...") and len(reason) <= 300
    assert re.fullmatch(r"no such table: (word\d+ )+\.\.\.", reason), reason
