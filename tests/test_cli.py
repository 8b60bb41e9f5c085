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


def test_profile_list_and_show_name_each_profile():
    listed = subprocess.run([str(QAC), "profile", "list"], capture_output=True, text=True, check=True).stdout
    for name in ("smoke", "default", "paper"):
        assert f"profiles/{name}/" in listed
    shown = subprocess.run([str(QAC), "profile", "show", "smoke"], capture_output=True, text=True, check=True).stdout
    assert "profile: smoke" in shown and "# smoke:" in shown


def test_profile_render_rejects_an_unknown_name():
    result = subprocess.run([str(QAC), "profile", "render", "huge"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown profile huge" in result.stderr
