"""The suite's smoke study is built once per session, however many pytest-xdist workers ask for it at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# A worker process: asks for the study under argv[1] with a build that takes a second and leaves its mark.
WORKER = f"""
import os, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
import smoke_study

def build(work, shared_data, copy_repository):
    work.mkdir(parents=True)
    (work.parent / f"built-by-{{os.getpid()}}").touch()
    time.sleep(1)
    return subprocess.CompletedProcess(["dvc", "repro"], 0, "stages ran", "")

smoke_study.build = build
work, first = smoke_study.shared_study(Path(sys.argv[1]), None, None)
print(work, first.stdout, sep="|")
"""


def _workers(root: Path, count: int) -> list[str]:
    processes = [subprocess.Popen([sys.executable, "-c", WORKER, str(root)], stdout=subprocess.PIPE, text=True)
                 for _ in range(count)]
    outputs = [process.communicate(timeout=120)[0].strip() for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    return outputs


def test_workers_asking_at_once_build_the_study_once_and_share_it(tmp_path):
    outputs = _workers(tmp_path, 3)
    assert outputs == [f"{tmp_path / 'smoke-study' / 'repo'}|stages ran"] * 3
    assert len(list((tmp_path / "smoke-study").glob("built-by-*"))) == 1


def test_a_build_that_died_half_way_is_built_again(tmp_path):
    half = tmp_path / "smoke-study" / "repo"
    half.mkdir(parents=True)
    (half / "left-over").touch()
    assert _workers(tmp_path, 1) == [f"{half}|stages ran"]
    assert not (half / "left-over").exists()
    assert _workers(tmp_path, 1) == [f"{half}|stages ran"]             # built: found, not built again
    assert len(list((tmp_path / "smoke-study").glob("built-by-*"))) == 1
