"""The variables that steer how a stage runs (qac/environment.py): a bad value is one sentence naming the
variable, found before the stage does any work, instead of a traceback deep in a search or a rendezvous."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qac.environment import environment_problem

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name, value", [
    ("QAC_SEARCH_BACKEND", "fiass"),
    ("QAC_SEARCH_DEVICE", "gpu0"),
    ("QAC_SEARCH_DEVICE", "meta"),
    ("QAC_SEARCH_BLOCKS", "-1,-1"),
    ("QAC_SEARCH_BLOCKS", "5"),
    ("QAC_SEARCH_BLOCKS", "abc"),
    ("QAC_SEARCH_BLOCKS", "0,10"),
    ("QAC_DIST_TIMEOUT_MINUTES", "inf"),
    ("QAC_DIST_TIMEOUT_MINUTES", "1e300"),
    ("QAC_DIST_TIMEOUT_MINUTES", "0"),
    ("QAC_DIST_TIMEOUT_MINUTES", "x"),
    ("QAC_RENDEZVOUS_TIMEOUT_MINUTES", "inf"),
    ("QAC_RENDEZVOUS_TIMEOUT_MINUTES", "1e300"),
    ("QAC_RENDEZVOUS_TIMEOUT_MINUTES", "0"),
    ("QAC_RENDEZVOUS_TIMEOUT_MINUTES", "x"),
    ("WORLD_SIZE", "abc"),
])
def test_an_unusable_steering_variable_is_one_sentence_naming_it(name, value):
    problem = environment_problem({name: value})
    assert problem is not None and problem.startswith(f"{name}={value!r}: "), problem
    assert "\n" not in problem


def test_a_rank_beyond_the_world_size_is_refused():
    problem = environment_problem({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"})
    assert problem is not None and problem.startswith("RANK=2 with WORLD_SIZE=2: ranks count from 0"), problem


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_search_device_without_cuda_is_refused():
    problem = environment_problem({"QAC_SEARCH_DEVICE": "cuda"})
    assert problem is not None and problem.startswith("QAC_SEARCH_DEVICE='cuda': this machine has no CUDA"), problem


@pytest.mark.parametrize("env", [
    {},
    {"QAC_SEARCH_BACKEND": "torch"},
    {"QAC_SEARCH_DEVICE": "cpu"},
    {"QAC_SEARCH_BLOCKS": "1024,262144"},
    {"QAC_SEARCH_BLOCKS": " 8, 16 "},
    {"QAC_DIST_TIMEOUT_MINUTES": "30", "QAC_RENDEZVOUS_TIMEOUT_MINUTES": "0.5"},
    {"QAC_DIST_TIMEOUT_MINUTES": ""},
    {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"},
])
def test_usable_values_pass(env):
    assert environment_problem(env) is None


def test_a_stage_refuses_a_bad_variable_before_anything_else(tmp_path):
    """No params file in the folder: the variable is checked before the params are read."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "QAC_SEARCH_BLOCKS": "-1,-1"}
    environment.pop("QAC_VERBOSE", None)
    done = subprocess.run([sys.executable, str(REPO / "pipelines" / "evaluate.py"), "--variant", "none"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("evaluate.py: error: QAC_SEARCH_BLOCKS='-1,-1': "), done.stderr
