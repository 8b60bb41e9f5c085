"""qac's import graph: no module imports itself round a circle, and the rooms stack in layers.

A room is a subpackage of qac (``qac.data``) or a top-level module (``qac.io``).
Every import of a qac module counts, those inside functions too: the graph is
:func:`qac.import_graph.import_graph`, the one the stages' code deps are generated from. An arrow
from a room to a room below it is the normal direction; an arrow running back
up the layering is allowed only where ``ARROWS_UP`` lists it, and
docs/architecture.md explains each one ("Import layers").
"""

from __future__ import annotations

import ast
from pathlib import Path

from qac.import_graph import import_graph

REPO = Path(__file__).resolve().parent.parent

# Bottom to top: a room may import the rooms before it.
LAYERS = (
    "errors", "import_graph", "exiting", "threads", "launcher", "names", "redaction", "io", "timeouts", "distributed", "accelerators", "benchmarking", "model_specs",
    "params", "config", "pipeline_plan", "parallel_repro", "deviations", "cluster", "gpu_cost",
    "tracking", "console", "data", "models", "evaluation", "retrieval", "environment", "train", "reference", "reporting", "querygen",
    "llm_queries", "stages",
    "hpo",
    "cli",
)
# The arrows that run back up, each explained in docs/architecture.md: none.
ARROWS_UP: set[tuple[str, str]] = set()
MAX_ARROWS_UP = 0


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "qac"


def room_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    arrows: dict[tuple[str, str], list[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            if room(source) != room(target) and room(target) != "qac":
                arrows.setdefault((room(source), room(target)), []).append(f"{source} -> {target}")
    return arrows


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for following in sorted(graph[node]):
            if following not in index:
                visit(following)
                low[node] = min(low[node], low[following])
            elif following in on_stack:
                low[node] = min(low[node], index[following])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reader_sees_function_level_and_package_imports():
    graph = import_graph()
    assert "qac.params.sections" in graph["qac.params.validation"]
    assert "qac.data.textfile" in graph["qac.train.groups"]
    # an import inside a function counts as much as one at the top
    assert "qac.data.tokenizer" in graph["qac.data.splitting"]


def test_no_module_imports_itself_round_a_circle():
    assert circles(import_graph()) == []


def test_every_room_has_a_layer():
    rooms = {room(module) for module in import_graph()} - {"qac"}
    assert rooms <= set(LAYERS), f"place the new room(s) in LAYERS: {sorted(rooms - set(LAYERS))}"


def test_arrows_run_down_the_layers_except_the_explained_few():
    level = {name: position for position, name in enumerate(LAYERS)}
    up = {arrow: imports for arrow, imports in room_arrows(import_graph()).items()
          if level[arrow[0]] < level[arrow[1]]}
    unexplained = {f"{a} -> {b}": imports for (a, b), imports in up.items() if (a, b) not in ARROWS_UP}
    assert not unexplained, f"imports running back up the layers: {unexplained}"
    assert len(ARROWS_UP) <= MAX_ARROWS_UP
    stale = ARROWS_UP - set(up)
    assert not stale, f"ARROWS_UP lists arrows that no longer exist: {sorted(stale)}"


def test_each_arrow_up_is_explained_in_the_architecture_doc():
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.partition("## Import layers")[2].partition("\n## ")[0]
    assert section, "docs/architecture.md has no '## Import layers' section"
    for source, target in ARROWS_UP:
        assert f"`{source} -> {target}`" in section, f"docs/architecture.md does not explain {source} -> {target}"
    assert " < ".join(LAYERS) in " ".join(section.split())


# --------------------------------------------------------------------------- the stages as the house's rooms

def _stage_scripts() -> set[str]:
    """The scripts the pipeline's stages run (``pipelines/<name>.py`` in each stage's command)."""
    import re

    import yaml

    stages = yaml.safe_load((REPO / "profiles" / "pipeline.yaml").read_text())["stages"]
    commands = [stage.get("cmd") or stage["do"]["cmd"] for stage in stages.values()]
    return {match for command in commands for match in re.findall(r"pipelines/\w+\.py", str(command))}


def test_only_a_stage_module_opens_a_stage_run():
    """A stage's MLflow run is opened in its own module of qac/stages, nowhere else (the tracking room
    defines the calls)."""
    opening = set()
    for path in sorted((REPO / "qac").rglob("*.py")) + sorted((REPO / "pipelines").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = {node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                 for node in ast.walk(tree) if isinstance(node, ast.Call)}
        if calls & {"tracked_stage", "reopened_stage"}:
            opening.add(path.relative_to(REPO).as_posix())
    outside = {path for path in opening if not path.startswith("qac/stages/") and path != "qac/tracking/lifecycle.py"}
    assert not outside, f"stage runs opened outside qac/stages: {sorted(outside)}"


def test_every_stage_script_is_a_shim_or_calls_its_stage_module():
    """pipelines/<stage>.py is what DVC runs: a few lines around its stage's module (or, for the tables, the
    reporting room's two calls)."""
    scripts = _stage_scripts()
    assert len(scripts) >= 15, scripts
    for name in scripts:
        lines = [line for line in (REPO / name).read_text(encoding="utf-8").splitlines() if line.strip()]
        assert len(lines) <= 45, f"{name} is {len(lines)} lines: move its body to qac/stages/"


MAX_STAGE_FUNCTION_LINES = 60


def test_no_stage_function_is_longer_than_60_lines():
    """A stage's function reads in one screen (STYLE.md: functions stay under about 60 lines); a longer one is
    split into helpers, one per step. A nested function counts inside its parent too."""
    offenders = []
    for path in sorted((REPO / "qac" / "stages").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_STAGE_FUNCTION_LINES:
                    offenders.append(f"{path.relative_to(REPO).as_posix()}:{node.name} ({length} lines)")
    assert not offenders, f"stage functions over {MAX_STAGE_FUNCTION_LINES} lines: {', '.join(offenders)}"


def _function_level_qac_imports(path: Path):
    """``(line, statement)`` of each import of a qac module inside a function of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                relative = isinstance(node, ast.ImportFrom) and node.level > 0
                named = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                if relative or any(name == "qac" or name.startswith("qac.") for name in named):
                    found[node.lineno] = node
    return sorted(found.items())


def test_an_import_left_inside_a_function_says_why():
    """Imports sit at the top of a module; one left in a function (it would load a heavy library at the
    module's import, or tests stand in for the name it binds) carries a comment on its line or just above
    the run of imports it belongs to."""
    unexplained = []
    for path in sorted((REPO / "qac").rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for lineno, node in _function_level_qac_imports(path):
            above = lineno - 2
            while above >= 0 and lines[above].lstrip().startswith(("from ", "import ")):
                above -= 1
            commented = "#" in lines[node.end_lineno - 1] or (above >= 0 and lines[above].lstrip().startswith("#"))
            if not commented:
                unexplained.append(f"{path.relative_to(REPO)}:{lineno}")
    assert not unexplained, f"imports inside functions without a reason: {unexplained}"
