"""Shared fixtures: tiny models built from a config, an isolated MLflow store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qac.threads import shared_cores_environment

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite's workers and the stage processes and torchrun ranks they start share the cores (qac/threads.py);
# set before any test module imports torch, which reads it, and inherited by every process a test starts.
os.environ.update(shared_cores_environment(processes=2))


# The study of test_pipeline.py takes most of the suite's time: its file is handed out first,
# so that under pytest-xdist one worker starts it at once while the others take every other file.
FIRST = ("test_pipeline.py",)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in FIRST)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A 2-layer, 64-wide random BERT with the MiniLM vocabulary, saved as a HF folder."""
    from qac.models.loading import load_model, load_tokenizer

    path = tmp_path_factory.mktemp("tiny-bert")
    load_model("tiny:minilm", seed=0).save_pretrained(path)
    load_tokenizer("minilm").save_pretrained(path)
    return path


@pytest.fixture()
def mlflow_store(tmp_path, monkeypatch) -> str:
    """Point MLflow at a fresh SQLite store in the test's temporary directory: a copy of an empty store
    MLflow made (tests/mlflow_stores.py), as the first run would find it. Tests that no store gets
    created use a path of their own."""
    from mlflow_stores import empty_store

    uri = empty_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"data mirror {SHARED_DATA} not present")
    return SHARED_DATA


def repository_copier(root: Path):
    """``copy(destination)``: the checkout at ``root`` without its environment, outputs, history and DVC cache.

    ``qac/data`` is code and stays. The copy starts from an empty DVC cache of
    its own: the checkout's cache (``.dvc/cache``, run cache included, and
    ``.dvc/tmp``) would let DVC restore stages instead of running them, and
    grows to gigabytes.
    """
    import shutil

    top_level_skip = {".venv", "data", "mlflow.db", "mlartifacts", "mlruns", ".git", "reports", "hpo"}
    dvc_skip = {"cache", "tmp"}
    root = Path(root).resolve()

    def ignore(directory, names):
        skipped = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        here = Path(directory).resolve()
        if here == root:
            skipped |= top_level_skip & set(names)
        elif here == root / ".dvc":
            skipped |= dvc_skip & set(names)
        return skipped

    def copy(destination: Path) -> Path:
        shutil.copytree(root, destination, ignore=ignore)
        return destination

    return copy


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL server on loopback: ``$QAC_TEST_POSTGRES_URL`` (.ci/run starts one), else a throwaway one.

    Skips, naming the missing piece, where neither can be had (no server
    binaries, no driver, no unprivileged user to run the server as root).
    """
    import postgres_server

    if os.environ.get(postgres_server.URL_ENV):
        yield os.environ[postgres_server.URL_ENV]
        return
    try:
        postgres_server.check_driver()
        url, root = postgres_server.start()
    except postgres_server.Unavailable as missing:
        pytest.skip(f"no PostgreSQL server for the database storage tests: {missing}")
    try:
        yield url
    finally:
        postgres_server.stop(root)


@pytest.fixture(scope="session")
def copy_repository():
    """Copy this checkout for a test study (see :func:`repository_copier`)."""
    return repository_copier(REPO_ROOT)


@pytest.fixture(scope="session")
def shared_smoke_study(tmp_path_factory, shared_data, copy_repository):
    """``(folder, first dvc repro)`` of the suite's one smoke study (tests/smoke_study.py), built once per session.

    Shared by every worker of a pytest-xdist run (its folder is the session's, not the worker's) and
    by every test: never change it; work on ``smoke_study.copy_study(folder, tmp_path / "repo")``.
    """
    import smoke_study

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base   # the workers' common folder
    return smoke_study.shared_study(root, shared_data, copy_repository)
