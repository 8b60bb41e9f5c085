"""The params schema: every key declared, typed and ranged; wrong settings refused before any work.

The first part reproduces what a stress test of the smoke profile found (a misspelt key
trained with the default, C=10 trained as C=4, a batch size of 0, a negative learning rate,
DVC's ``5e-05``); the second holds bad parameters of other kinds, to check that the promise
is general: the error names the file, the line and the dotted key, and says what was expected.
"""

from __future__ import annotations

import copy
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qac.config import render_profile, write_params
from qac.params import PROFILE_NAMES, load_params, profile_params_path
from qac.params import ParamsError, Params, known_keys_at, read_yaml, validate_params

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smoke() -> dict:
    """The smoke profile as plain data, for tests that write an edited copy."""
    return load_params(REPO / "profiles" / "smoke" / "params.yaml").to_dict()


def edited(tmp_path: Path, params: dict, edit) -> Path:
    """``params`` changed by ``edit(params)``, written as a rendered params file; its path."""
    changed = copy.deepcopy(params)
    edit(changed)
    path = tmp_path / "params.yaml"
    write_params(changed, path)
    return path


def refused(path: Path) -> ParamsError:
    with pytest.raises(ParamsError) as caught:
        load_params(path)
    return caught.value


def line_of(path: Path, text: str) -> int:
    """1-based line of the first line of ``path`` that contains ``text``."""
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# --- every profile, every key -------------------------------------------------------------

@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_every_profile_satisfies_the_schema(name):
    # Read, not run: the paper profile's hub pins are checked when it runs (tests/test_pinning.py).
    params = load_params(profile_params_path(name, REPO / "profiles"), running=False)
    assert isinstance(validate_params(params), Params)
    # The file a profile renders from validates too, so profiles/<name>.yaml cannot add an undeclared key.
    validate_params(render_profile(name, REPO / "profiles"))


def _leaf_keys(mapping: dict, prefix: str = ""):
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        yield dotted
        if isinstance(value, dict) and key not in ("datasets", "variants", "space", "kind_prefixes", "stages",
                                                         "templates", "generators"):
            yield from _leaf_keys(value, dotted + ".")


def test_every_key_of_base_yaml_is_declared_with_a_description():
    base = read_yaml((REPO / "profiles" / "base.yaml").read_text())
    for key in _leaf_keys(base):
        parent, _, name = key.rpartition(".")
        parts = tuple(parent.split(".")) if parent else ()
        assert name in known_keys_at(parts), f"{key}: in profiles/base.yaml but not in qac/params/sections.py"
    for model in _models(Params):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"


def _models(model, seen=None):
    import typing

    from pydantic import BaseModel

    seen = seen if seen is not None else []
    if model in seen:
        return seen
    seen.append(model)
    for info in model.model_fields.values():
        stack = [info.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                _models(annotation, seen)
            stack.extend(typing.get_args(annotation))
    return seen


def test_docs_parameters_md_is_generated_from_the_current_schema():
    from qac.cli.profile_command import parameters_doc_text

    text = parameters_doc_text()
    assert (REPO / "docs" / "parameters.md").read_text(encoding="utf-8") == text, \
        "docs/parameters.md is stale: run `qac profile docs`"
    for key in ("finetune.lr", "pretrain.variants.<name>.query_count", "querygen.queries_per_passage",
                "datasets.<name>.md5", "hpo.space"):
        assert f"`{key}`" in text


# --- reproductions ------------------------------------------------------------------------

@pytest.mark.parametrize("edit, key, suggestion", [
    (lambda p: p["finetune"].update(learning_rate=p["finetune"].pop("lr")), "finetune.learning_rate", "finetune.lr"),
    (lambda p: p.update(seeed=p.pop("seed")), "seeed", "seed"),
    (lambda p: p["prepare"].update(max_document=p["prepare"].pop("max_documents")), "prepare.max_document",
     "prepare.max_documents"),
    (lambda p: p.update(finetun=p.pop("finetune")), "finetun", "finetune"),
])
def test_a_misspelt_key_is_an_error_naming_the_key_its_line_and_the_close_spelling(tmp_path, smoke, edit, key,
                                                                                    suggestion):
    path = edited(tmp_path, smoke, edit)
    error = refused(path)
    message = str(error)
    name = key.rpartition(".")[2]
    assert f"{path}:{line_of(path, name + ':')}: parameter {key}: unknown key; did you mean {suggestion}?" in message
    assert "Traceback" not in message and "missing" not in message   # the misspelling is the one problem


def test_a_query_count_above_the_generated_candidates_is_refused(tmp_path, smoke):
    def edit(params):
        params["querygen"]["queries_per_passage"] = 4
        params["pretrain"]["variants"]["cocondenser-query-q4"]["query_count"] = 10

    path = edited(tmp_path, smoke, edit)
    message = str(refused(path))
    assert "pretrain.variants.cocondenser-query-q4.query_count: C=10" in message
    assert "querygen.queries_per_passage generates 4" in message
    assert f"{path}:{line_of(path, 'cocondenser-query-q4:')}:" in message


@pytest.mark.parametrize("key, value, written, expected", [
    ("batch_size", 0, "batch_size: 0,", "must be >= 1, found 0"),
    ("lr", -2e-5, "lr: -2.0e-05,", "must be >= 0, found -2e-05"),
])
def test_a_value_out_of_range_names_the_key_and_the_range(tmp_path, smoke, key, value, written, expected):
    path = edited(tmp_path, smoke, lambda p: p["finetune"].update({key: value}))
    message = str(refused(path))
    assert message.startswith(f"{path}:{line_of(path, written)}: parameter finetune.{key}: {expected}.")


def test_floats_as_dvc_writes_them_read_as_numbers(tmp_path, smoke):
    """``dvc exp run -S ...lr=5e-5`` writes ``lr: 5e-05``, which YAML 1.1 reads as a string."""
    path = edited(tmp_path, smoke, lambda p: None)
    text = path.read_text()
    # pretrain.common, finetune and beir_retriever (in flow or block style, as the section's size makes the
    # writer choose)
    pretrain_lr, finetune_lr = re.compile(r" lr: 0\.0001(?=[,\n])"), re.compile(r" lr: 2\.0e-05(?=[,\n])")
    assert len(pretrain_lr.findall(text)) == 1 and len(finetune_lr.findall(text)) == 2
    text = finetune_lr.sub(" lr: 1e-4", pretrain_lr.sub(" lr: 5e-05", text))
    assert "lr: 5e-05" in text and "lr: 1e-4" in text
    path.write_text(text)
    params = load_params(path)
    assert params["pretrain"]["common"]["lr"] == 5e-05 and params["finetune"]["lr"] == 1e-4
    assert params["beir_retriever"]["lr"] == 1e-4
    assert isinstance(params["pretrain"]["common"]["lr"], float)
    assert yaml.safe_load("lr: 5e-05")["lr"] == "5e-05"     # what PyYAML alone makes of it
    # Integers stay integers, strings strings.
    assert read_yaml("a: 5\nb: 1_000\nc: e5\nd: '5e-05'\n") == {"a": 5, "b": 1000, "c": "e5", "d": "5e-05"}
    # YAML 1.1's base-60 numbers are YAML 1.2 strings, as DVC writes a Slurm time unquoted.
    assert read_yaml("t: 24:00:00\nu: 1:30.5\n") == {"t": "24:00:00", "u": "1:30.5"}
    assert yaml.safe_load("t: 24:00:00") == {"t": 86400}


# --- bad parameters of other kinds ---------------------------------------------------------

@pytest.mark.parametrize("edit, expected", [
    (lambda p: p["finetune"].update(lr="5e-05"), "parameter finetune.lr: expected a number, found '5e-05' "
                                                 "(a number written as a string: drop the quotes)"),
    (lambda p: p["finetune"].update(batch_size=True), "parameter finetune.batch_size: expected an integer, found True"),
    (lambda p: p["finetune"].update(batch_size="8"), "parameter finetune.batch_size: expected an integer, found '8'"),
    (lambda p: p["finetune"].update(epochs=1.5), "parameter finetune.epochs: expected an integer, found 1.5"),
    (lambda p: p["finetune"].update(pooling="max"), "parameter finetune.pooling: expected one of 'cls' or 'mean'"),
    (lambda p: p["querygen"].update(top_p=1.5), "parameter querygen.top_p: must be <= 1, found 1.5"),
    (lambda p: p["pretrain"]["common"].update(mlm_probability=1.0),
     "parameter pretrain.common.mlm_probability: must be < 1"),
    (lambda p: p["pretrain"]["common"].update(lr=float("nan")), "parameter pretrain.common.lr: must be a finite"),
    (lambda p: p["pretrain"]["variants"]["cotmae-passage"].update(metod="cotmae"),
     "parameter pretrain.variants.cotmae-passage.metod: unknown key; did you mean "
     "pretrain.variants.cotmae-passage.method?"),
    (lambda p: p["pretrain"]["variants"]["cotmae-passage"].update(steps=0),
     "parameter pretrain.variants.cotmae-passage.steps: must be >= 1"),
    (lambda p: p["pretrain"]["common"].update(steps=10_000_000_000),
     "parameter pretrain.common.steps: must be <= 1000000000"),
    (lambda p: p["pretrain"]["variants"]["cotmae-passage"].update(steps=2_000_000_000),
     "parameter pretrain.variants.cotmae-passage.steps: must be <= 1000000000"),
    (lambda p: p["query_generator"].update(max_steps=10 ** 12),
     "parameter query_generator.max_steps: must be <= 1000000000"),
    (lambda p: p["pretrain"]["variants"]["none"].pop("method"), "parameter pretrain.variants.none.method: missing"),
    (lambda p: p["datasets"]["scifact"].update(md5="abc"), "parameter datasets.scifact.md5: expected a string of the form ^[0-9a-fA-F]{32}$, found 'abc'"),
    (lambda p: p["datasets"]["scifact"].update(fromat="beir"),
     "parameter datasets.scifact.fromat: unknown key; did you mean datasets.scifact.format?"),
    (lambda p: p.update(train_dataset="scifcat"),
     "parameter train_dataset: 'scifcat' is not a key of datasets (declared: scifact, cranfield); did you mean "
     "scifact?"),
    (lambda p: p["finetune"].pop("epochs"), "parameter finetune.epochs: missing"),
    (lambda p: p["hpo"].update(variant="cotmae-query-q20"), "parameter hpo.variant: 'cotmae-query-q20' is not a key"),
    (lambda p: p["hpo"]["space"].update({"pretrain.lr": {"type": "float", "low": 1e-3, "high": 1e-5}}),
     "hpo.space.pretrain.lr: 'low' (0.001) is above 'high' (1e-05)"),
    (lambda p: p["pretrain"]["variants"]["cocondenser-passage"].update(batch_size=9, grad_accumulation=2),
     "parameter pretrain.variants.cocondenser-passage.batch_size: 9 pairs per step do not split into "
     "grad_accumulation=2"),
    (lambda p: p["finetune"].update(mine_skip_top=30), "parameter finetune.mine_skip_top: 30 skips every mined"),
    (lambda p: p["finetune"].update(train_n_passages=4, mine_sample=2),
     "parameter finetune.mine_sample: 2 sampled mined negatives cannot give 3 negatives"),
    (lambda p: p["finetune"].update(mine_depth=500),
     "parameter finetune.mine_depth: 500 exceeds the 120 documents the profile keeps of scifact"),
    (lambda p: p["finetune"].update(max_train_queries=60, incomplete_batch="error"),
     "parameter finetune.max_train_queries: 60 queries do not fill whole batches of 8"),
    (lambda p: p["evaluate"].update(metrics=["RR@10", "MRR@10"]),
     "parameter evaluate.metrics.1: unknown measure 'MRR@10'"),
    (lambda p: p["evaluate"].update(zero_shot_variants=["cocondenser-qeury-q4"]),
     "parameter evaluate.zero_shot_variants.0: 'cocondenser-qeury-q4' is not a key of pretrain.variants"),
    (lambda p: p["tables"]["in_domain_columns"][0].update(split="dev"),
     "parameter tables.in_domain_columns.0.split: 'dev' is not a split of scifact (train, test)"),
    (lambda p: p["annotation"].update(calibration_split="dev"),
     "parameter annotation.calibration_split: 'dev' is not a split of train_dataset scifact"),
    (lambda p: p.update(zero_shot=["cranfeld"]), "parameter zero_shot.0: 'cranfeld' is not a key of datasets"),
    (lambda p: p["querygen"].update(batch_invariant="yes"), "parameter querygen.batch_invariant: expected one of"),
    # a name listed twice: evaluated twice, two equal columns, and a mean over datasets that counts one twice
    (lambda p: p.update(zero_shot=["cranfield", "cranfield"]),
     "parameter zero_shot: expected each entry once ('cranfield' is listed twice)"),
    (lambda p: p["datasets"]["scifact"].update(splits=["train", "test", "train"]),
     "parameter datasets.scifact.splits: expected each entry once ('train' is listed twice)"),
    (lambda p: p["evaluate"].update(metrics=["RR@10", "nDCG@10", "RR@10"]),
     "parameter evaluate.metrics: expected each entry once ('RR@10' is listed twice)"),
    (lambda p: p["evaluate"].update(zero_shot_retrievers=["r1", "r1"]),
     "parameter evaluate.zero_shot_retrievers: expected each entry once ('r1' is listed twice)"),
    (lambda p: p.update(reference_retrievers=["minilm", "minilm"]),
     "parameter reference_retrievers: expected each entry once ('minilm' is listed twice)"),
    # seeds every generator takes: NumPy refuses negatives, torch's seed stops past 64 bits
    (lambda p: p.update(seed=-1), "parameter seed: must be >= 0, found -1"),
    (lambda p: p["pretrain"]["variants"]["cotmae-passage"].update(seed=2**70),
     "parameter pretrain.variants.cotmae-passage.seed: must be < 4294967296"),
    (lambda p: p["pretrain"]["variants"]["cotmae-passage"].update(seeds=[1, -2]),
     "parameter pretrain.variants.cotmae-passage.seeds.1: must be >= 0"),
    # folders written to: relative ones stay inside the working folder
    (lambda p: p.update(data_dir="../elsewhere"), "parameter data_dir: expected a relative path inside its folder"),
    (lambda p: p.update(data_dir=""), "parameter data_dir: expected a relative path inside its folder"),
    (lambda p: p["hpo"].update(report_dir="reports/../../x"), "parameter hpo.report_dir: expected a relative path"),
    # model specs that can name nothing: a folder written that is not there, a name no hub can hold
    (lambda p: p["pretrain"]["common"].update(init="/nonexistent/model"),
     "parameter pretrain.common.init: no such model folder '/nonexistent/model'"),
    (lambda p: p["pretrain"]["variants"]["cotmae-passage"].update(init="scratch:./no/such/folder"),
     "parameter pretrain.variants.cotmae-passage.init: no such model folder './no/such/folder'"),
    (lambda p: p["split"].update(tokenizer="my tokenizer"),
     "parameter split.tokenizer: 'my tokenizer' is neither a folder here nor a possible hub name"),
    (lambda p: p["annotation"].update(judge_model=str(Path(__file__))),
     "parameter annotation.judge_model: '" + str(Path(__file__)) + "' is a file; a model spec names a model folder"),
])
def test_bad_parameters_of_every_kind_are_named(tmp_path, smoke, edit, expected):
    path = edited(tmp_path, smoke, edit)
    message = str(refused(path))
    assert expected in message, message
    assert message.startswith(f"{path}:")


def test_several_problems_are_listed_together_each_with_its_line(tmp_path, smoke):
    def edit(params):
        params["finetune"]["batch_size"] = 0
        params["split"]["max_len"] = -1
        params["bm25"]["k"] = 0.9

    path = edited(tmp_path, smoke, edit)
    message = str(refused(path))
    assert message.startswith(f"{path}: 3 problems in the parameters:")
    for key, text in (("finetune.batch_size", "batch_size: 0,"), ("split.max_len", "max_len: -1,"),
                      ("bm25.k", " k: 0.9")):
        assert f"{path}:{line_of(path, text)}: parameter {key}:" in message


def test_a_file_that_is_not_yaml_or_not_there_is_named(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("profile: smoke\nfinetune:\n  lr: [1\n")
    assert "not valid YAML at line" in str(refused(broken))
    assert "no such params file" in str(refused(tmp_path / "absent.yaml"))
    assert "is a folder, not a params file" in str(refused(tmp_path))


def test_folders_outside_the_working_folder_are_taken_only_when_absolute(tmp_path, smoke):
    """An absolute data folder is a deliberate choice of another disk; '..' is refused in either form."""
    assert load_params(edited(tmp_path, smoke, lambda p: p.update(data_dir=str(tmp_path / "data")))).data_dir \
        == str(tmp_path / "data")
    assert "parameter data_dir" in str(refused(edited(tmp_path, smoke, lambda p: p.update(data_dir="/tmp/../etc"))))


def test_a_params_file_not_utf8_names_the_line_and_column_of_the_byte(tmp_path, smoke):
    path = edited(tmp_path, smoke, lambda p: None)
    lines = path.read_bytes().split(b"\n")
    number = next(i for i, line in enumerate(lines) if line.startswith(b"seed:"))
    lines[number] = lines[number] + b"  # caf\xe9"
    path.write_bytes(b"\n".join(lines))
    message = str(refused(path))
    assert message == (f"{path}: not UTF-8 text at line {number + 1}, column {len(lines[number])} (byte 0xe9); "
                       "save the file as UTF-8")


def test_nested_aliases_are_refused_before_they_expand(tmp_path):
    """Nine aliases of nine aliases of ... reach millions of values from a dozen lines: refused at once."""
    import time

    rows = ["profile: smoke", "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    path = tmp_path / "params.yaml"
    path.write_text("\n".join(rows) + "\n")
    started = time.monotonic()
    message = str(refused(path))
    assert time.monotonic() - started < 5
    assert message.startswith(f"{path}: not valid YAML") and "aliases expand to more than 100,000 values" in message
    assert read_yaml("a: &x {b: 1}\nc: *x\n") == {"a": {"b": 1}, "c": {"b": 1}}      # aliases as such are fine


def test_an_hpo_report_folder_outside_the_working_folder_is_refused_before_the_study(tmp_path):
    result = _run([sys.executable, "-m", "qac.cli", "hpo", "--report-only", "--report-dir", "../../x"], tmp_path,
                  QAC_PROFILE="smoke")
    assert result.returncode == 2 and "--report-dir '../../x': expected a relative path inside" in result.stdout
    assert not (tmp_path.parent.parent / "x").exists()


def test_a_key_written_twice_is_named_with_the_line_of_its_second_writing(tmp_path):
    """PyYAML alone keeps the last of two equal keys: a second `lr:` further down would win silently."""
    text = (REPO / "profiles" / "smoke" / "params.yaml").read_text()
    lines = text.splitlines()
    at = next(index for index, line in enumerate(lines) if line.startswith("seed:"))
    twice = tmp_path / "params.yaml"
    twice.write_text("\n".join([*lines[:at + 3], "seed: 7", *lines[at + 3:]]) + "\n")
    message = str(refused(twice))
    assert f"not valid YAML at line {at + 4}" in message and "'seed' is written twice" in message
    # in a nested mapping, and in flow style, too
    nested = tmp_path / "nested.yaml"
    nested.write_text("profile: smoke\nfinetune: {lr: 1.0e-05, epochs: 1, lr: 2.0e-05}\n")
    assert "'lr' is written twice" in str(refused(nested))
    # a YAML merge key brings keys in without repeating them
    from qac.params import read_yaml

    assert read_yaml("a: &x {k: 1}\nb:\n  <<: *x\n  k: 2\n") == {"a": {"k": 1}, "b": {"k": 2}}


# --- settings that validate alone but cannot run as written ---------------------------------------

@pytest.mark.parametrize("edit, expected", [
    # a rendered file's seeds changed by hand: render makes the seed variants, so no variant would run them
    (lambda p: p.update(seeds=[42, 43, 44]), "parameter seeds: [42, 43, 44], but no variant runs these seeds"),
    (lambda p: p["pretrain"]["variants"]["master-passage"].update(master_dor_queries=5),
     "parameter pretrain.variants.master-passage.master_dor_queries: 5 queries for the DOR decoder but "
     "querygen.queries_per_passage generates 4 per passage"),
    (lambda p: p.update(train_dataset=None), "parameter train_dataset: required: the in-domain dataset"),
    (lambda p: p["bm25"].update(stopwords="eng"), "parameter bm25.stopwords: 'eng' is not a stopword list"),
    (lambda p: p["bm25"].update(stemmer="englsh"),
     "parameter bm25.stemmer: 'englsh' is not a PyStemmer algorithm; did you mean english?"),
    (lambda p: p["tables"].update(permutations=2**70), "parameter tables.permutations: must be <= 1000000"),
])
def test_settings_that_cannot_run_as_written_are_named(tmp_path, smoke, edit, expected):
    path = edited(tmp_path, smoke, edit)
    message = str(refused(path))
    assert expected in message, message
    assert message.startswith(f"{path}:")


@pytest.mark.parametrize("pad_to, expected", [
    (32, "parameter pretrain.common.pad_to: 32 is shorter than the sequences it pads (max_len 64, query_max_len "
         "16): at least 64"),
    (100000, "parameter pretrain.common.pad_to: 100000 is more than the model 'tiny:minilm' (pretrain.common.init) "
             "can read: 512 positions"),
])
def test_a_common_pad_to_that_fits_no_sequence_is_named_once(tmp_path, smoke, pad_to, expected):
    """pad_to in pretrain.common fails for every pre-training variant alike: one problem, not one per variant."""
    message = str(refused(edited(tmp_path, smoke, lambda p: p["pretrain"]["common"].update(pad_to=pad_to))))
    assert expected in message, message
    assert message.count("parameter pretrain.common.pad_to") == 1, message


def test_generated_tokens_beyond_the_generator_name_their_key_with_a_limit_there_is_room_for(tmp_path, smoke):
    message = str(refused(edited(tmp_path, smoke, lambda p: p["querygen"].update(max_new_tokens=100000))))
    found = re.search(r"parameter querygen\.max_new_tokens: 100000 tokens plus 64 source tokens "
                      r"\(querygen\.max_source_len\) are more than .* so at most (\d+)", message)
    assert found and int(found.group(1)) == 512 - 64, message


def test_an_output_folder_that_is_a_file_is_refused(tmp_path, smoke, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tables").write_text("a file where the tables' folder should be\n")
    message = str(refused(edited(tmp_path, smoke, lambda p: p["tables"].update(out_dir="tables"))))
    assert "parameter tables.out_dir: 'tables' is a file, not a folder" in message, message


def test_a_params_file_that_is_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    import threading

    fifo = tmp_path / "params.yaml"
    os.mkfifo(fifo)
    outcome = []

    def read():
        try:
            load_params(fifo)
        except ParamsError as error:
            outcome.append(str(error))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    if reader.is_alive():                       # release the blocked reader before failing
        with open(fifo, "w"):
            pass
        reader.join(timeout=20)
        pytest.fail("reading a FIFO as a params file blocked")
    assert outcome == [f"{fifo}: not a regular file (a params file is a YAML file)"]


def test_an_oversized_params_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: smoke\n#" + "x" * 5_000_000 + "\n")
    message = str(refused(path))
    assert message.startswith(f"{path}: {path.stat().st_size:,} bytes: a params file holds a few thousand values")
    assert "(the limit is 5,000,000)" in message


def test_a_file_of_too_many_values_without_aliases_is_not_told_about_aliases(tmp_path, monkeypatch):
    # At a limit of 1,000 instead of 100,000: the same path, without parsing 150,000 values in pure Python.
    monkeypatch.setattr("qac.params.yaml_io.MAX_EXPANDED_VALUES", 1_000)
    path = tmp_path / "params.yaml"
    path.write_text("profile: smoke\nx: [" + ", ".join(["1"] * 1_500) + "]\n")
    message = str(refused(path))
    assert "it holds more than 1,000 values (a profile holds a few thousand)" in message, message
    assert "alias" not in message and "anchor" not in message


def test_render_without_the_base_file_is_one_paragraph_naming_it(tmp_path):
    import shutil

    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    (profiles / "base.yaml").unlink()
    with pytest.raises(ParamsError) as caught:
        render_profile("smoke", profiles)
    message = str(caught.value)
    assert message.startswith(f"{profiles / 'base.yaml'}: not found (the profiles' files are profiles/base.yaml"), \
        message
    assert "\n" not in message


def test_docs_out_naming_a_folder_is_refused(tmp_path, capsys):
    from qac.cli import main
    from qac.console import call_main

    (tmp_path / "keep.md").write_text("mine\n")
    assert call_main(main, ["profile", "docs", "--out", str(tmp_path)], prog="qac") == 2
    assert f"--out {tmp_path}: a folder; name the Markdown file to write" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.md"]


# --- the command line: one paragraph, exit status 2 -----------------------------------------

def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
                   **env}
    environment.pop("QAC_VERBOSE", None)
    environment.update(env)
    return subprocess.run(args, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)


def test_qac_profile_validate_checks_a_file_alone(tmp_path, smoke):
    good = edited(tmp_path, smoke, lambda p: None)
    done = _run([sys.executable, "-m", "qac.cli", "profile", "validate", str(good)], tmp_path)
    variants = len(smoke["pretrain"]["variants"])
    assert done.returncode == 0 and f"valid (profile smoke, {variants} pre-training variants)" in done.stdout
    bad = edited(tmp_path, smoke, lambda p: p["finetune"].update(learning_rate=1e-4))
    done = _run([sys.executable, "-m", "qac.cli", "profile", "validate", str(bad)], tmp_path)
    assert done.returncode == 2
    assert "finetune.learning_rate: unknown key; did you mean finetune.lr?" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("stage, argv", [
    ("finetune", ["--variant", "none"]),
    ("pretrain", ["--variant", "cocondenser-query-q4"]),
    ("generate_queries", []),
])
def test_a_stage_refuses_bad_parameters_before_any_work(tmp_path, smoke, stage, argv):
    path = edited(tmp_path, smoke, lambda p: (p["finetune"].update(learning_rate=1e-4),
                                              p.update(data_dir=str(tmp_path / "data"))))
    done = _run([sys.executable, str(REPO / "pipelines" / f"{stage}.py"), *argv], tmp_path, QAC_PARAMS=str(path))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0].startswith(f"{stage}.py: error: {path}:{line_of(path, 'learning_rate')}: parameter "
                               "finetune.learning_rate: unknown key; did you mean finetune.lr?")
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "mlflow.db").exists()   # nothing started


@pytest.mark.parametrize("stage", ["pretrain", "finetune", "evaluate"])
def test_a_variant_stage_refuses_an_unknown_variant_in_one_line(tmp_path, smoke, stage):
    """A variant name is checked against the params file before any work, as a parameter is."""
    path = edited(tmp_path, smoke, lambda p: p.update(data_dir=str(tmp_path / "data")))
    done = _run([sys.executable, str(REPO / "pipelines" / f"{stage}.py"), "--variant", "cotmae-pasage"], tmp_path,
                QAC_PARAMS=str(path))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"{stage}.py: error: unknown variant 'cotmae-pasage': not a key of pretrain.variants in the "
                     "params file; did you mean cotmae-passage?"], done.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("spec", ["models/not-in-this-cache", "tiny:nobody/not-in-this-cache"])
def test_a_hub_model_that_cannot_be_fetched_is_one_paragraph_naming_it(spec, capsys, monkeypatch):
    """A valid hub name neither here nor in the cache (the hub switched off): named where it fails to load."""
    from qac.console import call_main
    from qac.models.loading import load_tokenizer

    monkeypatch.delenv("QAC_VERBOSE", raising=False)
    assert os.environ.get("HF_HUB_OFFLINE") == "1"          # the suite's setting (tests/conftest.py)
    assert call_main(lambda: load_tokenizer(spec), prog="stage") == 2
    err = capsys.readouterr().err
    name = spec.partition(":")[2] or spec
    assert err.startswith(f"stage: error: cannot load the model {name!r} (") and "Traceback" not in err
    assert "not in the Hugging Face cache, and HF_HUB_OFFLINE=1 keeps the hub switched off" in err
    assert "pretrain.common.init" in err and len(err.strip().splitlines()) == 1


def test_verbose_adds_the_traceback_to_a_user_error(tmp_path, smoke):
    bad = edited(tmp_path, smoke, lambda p: p["finetune"].update(batch_size=0))
    quiet = _run([sys.executable, "-m", "qac.cli", "check", "--params", str(bad)], tmp_path)
    loud = _run([sys.executable, "-m", "qac.cli", "check", "--params", str(bad)], tmp_path, QAC_VERBOSE="1")
    flag = _run([sys.executable, "-m", "qac.cli", "check", "--params", str(bad), "-v"], tmp_path)
    assert quiet.returncode == loud.returncode == flag.returncode == 2
    assert "Traceback" not in quiet.stderr
    assert quiet.stderr.startswith("qac: error: ") and "finetune.batch_size: must be >= 1, found 0" in quiet.stderr
    for done in (loud, flag):
        assert "Traceback (most recent call last)" in done.stderr
        assert done.stderr.rstrip().endswith(quiet.stderr.rstrip().splitlines()[-1])


def test_a_program_error_keeps_its_traceback(monkeypatch, capsys):
    from qac.console import call_main

    def broken(argv):
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        call_main(broken, [])

    def user(argv):
        raise SystemExit("data/x: missing (run the stage y)")

    assert call_main(user, [], prog="stage") == 2
    assert capsys.readouterr().err == "stage: error: data/x: missing (run the stage y)\n"


def test_the_params_file_as_dvc_exp_run_rewrites_it_is_read_back(tmp_path):
    """`dvc exp run ... -S profiles/smoke/params.yaml:pretrain.common.lr=5e-5` rewrites the whole file as YAML 1.2:
    `lr: 5e-05` (a string to PyYAML) and `time: 24:00:00` unquoted (the base-60 integer 86400 to PyYAML).
    A one-stage pipeline on the real smoke params reads them back as DVC meant them (the smoke pipeline test
    runs the README's command on the study itself)."""
    bin_dir = Path(sys.executable).parent
    (tmp_path / "profiles" / "smoke").mkdir(parents=True)
    (tmp_path / "profiles" / "smoke" / "params.yaml").write_text(
        (REPO / "profiles" / "smoke" / "params.yaml").read_text())
    reader = ("from qac.params import load_params; p = load_params(); "
              "print(repr(p['pretrain']['common']['lr']), repr(p['cluster']['sweep']['time']))")
    (tmp_path / "profiles" / "smoke" / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"read": {
        "wdir": "../..", "cmd": f'QAC_PARAMS=profiles/smoke/params.yaml python -c "{reader}" > read.txt',
        "params": [{"profiles/smoke/params.yaml": ["pretrain.common"]}], "outs": ["read.txt"]}}}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for command in (["git", "init", "-q"], [str(bin_dir / "dvc"), "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=qac", "-c", "user.email=qac@localhost", "commit", "-qm", "study"],
                    [str(bin_dir / "dvc"), "exp", "run", "profiles/smoke/dvc.yaml",
                     "-S", "profiles/smoke/params.yaml:pretrain.common.lr=5e-5"]):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "profiles" / "smoke" / "params.yaml").read_text()
    assert "lr: 5e-05" in text and yaml.safe_load(text)["pretrain"]["common"]["lr"] == "5e-05"
    assert (tmp_path / "read.txt").read_text().split() == ["5e-05", "'24:00:00'"]
