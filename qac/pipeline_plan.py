"""A profile's pipeline as DVC would run it: every stage in order, with its command.

``dvc repro --dry`` stops at the first stage whose inputs are missing, so on a
machine without the paper's data it never shows the paper's plan. The order
here is DVC's own (:func:`dvc.repo.reproduce.plan_repro` over the stage graph
that `dvc repro profiles/<name>/dvc.yaml` builds); nothing runs and no input is
read.
"""

from __future__ import annotations

from pathlib import Path

from qac.config import profile_params_path


def stage_plan(name: str, repo_root: str | Path = ".") -> list[tuple[str, str]]:
    """``(stage name, command)`` of every stage of profile ``name``, dependencies first."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import plan_repro

    pipeline = profile_params_path(name).parent / "dvc.yaml"
    if not pipeline.exists():
        raise FileNotFoundError(f"{pipeline}: not rendered; run `qac profile render {name}`")
    with Repo(str(repo_root)) as repo:
        stages = repo.stage.collect(str(pipeline))
        return [(stage.name, stage.cmd) for stage in plan_repro(repo.index.graph, stages)]


def stage_graph(name: str, repo_root: str | Path = ".") -> list[tuple[str, str, tuple[str, ...]]]:
    """``(stage name, command, the stages it depends on)`` of every stage of profile ``name``, in run order.

    The dependencies are the edges of DVC's own stage graph: stage A depends on
    stage B when one of A's ``deps`` is (inside) one of B's ``outs``. Data that
    no stage writes (files tracked with ``dvc add``) has no job of its own.
    """
    from dvc.repo import Repo
    from dvc.repo.reproduce import plan_repro

    pipeline = profile_params_path(name).parent / "dvc.yaml"
    if not pipeline.exists():
        raise FileNotFoundError(f"{pipeline}: not rendered; run `qac profile render {name}`")
    with Repo(str(repo_root)) as repo:
        graph = repo.index.graph
        stages = repo.stage.collect(str(pipeline))
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
