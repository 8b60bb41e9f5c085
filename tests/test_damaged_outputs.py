"""A stage output that is truncated or damaged is named with the stage that rebuilds it, in one paragraph."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dvc_study import RAW_PARAMS, write_study
from qac.cli import main as qac_main


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage" + data[:10])
    elif how == "wrong shape":
        path.write_text('["a list, not an object"]', encoding="utf-8")


def _tables_on(data: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    """``qac tables`` on the study at ``data`` with the test study's params: its exit status and stderr."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    code = qac_main(["tables", "--params", str(params), "--out", str(tmp_path / "reports"), "--data", str(data),
                     "--no-mlflow", "--quiet"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("relative, stage", [
    ("eval/cotmae-passage/r2/scifact/test.per_query.json", "evaluate@cotmae-passage"),
    ("bm25/runs/scifact/test.per_query.json", "bm25"),
    ("annotation/summary.json", "annotation"),
    ("pretrain/cocondenser-passage/losses.tsv", "pretrain@cocondenser-passage"),
])
@pytest.mark.parametrize("how", ["truncated", "empty", "binary", "wrong shape"])
def test_qac_tables_names_a_damaged_output_and_its_stage(tmp_path, capsys, relative, stage, how):
    data = write_study(tmp_path / "data" / "smoke")
    damage(data / relative, how)
    code, err = _tables_on(data, tmp_path, capsys)
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(data / relative) in err and stage in err and "dvc repro profiles/smoke/dvc.yaml" in err
    assert not (tmp_path / "reports" / "smoke").exists()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "true", '"0.5"', "null"])
def test_a_per_query_value_that_is_not_a_finite_number_is_named(tmp_path, capsys, value):
    """JSON lets a writer put NaN, a boolean or a string where a measure belongs: every mean would carry it."""
    import json

    data = write_study(tmp_path / "data" / "smoke")
    path = data / "eval" / "cotmae-passage" / "r2" / "scifact" / "test.per_query.json"
    values = json.loads(path.read_text())
    measure, by_query = next(iter(values.items()))
    qid = next(iter(by_query))
    text = json.dumps(values).replace(json.dumps({qid: by_query[qid]})[1:-1], f'"{qid}": {value}', 1)
    assert text != json.dumps(values)
    path.write_text(text)
    code, err = _tables_on(data, tmp_path, capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and f"query {qid!r}" in err and "evaluate@cotmae-passage" in err
    assert not (tmp_path / "reports" / "smoke").exists()


def _edited_per_query(data: Path, edit) -> tuple[Path, str, str]:
    """The per-query file of one variant, changed by ``edit(values, measure, qid)``; its path, measure and qid."""
    import json

    path = data / "eval" / "cotmae-passage" / "r2" / "scifact" / "test.per_query.json"
    values = json.loads(path.read_text())
    measure = sorted(values)[0]
    qid = sorted(values[measure])[0]
    edit(values, measure, qid)
    path.write_text(json.dumps(values))
    return path, measure, qid


@pytest.mark.parametrize("edit, named", [
    (lambda values, measure, qid: values[measure].update({qid: -5.0}), "is outside [0, 1]"),
    (lambda values, measure, qid: values[measure].update({qid: 7.0}), "is outside [0, 1]"),
    (lambda values, measure, qid: values[measure].pop(qid), "has a value of"),
    (lambda values, measure, qid: values[measure].update({"not-a-query": 1.0}), "has a value of"),
    (lambda values, measure, qid: values.update({measure: {}}), "holds no queries"),
    (lambda values, measure, qid: values.clear(), "with at least one measure"),
], ids=["negative", "above one", "a query missing from one measure", "a query only one measure has",
        "a measure without queries", "no measures"])
def test_a_per_query_file_no_evaluation_writes_is_named_not_reported(tmp_path, capsys, edit, named):
    """Values no measure takes, or measures over different queries: a damaged file, never a number in a table."""
    data = write_study(tmp_path / "data" / "smoke")
    path, measure, qid = _edited_per_query(data, edit)
    code, err = _tables_on(data, tmp_path, capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and named in err and "evaluate@cotmae-passage" in err
    assert not (tmp_path / "reports" / "smoke").exists()


@pytest.mark.parametrize("relative, stage", [("datasets/scifact/corpus.jsonl", "prepare@scifact"),
                                             ("bm25/negatives.jsonl", "bm25")])
def test_any_malformed_stage_file_names_the_stage_that_rebuilds_it(tmp_path, monkeypatch, capsys, relative, stage):
    """Every reader's DataFormatError on a file under data/<profile>/ gains the stage to rerun."""
    from qac.console import call_main
    from qac.data.textfile import iter_jsonl

    monkeypatch.chdir(tmp_path)
    path = Path("data/smoke") / relative
    path.parent.mkdir(parents=True)
    path.write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "te', encoding="utf-8")
    assert call_main(lambda argv: list(iter_jsonl(path)), [], prog="qac") == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and f"rebuild it with the DVC stage {stage}" in err


def test_a_malformed_input_outside_the_data_folder_gets_no_stage(tmp_path, monkeypatch, capsys):
    from qac.console import call_main
    from qac.data.textfile import iter_jsonl

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mirror" / "scifact" / "corpus.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"_id": "d1", "te', encoding="utf-8")
    assert call_main(lambda argv: list(iter_jsonl(path)), [], prog="qac") == 2
    assert "DVC stage" not in capsys.readouterr().err


@pytest.mark.parametrize("file, how, what", [
    ("model.safetensors", "truncated", "a model"),
    ("model.safetensors", "missing", "a model"),
    ("config.json", "truncated", "a model"),
    ("tokenizer.json", "binary", "a tokenizer"),
])
@pytest.mark.parametrize("folder, stage", [("pretrain/cotmae-passage/encoder", "pretrain@cotmae-passage"),
                                           ("finetune/none/r1", "finetune@none")])
def test_a_damaged_model_folder_names_the_stage_that_rebuilds_it(tmp_path, monkeypatch, capsys, tiny_bert_dir,
                                                                 file, how, what, folder, stage):
    """A weights file cut short by a full disk or a copy, a config.json half written: one paragraph naming the
    folder and the stage to rerun, not a deserialisation traceback."""
    import shutil

    from qac.console import call_main
    from qac.models.biencoder import BiEncoder
    from qac.models.loading import load_tokenizer

    monkeypatch.chdir(tmp_path)
    path = Path("data") / "smoke" / folder
    shutil.copytree(tiny_bert_dir, path)
    if how == "missing":
        (path / file).unlink()
    else:
        damage(path / file, how)

    def load(argv):
        BiEncoder.from_pretrained(path)
        load_tokenizer(str(path))
        return 0

    assert call_main(load, [], prog="qac") == 2
    err = capsys.readouterr().err
    # (transformers' own progress lines come first here: a stage's console keeps them quiet)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(errors) == 1, err
    assert f"{path}: cannot be loaded as {what}" in err and f"rebuild it with the DVC stage {stage}" in err


def test_a_model_folder_that_loads_is_untouched_by_the_check(tiny_bert_dir):
    from qac.models.biencoder import BiEncoder

    assert BiEncoder.from_pretrained(tiny_bert_dir).encoder.config.hidden_size == 64


@pytest.mark.parametrize("how", ["truncated", "wrong shape"])
def test_a_damaged_run_record_says_what_it_is_and_how_to_be_rid_of_it(tmp_path, capsys, how):
    """The run records beside the outputs are bookkeeping DVC cannot restore: the message says deleting one
    only unlinks that output from its MLflow run, and that a deleted one lets the tables build."""
    data = write_study(tmp_path / "data" / "smoke")
    record = data / ".runs" / "finetune" / "none" / "r1" / "mlflow_run.json"
    damage(record, how)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    arguments = ["tables", "--params", str(params), "--out", str(tmp_path / "reports"), "--data", str(data),
                 "--no-mlflow", "--quiet"]
    assert qac_main(arguments) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(record) in err and "delete it" in err and "finetune@none" in err
    record.unlink()
    assert qac_main(arguments) == 0


@pytest.mark.parametrize("how", ["truncated", "a folder"])
def test_the_word_frequencies_stage_names_a_damaged_passages_file_in_one_paragraph(tmp_path, how):
    """The stage script ends through run_main as every stage does: status 2, one paragraph, no traceback."""
    import subprocess

    from qac.data.arrowstore import write_passages
    from stages import PYTHON, REPO, passage_records, subprocess_env

    passages = tmp_path / "data" / "smoke" / "passages.arrow"
    passages.parent.mkdir(parents=True)
    write_passages(passages, passage_records(12))
    if how == "truncated":
        damage(passages, "truncated")
    else:
        passages.unlink()
        passages.mkdir()
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"profile": "smoke", "data_dir": "data"}), encoding="utf-8")
    env = {**subprocess_env(params, f"sqlite:///{tmp_path / 'mlflow.db'}"), "QAC_VERBOSE": ""}
    result = subprocess.run([str(PYTHON), str(REPO / "pipelines" / "word_frequencies.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert lines[0].startswith("word_frequencies.py: error: data/smoke/passages.arrow")
    assert "split_passages" in lines[0]
    assert not (tmp_path / "data" / "smoke" / "word_frequencies.json").exists()
