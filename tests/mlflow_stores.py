"""Empty MLflow SQLite stores for tests: made by MLflow once per process, then copied.

MLflow creates a new SQLite store by running its schema migrations, which takes seconds; a test, or
a stage process a test starts, would spend them each time it opened a store of its own. A copy of a
store MLflow made is the store the first run would have found: MLflow's current schema and its
default experiment, nothing else.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

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
