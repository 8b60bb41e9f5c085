"""A stage started by a Python that lacks qac says which one to use, in one line, before anything else."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STAGES = sorted(path for path in (REPO / "pipelines").glob("*.py") if not path.name.startswith("_"))


@pytest.mark.parametrize("script", ["prepare", "pretrain", "tables"])
def test_a_python_without_qac_gets_one_line_naming_the_environment(script, tmp_path):
    # -S -s and no PYTHONPATH: no site-packages, so qac (installed into .venv) cannot be imported,
    # as with the system's python on PATH.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", "-s", f"pipelines/{script}.py", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"pipelines/{script}.py: {sys.executable} cannot import qac")
    assert "source .venv/bin/activate" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("script", STAGES, ids=lambda path: path.stem)
def test_every_stage_script_checks_its_interpreter_before_importing_qac(script):
    body = ast.parse(script.read_text(encoding="utf-8")).body
    imports = [node for node in body if isinstance(node, (ast.Import, ast.ImportFrom)) and
               not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
    assert imports and isinstance(imports[0], ast.Import) and imports[0].names[0].name == "_environment", script.name
