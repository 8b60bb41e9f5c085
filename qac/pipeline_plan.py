"""A profile's pipeline as DVC would run it: every stage in order, with its command.

``dvc repro --dry`` stops at the first stage whose inputs are missing, so on a
machine without the paper's data it never shows the paper's plan. The order
here is DVC's own (:func:`dvc.repo.reproduce.plan_repro` over DVC's graph of
the stages of ``profiles/<name>/dvc.yaml``, as `dvc repro` of that file orders
them); nothing runs and no input is read.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from qac.config import PIPELINE_TEMPLATE
from qac.params import profile_params_path, profiles_root


def stage_plan(name: str, repo_root: str | Path = ".") -> list[tuple[str, str]]:
    """``(stage name, command)`` of every stage of profile ``name``, dependencies first."""
    from dvc.repo import Repo

    pipeline = profile_params_path(name).parent / "dvc.yaml"
    if not pipeline.exists():
        raise FileNotFoundError(f"{pipeline}: not rendered; run `qac profile render {name}`")
    with Repo(str(repo_root)) as repo:
        return [(stage, command) for stage, command, _ in graph_in(repo, pipeline)]


def stage_graph(name: str, repo_root: str | Path = ".") -> list[tuple[str, str, tuple[str, ...]]]:
    """``(stage name, command, the stages it depends on)`` of every stage of profile ``name``, in run order
    (:func:`pipeline_graph` of ``profiles/<name>/dvc.yaml``)."""
    pipeline = profile_params_path(name).parent / "dvc.yaml"
    if not pipeline.exists():
        raise FileNotFoundError(f"{pipeline}: not rendered; run `qac profile render {name}`")
    return pipeline_graph(pipeline, repo_root)


def pipeline_graph(pipeline: str | Path, repo_root: str | Path = ".") -> list[tuple[str, str, tuple[str, ...]]]:
    """``(stage name, command, the stages it depends on)`` of every stage of the DVC file ``pipeline``, in run order
    (:func:`graph_in`)."""
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        return graph_in(repo, pipeline)


def graph_in(repo, pipeline: str | Path, stages: list | None = None) -> list[tuple[str, str, tuple[str, ...]]]:
    """:func:`pipeline_graph` in an open DVC ``repo`` (``stages``: the pipeline's, when already collected).

    The dependencies are the edges of DVC's own stage graph (``build_graph``):
    stage A depends on stage B when one of A's ``deps`` is (inside) one of B's
    ``outs``. The graph holds the stages of ``pipeline`` only, so that planning
    one profile does not read the other profiles' pipelines and locks (a
    profile reads no other profile's outputs). Data that no stage writes (files
    tracked with ``dvc add``) has no job of its own.
    """
    from dvc.repo.graph import build_graph
    from dvc.repo.reproduce import plan_repro

    stages = repo.stage.collect(str(pipeline)) if stages is None else stages
    graph = build_graph(stages)
    plan = []
    for stage in plan_repro(graph, stages):
        upstream = sorted(dependency.name for dependency in graph.successors(stage) if dependency.cmd)
        plan.append((stage.name, stage.cmd, tuple(upstream)))
    return plan


def print_plan(name: str) -> int:
    plan = stage_plan(name)
    width = max(len(stage) for stage, _ in plan)
    print(f"profile {name}: {len(plan)} stages, in the order `dvc repro` runs them")
    for number, (stage, cmd) in enumerate(plan, 1):
        print(f"{number:3}. {stage:{width}}  {cmd}")
    return 0


@functools.lru_cache(maxsize=4)
def _output_patterns(template: Path) -> list[tuple[str, bool, re.Pattern]]:
    """``(stage, per key, pattern)`` of each output of the pipeline template; ``${profile}`` and ``${key}``
    become named groups, any other ``${...}`` one path component."""
    import yaml

    try:
        stages = (yaml.safe_load(template.read_text(encoding="utf-8")) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        return []
    patterns = []
    for name, stage in stages.items():
        body = (stage.get("do", stage) if isinstance(stage, dict) else None) or {}
        for out in [*(body.get("outs") or []), *(body.get("metrics") or []), *(body.get("plots") or [])]:
            out = next(iter(out)) if isinstance(out, dict) else str(out)
            pieces = []
            for piece in re.split(r"(\$\{[^}]*\})", out):
                if piece in ("${profile}", "${key}"):
                    group = piece[2:-1]
                    pieces.append(f"(?P<{group}>[^/]+)" if f"(?P<{group}>" not in "".join(pieces)
                                  else f"(?P={group})")
                else:
                    pieces.append("[^/]+" if piece.startswith("${") else re.escape(piece))
            patterns.append((name, "foreach" in stage, re.compile("".join(pieces) + r"(/.*)?")))
    return patterns


def stage_writing(path: str | os.PathLike) -> tuple[str, str] | None:
    """``(profile, stage)`` of the DVC stage whose output holds ``path`` (``data/smoke/passages.arrow`` ->
    ``('smoke', 'split_passages')``; a per-key stage as ``evaluate@<variant>``), else None.

    Read from the pipeline template's ``outs`` (no DVC import: this names the stage in error messages),
    matched against the end of ``path`` so an absolute path or one under another data folder is found too.
    """
    parts = Path(path).as_posix().split("/")
    template = profiles_root() / PIPELINE_TEMPLATE
    for start in range(len(parts)):
        tail = "/".join(parts[start:])
        for name, per_key, pattern in _output_patterns(template):
            match = pattern.fullmatch(tail)
            if match:
                key = match.groupdict().get("key")
                return match.groupdict().get("profile") or "", f"{name}@{key}" if per_key and key else name
    return None


def rerun_hint(path: str | os.PathLike) -> str:
    """``rebuilt by the DVC stage split_passages (`dvc repro profiles/smoke/dvc.yaml`)``, or a general hint."""
    writer = stage_writing(path)
    if writer is None:
        return "rebuild it by rerunning the stage that writes it (`dvc repro profiles/<profile>/dvc.yaml`)"
    profile, stage = writer
    return (f"rebuild it with the DVC stage {stage} (`dvc repro profiles/{profile}/dvc.yaml` restores it from "
            f"the DVC cache or reruns {stage})")


def restore_hint(path: str | os.PathLike) -> str:
    """How to get a damaged stage file back: DVC's cached copy, or the stage rerun where that copy is damaged
    too (``dvc checkout`` restores a damaged cache object as it is, without a word)."""
    writer = stage_writing(path)
    if writer is None:
        rebuild = "rerunning the stage that writes it (`dvc repro -f profiles/<profile>/dvc.yaml`)"
    else:
        profile, stage = writer
        rebuild = f"`dvc repro -s -f profiles/{profile}/dvc.yaml:{stage}` (reruns the DVC stage {stage})"
    return (f"restore it from the DVC cache with `dvc checkout --force {path}`, or, if the cached copy is damaged "
            f"too, rebuild it with {rebuild}")
