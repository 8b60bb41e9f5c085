"""Faults of the machine, not the input: Ctrl-C, a full disk, a file size limit, a read-only folder.

Each ends in one paragraph on stderr (qac.console.run_main), and leaves no
half-written output: every output goes through qac.io.atomic_path, a temporary
sibling renamed into place only when complete. The faults are real: a SIGINT
sent to a running process, a kernel file size limit, a tiny tmpfs that fills up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dvc_study import RAW_PARAMS, PROFILE, write_study

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, cwd: Path, **options) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "QAC_VERBOSE": ""}
    return subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **options)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def leftovers(folder: Path) -> list[str]:
    return sorted(str(path) for path in folder.rglob("*") if path.name.endswith(".tmp") or path.name.endswith(".old"))


def one_paragraph(stderr: str, prog: str) -> str:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr
    return lines[0]


def test_ctrl_c_while_writing_ends_in_one_paragraph_and_leaves_no_partial_output(tmp_path):
    """A real SIGINT while a stage is half-way through writing its output."""
    code = f"""
import time
from pathlib import Path
from qac.console import run_main
from qac.io import atomic_path

def main(argv=None):
    with atomic_path({str(tmp_path / 'out' / 'queries.jsonl')!r}) as tmp:
        with open(tmp, "w") as handle:
            handle.write("half")
            handle.flush()
            Path({str(tmp_path / 'started')!r}).touch()
            time.sleep(60)
            handle.write(" and the rest")

run_main(main)
"""
    # Started as from a terminal: a shell's background job (a CI runner's) inherits SIGINT ignored, and
    # Python then leaves it ignored; the child gets the default disposition back before it starts.
    process = run_python(code, tmp_path, preexec_fn=_default_sigint)
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "interrupted (Ctrl-C)" in one_paragraph(stderr, "-c")
    assert list((tmp_path / "out").iterdir()) == []


def tables_command(tmp_path: Path, data: Path, out: Path) -> str:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    return ("from qac.cli import main; import sys; sys.exit(main(['tables', '--params', "
            f"{str(params)!r}, '--out', {str(out)!r}, '--data', {str(data)!r}, '--no-mlflow', '--quiet']))")


def test_a_file_size_limit_while_writing_the_report_leaves_the_previous_report(tmp_path):
    data = write_study(tmp_path / "data")
    out = tmp_path / "reports"
    code = tables_command(tmp_path, data, out)
    first = run_python(code, tmp_path)
    assert first.wait(timeout=120) == 0, first.communicate()
    before = {path: path.read_bytes() for path in (out / PROFILE).rglob("*") if path.is_file()}
    limited = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))\n" + code)
    process = run_python(limited, tmp_path)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2
    message = one_paragraph(stderr, "qac")
    assert "file size limit exceeded" in message and str(out) in message
    assert {path: path.read_bytes() for path in (out / PROFILE).rglob("*") if path.is_file()} == before
    assert leftovers(out) == []


@contextlib.contextmanager
def tmpfs(mount_point: Path, options: str):
    """A small tmpfs at ``mount_point`` (skips the test where mounting is not permitted)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_disk_while_writing_the_report_ends_in_one_paragraph(tmp_path):
    data = write_study(tmp_path / "data")
    with tmpfs(tmp_path / "small", "size=96k") as out:
        process = run_python(tables_command(tmp_path, data, out), tmp_path)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 2
        message = one_paragraph(stderr, "qac")
        assert "no space left on the device" in message and str(out) in message
        assert leftovers(out) == [] and not (out / PROFILE).exists()


def test_a_read_only_data_folder_ends_in_one_paragraph(tmp_path):
    data = write_study(tmp_path / "data")
    with tmpfs(tmp_path / "readonly", "size=1m,ro") as out:
        process = run_python(tables_command(tmp_path, data, out), tmp_path)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 2
        assert "read-only" in one_paragraph(stderr, "qac")


def test_a_failing_store_outside_a_stage_ends_in_one_paragraph(tmp_path, capsys):
    """A command that reads a damaged store database directly: one paragraph, no traceback."""
    import sqlite3

    from qac.console import call_main

    damaged = tmp_path / "mlflow.db"
    damaged.write_bytes(os.urandom(4096))

    def main(argv):
        with sqlite3.connect(damaged) as connection:
            connection.execute("SELECT name FROM sqlite_master").fetchall()

    assert call_main(main, [], prog="qac") == 2
    err = capsys.readouterr().err
    assert err.startswith("qac: error: the tracking store failed (DatabaseError") and len(err.splitlines()) == 1


def tiny_bm25_project(root: Path, documents: int = 2000) -> Path:
    """A profile with one prepared dataset (train and test splits) for the bm25 stage; its params file."""
    import json

    folder = root / "data" / "test" / "datasets" / "tiny"
    (folder / "qrels").mkdir(parents=True)
    words = ["apple", "orchard", "harvest", "banana", "recipe", "tractor", "market", "river", "stone", "cloud"]
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for n in range(documents):
            text = " ".join(words[(n * k) % len(words)] for k in range(1, 8)) + f" doc{n}"
            handle.write(json.dumps({"_id": f"d{n}", "title": "", "text": text}) + "\n")
    (folder / "queries.jsonl").write_text('{"_id": "t1", "text": "apple orchard"}\n'
                                          '{"_id": "s1", "text": "banana recipe"}\n', encoding="utf-8")
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nt1\td1\t1\n", encoding="utf-8")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\ns1\td3\t1\n", encoding="utf-8")
    (folder / "dataset.json").write_text(json.dumps({"name": "tiny", "splits": ["train", "test"],
                                                     "rel_threshold": {"train": 1, "test": 1}}), encoding="utf-8")
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump({"profile": "test", "data_dir": "data", "train_dataset": "tiny",
                                      "zero_shot": [], "mlflow": {"experiment": None, "system_metrics": False},
                                      "finetune": {"bm25_depth": 3}, "evaluate": {"depth": 10, "metrics": ["RR@10"]}}),
                      encoding="utf-8")
    return params


def test_sigterm_mid_stage_ends_in_one_paragraph_with_status_143_and_no_staging_left(tmp_path):
    """`timeout`, Slurm and `docker stop` send SIGTERM: the stage cleans up as after Ctrl-C and says so."""
    from stages import PYTHON, subprocess_env

    params = tiny_bm25_project(tmp_path)
    env = {**subprocess_env(params, f"sqlite:///{tmp_path / 'mlflow.db'}"), "QAC_VERBOSE": ""}
    process = subprocess.Popen([str(PYTHON), str(REPO / "pipelines" / "bm25.py")], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    data = tmp_path / "data" / "test"
    deadline = time.monotonic() + 120
    while not list(data.glob(".bm25.*.tmp")):       # its output's staging folder: the stage is working
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "terminated (SIGTERM" in one_paragraph(stderr, "bm25.py")
    assert [path for path in data.rglob("*") if path.name.endswith(".tmp")] == []
    assert not (data / "bm25").exists()
