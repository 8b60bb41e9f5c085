"""The patch of DVC's internals (qac.parallel_repro.read_locks_plainly) holds only for the DVC it was written for.

The patch replaces ``dvc.dvcfile.modify_yaml`` for ``dvc.lock`` with ``_yaml._modify_data`` over a plain
parse. A DVC upgrade could rename those functions (the patch then switches itself off without a word: the
runs stay right, only slower) or change what they do (the patch would then write locks another way than
DVC's own code). Each test here fails loudly on either, naming what to review in ``read_locks_plainly``
before the pin in constraints.txt moves.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REVIEW = "review qac.parallel_repro.read_locks_plainly against this DVC before moving the pin in constraints.txt"


def _pinned(package: str) -> str:
    text = (REPO / "constraints.txt").read_text(encoding="utf-8")
    found = re.search(rf"^{re.escape(package)}==(\S+)\s*$", text, re.M)
    assert found, f"constraints.txt pins no version of {package}"
    return found.group(1)


def test_the_installed_dvc_is_the_one_the_patch_was_written_for():
    installed = metadata.version("dvc")
    assert installed == _pinned("dvc"), f"DVC {installed} is installed, {_pinned('dvc')} pinned: {REVIEW}"


def test_the_patched_functions_are_there_with_the_signatures_the_patch_calls():
    from dvc import dvcfile
    from dvc.utils.serialize import _yaml

    for name in ("modify_yaml", "_modify_data", "parse_yaml", "parse_yaml_for_update", "_dump"):
        assert callable(getattr(_yaml, name, None)), f"dvc.utils.serialize._yaml.{name} is gone: {REVIEW}"
    signatures = {name: list(inspect.signature(getattr(_yaml, name)).parameters)
                  for name in ("modify_yaml", "_modify_data", "parse_yaml", "_dump")}
    assert signatures == {"modify_yaml": ["path", "fs"], "_modify_data": ["path", "parser", "dumper", "fs"],
                          "parse_yaml": ["text", "path", "typ"], "_dump": ["data", "stream"]}, REVIEW
    assert "modify_yaml" in vars(dvcfile), f"dvc.dvcfile no longer imports modify_yaml: {REVIEW}"


def test_the_round_trip_differs_from_the_patch_only_in_its_parser():
    """DVC's ``modify_yaml`` is ``_modify_data`` with the round-trip parser; the patch swaps that parser alone."""
    from dvc.utils.serialize import _yaml

    body = inspect.getsource(_yaml.modify_yaml)
    assert "_modify_data(path, parse_yaml_for_update, _dump, fs=fs)" in body, f"{body}\n{REVIEW}"


def test_the_patch_takes_effect_in_a_fresh_process():
    """Applied where the DVC is the pinned one: ``dvc.lock`` goes through the plain read, other files not."""
    script = ("from dvc import dvcfile; from dvc.utils.serialize import _yaml; "
              "from qac.parallel_repro import read_locks_plainly; before = dvcfile.modify_yaml; "
              "assert before is _yaml.modify_yaml, 'dvc.dvcfile.modify_yaml is not the round trip'; "
              "read_locks_plainly(); assert dvcfile.modify_yaml is not before, 'the patch switched itself off'")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n{REVIEW}"
