"""Slurm job scripts for a profile's stages, chained along the DVC graph (docs/cluster.md).

``qac profile plan NAME --slurm DIR`` writes one ``sbatch`` script per stage of
``profiles/NAME/dvc.yaml`` and ``DIR/submit.sh``, which submits them in DVC's run
order, each with ``--dependency=afterok:`` on the jobs of the stages it depends
on in the DVC graph. Resources come from the ``cluster`` section of the params:
``cluster.default`` overridden per stage by ``cluster.stages.<base name>`` (a
``foreach`` stage such as ``pretrain@cotmae-mixed`` by ``pretrain``) and then by
``cluster.stages.<full name>``.

A job does not go through ``dvc repro`` (which holds the repository's lock for
the whole stage, so two stages could not run at once): it asks DVC whether the
stage is up to date (a requeued job that had finished stops there), runs the
stage's own command (under ``torchrun`` on every node for a ``distributed``
stage) and records the result with ``dvc commit``, which writes ``dvc.lock`` and
fills the shared DVC cache exactly as ``dvc repro`` would.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qac.errors import UserError
from qac.params.fields import SCRIPT_PATH_RULE, is_script_path
from qac.io import atomic_path

if TYPE_CHECKING:
    from qac.params.sections import ClusterSection, Params

RESOURCE_KEYS = ("nodes", "gpus_per_node", "cpus_per_task", "mem", "time", "distributed")
RENDEZVOUS_PORT = 29500


class ClusterSettingsError(ValueError, UserError):
    """A bad ``cluster`` setting; the message names the key."""


@dataclass(frozen=True)
class Resources:
    """What one stage's job asks Slurm for, and how it launches."""

    nodes: int
    gpus_per_node: int
    cpus_per_task: int
    mem: str
    time: str
    distributed: bool

    @property
    def processes_per_node(self) -> int:
        """torchrun processes per node: one per GPU (one on a CPU-only node)."""
        return max(self.gpus_per_node, 1)


@dataclass(frozen=True)
class StageJob:
    name: str
    command: str
    upstream: tuple[str, ...]
    resources: Resources

    @property
    def file_name(self) -> str:
        return self.name.replace("@", "-") + ".sbatch"


def stage_resources(cluster: ClusterSection, stage: str, where: str = "params.yaml") -> Resources:
    """``cluster.default`` overridden by the stage's base name, then by its full name.

    An override holds the resources its entry sets (the schema checked their types and ranges); the
    others come from the entry before it."""
    merged = dict(cluster.default)
    base = stage.split("@", 1)[0]
    for key in dict.fromkeys((base, stage)):
        if key in cluster.stages:
            merged.update(cluster.stages[key])
    missing = [key for key in RESOURCE_KEYS if merged.get(key) is None]
    if missing:
        raise ClusterSettingsError(f"{where}: cluster.default: {', '.join(missing)} not set")
    resources = Resources(**{**{key: merged[key] for key in RESOURCE_KEYS}, "mem": str(merged["mem"]),
                             "time": str(merged["time"])})
    if resources.nodes > 1 and not resources.distributed:
        raise ClusterSettingsError(f"{where}: cluster.stages.{base}: {resources.nodes} nodes need distributed: true "
                                   "(a stage runs on several nodes only under torchrun)")
    return resources


def check_stage_names(cluster: ClusterSection, stages: list[str], where: str = "params.yaml") -> None:
    """Every key of ``cluster.stages`` names a stage of the pipeline (by base or full name)."""
    known = set(stages) | {stage.split("@", 1)[0] for stage in stages}
    for key in cluster.stages:
        if key not in known:
            raise ClusterSettingsError(f"{where}: cluster.stages.{key}: no such stage in the pipeline "
                                       f"(stages: {', '.join(sorted({s.split('@', 1)[0] for s in stages}))})")


def plan_jobs(params: Params, graph: list[tuple[str, str, tuple[str, ...]]],
              where: str = "params.yaml") -> list[StageJob]:
    """One job per stage of ``graph`` (``(stage, command, upstream stages)`` in run order)."""
    cluster = params.cluster
    check_stage_names(cluster, [stage for stage, _, _ in graph], where)
    jobs = []
    for stage, command, upstream in graph:
        resources = stage_resources(cluster, stage, where)
        if resources.distributed:
            split_python_command(command, stage)   # fails now, naming the stage, if it cannot run under torchrun
        jobs.append(StageJob(stage, command, tuple(upstream), resources))
    return jobs


def split_python_command(command: str, stage: str) -> tuple[list[str], list[str]]:
    """``VAR=value ... python script args`` as (the assignments, the script and its arguments)."""
    words = shlex.split(command)
    assignments = []
    while words and "=" in words[0] and not words[0].startswith("-"):
        assignments.append(words.pop(0))
    if len(words) < 2 or Path(words[0]).name not in ("python", "python3"):
        raise ClusterSettingsError(f"stage {stage}: distributed: true needs a `python SCRIPT ...` command to run "
                                   f"under torchrun, but its command is {command!r}")
    return assignments, words[1:]


def launch_lines(job: StageJob) -> list[str]:
    """The shell lines that run the stage's command on the job's allocation."""
    resources = job.resources
    if not resources.distributed:
        return [job.command]
    assignments, script = split_python_command(job.command, job.name)
    exports = [f"export {shlex.quote(assignment)}" for assignment in assignments]
    # One torchrun launcher per node (srun: one task per node); they meet at the first node's address.
    return exports + [
        'rendezvous_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 torchrun --nnodes=\"$SLURM_JOB_NUM_NODES\" "
        f"--nproc-per-node={resources.processes_per_node} --rdzv-backend=c10d "
        f"--rdzv-endpoint=\"$rendezvous_host:{RENDEZVOUS_PORT}\" --rdzv-id=\"$SLURM_JOB_ID\" "
        + " ".join(shlex.quote(word) for word in script),
    ]


def job_script(job: StageJob, profile: str, pipeline: str, cluster: ClusterSection, root: str,
               log_dir: str) -> str:
    """The ``sbatch`` script of one stage."""
    resources = job.resources
    directives = [f"--job-name=qac-{profile}-{job.name}", f"--nodes={resources.nodes}", "--ntasks-per-node=1",
                  f"--cpus-per-task={resources.cpus_per_task}", f"--mem={resources.mem}", f"--time={resources.time}"]
    if resources.gpus_per_node:
        directives.append(f"--gpus-per-node={resources.gpus_per_node}")
    directives += _placement(cluster)
    if cluster.requeue:
        directives.append("--requeue")
    directives += ["--open-mode=append", f"--output={log_dir}/%x.%j.out"]
    target = f"{pipeline}:{job.name}"
    lines = [
        "#!/bin/bash",
        f"# Stage {job.name} of profile {profile}: rendered by `qac profile plan {profile} --slurm`; re-render, "
        "do not edit.",
        *(f"#SBATCH {directive}" for directive in directives),
        "set -euo pipefail",
        f"cd {shlex.quote(root)}",
        *cluster.setup,
    ]
    if not resources.gpus_per_node:
        lines.append("export CUDA_VISIBLE_DEVICES=''   # a CPU stage: no GPU, even on a GPU node")
    lines += [
        f"stage={shlex.quote(target)}",
        "# A requeued job whose stage had finished (or a stage DVC finds unchanged) has nothing to do.",
        'if dvc --wait-for-lock status --quiet "$stage"; then',
        '    echo "$stage: up to date"',
        "    exit 0",
        "fi",
        "# Pre-empted and requeued: the stage resumes from its last checkpoint or committed chunk.",
        *launch_lines(job),
        'dvc --wait-for-lock commit --force "$stage"',
        "",
    ]
    return "\n".join(lines)


def submit_script(jobs: list[StageJob], profile: str, root: str, cluster: ClusterSection,
                  script_dir: str) -> str:
    """``submit.sh``: sets the shared DVC cache, then submits every job in run order, chained by afterok."""
    index = {job.name: number for number, job in enumerate(jobs)}
    lines = [
        "#!/bin/bash",
        f"# Submit every stage of profile {profile} to Slurm, each after the stages it depends on in the DVC graph.",
        f"# Rendered by `qac profile plan {profile} --slurm`; re-render, do not edit.",
        "set -euo pipefail",
        f"cd {shlex.quote(root)}",
    ]
    if cluster.dvc_cache:
        lines.append(f"dvc cache dir --local {shlex.quote(cluster.dvc_cache)}   # shared by every node")
        lines.append("dvc config --local cache.shared group")
        lines.append("dvc config --local cache.type symlink,hardlink,copy")
    lines.append("declare -a job")
    for number, job in enumerate(jobs):
        options = ["--parsable", "--kill-on-invalid-dep=yes"]
        upstream = [index[name] for name in job.upstream if name in index]
        if upstream:
            options.append("--dependency=afterok:" + ":".join(f"${{job[{i}]}}" for i in sorted(upstream)))
        script = shlex.quote(f"{script_dir}/{job.file_name}")
        lines.append(f"job[{number}]=$(sbatch {' '.join(options)} {script})   # {job.name}")
        lines.append(f'echo "{job.name}: job ${{job[{number}]}}"')
    lines.append("")
    return "\n".join(lines)


def sweep_script(profile: str, cluster: ClusterSection, root: str, log_dir: str) -> str:
    """``sweep.sbatch``: runs the experiments queued with ``dvc exp run --queue`` on one node, one per GPU."""
    sweep = cluster.sweep
    unset = [key for key in ("gpus_per_node", "cpus_per_task", "mem", "time") if getattr(sweep, key) is None]
    if unset:
        raise ClusterSettingsError(f"params.yaml: cluster.sweep: {', '.join(unset)} not set")
    gpus = sweep.gpus_per_node
    directives = [f"--job-name=qac-{profile}-sweep", "--nodes=1", "--ntasks-per-node=1",
                  f"--cpus-per-task={sweep.cpus_per_task}", f"--mem={sweep.mem}", f"--time={sweep.time}",
                  f"--output={log_dir}/%x.%j.out"]
    if gpus:
        directives.append(f"--gpus-per-node={gpus}")
    directives += _placement(cluster)
    return "\n".join([
        "#!/bin/bash",
        f"# Queued experiments of profile {profile} (`dvc exp run --queue -S ...`), {max(gpus, 1)} at a time.",
        f"# Rendered by `qac profile plan {profile} --slurm`; re-render, do not edit.",
        *(f"#SBATCH {directive}" for directive in directives),
        "set -euo pipefail",
        f"cd {shlex.quote(root)}",
        *cluster.setup,
        f"dvc exp run --run-all --jobs {max(gpus, 1)}",
        "",
    ])


def _placement(cluster: ClusterSection) -> list[str]:
    """The ``sbatch`` options that say where a job runs and on whose account (those the params set)."""
    return [f"--{key}={getattr(cluster, key)}" for key in ("partition", "account", "qos") if getattr(cluster, key)]


def write_slurm_scripts(profile: str, params: Params, graph, out_dir: str | Path,
                        root: str | Path, where: str = "params.yaml") -> list[Path]:
    """Render every job script, ``submit.sh`` and ``sweep.sbatch`` into ``out_dir``; the paths written.

    Everything is checked before the first file is written.
    """
    jobs = plan_jobs(params, graph, where)
    cluster = params.cluster
    root = str(cluster.shared_root or root)
    out_dir = Path(out_dir)
    script_dir = str(out_dir if out_dir.is_absolute() else Path(root) / out_dir)
    if not is_script_path(script_dir):
        # It is written unquoted into each job's `#SBATCH --output=` line, which ends at a space.
        raise ClusterSettingsError(f"the scripts' folder {script_dir} (--slurm {out_dir}"
                                   f"{'' if out_dir.is_absolute() else f' under {root}'}) is not {SCRIPT_PATH_RULE}; "
                                   "it is written into each job's #SBATCH --output line")
    log_dir = f"{script_dir}/logs"
    pipeline = f"profiles/{profile}/dvc.yaml"
    texts = {job.file_name: job_script(job, profile, pipeline, cluster, root, log_dir) for job in jobs}
    texts["submit.sh"] = submit_script(jobs, profile, root, cluster, script_dir)
    texts["sweep.sbatch"] = sweep_script(profile, cluster, root, log_dir)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        path = out_dir / name
        with atomic_path(path) as tmp:
            Path(tmp).write_text(text, encoding="utf-8")
        path.chmod(0o755)
        written.append(path)
    return written
