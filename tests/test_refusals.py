"""Refusals that name what to change: a stage run from the wrong folder, an upstream output missing, a
runaway document, a TSV line separated by spaces, a problem in base.yaml, the hpo command's options, a
model spec naming nothing, a retired MLflow store, a metrics pattern that matches nothing.

Each case was once a traceback, a message that pointed elsewhere, or work done in the wrong place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qac.errors import UserError

REPO = Path(__file__).resolve().parent.parent


def _stage(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("QAC_")}
    environment.update(PYTHONPATH=str(REPO), QAC_VERBOSE="", **env)
    return subprocess.run([sys.executable, str(REPO / "pipelines" / script)], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=120)


def test_a_stage_of_a_checkout_profile_run_from_another_folder_writes_nothing_there(tmp_path):
    """From docs/ (or anywhere but the checkout's root) outputs and runs would land in that folder."""
    result = _stage("bm25.py", tmp_path, QAC_PARAMS=str(REPO / "profiles" / "smoke" / "params.yaml"))
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("bm25.py: error: ") and f"run it from {REPO}" in line
    assert list(tmp_path.iterdir()) == []          # no data/, no mlflow.db, no mlartifacts/


def test_the_working_folder_rule_leaves_project_folders_of_their_own_alone(tmp_path):
    from qac.environment import working_folder_problem

    assert working_folder_problem(tmp_path / "params.yaml", REPO, REPO) is None     # a project folder elsewhere
    assert working_folder_problem(REPO / "profiles" / "smoke" / "params.yaml", REPO, REPO) is None
    assert "runs in" in working_folder_problem(REPO / "profiles" / "smoke" / "params.yaml", REPO / "docs", REPO)


@pytest.mark.parametrize("script", ["split_passages.py", "generate_continuations.py"])
def test_a_missing_upstream_output_is_one_paragraph(tmp_path, script):
    """A project folder whose prepare / split stages never ran."""
    from qac.config import write_params

    write_params({**_smoke_params(), "data_dir": "data"}, tmp_path / "params.yaml")
    result = _stage(script, tmp_path, QAC_PARAMS=str(tmp_path / "params.yaml"),
                    MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "not found" in result.stderr and "run the" in result.stderr


@pytest.mark.parametrize("script, args, missing", [
    ("pretrain.py", ["--variant", "cocondenser-query-q1"], "data/smoke/passages.arrow: file not found"),
    ("pretrain.py", ["--variant", "master-passage"], "data/smoke/passages.arrow: file not found"),
    ("bm25.py", [], "data/smoke/datasets/scifact: not found"),
])
def test_a_stage_missing_its_inputs_leaves_no_folder_and_no_run_behind(tmp_path, script, args, missing):
    """The inputs are checked before the output folder, the process group and the MLflow run are made: a
    failed stage once left an empty data/<profile>/pretrain folder and a FAILED run in the store."""
    from qac.config import write_params

    write_params({**_smoke_params(), "data_dir": "data"}, tmp_path / "params.yaml")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("QAC_")}
    environment.update(PYTHONPATH=str(REPO), QAC_VERBOSE="", QAC_PARAMS=str(tmp_path / "params.yaml"),
                       MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    result = subprocess.run([sys.executable, str(REPO / "pipelines" / script), *args], cwd=tmp_path,
                            env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert missing in result.stderr and "rebuild it with the DVC stage" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["params.yaml"]


def _smoke_params() -> dict:
    from qac.params import read_yaml

    return read_yaml((REPO / "profiles" / "smoke" / "params.yaml").read_text(encoding="utf-8"))


class _GivingUp:
    """NLTK's Punkt as it behaves on a pathological text: its regular-expression guard raises TimeoutError."""

    def span_tokenize(self, text):
        raise TimeoutError("regular-expression match exceeded its 5.0s time limit")


def test_a_document_the_sentence_splitter_gives_up_on_is_named():
    from qac.data.splitting import SplitSettings, TokenCounter, split_documents

    with pytest.raises(UserError, match=r"document 'D7' \(12 characters\): NLTK's Punkt sentence splitter gave up"):
        split_documents([("D7", "Word number.")], _GivingUp(), TokenCounter("minilm"),
                        SplitSettings(max_len=32, short_span_prob=0.0, random_sampled_window=10,
                                      overlap_sentences=1, seed=0, spans="bounded"))


@pytest.mark.parametrize("content, fields, whitespace, hint", [
    ("q1 some query text\n", ("qid", "text"), False, "no tab after a field"),
    ("q1\tdoc1\t1\n", ("qid", "iter", "docid", "rel"), True, "three columns are BEIR qrels"),
])
def test_a_wrongly_separated_line_says_how_it_reads(tmp_path, content, fields, whitespace, hint):
    from qac.data.errors import DataFormatError
    from qac.data.textfile import iter_rows, iter_trec_rows

    path = tmp_path / "file.tsv"
    path.write_text(content)
    rows = (iter_trec_rows(path, fields, comments="line-start", extra_fields=False) if whitespace
            else iter_rows(path, fields))
    with pytest.raises(DataFormatError, match=hint):
        list(rows)


def _profiles_copy(tmp_path: Path) -> Path:
    target = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", target)
    return target


def test_a_problem_in_the_base_is_named_at_the_base_even_in_a_section_the_profile_opens(tmp_path):
    """smoke.yaml writes `finetune:` (some of its keys); base.yaml writes finetune.temperature."""
    from qac.config import render_profile
    from qac.params.errors import ParamsError

    profiles = _profiles_copy(tmp_path)
    base = (profiles / "base.yaml").read_text()
    assert re.search(r"^finetune:", (profiles / "smoke.yaml").read_text(), re.M)
    start = base.index("\nfinetune:")
    line = base[:start].count("\n") + 1 + base[start:].splitlines().index("  temperature: 1.0")
    (profiles / "base.yaml").write_text(base[:start] + base[start:].replace("  temperature: 1.0",
                                                                             "  temperature: -1.0", 1))
    with pytest.raises(ParamsError) as caught:
        render_profile("smoke", profiles)
    assert f"{profiles / 'base.yaml'}:{line}: parameter finetune.temperature" in str(caught.value)


def test_render_refusing_a_hand_edit_exits_as_a_user_error(tmp_path, monkeypatch, capsys):
    from qac.cli import main

    rendered = REPO / "profiles" / "smoke" / "params.yaml"
    _profiles_copy(tmp_path)
    monkeypatch.chdir(tmp_path)          # profiles/ of the working folder is the one rendered
    copy = tmp_path / "profiles" / "smoke" / "params.yaml"
    assert copy.read_text() == rendered.read_text()
    copy.write_text(copy.read_text().replace("seed: 42", "seed: 44", 1))
    overrides = tmp_path / "profiles" / "smoke.yaml"
    overrides.write_text(overrides.read_text() + "\n")
    assert main(["profile", "render", "smoke"]) == 2
    assert "edited by hand" in capsys.readouterr().err


@pytest.mark.parametrize("option, value, said", [
    ("--n-trials", "-1", "--n-trials -1: must be >= 1"),
    ("--nproc-per-node", "0", "--nproc-per-node 0: must be >= 1"),
    ("--study-name", "../x", "--study-name ../x: expected a plain name"),
])
def test_the_hpo_command_names_its_own_options(option, value, said, capsys):
    from qac.cli import main

    assert main(["hpo", "--params", str(REPO / "profiles" / "smoke" / "params.yaml"), option, value]) == 2
    error = capsys.readouterr().err
    assert said in error and "Change it in that file" not in error


@pytest.mark.parametrize("spec, said", [("scratch:", "names no model after 'scratch:'"),
                                        ("tiny:", "names no model after 'tiny:'"), ("", "names no model")])
def test_a_model_spec_naming_nothing_is_refused(spec, said):
    from qac.model_specs import spec_problem

    assert said in spec_problem(spec)


def test_the_zero_shot_hard_negatives_are_looked_for_inside_the_mirror():
    from pydantic import ValidationError

    from qac.params.sections import HardNegativesSource

    HardNegativesSource(mirror="msmarco/hard-negatives.jsonl.gz", url=None, md5=None)
    with pytest.raises(ValidationError):
        HardNegativesSource(mirror="../../../etc/passwd", url=None, md5=None)


@pytest.mark.parametrize("allowed", ["", "true"])
def test_mlflows_folder_store_is_found_unusable_unless_allowed(tmp_path, monkeypatch, allowed):
    from qac.tracking import store

    monkeypatch.setattr(store, "_answers", {})
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", allowed)
    problem = store.store_problem(f"file:{tmp_path / 'runs'}")
    assert (problem is None) if allowed else ("folder store" in problem and "migrate-filestore" in problem)


def test_a_metrics_pattern_that_matches_nothing_is_told_from_a_profile_never_run(tmp_path, monkeypatch, capsys):
    from qac.cli import main
    from qac.config import write_params

    params = {**_smoke_params(), "data_dir": str(tmp_path / "data")}
    write_params(params, tmp_path / "params.yaml")
    assert main(["metrics", "--params", str(tmp_path / "params.yaml")]) == 1
    assert "run the profile first" in capsys.readouterr().err
    metrics = tmp_path / "data" / "smoke" / "metrics"
    metrics.mkdir(parents=True)
    (metrics / "split.json").write_text('{"passages": 12}')
    assert main(["metrics", "--params", str(tmp_path / "params.yaml"), "nDCG"]) == 1
    error = capsys.readouterr().err
    assert "no metric of" in error and "'nDCG'" in error and "run the profile first" not in error


@pytest.mark.parametrize("argv", [["check"], ["metrics"], ["tables"], ["profile", "show", "smoke"]])
def test_a_checkout_command_run_from_a_subfolder_names_the_root(tmp_path, monkeypatch, capsys, argv):
    """From reports/ or docs/, the relative paths would miss the profile's outputs: `qac check` said "not run"
    of a finished run. The command names the root to run it from, and writes nothing."""
    from qac.cli import main

    (tmp_path / ".dvc").mkdir()
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "base.yaml").write_text("seed: 1\n", encoding="utf-8")
    inside = tmp_path / "reports" / "smoke"
    inside.mkdir(parents=True)
    monkeypatch.chdir(inside)
    assert main(argv) == 2
    message = capsys.readouterr().err
    assert f"run it in {tmp_path} (cd {tmp_path})" in message and f"qac {argv[0]} works on the checkout" in message
    assert sorted(p.name for p in tmp_path.rglob("*")) == [".dvc", "base.yaml", "profiles", "reports", "smoke"]


def test_eval_reads_the_files_it_is_given_from_any_folder(tmp_path, monkeypatch, capsys):
    from qac.cli import main

    (tmp_path / ".dvc").mkdir()
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "base.yaml").write_text("seed: 1\n", encoding="utf-8")
    inside = tmp_path / "notes"
    inside.mkdir()
    (inside / "qrels.txt").write_text("q1 0 d1 1\n", encoding="utf-8")
    (inside / "run.txt").write_text("q1 Q0 d1 1 2.0 x\n", encoding="utf-8")
    monkeypatch.chdir(inside)
    assert main(["eval", "--qrels", "qrels.txt", "--run", "run.txt", "--metrics", "RR@10"]) == 0
    assert json.loads(capsys.readouterr().out)["RR@10"] == 1.0
