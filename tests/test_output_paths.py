"""Every path a stage writes stays under its profile's data folder, and names are never paths.

Profile, dataset, variant, split and study names become folder names
(``data/<profile>/eval/<variant>/<dataset>/``), so the params schema accepts
plain names only; paths a profile names inside a folder (a mirror sub-folder, a
dataset's files) stay inside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qac.config import render_profile
from qac.params import PROFILE_NAMES, load_params, profile_params_path
from qac.errors import UserError
from qac.names import checked_plain_name, is_inside_path, is_plain_name
from qac.params import ParamsError

REPO = Path(__file__).resolve().parent.parent


def stage_outputs(profile: str) -> dict[str, list[Path]]:
    """The outputs (outs, metrics, plots) of every stage of the profile's dvc.yaml, resolved by DVC itself."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        stages = repo.stage.collect(str(profile_params_path(profile, REPO / "profiles").parent / "dvc.yaml"))
        return {stage.addressing: [Path(out.fs_path) for out in stage.outs] for stage in stages}


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_stage_writes_under_its_profiles_data_folder_or_report(profile):
    outputs = stage_outputs(profile)
    params = render_profile(profile, REPO / "profiles")
    data = (REPO / params["data_dir"] / profile).resolve()
    reports = (REPO / params["tables"]["out_dir"]).resolve()
    assert len(outputs) >= 10

    def allowed(path: Path) -> bool:
        path = path.resolve()
        if data == path or data in path.parents:
            return True
        # A report: under reports/, named for its profile (reports/<profile>/, reports/query_generator/<profile>.md).
        return reports in path.parents and profile in (path.relative_to(reports).parts[0], path.stem)

    escaping = {stage: str(path) for stage, paths in outputs.items() for path in paths if not allowed(path)}
    assert not escaping
    # The profile's report folder is the tables stage's alone.
    writers = {stage.rsplit(":", 1)[-1] for stage, paths in outputs.items()
               for path in paths if (reports / profile) in [path.resolve(), *path.resolve().parents]}
    assert writers == {"tables"}


def write_params(tmp_path: Path, edit) -> Path:
    params = yaml.safe_load((REPO / "profiles" / "smoke" / "params.yaml").read_text(encoding="utf-8"))
    edit(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def rename_key(mapping: dict, old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


def _variant(params, name):
    variants = params["pretrain"]["variants"]
    rename_key(variants, "cocondenser-passage", name)
    for spec in variants.values():     # its seed copies name it
        if spec.get("seed_of") == "cocondenser-passage":
            spec["seed_of"] = name


def _dataset(params, name):
    old = params["train_dataset"]
    rename_key(params["datasets"], old, name)
    params["train_dataset"] = params["pretrain_corpus"] = name


@pytest.mark.parametrize("edit, key", [
    (lambda p: p.update(profile="../../etc"), "profile"),
    (lambda p: p.update(profile="/tmp/x"), "profile"),
    (lambda p: p.update(profile=".."), "profile"),
    (lambda p: p.update(profile=""), "profile"),
    (lambda p: _variant(p, "a/b"), "pretrain.variants"),
    (lambda p: _variant(p, ".."), "pretrain.variants"),
    (lambda p: _variant(p, ".hidden"), "pretrain.variants"),
    (lambda p: _variant(p, "--rm"), "pretrain.variants"),
    (lambda p: _dataset(p, "../scifact"), "datasets"),
    (lambda p: _dataset(p, "sci fact"), "datasets"),
    (lambda p: p["datasets"]["scifact"].update(mirror="../../etc"), "datasets.scifact.mirror"),
    (lambda p: p["datasets"]["scifact"].update(mirror="/etc"), "datasets.scifact.mirror"),
    (lambda p: p["datasets"]["scifact"].update(splits=["../test"]), "datasets.scifact.splits.0"),
    (lambda p: p["hpo"].update(study_name="../study"), "hpo.study_name"),
])
def test_a_name_that_is_a_path_is_refused_naming_its_key(tmp_path, edit, key):
    with pytest.raises(ParamsError) as caught:
        load_params(write_params(tmp_path, edit))
    message = str(caught.value)
    assert f"parameter {key}:" in message
    assert "Traceback" not in message


@pytest.mark.parametrize("name", ["smoke", "cocondenser-query-q5", "dl19_subset", "v1.2", "_x", "a..b"])
def test_plain_names_are_accepted(tmp_path, name):
    params = load_params(write_params(tmp_path, lambda p: _variant(p, name)))
    assert name in params["pretrain"]["variants"]
    assert is_plain_name(name)


@pytest.mark.parametrize("path, inside", [("scifact", True), ("msmarco/hard.jsonl.gz", True), ("../x", False),
                                          ("a/../../b", False), ("/etc/passwd", False), ("a//b", False),
                                          ("a/./b", False), ("a\\..\\b", False), ("", False)])
def test_paths_inside_a_folder(path, inside):
    assert is_inside_path(path) is inside


def test_a_profile_name_from_the_environment_is_checked(monkeypatch):
    monkeypatch.delenv("QAC_PARAMS", raising=False)
    monkeypatch.setenv("QAC_PROFILE", "../../etc")
    with pytest.raises(UserError, match="QAC_PROFILE"):
        load_params()
    with pytest.raises(UserError, match="not a plain name"):
        checked_plain_name("a/b", "variant")


def test_a_study_name_given_on_the_command_line_is_checked(capsys):
    from qac.cli import main

    smoke = REPO / "profiles" / "smoke" / "params.yaml"
    assert main(["hpo", "--params", str(smoke), "--study-name", "../../elsewhere"]) == 2
    assert "--study-name ../../elsewhere: expected a plain name" in capsys.readouterr().err


def test_a_symbolic_link_leading_out_of_the_data_folder_is_refused(tmp_path, monkeypatch):
    from qac.io import atomic_path, write_json

    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "data" / "smoke").mkdir(parents=True)
    (tmp_path / "data" / "smoke" / "eval").symlink_to(elsewhere)
    with pytest.raises(UserError, match="outside the profile's data folder"):
        write_json("data/smoke/eval/none/metrics.json", {"x": 1})
    with pytest.raises(UserError, match="symbolic link"):
        with atomic_path(Path("data/smoke/eval/none/r1"), directory=True):
            pass
    assert list(elsewhere.iterdir()) == []


def test_a_data_folder_linked_as_a_whole_to_another_disk_is_fine(tmp_path, monkeypatch):
    from qac.io import write_json

    monkeypatch.chdir(tmp_path)
    disk = tmp_path / "big-disk" / "smoke"
    disk.mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "smoke").symlink_to(disk)
    write_json("data/smoke/metrics/split.json", {"x": 1})
    assert json.loads((disk / "metrics" / "split.json").read_text()) == {"x": 1}


@pytest.mark.parametrize("key, value", [("tables.out_dir", "../../tmp"), ("tables.out_dir", "/etc"),
                                        ("check.expected", "../outside.yaml"), ("check.expected", "/tmp/x.yaml")])
def test_a_folder_a_command_writes_is_a_path_inside_the_checkout(tmp_path, key, value):
    section, leaf = key.split(".")
    with pytest.raises(ParamsError) as caught:
        load_params(write_params(tmp_path, lambda p: p[section].update({leaf: value})))
    assert f"parameter {key}:" in str(caught.value)
