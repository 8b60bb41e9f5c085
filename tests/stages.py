"""Running stage scripts in tests: imported in-process, as a subprocess, under torchrun, or killed mid-run.

The sharded generation stages (generate_queries, generate_continuations) are
tested alike: the same passages, the same kill -9 between committed chunks,
the same two-process torchrun run compared with a single process.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
TORCHRUN = REPO / ".venv" / "bin" / "torchrun"


def load_stage(name: str):
    """Import ``pipelines/<name>.py`` as a module (the stage scripts are not a package).

    Its folder goes on ``sys.path`` as when Python runs it as a script: the scripts import
    their sibling ``_environment`` (and beir_retriever its sibling stages).
    """
    import sys

    if str(REPO / "pipelines") not in sys.path:
        sys.path.append(str(REPO / "pipelines"))
    spec = importlib.util.spec_from_file_location(f"{name}_stage", REPO / "pipelines" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_stage_main(name: str, params_path: Path, monkeypatch, *args: str) -> None:
    """Run stage ``name``'s ``main(args)`` in this process on ``params_path``; it must succeed."""
    monkeypatch.setenv("QAC_PARAMS", str(params_path))
    assert load_stage(name).main(list(args)) == 0


def subprocess_env(params_path: Path, mlflow_uri: str) -> dict:
    return dict(os.environ, QAC_PARAMS=str(params_path), MLFLOW_TRACKING_URI=mlflow_uri, HF_HUB_OFFLINE="1",
                OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def run_torchrun(name: str, params_path: Path, mlflow_uri: str, processes: int = 2, *args: str) -> None:
    """Run stage ``name`` (with ``args``) under ``torchrun --standalone`` with ``processes`` processes;
    it must succeed."""
    result = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node", str(processes),
                             str(REPO / "pipelines" / f"{name}.py"), *args],
                            cwd=params_path.parent, env=subprocess_env(params_path, mlflow_uri), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def kill_after_chunks(name: str, params_path: Path, mlflow_uri: str, work_dir: Path, chunks: int = 2) -> int:
    """Start stage ``name`` as a process, SIGKILL it once ``work_dir`` holds ``chunks`` committed chunks;
    the number of chunks committed when it died."""
    markers = "*/chunks/*.json"
    process = subprocess.Popen([str(PYTHON), str(REPO / "pipelines" / f"{name}.py")], cwd=params_path.parent,
                               env=subprocess_env(params_path, mlflow_uri), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            if len(list(work_dir.glob(markers))) >= chunks:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    return len(list(work_dir.glob(markers)))


def passage_records(n: int) -> list[dict]:
    """``n`` passages of a few documents (three passages each), of varied lengths."""
    topics = ["protein folding", "river delta sediment", "neural spike timing", "tax policy", "coral bleaching"]
    records = []
    for i in range(n):
        doc, position = f"d{i // 3}", i % 3
        text = f"{topics[i % 5].capitalize()} study {i}. " + "Results were measured twice. " * (i % 4)
        records.append({"pid": f"{doc}#{position}", "doc_id": doc, "position": position, "text": text,
                        "n_tokens": len(text.split()), "contexts": {"nearby": [], "random_sampled": [], "overlap": ""}})
    return records


def arrow_records(data: bytes) -> list[dict]:
    """The rows of an Arrow stream file's bytes."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.BufferReader(data)).read_all().to_pylist()
