"""Params are read by the rules DVC records them with (YAML 1.2), and a profile's file names its own profile."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc.utils.serialize import parse_yaml

from qac.params import ParamsError, load_params, read_yaml, yaml_dumper

REPO = Path(__file__).resolve().parent.parent

# Plain scalars of every kind a params value is written as: the bodies YAML 1.1 and 1.2 read otherwise
# (leading zeros, 0o, base 60, yes/no/on/off), and the ones both read alike, each with every sign.
BODIES = ["0", "00", "010", "0777", "08", "09", "0o10", "0o", "0O10", "0x1F", "0X1F", "0x", "0b101", "0b2",
          "1_000", "1__0", "_1", "1_", "1:30", "190:20:30", "1:30.5", "1:70", "10", "1e3", "1E3", "1.0e+3",
          "1e+3", "1.0e3", "1e-4", "5e-05", ".5", ".5e3", ".5e+3", "1.", "1.5", "1_0.5", "0.1_2", "12e", "1e",
          "1.2.3", "1,000", "1.0e+308", "1e400", "1e-400", ".inf", ".Inf", ".INF", ".iNf", "inf", ".nan", ".NaN",
          ".NAN", "nan", "yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF", "y", "Y",
          "n", "N", "true", "True", "TRUE", "tRUE", "false", "False", "FALSE", "~", "null", "Null", "NULL",
          "nULL", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10", "24:00:00"]
SCALARS = sorted({sign + body for body in BODIES for sign in ("", "+", "-")} |
                 {"", "!!int 010", "!!int 0o10", "!!float 1", "!!str 010", "!!bool yes", "'010'", '"yes"'})


def _same(left, right) -> bool:
    """Equal values of the same types all the way down (nan equal to nan)."""
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[key], right[key]) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_same, left, right))
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        return math.isnan(right)
    return type(left) is type(right) and left == right


def _dvc_reads(text: str):
    return parse_yaml(text, "params.yaml")


@pytest.mark.parametrize("scalar", SCALARS)
def test_every_scalar_reads_as_dvc_reads_it(scalar):
    for text in (f"key: {scalar}\n", f"key: [{scalar}]\n", f"{{key: {scalar}}}\n"):
        try:
            dvc = _dvc_reads(text)
        except Exception:           # DVC refuses the text: qac must too, as a YAML error
            with pytest.raises(yaml.YAMLError):
                read_yaml(text)
            continue
        ours = read_yaml(text)
        assert _same(ours, dvc), (text, ours, dvc)


@pytest.mark.parametrize("scalar", [s for s in SCALARS if not s.startswith(("!", "'", '"'))])
def test_a_string_written_by_the_params_dumper_reads_back_as_that_string_in_both_readers(scalar):
    # A rendered profile or a search's trial file holds strings such as '08' or 'on': DVC must read them so.
    text = yaml.dump({"key": scalar, "row": [scalar]}, Dumper=yaml_dumper(), default_flow_style=None)
    assert _dvc_reads(text) == {"key": scalar, "row": [scalar]}, text
    assert read_yaml(text) == {"key": scalar, "row": [scalar]}, text


def test_a_leading_zero_is_decimal_as_in_the_lock(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: smoke\npretrain:\n  common:\n    steps: 010\n")
    assert load_params(path).pretrain.common.steps == 10
    assert _dvc_reads(path.read_text())["pretrain"]["common"]["steps"] == 10


def test_a_yaml_11_boolean_where_a_boolean_is_wanted_is_refused_naming_the_file_line_and_key(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: smoke\nmlflow:\n  log_models: on\n")
    with pytest.raises(ParamsError) as error:
        load_params(path)
    message = str(error.value)
    assert f"{path}:3: parameter mlflow.log_models:" in message
    assert "YAML 1.2" in message and "write true" in message


def test_a_value_its_tag_cannot_hold_is_refused_naming_the_file_line_and_key(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: smoke\npretrain:\n  common:\n    steps: !!int 1:30\n")
    with pytest.raises(ParamsError) as error:
        load_params(path)
    assert f"{path}: not valid YAML at line 4, column 12 (key pretrain.common.steps)" in str(error.value)


def test_a_yaml_11_directive_is_refused(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("%YAML 1.1\n---\nprofile: smoke\npretrain:\n  common:\n    steps: 010\n")
    with pytest.raises(ParamsError, match="declares %YAML 1.1"):
        load_params(path)


@pytest.fixture()
def profiles_copy(tmp_path, monkeypatch):
    """A checkout's profiles/ folder (its templates and rendered files), the working directory its parent."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles", ignore=shutil.ignore_patterns("dvc.lock", "expected"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "profiles"


def test_a_profile_file_naming_another_profile_is_refused(profiles_copy):
    path = profiles_copy / "smoke" / "params.yaml"
    text = path.read_text()
    path.write_text(text.replace("\nprofile: smoke\n", "\nprofile: default\n"))
    line = text.splitlines().index("profile: smoke") + 1
    with pytest.raises(ParamsError) as error:
        load_params(path)
    assert f"{path}:{line}: parameter profile: is 'default' in the folder of profile 'smoke'" in str(error.value)
    # Outside profiles/ the same file is a study of its own, and names the profile it likes.
    outside = profiles_copy.parent / "study" / "params.yaml"
    outside.parent.mkdir()
    shutil.copy(path, outside)
    assert load_params(outside).profile == "default"


def test_a_profile_source_naming_another_profile_is_not_rendered(profiles_copy):
    from qac.config import render_profile

    source = profiles_copy / "smoke.yaml"
    source.write_text(source.read_text() + "profile: paper\n")
    with pytest.raises(ParamsError, match=r"smoke\.yaml:\d+: parameter profile: is 'paper' in the file of profile"):
        render_profile("smoke", profiles_copy)


def test_dvc_repro_of_a_profile_whose_file_names_another_profile_stops_at_its_first_stage(profiles_copy):
    # The stage's command reads profiles/${profile}/params.yaml: the default profile's, valid on its own.
    root = profiles_copy.parent
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([str(Path(sys.executable).parent / "dvc"), "init", "-q"], cwd=root, check=True)
    smoke = profiles_copy / "smoke"
    (smoke / "params.yaml").write_text((smoke / "params.yaml").read_text().replace("\nprofile: smoke\n",
                                                                                    "\nprofile: default\n"))
    reader = f"import sys; sys.path.insert(0, {str(REPO)!r}); from qac.console import run_main; " \
             "from qac.params import load_params; run_main(lambda argv: load_params('profiles/${profile}/params.yaml') and 0)"
    (smoke / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"read": {
        "wdir": "../..", "cmd": f'{sys.executable} -c "{reader}"', "outs": ["data/${profile}/read.txt"]}}}))
    result = subprocess.run([str(Path(sys.executable).parent / "dvc"), "repro", "profiles/smoke/dvc.yaml"],
                            cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "profiles/smoke/params.yaml:" in result.stderr + result.stdout
    assert "parameter profile: is 'default' in the folder of profile 'smoke'" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
