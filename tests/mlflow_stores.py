"""Empty MLflow SQLite stores for tests: made by MLflow once per process, then copied.

MLflow creates a new SQLite store by running its schema migrations, which takes seconds; a test, or
a stage process a test starts, would spend them each time it opened a store of its own. A copy of a
store MLflow made is the store the first run would have found: MLflow's current schema and its
default experiment, nothing else. :func:`tracking_server` runs a real tracking server on loopback.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

_made: list[Path] = []


def empty_store(path: Path) -> str:
    """Put an empty MLflow store at ``path``; its tracking URI."""
    if not _made:
        import mlflow

        folder = Path(tempfile.mkdtemp(prefix="qac-empty-mlflow-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        mlflow.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
        _made.append(folder / "mlflow.db")
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_made[0], path)
    return f"sqlite:///{path}"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def tracking_server(folder: Path) -> Iterator[str]:
    """A real ``mlflow server`` on loopback, its store and artifacts in ``folder``; yields its URL."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    port = free_port()
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
         "--artifacts-destination", str(folder / "artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    raise RuntimeError("mlflow server did not start")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(process.pid, 9)
        process.wait()
