"""Credentials are used as given and shown nowhere: a tracking server and a dataset named with a password,
a store that cannot take writes found before the work.

The servers are real: ``mlflow server`` on loopback, and an HTTP server that serves a dataset only to the
user and password it was given.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

import mlflow
import pytest
import yaml
from mlflow_stores import empty_store, tracking_server
from test_prepare import _beir_zip, beir_files, write_tree

from qac.data.errors import DatasetUnavailableError
from qac.data.sources import DatasetSpec, locate_dataset
from qac.params.sections import DatasetEntry

REPO = Path(__file__).resolve().parent.parent
TRACKING_PASSWORD = "Tr4ck-pw/planted"      # a slash: written %2F in a URL, as a password must be
DATA_PASSWORD = "D4ta-pw-planted"


@contextlib.contextmanager
def guarded_site(directory: Path, user: str, password: str):
    """An HTTP server on loopback serving ``directory`` only to ``user``:``password`` (HTTP Basic)."""
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def send_head(self):
            if self.headers.get("Authorization") != expected:
                self.send_error(401, "credentials required")
                return None
            return super().send_head()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tracking-server")
    with tracking_server(folder) as url:
        yield url, folder


def _project(tmp_path: Path, dataset_url: str, md5: str | None) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    params = {"profile": "smoke", "seed": 1, "data_dir": "data", "mlflow": {"system_metrics": False},
              "datasets": {"tiny": {"format": "beir", "mirror": "tiny", "url": dataset_url, "md5": md5,
                                    "splits": ["test", "train"], "rel_threshold": 1}},
              "prepare": {"max_documents": 4, "keep_judged_documents": True, "min_text_chars": 1}}
    (work / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    (tmp_path / "mirror").mkdir()
    return work


def _prepare(work: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "QAC_PARAMS": str(work / "params.yaml"), "QAC_DATA_MIRROR":
                   str(work.parent / "mirror"), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, str(REPO / "pipelines" / "prepare.py"), "--dataset", "tiny"], cwd=work,
                          env=environment, capture_output=True, text=True, timeout=300)


def _files_holding(folder: Path, secrets: list[str]) -> list[str]:
    return [str(path) for path in folder.rglob("*") if path.is_file()
            and any(secret.encode() in path.read_bytes() for secret in secrets)]


def _planted(password: str) -> list[str]:
    return [password, quote(password, safe="")]


@pytest.mark.parametrize("given", ["in the URL", "in MLflow's variables"])
def test_a_stage_logs_through_credentials_and_records_none_of_them(tmp_path, server, given):
    url, server_folder = server
    site = tmp_path / "site"
    md5 = _beir_zip(site)
    with guarded_site(site, "reader", DATA_PASSWORD) as port:
        work = _project(tmp_path, f"http://reader:{DATA_PASSWORD}@127.0.0.1:{port}/tiny.zip", md5)
        tracked = url.replace("http://", f"http://qac:{quote(TRACKING_PASSWORD, safe='')}@")
        env = ({"MLFLOW_TRACKING_URI": tracked} if given == "in the URL" else
               {"MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": "qac",
                "MLFLOW_TRACKING_PASSWORD": TRACKING_PASSWORD})
        done = _prepare(work, **env)
    assert done.returncode == 0, done.stderr
    assert "tracking store" not in done.stderr, done.stderr      # reached: no note that it was not

    client = mlflow.MlflowClient(url)
    runs = client.search_runs([client.get_experiment_by_name("qac-smoke").experiment_id],
                              filter_string="tags.`qac.stage` = 'prepare@tiny'")
    # This test's run: its data source is this test's site, named without the password.
    mine = [run for run in runs if run.data.tags["qac.data_source"] == f"http://***@127.0.0.1:{port}/tiny.zip"]
    assert len(mine) == 1

    secrets = _planted(TRACKING_PASSWORD) + _planted(DATA_PASSWORD)
    assert not [secret for secret in secrets if secret in done.stdout + done.stderr]
    assert _files_holding(work, secrets) == [str(work / "params.yaml")]      # the user's own file alone
    # The server's database holds every param, tag and metric it was sent; its folder every artifact.
    assert _files_holding(server_folder, secrets) == []
    for run in runs:
        recorded = json.dumps([run.data.params, run.data.tags])
        assert not [secret for secret in secrets if secret in recorded]
    config = Path(client.download_artifacts(mine[0].info.run_id, "config/params.yaml", str(tmp_path))).read_text()
    assert f"http://***@127.0.0.1:{port}/tiny.zip" in config


@pytest.mark.parametrize("url", [
    f"https://user:{DATA_PASSWORD}@host/archive.zip",                  # no such host
    f"https://user:{DATA_PASSWORD}@archive.invalid:8443/archive.zip",
    f"http://user:{DATA_PASSWORD}@127.0.0.1:9/archive.zip",            # nothing listens
    f"http://{DATA_PASSWORD}@127.0.0.1:9/archive.zip",                 # a token as the user
    f"http://user:{quote(DATA_PASSWORD + ':@#', safe='')}@127.0.0.1:9/archive.zip",
    f"https://127.0.0.1:9/archive.zip?token={DATA_PASSWORD}",
])
def test_a_dataset_url_with_credentials_that_fails_says_so_without_them(tmp_path, url):
    spec = DatasetSpec.from_params("tiny", DatasetEntry(format="beir", mirror="tiny", url=url, splits=["test"]))
    with pytest.raises(DatasetUnavailableError) as caught:
        locate_dataset(spec, tmp_path / "mirror", tmp_path / "downloads")
    message = str(caught.value)
    assert "\n" not in message and DATA_PASSWORD not in message and quote(DATA_PASSWORD) not in message
    assert "***" in message and "the download from" in message


def test_a_dataset_served_to_other_credentials_is_refused_in_one_paragraph_by_the_stage(tmp_path):
    site = tmp_path / "site"
    md5 = _beir_zip(site)
    with guarded_site(site, "reader", "the-right-one") as port:
        work = _project(tmp_path, f"http://reader:{DATA_PASSWORD}@127.0.0.1:{port}/tiny.zip", md5)
        done = _prepare(work, MLFLOW_TRACKING_URI=empty_store(tmp_path / "store" / "mlflow.db"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "HTTP Error 401" in done.stderr and DATA_PASSWORD not in done.stderr
    assert not (work / "data" / "smoke" / "datasets" / "tiny").exists()


def test_the_issues_dataset_url_with_a_password_ends_in_one_paragraph_without_it(tmp_path):
    work = _project(tmp_path, f"https://user:{DATA_PASSWORD}@host/archive.zip", None)
    done = _prepare(work, MLFLOW_TRACKING_URI=empty_store(tmp_path / "store" / "mlflow.db"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert DATA_PASSWORD not in done.stderr + done.stdout and "https://***@host/archive.zip" in done.stderr


@contextlib.contextmanager
def refusing_writes(path: Path):
    """``path`` made to refuse writes even to root: immutable (``chattr +i``), else read-only for a user.

    Skips when neither holds here (a file system without the immutable flag, and running as root)."""
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0 \
        if shutil.which("chattr") else False
    if not made:
        path.chmod(0o444 if path.is_file() else 0o555)
    try:
        try:
            with sqlite3.connect(path if path.is_file() else path / "probe.db") as connection:
                connection.execute("CREATE TABLE written (x)")
            pytest.skip("neither chattr +i nor a read-only mode stops writes here (root on a file system "
                        "without the immutable flag)")
        except sqlite3.OperationalError:
            pass
        yield
    finally:
        if made:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o644 if path.is_file() else 0o755)


@pytest.mark.parametrize("refused", ["the store's file", "the store's folder", "the folder of a new store"])
def test_a_store_that_cannot_take_writes_is_said_before_the_work_in_one_paragraph(tmp_path, refused):
    work = _project(tmp_path, None, None)
    write_tree(work.parent / "mirror" / "tiny", beir_files())
    store = tmp_path / "store" / ("new" if refused == "the folder of a new store" else "") / "mlflow.db"
    if refused != "the folder of a new store":
        empty_store(store)
        before = store.read_bytes()
    else:
        store.parent.parent.mkdir(parents=True)
    target = store if refused == "the store's file" else store.parent.parent if "new" in refused else store.parent
    with refusing_writes(target):
        done = _prepare(work, MLFLOW_TRACKING_URI=f"sqlite:///{store}", QAC_VERBOSE="0")
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "tracking store" in line]
    assert len(notes) == 1 and "cannot" in notes[0] and "goes on without it" in notes[0], done.stderr
    assert "Traceback" not in done.stderr
    assert (work / "data" / "smoke" / "datasets" / "tiny" / "dataset.json").is_file()
    if refused != "the folder of a new store":
        assert store.read_bytes() == before
    else:
        assert not store.parent.exists()
