"""The `qac` console script: every subcommand documents itself."""

import subprocess
import sys
from pathlib import Path

import pytest

from qac.cli import SUBCOMMANDS

QAC = Path(sys.executable).parent / "qac"


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(command):
    result = subprocess.run([str(QAC), command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"qac {command}" in result.stdout


def test_profile_use_renders_params(tmp_path):
    target = tmp_path / "params.yaml"
    subprocess.run([str(QAC), "profile", "use", "smoke", "--params", str(target)], check=True, capture_output=True)
    result = subprocess.run([str(QAC), "profile", "show", "--params", str(target)], capture_output=True, text=True)
    assert result.stdout.strip() == "smoke"
    assert "# smoke:" in target.read_text()
