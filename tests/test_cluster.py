"""Slurm job scripts for the paper profile: every stage a job, chained as the DVC graph says.

The scripts are rendered without a cluster; ``submit.sh`` is then run with
``sbatch`` and ``dvc`` replaced by recorders on PATH (Slurm is not installed
here), so that what it would submit, and after what, is checked as bash
expands it. The expected dependencies are worked out here from first
principles: stage A waits for stage B when one of A's ``deps`` is, lies
inside or holds one of B's ``outs``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from qac.cluster import ClusterSettingsError, plan_jobs, stage_resources, write_slurm_scripts
from qac.params import ParamsError, load_params, profile_params_path, validate_params, with_values

REPO = Path(__file__).resolve().parent.parent

RECORDER = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["RECORD"]
calls = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
with open(log, "a") as handle:
    handle.write(json.dumps({"tool": os.path.basename(sys.argv[0]), "args": sys.argv[1:]}) + "\\n")
if os.path.basename(sys.argv[0]) == "sbatch":
    print(1000 + sum(call["tool"] == "sbatch" for call in calls))
"""


@pytest.fixture(scope="module")
def paper_graph():
    from qac.pipeline_plan import stage_graph

    return stage_graph("paper", REPO)


def dvc_edges() -> dict[str, set[str]]:
    """For each paper stage, the stages with an out that is, holds or lies inside one of its deps."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        stages = repo.stage.collect(str(profile_params_path("paper").parent / "dvc.yaml"))
        outs = {stage.name: [Path(out.fs_path) for out in stage.outs] for stage in stages}
        edges = {}
        for stage in stages:
            deps = [Path(dep.fs_path) for dep in stage.deps]
            edges[stage.name] = {other for other, paths in outs.items() if other != stage.name and any(
                dep == out or out in dep.parents or dep in out.parents for dep in deps for out in paths)}
        return edges


def run_submit(out_dir: Path, tmp_path: Path) -> list[dict]:
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for tool in ("sbatch", "dvc"):
        (tools / tool).write_text(RECORDER)
        (tools / tool).chmod(0o755)
    record = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "RECORD": str(record)}
    result = subprocess.run(["bash", str(out_dir / "submit.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def directives(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].split("=", 1) if "=" in line else (line[len("#SBATCH --"):], "")
                for line in script.splitlines() if line.startswith("#SBATCH --"))


@pytest.mark.slow
def test_paper_jobs_follow_the_dvc_graph(paper_graph, tmp_path, monkeypatch, capsys):
    from qac.cli import main

    monkeypatch.setattr("qac.pipeline_plan.stage_graph", lambda name: paper_graph)
    out_dir = tmp_path / "slurm"
    assert main(["profile", "plan", "paper", "--slurm", str(out_dir)]) == 0
    assert f"{len(paper_graph)} job scripts" in capsys.readouterr().out

    edges = dvc_edges()
    assert len(edges) == len(paper_graph) > 50
    calls = [call for call in run_submit(out_dir, tmp_path) if call["tool"] == "sbatch"]
    assert len(calls) == len(edges)
    submitted: dict[str, str] = {}     # job id -> stage
    for number, call in enumerate(calls):
        script = Path(call["args"][-1])
        stage = re.search(r"^stage=(\S+)$", script.read_text(), re.M).group(1)
        stage = shlex.split(stage)[0].split(":", 1)[1]
        after = [option.split(":")[1:] for option in call["args"] if option.startswith("--dependency=afterok:")]
        waits_for = {submitted[job] for job in (after[0] if after else [])}   # every id was submitted before
        assert waits_for == edges[stage], stage
        submitted[str(1000 + number)] = stage
    assert set(submitted.values()) == set(edges)

    params = load_params(profile_params_path("paper"), running=False)
    for stage, command, _ in paper_graph:
        script = (out_dir / (stage.replace("@", "-") + ".sbatch")).read_text()
        options = directives(script)
        resources = stage_resources(params.cluster, stage)
        assert "requeue" in options and options["nodes"] == str(resources.nodes)
        bash = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
        assert bash.returncode == 0, (stage, bash.stderr)
        if resources.gpus_per_node:
            assert options["gpus-per-node"] == str(resources.gpus_per_node)
        else:
            assert "gpus-per-node" not in options and "export CUDA_VISIBLE_DEVICES=''" in script
        if resources.distributed:
            launch = next(line for line in script.splitlines() if line.startswith("srun "))
            assert f"--nproc-per-node={resources.gpus_per_node}" in launch and "--rdzv-backend=c10d" in launch
            assert launch.endswith(command.split(" python ", 1)[1])
        else:
            assert command in script.splitlines() and "torchrun" not in script
        assert script.index("dvc --wait-for-lock status --quiet") < script.index("dvc --wait-for-lock commit --force")

    # The paper's GPU layout: multi-node generation, 8-GPU pre-training, CPU-only preparation and tables.
    assert stage_resources(params.cluster, "generate_queries").nodes == 2
    assert stage_resources(params.cluster, "pretrain@cotmae-mixed").distributed
    assert not stage_resources(params.cluster, "pretrain@none").gpus_per_node
    assert not stage_resources(params.cluster, "tables").gpus_per_node
    assert "dvc exp run --run-all --jobs 8" in (out_dir / "sweep.sbatch").read_text()


@pytest.mark.slow
def test_the_shared_cache_and_root_are_set_before_any_submission(paper_graph, tmp_path):
    params = with_values(load_params(profile_params_path("paper"), running=False), {
        "cluster.shared_root": str(tmp_path / "shared" / "qac"), "cluster.dvc_cache": str(tmp_path / "cache"),
        "cluster.partition": "gpu", "cluster.setup": ["source .venv/bin/activate"]})
    (tmp_path / "shared" / "qac").mkdir(parents=True)
    write_slurm_scripts("paper", params, paper_graph, tmp_path / "slurm", root=REPO)
    calls = run_submit(tmp_path / "slurm", tmp_path)
    assert calls[0] == {"tool": "dvc", "args": ["cache", "dir", "--local", str(tmp_path / "cache")]}
    assert all(call["tool"] == "dvc" for call in calls[:3]) and calls[3]["tool"] == "sbatch"
    script = (tmp_path / "slurm" / "tables.sbatch").read_text()
    assert f"cd {tmp_path / 'shared' / 'qac'}\nsource .venv/bin/activate\n" in script
    assert directives(script)["partition"] == "gpu"


GRAPH = [("prepare@a", "python pipelines/prepare.py --dataset a", ()),
         ("train", "QAC_PARAMS=p.yaml python pipelines/pretrain.py", ("prepare@a",)),
         ("report", "bash make_report.sh", ("train",))]
DEFAULT = {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 2, "mem": "4G", "time": "1:00:00", "distributed": False}


def cluster_params(stages: dict) -> dict:
    """A partial params file naming only its cluster resources."""
    return {"profile": "smoke", "cluster": {"default": DEFAULT, "stages": stages}}


@pytest.mark.parametrize("stages, message", [
    ({"trian": {"nodes": 2}}, "cluster.stages.trian: no such stage in the pipeline"),
    ({"train": {"nodes": 2}}, "cluster.stages.train: 2 nodes need distributed: true"),
    ({"report": {"distributed": True}}, "stage report: distributed: true needs a `python SCRIPT ...` command"),
])
def test_bad_cluster_settings_name_the_key_and_write_nothing(stages, message, tmp_path):
    params = validate_params(cluster_params(stages), complete=False)
    with pytest.raises(ClusterSettingsError, match=re.escape(message)):
        write_slurm_scripts("smoke", params, GRAPH, tmp_path / "slurm", root=tmp_path)
    assert not (tmp_path / "slurm").exists()


@pytest.mark.parametrize("stages, key", [
    ({"train": {"gpus": 2}}, "cluster.stages.train.gpus"),
    ({"train": {"gpus_per_node": -1}}, "cluster.stages.train.gpus_per_node"),
])
def test_a_resource_the_schema_refuses_stops_the_params_before_any_script(stages, key):
    with pytest.raises(ParamsError, match=re.escape(key)):
        validate_params(cluster_params(stages), complete=False)


def test_overrides_go_from_default_to_base_name_to_full_name():
    params = validate_params(cluster_params({
        "prepare": {"cpus_per_task": 8}, "prepare@a": {"mem": "32G"},
        "train": {"nodes": 2, "gpus_per_node": 4, "distributed": True}}), complete=False)
    prepare, train, report = plan_jobs(params, GRAPH)
    assert (prepare.resources.cpus_per_task, prepare.resources.mem, prepare.resources.time) == (8, "32G", "1:00:00")
    assert train.resources.processes_per_node == 4 and train.resources.nodes == 2
    assert report.resources == stage_resources(params.cluster, "report")
    assert report.upstream == ("train",)


def test_every_profile_declares_usable_cluster_settings():
    for name in ("smoke", "default", "paper"):
        params = load_params(profile_params_path(name), running=False)
        for stage in ("prepare@x", "generate_queries", "pretrain@none", "tables"):
            stage_resources(params.cluster, stage)


# --- what reaches a script line: checked by the schema, before any script -------------------------------

@pytest.mark.parametrize("key, value", [
    ("default.time", "25:00:00x"), ("default.time", "99:99:99"), ("default.time", "12:60:00"),
    ("default.time", "1-24:00:00"), ("default.time", "0"), ("default.time", " 1:00:00"),
    ("default.mem", "lots"), ("default.mem", "-4G"), ("default.mem", "0"), ("default.mem", "64 G"),
    ("stages.train.time", "12:00:00\n#SBATCH --exclusive"), ("stages.train.mem", 0),
    ("partition", "gpu; touch /tmp/x"), ("partition", "gpu long"), ("account", "lab$(id)"),
    ("qos", "high\n#SBATCH --exclusive"), ("shared_root", "relative/dir"), ("shared_root", "/shared/../qac"),
    ("shared_root", "/shared/my qac"), ("shared_root", "/shared/qac; rm -rf ~"),
])
def test_a_cluster_setting_sbatch_or_the_shell_would_misread_is_refused_naming_its_key(key, value):
    settings = copy.deepcopy(cluster_params({"train": {}}))
    *parents, name = key.split(".")
    target = settings["cluster"]
    for part in parents:
        target = target[part]
    target[name] = value
    with pytest.raises(ParamsError, match=re.escape(f"parameter cluster.{key}: expected ")):
        validate_params(settings, complete=False)


@pytest.mark.parametrize("time, mem", [("90", "64G"), (90, "512M"), ("30:00", "1T"), ("72:00:00", "900K"),
                                       ("2-12", "2048"), ("2-12:30", 64000), ("2-12:30:15", "16G"), ("0:30", "4G")])
def test_every_time_and_memory_form_sbatch_takes_is_written_as_given(time, mem, tmp_path):
    params = validate_params({"profile": "smoke", "cluster": {
        "default": {**DEFAULT, "time": time, "mem": mem}, "stages": {},
        "partition": "gpu,gpu-long", "account": "lab_1", "qos": "normal", "shared_root": "/shared/qac"}},
        complete=False)
    write_slurm_scripts("smoke", params, GRAPH, tmp_path / "slurm", root=tmp_path)
    options = directives((tmp_path / "slurm" / "train.sbatch").read_text())
    assert (options["time"], options["mem"], options["partition"]) == (str(time), str(mem), "gpu,gpu-long")
    assert (options["account"], options["qos"]) == ("lab_1", "normal")


def test_a_bad_cluster_setting_is_named_with_its_file_and_line(tmp_path):
    text = profile_params_path("smoke").read_text(encoding="utf-8")
    assert "  partition: null\n" in text
    path = tmp_path / "params.yaml"
    path.write_text(text.replace("  partition: null\n", "  partition: 'gpu; touch /tmp/x'\n"), encoding="utf-8")
    line = next(number for number, row in enumerate(path.read_text().splitlines(), 1) if "partition:" in row)
    with pytest.raises(ParamsError) as caught:
        load_params(path)
    assert str(caught.value).startswith(f"{path}:{line}: parameter cluster.partition: expected one or more Slurm "
                                        "names")


def test_a_scripts_folder_that_would_break_the_output_directive_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = validate_params(cluster_params({}), complete=False)
    root = tmp_path / "my checkout"
    with pytest.raises(ClusterSettingsError, match=re.escape(f"the scripts' folder {root}/slurm (--slurm slurm "
                                                             f"under {root}) is not an absolute path")):
        write_slurm_scripts("smoke", params, GRAPH, "slurm", root=root)
    assert not (root / "slurm").exists() and not (tmp_path / "slurm").exists()


# --- the --slurm folder: one paragraph, nothing written ------------------------------------------------

def slurm_refused(capsys, folder: str) -> str:
    from qac.cli import main

    assert main(["profile", "plan", "smoke", "--slurm", folder]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("qac: error: --slurm "), err
    return lines[0]


def test_a_slurm_folder_that_is_a_file_or_beneath_one_is_refused(tmp_path, capsys):
    taken = tmp_path / "f"
    taken.write_text("a file\n")
    assert slurm_refused(capsys, str(taken)) == f"qac: error: --slurm {taken}: is a file, not a folder"
    assert f"--slurm {taken}/sub: {taken} is a file, so no folder can be made under it" in \
        slurm_refused(capsys, f"{taken}/sub")
    assert taken.read_text() == "a file\n" and sorted(tmp_path.iterdir()) == [taken]


def test_a_slurm_folder_outside_the_working_folder_or_holding_other_files_is_refused(tmp_path, capsys,
                                                                                     monkeypatch):
    from qac.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert "--slurm ../slurm: expected a relative path inside its folder" in slurm_refused(capsys, "../slurm")
    assert not (tmp_path / "slurm").exists()
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "notes.txt").write_text("mine\n")
    assert "holds other files (notes.txt)" in slurm_refused(capsys, str(mixed))
    assert sorted(path.name for path in mixed.iterdir()) == ["notes.txt"]
    # A folder of an earlier rendering is rendered again.
    monkeypatch.chdir(REPO)
    assert main(["profile", "plan", "smoke", "--slurm", str(tmp_path / "slurm")]) == 0
    assert main(["profile", "plan", "smoke", "--slurm", str(tmp_path / "slurm")]) == 0


def test_plan_shows_one_view_at_a_time(capsys):
    from qac.cli import main

    with pytest.raises(SystemExit) as caught:
        main(["profile", "plan", "smoke", "--cells", "--slurm", "out"])
    assert caught.value.code == 2 and "argument --slurm: not allowed with argument --cells" in capsys.readouterr().err
    # --cost goes alone or with --cells (the extension tables' cells with their GPU-hours), never with --slurm
    assert main(["profile", "plan", "smoke", "--cost", "--slurm", "out"]) == 2
    assert "--cost and --slurm: one plan at a time" in capsys.readouterr().err
    assert main(["profile", "plan", "smoke", "--figures", "bench.json"]) == 2
    assert "--figures bench.json: only with --cost" in capsys.readouterr().err
