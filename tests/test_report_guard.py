"""A committed report is never replaced by one built from outputs that are missing (qac.reporting.guard)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dvc_study import PARAMS, PROFILE, RAW_PARAMS, write_study
from qac.cli import main as qac_main
from qac.reporting.guard import MissingOutputs, stages_writing
from qac.reporting.profile_report import write_report


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture()
def committed(tmp_path) -> tuple[Path, Path]:
    """A study's outputs and the report built from them (as if committed)."""
    data = write_study(tmp_path / "data")
    write_report(PARAMS, tmp_path / "reports", data)
    return data, tmp_path / "reports" / PROFILE


def test_a_profile_that_never_ran_leaves_the_committed_report_untouched(committed, tmp_path, capsys):
    data, report = committed
    before = snapshot(report)
    params = tmp_path / "params.yaml"
    import yaml

    params.write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    code = qac_main(["tables", "--params", str(params), "--out", str(tmp_path / "reports"),
                     "--data", str(tmp_path / "nowhere"), "--no-mlflow"])
    err = capsys.readouterr().err
    assert code == 2
    assert "would become n/a" in err and "left as it is" in err and "Traceback" not in err
    assert snapshot(report) == before


@pytest.mark.parametrize("removed", ["bm25", "eval", "annotation"])
def test_a_missing_output_folder_names_its_files_and_the_stage_that_writes_them(committed, removed):
    data, report = committed
    before = snapshot(report)
    shutil.rmtree(data / removed)
    with pytest.raises(MissingOutputs) as caught:
        write_report(PARAMS, report.parent, data)
    message = str(caught.value)
    assert f"{data}/{removed}/" in message
    stage = {"bm25": "bm25", "eval": "evaluate@", "annotation": "annotation"}[removed]
    assert stage in message
    assert snapshot(report) == before


def test_a_single_missing_per_query_file_is_named(committed):
    data, report = committed
    victim = sorted((data / "eval").rglob("*.per_query.json"))[0]
    victim.unlink()
    with pytest.raises(MissingOutputs) as caught:
        write_report(PARAMS, report.parent, data)
    assert str(victim) in str(caught.value)
    assert f"evaluate@{victim.relative_to(data / 'eval').parts[0]}" in str(caught.value)


def test_no_outputs_and_no_report_writes_nothing(tmp_path):
    with pytest.raises(MissingOutputs, match="Run the profile first") as caught:
        write_report(PARAMS, tmp_path / "reports", tmp_path / "data")
    assert "nothing was written" in str(caught.value)
    assert not (tmp_path / "reports").exists()


def test_outputs_that_exist_rebuild_the_report_as_before(committed):
    data, report = committed
    before = snapshot(report)
    write_report(PARAMS, report.parent, data)
    assert snapshot(report) == before


def test_a_deleted_report_is_built_from_what_there_is(committed):
    """The way out the message offers: without a committed report nothing is lost."""
    data, report = committed
    shutil.rmtree(data / "annotation")
    shutil.rmtree(report)
    write_report(PARAMS, report.parent, data)
    assert (report / "tables.md").is_file()


@pytest.mark.parametrize("path, stage", [
    ("eval/cotmae-query-q5/r1/scifact/test.per_query.json", "evaluate@cotmae-query-q5"),
    ("bm25/runs/scifact/test.per_query.json", "bm25"),
    ("annotation/labels.csv", "annotation"),
    ("beir/cocondenser-passage/eval/fiqa/test.per_query.json", "beir_retriever"),
    ("pretrain/master-passage/losses.tsv", "pretrain@master-passage"),
    ("datasets/scifact/corpus.arrow", "prepare@scifact"),
    ("metrics/queries.json", "generate_queries"),
    ("nothing/of/the/pipeline.json", None),
])
def test_each_output_maps_to_the_stage_of_the_pipeline_that_writes_it(path, stage):
    assert stages_writing([path], "smoke") == ([stage] if stage else [])


def test_the_default_profiles_committed_report_survives_tables_before_the_profile_ran(tmp_path, capsys):
    """The committed reports/default/ (a copy) with no data/default/: exit 2, not a byte changed."""
    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "reports" / "default", tmp_path / "reports" / "default")
    before = snapshot(tmp_path / "reports" / "default")
    code = qac_main(["tables", "--params", str(root / "profiles" / "default" / "params.yaml"),
                     "--out", str(tmp_path / "reports"), "--data", str(tmp_path / "data" / "default"), "--no-mlflow"])
    err = capsys.readouterr().err
    assert code == 2 and "evaluate@" in err and "dvc repro profiles/default/dvc.yaml" in err
    assert snapshot(tmp_path / "reports" / "default") == before


@pytest.mark.parametrize("out", ["a-file", "a-file/report"])
def test_a_report_folder_that_cannot_be_made_is_named_before_any_table_is_built(tmp_path, capsys, out):
    import yaml

    data = write_study(tmp_path / "data" / PROFILE)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    (tmp_path / "a-file").write_text("not a folder\n")
    code = qac_main(["tables", "--params", str(params), "--out", str(tmp_path / out), "--data", str(data),
                     "--no-mlflow", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"--out {tmp_path / out}: " in err and ("is a file" in err)
    assert (tmp_path / "a-file").read_text() == "not a folder\n"
