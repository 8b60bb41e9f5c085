"""The study end to end: `dvc repro` on the smoke profile in a fresh copy of the repository.

The suite's one smoke study (tests/smoke_study.py, built once per session) is
the slowest thing in the suite (a few minutes); this module works on a copy of
it, and every assertion here is about its result, a second `dvc repro`, or a
targeted parameter change.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qac.config import write_params
from smoke_study import PARAMS, PIPELINE, copy_study, study_env

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# The module's first test sets up the whole smoke study (minutes on 2 cores): a longer timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _run(cmd, cwd, env, check=True):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}")
    return result


@pytest.fixture(scope="module")
def smoke_study(shared_smoke_study, shared_data, tmp_path_factory):
    """This module's copy of the suite's smoke study (its tests change it): folder, environment, first repro."""
    work = copy_study(shared_smoke_study[0], tmp_path_factory.mktemp("study") / "repo")
    return work, study_env(work, shared_data), shared_smoke_study[1]


def _headline(work: Path) -> dict:
    return json.loads((work / "reports" / "headline" / "smoke.json").read_text(encoding="utf-8"))


def test_an_experiment_shows_the_changed_parameter_beside_the_headline_it_moved(shared_smoke_study, shared_data,
                                                                              tmp_path):
    """`dvc exp run -S` on the committed study reruns only what the parameter reaches; `dvc exp show`
    holds the parameter and the numeric headline of the baseline and the experiment; `dvc checkout`
    of the baseline's lock restores the baseline's headline from the DVC cache.

    A cheap parameter: annotation.documents reaches the annotation stage and the tables (Table 5).
    It runs on its own copy of the study, as `dvc repro` left it.
    """
    work = copy_study(shared_smoke_study[0], tmp_path / "repo")
    env = study_env(work, shared_data)
    commit = ["git", "-c", "user.name=qac", "-c", "user.email=qac@localhost", "commit", "--allow-empty", "-qm"]
    _run(["git", "add", "-A"], work, env)
    _run([*commit, "smoke study"], work, env)
    baseline = _headline(work)
    documents = yaml.safe_load((work / PARAMS).read_text())["annotation"]["documents"]
    done = _run([str(BIN / "dvc"), "exp", "run", PIPELINE, "-n", "fewer-documents",
                 "-S", f"{PARAMS}:annotation.documents={documents // 2}"], work,
                {**env, "DVC_IGNORE_ISATTY": "true"})   # DVC's progress and lock lines as on a terminal
    ran = {line.split("'")[1].rsplit(":", 1)[-1] for line in done.stdout.splitlines()
           if line.startswith("Running stage") or "is cached - skipping run" in line}   # (or from DVC's run cache)
    assert ran == {"annotation", "tables"}, done.stdout
    # The stages take no lock of DVC's, so DVC never waits for its own lock between them.
    assert "Waiting to acquire lock" not in done.stdout + done.stderr
    moved = _headline(work)
    assert moved != baseline and moved["table1"] == baseline["table1"]
    assert moved["table5"] != baseline["table5"]

    shown = json.loads(_run([str(BIN / "dvc"), "exp", "show", "--only-changed", "--json"], work, env).stdout)
    rows = {row["rev"]: row for row in shown}
    head = _run(["git", "rev-parse", "HEAD"], work, env).stdout.strip()
    experiment = next(rev for group in rows[head]["experiments"] for rev in group["revs"]
                      if rev["name"] == "fewer-documents")
    for row, expected, headline in ((rows[head], documents, baseline), (experiment, documents // 2, moved)):
        data = row["data"]
        assert data["params"][PARAMS]["data"]["annotation"]["documents"] == expected
        metrics = data["metrics"]["reports/headline/smoke.json"]["data"]
        assert metrics == headline
        values = [value for rows_ in metrics.values() for columns in rows_.values() for value in columns.values()]
        assert values and all(isinstance(value, (int, float)) for value in values)

    # Back to the baseline: git restores the params and the lock, DVC the headline the lock names.
    _run(["git", "checkout", "--", "profiles/smoke"], work, env)
    _run([str(BIN / "dvc"), "checkout", PIPELINE], work, env)
    assert _headline(work) == baseline


def test_every_stage_ran_and_wrote_its_outputs(smoke_study):
    work, _, first = smoke_study
    params = yaml.safe_load((work / PARAMS).read_text())
    out = work / "data" / "smoke"
    assert (out / "passages.arrow").exists() and (out / "queries.arrow").exists()
    for variant in params["pretrain"]["variants"]:
        assert (out / "pretrain" / variant / "encoder" / "config.json").exists()
        for retriever in ("r1", "r2"):
            assert (out / "finetune" / variant / retriever / "config.json").exists()
        metrics = json.loads((out / "metrics" / "eval" / f"{variant}.json").read_text())
        assert metrics, variant
    tables = (work / "reports" / "smoke" / "tables.md").read_text()
    for number in range(1, 6):
        assert f"Table {number}" in tables


def test_queries_cover_every_passage(smoke_study):
    work, _, _ = smoke_study
    from qac.data.arrowstore import PASSAGES_SCHEMA, QUERIES_SCHEMA, iter_records

    passages = [record["pid"] for record in iter_records(work / "data/smoke/passages.arrow", PASSAGES_SCHEMA)]
    queries = list(iter_records(work / "data/smoke/queries.arrow", QUERIES_SCHEMA))
    assert [q["pid"] for q in queries] == passages
    assert all(q["queries"] for q in queries)


def test_mlflow_holds_the_study_tree(smoke_study):
    work, _, _ = smoke_study
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("qac-smoke")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    by_id = {run.info.run_id: run for run in runs}
    pretrain = [r for r in runs if r.data.tags.get("qac.kind") == "pretrain"]
    finetune = [r for r in runs if r.data.tags.get("qac.kind") == "finetune"]
    assert pretrain and finetune
    study = by_id[pretrain[0].data.tags["mlflow.parentRunId"]]
    assert study.data.tags["qac.role"] == "study"
    for run in finetune:
        assert by_id[run.data.tags["mlflow.parentRunId"]].data.tags["qac.kind"] == "pretrain"
        assert any(key.endswith("nDCG_at_10") for key in run.data.metrics)
    trained = [r for r in pretrain if r.data.tags.get("qac.method") != "none"]
    assert trained and all(client.get_metric_history(r.info.run_id, "loss") for r in trained)
    # Each training and generation stage measured what its work cost (qac.tracking.cost).
    measured = [r for r in runs if r.info.status == "FINISHED" and r.data.tags.get("qac.kind") in (
        "pretrain", "finetune", "query_generator", "querygen", "continuation")]
    assert {r.data.tags["qac.kind"] for r in measured} >= {"pretrain", "finetune", "query_generator", "querygen"}
    for run in measured:
        assert run.data.metrics["cost/device_seconds"] > 0 and "qac.cost.energy" in run.data.tags, run.info.run_name


def test_the_console_shows_summaries_and_no_library_noise(smoke_study):
    import re

    _, _, first = smoke_study
    output = first.stdout + first.stderr
    assert "LOAD REPORT" not in output
    assert "system_metrics" not in output
    assert re.search(r"^pretrain@cocondenser-\S+: \d+ steps, final loss \d+\.\d{3}, ", output, re.MULTILINE)
    assert re.search(r"^evaluate@none: r1 scifact/test ", output, re.MULTILINE)


def test_fine_tuning_runs_pivot_on_the_variant(smoke_study):
    import mlflow

    work, _, _ = smoke_study
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["qac-smoke"], filter_string="tags.`qac.kind` = 'finetune'")
    assert len(runs) and runs[["params.method", "params.context_type"]].notna().all().all()
    # C only where queries were read
    read_queries = runs["params.context_type"].isin(["query", "mixed"])
    assert runs.loc[read_queries, "params.query_count"].notna().all()
    assert runs.loc[~read_queries, "params.query_count"].isna().all()
    assert set(runs["params.retriever"]) == {"r1", "r2"}


def test_every_stage_declares_the_code_it_ran_and_only_code_it_can_import(smoke_study):
    """Both ways, per stage run of the smoke study: every qac file the run imported (its MLflow record) is
    among the stage's code deps, unless it cannot change an output (:data:`qac.import_graph.NOT_RESULT_CODE`,
    or imported only by such a module: the params file's checks, a log line); and the deps are the code the
    stage's script can import, as the render generates it, nothing more. A dep the run did not import is code
    of a path this profile does not take (a multi-GPU job, another corpus reader)."""
    import mlflow

    from qac.import_graph import is_result_code, runs_code, script_closure, stage_code
    from qac.tracking.record import CODE_ARTIFACT

    work, env, _ = smoke_study
    stages = yaml.safe_load((work / PIPELINE).read_text())["stages"]
    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("qac-smoke")
    runs = [run for run in client.search_runs([experiment.experiment_id], max_results=1000)
            if "qac.stage" in run.data.tags]
    checked = set()
    for run in runs:
        stage = run.data.tags["qac.stage"].split("@")[0]
        spec = stages[stage].get("do", stages[stage])
        script = next(word for word in spec["cmd"].split() if word.startswith("pipelines/"))
        code = [dep for dep in spec["deps"] if dep.startswith(("qac/", "pipelines/"))]
        assert code == stage_code(script, work), f"{stage}: profiles/smoke/dvc.yaml is not the render of its imports"
        reachable = {path.relative_to(work).as_posix() for path in script_closure(Path(script), work)}
        ran = json.loads(Path(client.download_artifacts(run.info.run_id, CODE_ARTIFACT)).read_text())
        assert "qac/tracking/__init__.py" in ran, stage     # the record holds what the stage imported
        served = reachable - set(code)        # reached only through modules that cannot change an output
        undeclared = [path for path in ran if is_result_code(path) and runs_code(work / path)
                      and path not in code and path not in served]
        assert not undeclared, f"{run.data.tags['qac.stage']} runs code it does not depend on: {undeclared}"
        checked.add(stage)
    assert checked >= {"prepare", "split_passages", "query_generator", "generate_queries", "pretrain", "bm25",
                       "finetune", "evaluate", "annotation"}


def test_dvc_writing_its_lock_marks_no_run_dirty(smoke_study):
    """The copy was committed before `dvc repro`: DVC rewriting profiles/smoke/dvc.lock is not a code change."""
    work, _, _ = smoke_study
    import mlflow

    store = work / "mlflow.db"
    client = mlflow.MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([client.get_experiment_by_name("qac-smoke").experiment_id], max_results=1000)
    stage_runs = [run for run in runs if "qac.stage" in run.data.tags]
    assert stage_runs and {run.data.tags["qac.git_dirty"] for run in stage_runs} == {"false"}
    assert all(run.info.status != "RUNNING" for run in runs)


def test_second_repro_is_a_no_op(smoke_study):
    work, env, _ = smoke_study
    second = _run([str(BIN / "dvc"), "repro", PIPELINE], work, env)
    assert "Running stage" not in second.stdout
    # the study was built two stages at a time (`qac repro --jobs 2`, as `make smoke`); DVC finds it whole, and so
    # does the runner
    again = _run([str(BIN / "qac"), "repro", "--jobs", "2", "smoke"], work, env)
    assert again.stdout.startswith("repro smoke: every stage up to date"), again.stdout


def test_running_a_profile_changes_only_its_own_lock_and_reports(smoke_study):
    """Profiles never dirty git: no params file is rewritten, no other profile's lock moves, nothing is staged."""
    work, env, _ = smoke_study
    status = _run(["git", "status", "--porcelain", "--untracked-files=all"], work, env).stdout.splitlines()
    changed = {line[3:] for line in status}
    assert all(line[0] in " ?" for line in status), f"DVC staged files: {status}"
    own = {"profiles/smoke/dvc.lock", "reports/query_generator/smoke.md"}
    assert all(path in own or path.startswith("reports/smoke/") for path in changed), changed


def _table_rows(work: Path) -> list[str]:
    text = (work / "reports" / "smoke" / "tables.md").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.startswith("|")]


def test_tables_rebuild_identically_without_the_mlflow_store(smoke_study, tmp_path):
    """DVC outputs are the source of every number: with the MLflow store gone the tables come out the same.

    The store is made absent by pointing the stage at an empty one. Deleting ``mlflow.db`` instead
    would leave this process's MLflow client (it caches one database engine per URI) reading the
    deleted file, so the later tests of this module would see a stale store.
    """
    import shutil

    work, env, _ = smoke_study
    before = _table_rows(work)
    assert before and "sqlite" not in (work / "reports" / "smoke" / "tables.md").read_text()
    shutil.rmtree(work / "reports" / "smoke")
    empty_store = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'empty.db'}"}
    again = _run([str(BIN / "dvc"), "repro", PIPELINE], work, empty_store)
    assert {line.split("'")[1].rsplit(":", 1)[-1] for line in again.stdout.splitlines()
            if line.startswith("Running stage")} == {"tables"}
    assert _table_rows(work) == before


def test_changing_one_parameter_reruns_only_its_dependents(smoke_study):
    work, env, _ = smoke_study
    params_path = work / PARAMS
    original = params_path.read_text()
    params = yaml.safe_load(original)
    params["evaluate"]["batch_size"] += 1
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        dry = _run([str(BIN / "dvc"), "repro", "--dry", PIPELINE], work, env)
    finally:    # the later tests start from the study's own parameters
        params_path.write_text(original)
    planned = {line.split("'")[1].rsplit(":", 1)[-1] for line in dry.stdout.splitlines()
               if line.startswith("Running stage")}
    # A dry run plans the stages whose own parameters or inputs changed: those that declare the
    # `evaluate` section (every evaluate@<variant> and the BEIR retriever, which evaluates too);
    # `tables` follows only if their outputs then change.
    stages = yaml.safe_load((work / PIPELINE).read_text())["stages"]
    declaring = set()
    for name, stage in stages.items():
        body = stage.get("do", stage)
        keys = [key for entry in body.get("params", []) if isinstance(entry, dict)
                for listed in entry.values() for key in listed]
        if "evaluate" in keys:
            if "foreach" in stage:      # ${section.key}: one stage per key of that mapping
                items = params
                for part in stage["foreach"].strip("${}").split("."):
                    items = items[part]
                declaring |= {f"{name}@{key}" for key in items}
            else:
                declaring.add(name)
    assert "beir_retriever" in declaring and planned == declaring


def test_the_readme_experiment_command_runs_to_the_end(smoke_study):
    """README: `dvc exp run profiles/smoke/dvc.yaml -S profiles/smoke/params.yaml:pretrain.common.lr=5e-5`.

    DVC writes the value as `lr: 5e-05`, which YAML 1.1 (PyYAML) reads as a string: pre-training
    once died with a TypeError inside torch. The experiment is aimed at one variant's pre-training,
    the first stage the value reaches, so that only it reruns (its upstream is in the DVC cache).
    """
    import mlflow

    work, env, _ = smoke_study
    variant = "cocondenser-query-q4"
    losses = work / "data" / "smoke" / "pretrain" / variant / "losses.tsv"
    before = losses.read_text()
    done = _run([str(BIN / "dvc"), "exp", "run", f"{PIPELINE}:pretrain@{variant}",
                 "-S", f"{PARAMS}:pretrain.common.lr=5e-5"], work, env)
    ran = {line.split("'")[1].rsplit(":", 1)[-1] for line in done.stdout.splitlines()
           if line.startswith("Running stage")}
    assert ran == {f"pretrain@{variant}"}, done.stdout
    import re

    assert re.search(r"\blr: 5e-0?5\b", (work / PARAMS).read_text())       # as DVC writes it
    from qac.params import load_params

    assert load_params(work / PARAMS)["pretrain"]["common"]["lr"] == 5e-05
    after = losses.read_text()
    assert len(after.splitlines()) == len(before.splitlines()) and after != before   # trained again, differently
    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("qac-smoke")
    runs = client.search_runs([experiment.experiment_id], f"tags.`qac.stage` = 'pretrain@{variant}'",
                              order_by=["attributes.start_time DESC"])
    seen = [(run.info.run_id, run.info.start_time, run.data.params.get("lr"), run.info.status) for run in runs]
    assert runs and float(runs[0].data.params["lr"]) == 5e-05, (seen, done.stdout, done.stderr[-3000:])


def test_outputs_and_metrics_hold_no_run_bookkeeping(smoke_study):
    work, _, _ = smoke_study
    data = work / "data" / "smoke"
    declared = [path for path in data.rglob("*") if path.is_file() and ".runs" not in path.parts
                and ".work" not in path.parts and "timing" not in path.parts]
    assert not [path for path in declared if path.name == "mlflow_run.json"]
    for path in declared:
        if path.suffix in (".json", ".md", ".csv", ".tsv"):
            text = path.read_text(encoding="utf-8", errors="replace")
            assert "mlflow_run_id" not in text and "sqlite:" not in text and "cost/device_seconds" not in text, path
    assert (data / ".runs" / "finetune" / "none" / "r1" / "mlflow_run.json").is_file()


def test_a_forced_rerun_without_the_store_reproduces_every_hash(smoke_study, tmp_path):
    """No MLflow store (or another one): fine-tuning reruns, links nothing, and writes the same bytes,
    so DVC's lock is unchanged and nothing downstream is out of date."""
    work, env, _ = smoke_study
    lock = (work / "profiles" / "smoke" / "dvc.lock").read_text()
    status = _run([str(BIN / "dvc"), "status", PIPELINE], work, env).stdout
    other = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'another.db'}"}
    forced = _run([str(BIN / "dvc"), "repro", "-f", "-s", f"{PIPELINE}:finetune@none"], work, other)
    assert "Running stage" in forced.stdout and "not linked" in forced.stdout + forced.stderr
    assert (work / "profiles" / "smoke" / "dvc.lock").read_text() == lock
    assert _run([str(BIN / "dvc"), "status", PIPELINE], work, env).stdout == status   # nothing more to rerun


def test_the_check_fails_on_a_regression(smoke_study, tmp_path):
    """`qac check` can fail: BM25 run with k1 = 0 (a broken setting: term frequency ignored) loses far more
    than two queries' worth of the 300 SciFact test queries. (The study's retrievers are tiny random models
    near chance level, whose cells a broken setting moves by about as much as another library version does;
    BM25 gives the check a real signal, and no training noise.)"""
    work, env, _ = smoke_study
    expected = tmp_path / "expected.yaml"
    smoke = {**env, "QAC_PROFILE": "smoke"}
    _run([str(BIN / "qac"), "check", "--record", "--expected", str(expected)], work, smoke)
    assert _run([str(BIN / "qac"), "check", "--expected", str(expected)], work, smoke).returncode == 0
    # Read and written as DVC does (YAML 1.2 numbers): PyYAML alone turns a Slurm time 24:00:00 into 86400.
    from qac.params import read_yaml

    params = read_yaml((work / PARAMS).read_text())
    params["bm25"]["k1"] = 0.0
    perturbed = tmp_path / "params.yaml"
    write_params(params, perturbed)
    _run([sys.executable, "pipelines/bm25.py"], work, {**env, "QAC_PARAMS": str(perturbed)})
    failed = _run([str(BIN / "qac"), "check", "--expected", str(expected)], work, smoke, check=False)
    _run([sys.executable, "pipelines/bm25.py"], work, {**env, "QAC_PARAMS": str(work / PARAMS)})   # as it was
    assert _run([str(BIN / "qac"), "check", "--expected", str(expected)], work, smoke).returncode == 0
    assert failed.returncode == 1 and "NOT reproduced" in failed.stdout
    failing = [line for line in failed.stdout.splitlines() if line.startswith("FAIL")]
    assert {line.split(" | ")[1] for line in failing} == {"BM25"}, failing
