"""Slurm job scripts for the paper profile: every stage a job, chained as the DVC graph says.

The scripts are rendered without a cluster; ``submit.sh`` is then run with
``sbatch`` and ``dvc`` replaced by recorders on PATH (Slurm is not installed
here), so that what it would submit, and after what, is checked as bash
expands it. The expected dependencies are worked out here from first
principles: stage A waits for stage B when one of A's ``deps`` is, lies
inside or holds one of B's ``outs``.
"""

from __future__ import annotations

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

    params = load_params(profile_params_path("paper"))
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
    params = with_values(load_params(profile_params_path("paper")), {
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
        params = load_params(profile_params_path(name))
        for stage in ("prepare@x", "generate_queries", "pretrain@none", "tables"):
            stage_resources(params.cluster, stage)
