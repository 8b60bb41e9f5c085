"""The paper profile in miniature: the paper's graph, switches and code paths, run end to end on synthetic data.

profiles/paper-mini.yaml is rendered over profiles/paper.yaml and may change only sizes and pin the hub
models to the mirror's commits; its graph must be the paper's stage by stage. The study runs `qac repro --jobs
2 paper-mini` in a copy of the repository on the mirror tests/paper_mini_mirror.py writes (real formats, tiny
random models under the paper's hub names), then `qac check` on it, and renders the paper's Slurm jobs from
the same graph. Measured with its 82 stages: 3 minutes on 2 quiet cores (172 s of it the study's set-up),
7 minutes on 2 cores shared with other work (load 3-4).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qac.config import render_profile
from qac.model_specs import is_commit, unpinned_problem
from qac.pipeline_plan import stage_graph

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(TESTS))
import paper_mini_mirror  # noqa: E402

# What the miniature may change: sizes (lengths, counts, steps, batches, depths, workers, logging and checkpoint
# intervals, the tables' permutation count), the run monitor, the cluster's resources and the expected file
# naming its own profile. A method switch is none of these: it stays the paper's.
SIZE_KEYS = {"max_len", "query_max_len", "passage_max_len", "corpus_max_len", "judge_max_len", "max_source_len",
             "max_new_tokens", "workers", "loader_workers", "batch_size", "encode_batch_size", "chunk_size",
             "steps", "grad_accumulation", "grad_cache_chunk", "checkpoint_every", "log_every", "epochs",
             "train_n_passages", "bm25_depth", "mine_depth", "mine_sample", "official_negatives", "depth", "documents",
             "calibration_pairs", "quality_max_documents", "permutations", "system_metrics", "passage_tokens",
             "example_tokens"}
SIZE_SECTIONS = ("cluster.", "check.expected")


def _leaves(value, prefix=""):
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{prefix}{key}.")
    elif isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        for index, item in enumerate(value):          # a list of model specs: each pinned or not on its own
            yield f"{prefix}{index}", item
    else:
        yield prefix[:-1], value


def _pinned(paper_value, mini_value) -> bool:
    """Whether the miniature's value is the paper's hub model pinned to a commit (``name@<commit>``)."""
    name, mark, commit = str(mini_value).rpartition("@")
    return bool(mark) and name == str(paper_value).partition("@")[0] and is_commit(commit)


def test_paper_mini_changes_only_sizes_of_the_paper_profile():
    paper, mini = dict(_leaves(render_profile("paper"))), dict(_leaves(render_profile("paper-mini")))
    assert set(mini) == set(paper), sorted(set(mini) ^ set(paper))
    changed = {key for key in paper if paper[key] != mini[key] and key != "profile"}
    switches = {key for key in changed if key.rsplit(".", 1)[-1] not in SIZE_KEYS and not key.startswith(SIZE_SECTIONS)
                and not _pinned(paper[key], mini[key])}
    assert not switches, f"profiles/paper-mini.yaml changes more than sizes: {sorted(switches)}"
    assert changed, "the miniature is the paper profile itself"


def test_paper_mini_pins_every_hub_model_it_loads():
    """Each hub spec of the miniature carries the commit its stand-in is stored under in the mirror's hub cache."""
    from qac.params import validate_params
    from qac.params.model_sources import model_keys, pin_problems

    params = validate_params(render_profile("paper-mini"))
    generators = {f"llm_queries.generators.{name}.model" for name, entry in params.llm_queries.generators.items()
                  if is_commit(entry.revision)}                     # pinned by their own revision key
    unpinned = {key: spec for key, spec in model_keys(params) if unpinned_problem(spec) and key not in generators}
    assert not unpinned, unpinned
    assert params.pinned_models and not pin_problems(params)       # as the paper profile requires of a run
    pins = paper_mini_mirror.hub_pins(render_profile("paper-mini"))
    assert pins["bert-base-uncased"] == paper_mini_mirror._revision("bert-base-uncased", {})


def test_paper_mini_has_the_paper_graph_stage_by_stage():
    """Each stage of the paper profile is a stage of the miniature with the same command and upstream stages."""
    paper = {name: (command, upstream) for name, command, upstream in stage_graph("paper", REPO)}
    mini = {name: (command.replace("profiles/paper-mini/", "profiles/paper/"), upstream)
            for name, command, upstream in stage_graph("paper-mini", REPO)}
    assert list(mini) == list(paper)
    for name in paper:
        assert mini[name] == paper[name], name


def test_paper_mini_expects_the_papers_cells():
    def cells(name):
        return yaml.safe_load((REPO / "profiles" / "expected" / f"{name}.yaml").read_text())["cells"]

    assert cells("paper-mini") == cells("paper")


def _digests(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def test_the_mirror_is_the_same_bytes_every_time(tmp_path):
    first = _digests(paper_mini_mirror.build(tmp_path / "a"))
    assert first == _digests(paper_mini_mirror.build(tmp_path / "b"))
    for folder in ("msmarco-docs", "msmarco-passage-rocketqa", "trec-msmarco", "msmarco-hard-negatives",
                   *paper_mini_mirror.BEIR_SETS, *(f"cqadupstack/{forum}" for forum in paper_mini_mirror.FORUMS)):
        assert any(name.startswith(f"mirror/{folder}/") for name in first), folder


def _run(cmd, cwd, env, codes=(0,)):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode in codes, f"{' '.join(map(str, cmd))}: exit {result.returncode}\n" \
                                       f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module")
def paper_mini_study(tmp_path_factory, copy_repository):
    """A copy of the repository in which `qac repro --jobs 2 paper-mini` ran; its folder and environment."""
    root = tmp_path_factory.mktemp("paper-mini")
    work = copy_repository(root / "repo")
    outside = paper_mini_mirror.build(root / "stand-ins", paper_mini_mirror.hub_pins(render_profile("paper-mini")))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(work),
           "TOKENIZERS_PARALLELISM": "false", **paper_mini_mirror.environment(outside)}
    env.pop("MLFLOW_TRACKING_URI", None)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=qac", "-c", "user.email=qac@localhost", "commit", "-qm", "study"]):
        _run(cmd, work, env)
    repro = _run([str(BIN / "qac"), "repro", "--jobs", "2", "paper-mini"], work, env)
    return work, env, repro


@pytest.mark.slow
@pytest.mark.timeout(900)   # the study's repro runs in this test's set-up
def test_paper_mini_runs_every_stage_of_the_paper_profile(paper_mini_study):
    work, _, repro = paper_mini_study
    lock = yaml.safe_load((work / "profiles" / "paper-mini" / "dvc.lock").read_text())
    assert set(lock["stages"]) == {name for name, _, _ in stage_graph("paper", REPO)}
    assert "82 stage(s) checked or run" in repro.stdout


@pytest.mark.slow
def test_the_runs_record_the_pinned_commits_they_loaded(paper_mini_study):
    """Every pinned hub model is loaded at its commit, and the run records of the outputs say so."""
    import json

    work, _, _ = paper_mini_study
    loaded = {(entry["model"], entry["revision"], entry["commit"])
              for record in (work / "data" / "paper-mini").rglob("mlflow_run.json")
              for entry in json.loads(record.read_text()).get("loaded_models", [])}
    pins = paper_mini_mirror.hub_pins(render_profile("paper-mini"))
    for name in ("bert-base-uncased", "Luyu/condenser", "doc2query/all-with_prefix-t5-base-v1"):
        assert (name, pins[name], pins[name]) in loaded, (name, sorted(loaded))
    assert all(commit is not None and (revision is None or revision == commit) for _, revision, commit in loaded)


@pytest.mark.slow
def test_qac_check_judges_every_published_cell_of_the_miniature(paper_mini_study):
    """A reproduction check of the paper's 146 cells: tiny random models reproduce none, and say so cell by cell."""
    work, env, _ = paper_mini_study
    result = _run([str(BIN / "qac"), "check"], work, {**env, "QAC_PROFILE": "paper-mini"}, codes=(1,))
    cells = yaml.safe_load((REPO / "profiles" / "expected" / "paper-mini.yaml").read_text())["cells"]
    verdicts = [line for line in result.stdout.splitlines()
                if line.startswith(("REPRODUCED", "WITHIN NOISE", "DIFFERS", "MISSING"))]
    assert len(verdicts) == len(cells)
    assert not [line for line in verdicts if line.startswith("MISSING")]
    assert "Traceback" not in result.stdout + result.stderr
    assert "NOT reproduced" in result.stdout.splitlines()[-1]


@pytest.mark.slow
def test_the_papers_slurm_jobs_are_the_stages_the_miniature_ran(paper_mini_study, tmp_path):
    work, env, _ = paper_mini_study
    jobs = {}
    for profile in ("paper", "paper-mini"):
        out = tmp_path / profile
        _run([str(BIN / "qac"), "profile", "plan", profile, "--slurm", str(out)], work, env)
        jobs[profile] = sorted(path.name for path in out.glob("*.sbatch") if path.name != "sweep.sbatch")
    assert jobs["paper"] == jobs["paper-mini"]
    lock = yaml.safe_load((work / "profiles" / "paper-mini" / "dvc.lock").read_text())
    assert len(jobs["paper"]) == len(lock["stages"])


@pytest.mark.slow
def test_the_extension_table_holds_the_planned_cells_with_their_queries(paper_mini_study):
    """The LLM-query extension table the tables stage wrote has exactly the cells `qac profile plan --cells`
    plans, each with a value; its Δ rows are tested; each LLM variant records the queries it pre-trained on."""
    import csv
    import json

    from qac.params import load_params
    from qac.reporting.cell_plan import EXTENSION_LLM, plan_extension_cells

    work, _, _ = paper_mini_study
    params = load_params(work / "profiles" / "paper-mini" / "params.yaml", running=False)
    with open(work / "reports" / "paper-mini" / f"{EXTENSION_LLM}.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    values = {(row["row"], row["column"]): row for row in rows if row["kind"] == "value"}
    planned = {(cell.row, cell.column) for cell in plan_extension_cells(params)}
    assert planned and planned <= set(values)
    assert all(values[key]["ours"] != "" for key in planned)
    differences = [row for row in rows if row["kind"] == "difference"]
    assert differences and all(row["p_value"] != "" and row["p_holm"] != "" for row in differences)
    assert any(row["row"].endswith("− unfiltered") for row in differences)
    for name, spec in params.llm_queries.variants.items():
        record = json.loads((work / "data" / "paper-mini" / "pretrain" / name / "queries.json").read_text())
        assert record["generator"] == spec.generator and record["filtered"] == spec.filtered
        assert 0 < record["queries"] <= record["passages"] * spec.query_count
        assert (record["filter"] is not None) == spec.filtered
