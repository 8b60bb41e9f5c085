"""The suite's one real smoke study: `dvc repro` of the smoke profile in a copy of the repository, built once.

It is the slowest thing in the suite (minutes on 2 cores), so every test that needs a study built
by the pipeline shares one. Under pytest-xdist each worker is a process of its own and a session
fixture runs once per worker: the first worker to ask builds the study in the session's shared
temporary folder while holding a file lock, and the others wait on the lock and find it built.
Tests never change the shared study: each module works on its own copy (:func:`copy_study`),
whose data and DVC cache are hard links to the study's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
PIPELINE = "profiles/smoke/dvc.yaml"
PARAMS = "profiles/smoke/params.yaml"
# The study's variants: every method once with query context, and coCondenser with passage context
# against the untuned baseline, so that every table has a row and a delta. The smoke profile's other
# variants (C=1, the mixed context, CoT-MAE and MASTER with passage context) add only more of the same
# stages, each about a minute and a half of a 2-core machine: `make smoke` runs them all, and the
# mixed context is tested on its own (its pairs in tests/test_pairs.py, its training in
# tests/test_pretrain_distributed.py, its Table 4 rows and deltas in tests/test_tables.py).
STUDY_VARIANTS = ("none", "cocondenser-passage", "cocondenser-query-q4", "cotmae-query-q4", "master-query-q4")
# The reference row (a released retriever evaluated as published) is left out too: its stage encodes the corpus
# with all-MiniLM-L6-v2 for half a minute of the study's build, and tests/test_reference_stage.py runs it, its
# records and its Table 1 row on their own. The stage itself still runs here, with nothing to evaluate.
_BUILT = "smoke-study.json"   # written last: the study is complete, with what the first `dvc repro` printed


def run(cmd, cwd, env, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}")
    return result


def study_env(work: Path, shared_data: Path) -> dict:
    """The environment the stages of the study at ``work`` run in (its own code, the data mirror, no hub)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(work),
           "QAC_DATA_MIRROR": str(shared_data), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)    # the study's own mlflow.db
    return env


def build(work: Path, shared_data: Path, copy_repository) -> subprocess.CompletedProcess:
    """Copy the repository to ``work``, keep the study's variants, commit, run the pipeline; that run."""
    from qac.config import write_params
    from qac.params import read_yaml

    copy_repository(work)
    params = read_yaml((work / PARAMS).read_text())
    variants = params["pretrain"]["variants"]
    assert set(STUDY_VARIANTS) <= set(variants), sorted(variants)
    params["pretrain"]["variants"] = {name: variants[name] for name in STUDY_VARIANTS}
    params["reference_retrievers"] = []
    write_params(params, work / PARAMS)
    env = study_env(work, shared_data)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=qac", "-c", "user.email=qac@localhost", "commit", "-qm", "study"]):
        run(cmd, work, env)
    # As `make smoke` runs it: DVC's stages, two at a time (qac/parallel_repro.py); the tests that follow
    # check with DVC itself that every stage is recorded and up to date.
    return run([str(BIN / "qac"), "repro", "--jobs", "2", "smoke"], work, env)


def shared_study(root: Path, shared_data: Path, copy_repository) -> tuple[Path, subprocess.CompletedProcess]:
    """The study under ``root`` (built there first if no process has): its folder and its first `dvc repro`."""
    from filelock import FileLock

    work = root / "smoke-study" / "repo"
    with FileLock(str(root / "smoke-study.lock")):
        built = root / _BUILT
        if not built.is_file():
            if work.exists():                     # a build that died half-way: start again
                shutil.rmtree(work.parent)
            first = build(work, shared_data, copy_repository)
            built.write_text(json.dumps({"args": first.args, "stdout": first.stdout, "stderr": first.stderr}),
                             encoding="utf-8")
        first = json.loads(built.read_text(encoding="utf-8"))
        return work, subprocess.CompletedProcess(first["args"], 0, first["stdout"], first["stderr"])


def copy_study(work: Path, destination: Path) -> Path:
    """A working copy of the study at ``work``, for tests that change it.

    ``data/`` and the DVC cache are hard-linked: stages write their outputs to a temporary file and
    rename it, DVC replaces an output it checks out and never edits a cache file, so neither copy
    can change the other's files. Everything else (git, the params files DVC edits in place, the
    SQLite store) is copied; DVC's own lock and state (``.dvc/tmp``) start afresh.
    """
    def link(source, target):
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    shutil.copytree(work, destination, symlinks=True, ignore=lambda folder, names: (
        [".dvc", "data"] if Path(folder) == work else []))
    shutil.copytree(work / "data", destination / "data", symlinks=True, copy_function=link)
    shutil.copytree(work / ".dvc", destination / ".dvc", symlinks=True, copy_function=link,
                    ignore=lambda folder, names: ["tmp"] if Path(folder) == work / ".dvc" else [])
    return destination
