"""qac's import graph, read from the source, and the code a DVC stage can run.

Every ``import`` of a qac module counts, those inside functions too: a function-level import runs when its
function does, so it is code the stage may run. ``qac profile render`` writes each stage's code dependencies
from :func:`stage_code` (the stage's entry script, the qac modules it can import, the data files they read),
so an edit reruns exactly the stages whose code holds it; ``tests/test_architecture.py`` checks the layers of
the same graph, and ``tests/test_pipeline.py`` checks it against what each stage of the smoke study imported.
Standard library only: it runs while rendering, before anything is installed but PyYAML.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "qac"

# Modules a stage runs that cannot change what its outputs hold, left out of its code dependencies (an edit
# to them reruns nothing). Each decides where and how a stage reads its parameters, its command line and the
# variables that steer it, writes a file atomically, prints, fails, records to MLflow, starts or ends.
NOT_RESULT_CODE = (
    "pipelines/_environment.py",     # says which Python to use when the one on PATH lacks qac
    "qac/cli/__init__.py",           # the `qac` command's table of subcommands
    "qac/stages/arguments.py",    # a stage's command line (--variant, --log-models)
    "qac/config.py",                 # rendering profiles, the data folder's name
    "qac/console.py",                # log lines, summaries, the exit on a user error
    "qac/environment.py",            # checks of QAC_* variables before any work
    "qac/errors.py",                 # the exception classes a user error is raised as
    "qac/data/errors.py",
    "qac/exiting.py",                # the quick exit after the work is written
    "qac/io.py",                     # atomic writes and MD5s of files
    "qac/launcher.py",               # a forked copy of a preloaded interpreter runs the stage
    "qac/pipeline_plan.py",          # names the stage that rebuilds a missing file, in an error message
    "qac/redaction.py",              # credentials hidden from logs
    "qac/timeouts.py",               # how long a distributed job waits for its peers
    "qac/tracking/",                 # MLflow run records, names and tags (no stage reads them)
    "qac/params/__init__.py",
    "qac/params/errors.py",          # reading the params file and naming a broken key's line: the values
    "qac/params/loading.py",         # a stage receives are the file's own (checked, never changed), so
    "qac/params/reading.py",         # only the typed sections (their defaults) and the grammars of
    "qac/params/rules.py",           # values are code of a result
    "qac/params/validation.py",
    "qac/params/yaml_io.py",
    "qac/params/locations.py",
)


def module_name(path: Path, root: Path = REPO) -> str:
    """``qac/data/sources.py`` -> ``qac.data.sources``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def _modules(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted((root / PACKAGE).rglob("*.py"))}


def qac_modules(root: Path = REPO) -> dict[str, Path]:
    """Every module of the package under ``root``: dotted name -> file."""
    return dict(_modules(Path(root).resolve()))


def _lazy_names(tree: ast.Module) -> list[str]:
    """The submodules a package's ``__getattr__`` imports on first use, as its ``_LAZY`` table names them
    (``qac.params``: names that need pydantic load with their module)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and [getattr(target, "id", None) for target in node.targets] == ["_LAZY"]
                and isinstance(node.value, ast.Dict)):
            return sorted({value.value for value in node.value.values if isinstance(value, ast.Constant)})
    return []


def _statements(tree: ast.AST, running: bool):
    """Every node of ``tree``; with ``running``, not those under ``if TYPE_CHECKING:``, which never run."""
    for node in ast.iter_child_nodes(tree):
        if running and isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for other in node.orelse:
                yield other
                yield from _statements(other, running)
            continue
        yield node
        yield from _statements(node, running)


def imported_names(path: Path, package: str, running: bool = False) -> list[str]:
    """The dotted names the import statements of ``path`` reach (relative imports resolved against
    ``package``, the package the file is in); ``from a.b import c`` gives ``a.b.c``, which may be a module or a
    name inside ``a.b``. With ``running``, only imports that can run: not those for type checkers, and with
    the submodules a package loads on first use of a name (its ``_LAZY`` table)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [f"{package}.{lazy}" for lazy in _lazy_names(tree)] if running and path.name == "__init__.py" else []
    for node in _statements(tree, running):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:     # a relative import: from the package, up level - 1 steps
                parents = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parents + ([base] if base else []))
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def _resolved(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:      # `from qac.x import name` imports module qac.x
        name = name.rpartition(".")[0]
    return name or None


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _with_parents(names: set[str]) -> set[str]:
    """Importing ``qac.a.b`` runs ``qac/__init__.py`` and ``qac/a/__init__.py`` first."""
    return {".".join(name.split(".")[:depth]) for name in names for depth in range(1, name.count(".") + 2)}


@lru_cache(maxsize=None)
def _graph(root: Path, running: bool) -> dict[str, frozenset[str]]:
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        targets = {_resolved(target, modules) for target in imported_names(path, _package_of(name, path), running)}
        targets = {target for target in targets if target}
        graph[name] = frozenset((_with_parents(targets) if running else targets) - {name})
    return graph


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """qac module -> the qac modules its import statements name, anywhere in its body (type checkers' too):
    the graph whose layers ``tests/test_architecture.py`` checks."""
    return {name: set(targets) for name, targets in _graph(Path(root).resolve(), False).items()}


def data_files(path: Path) -> list[Path]:
    """Files beside the module ``path`` that it names in a string (``Path(__file__).with_name("claims.yaml")``):
    data its code reads, so part of its code."""
    beside = {child.name: child for child in path.parent.iterdir() if child.is_file() and child.suffix != ".py"
              and not child.name.endswith(".pyc")}
    named = {node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return [beside[name] for name in sorted(named & set(beside))]


def runs_code(path: Path) -> bool:
    """False for a module of docstrings, ``from __future__`` and ``__version__`` only (a package marker)."""
    def inert(node) -> bool:
        return ((isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
                or (isinstance(node, ast.ImportFrom) and node.module == "__future__")
                or (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]))

    return not all(inert(node) for node in ast.parse(path.read_text(encoding="utf-8")).body)


def script_closure(script: Path, root: Path = REPO, through_service: bool = True) -> list[Path]:
    """The files a run of ``script`` (a stage's ``pipelines/<stage>.py``) can import: itself, the scripts of its
    folder it imports (``_environment``), and the qac modules reachable from them by imports that can run,
    anywhere in a body. Without ``through_service``, the imports of a module of :data:`NOT_RESULT_CODE` are
    not followed: what a log line, a check or a run record imports serves that purpose only."""
    root = Path(root).resolve()
    modules, graph = _modules(root), _graph(root, True)
    scripts, found, todo = [], set(), [Path(root / script)]
    while todo:                          # the script and the scripts of its folder it imports
        current = todo.pop()
        if current in scripts:
            continue
        scripts.append(current)
        for name in imported_names(current, "", running=True):
            beside = current.parent / f"{name.split('.')[0]}.py"
            if beside.is_file():
                todo.append(beside)
            elif (module := _resolved(name, modules)) and module.split(".")[0] == PACKAGE:
                found |= _with_parents({module})
    todo = list(found)
    while todo:
        current = todo.pop()
        if not through_service and not is_result_code(modules[current].relative_to(root).as_posix()):
            continue
        for target in graph[current]:
            if target not in found:
                found.add(target)
                todo.append(target)
    return scripts + [modules[name] for name in sorted(found)]


def is_result_code(relative: str) -> bool:
    """Whether a file (as a path relative to the repository) is code that can change a stage's outputs."""
    return not any(relative == entry or (entry.endswith("/") and relative.startswith(entry))
                   for entry in NOT_RESULT_CODE)


def stage_code(script: str | Path, root: Path = REPO) -> list[str]:
    """A stage's code dependencies, as paths relative to ``root``: its entry script first, then every file of
    :func:`script_closure` that runs code and can change a result (not in :data:`NOT_RESULT_CODE`), and the
    data files beside them that they read, sorted."""
    root = Path(root).resolve()
    files = script_closure(Path(script), root, through_service=False)
    entry, rest = files[0], set()
    for path in files[1:]:
        relative = path.relative_to(root).as_posix()
        if is_result_code(relative) and runs_code(path):
            rest.add(relative)
            rest |= {data.relative_to(root).as_posix() for data in data_files(path)}
    return [entry.relative_to(root).as_posix(), *sorted(rest)]


_STAGE = re.compile(r"^  ([A-Za-z_][\w-]*):\s*(#.*)?$")
_SCRIPT = re.compile(r"\bpython (pipelines/\S+\.py)\b")
_DEPS = re.compile(r"^(\s+)deps:\s*(#.*)?$")
_ITEM = re.compile(r"^(\s+)- ")


def with_code_deps(template: str, root: Path = REPO) -> str:
    """The pipeline ``template`` with each stage's code dependencies (:func:`stage_code` of the script its
    ``cmd`` runs) written at the head of its ``deps``, the template's data dependencies after them; comments
    and layout kept, line for line."""
    lines, out = template.splitlines(keepends=True), []
    stage = script = None
    for number, line in enumerate(lines):
        if _STAGE.match(line):
            stage, script = _STAGE.match(line).group(1), None
        elif stage and (found := _SCRIPT.search(line)) and line.lstrip().startswith("cmd:"):
            script = found.group(1)
        out.append(line)
        deps = _DEPS.match(line)
        if stage and deps:
            if script is None:
                raise ValueError(f"stage {stage}: its deps come before a cmd that runs python pipelines/<stage>.py")
            following = next((later for later in lines[number + 1:] if later.strip() and not
                              later.lstrip().startswith("#")), "")
            item = _ITEM.match(following)
            indent = item.group(1) if item else deps.group(1) + "  "
            out += [f"{indent}- {path}\n" for path in stage_code(script, root)]
    return "".join(out)
