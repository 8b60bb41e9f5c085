"""A stage depends on exactly the code it can import: generated from the imports, and an edit reruns only
the stages whose code holds the file.

The rendered ``dvc.yaml`` is the graph DVC walks; which stages an edit reruns is read from it as DVC reads
it (a dep names the file, or a folder above it), with each per-key stage counted once per key of the
profile's params, as ``dvc repro`` expands it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from qac.import_graph import NOT_RESULT_CODE, stage_code, with_code_deps

REPO = Path(__file__).resolve().parent.parent


def _stages(profile: str) -> dict:
    return yaml.safe_load((REPO / "profiles" / profile / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def _runs(stage: dict, params: dict) -> int:
    """How many stage runs a stage of dvc.yaml expands to: one, or one per key of its ``foreach``."""
    loop = stage.get("foreach")
    if loop is None:
        return 1
    node = params
    for part in loop.strip("${}").split("."):
        node = node[part]
    return len(node or {})


def rerun_by_edit(stages: dict, params: dict, path: str) -> dict[str, int]:
    """The stages an edit to ``path`` makes DVC rerun (a dep is the file or a folder above it), with their runs."""
    def holds(dep: str) -> bool:
        return path == dep or path.startswith(dep.rstrip("/") + "/")

    return {name: _runs(stage, params) for name, stage in stages.items()
            if _runs(stage, params) and any(holds(str(dep)) for dep in stage.get("do", stage)["deps"] or [])}


def _script(stage: dict) -> str:
    command = stage.get("do", stage)["cmd"]
    return next(word for word in command.split() if word.startswith("pipelines/"))


# The targets for the default profile's 39 stage runs of the paper's study (25, 25 and 26 before the deps were
# generated); the LLM-query extension's stages (llm_queries.*) come on top, each rerun only where it imports the file.
RERUN_TARGETS = {"qac/data/sources.py": 7, "qac/train/pretrain.py": 8, "qac/models/biencoder.py": 18}
EXTENSION_STAGES = ("generate_llm_queries", "filter_llm_queries", "pretrain_llm", "finetune_llm", "evaluate_llm")


@pytest.mark.parametrize("edited, most", RERUN_TARGETS.items())
def test_an_edit_reruns_only_the_stages_whose_code_holds_the_file(edited, most):
    stages = _stages("default")
    params = yaml.safe_load((REPO / "profiles" / "default" / "params.yaml").read_text(encoding="utf-8"))
    rerun = rerun_by_edit(stages, params, edited)
    importing = {name: _runs(stage, params) for name, stage in stages.items()
                 if _runs(stage, params) and edited in stage_code(_script(stage))}
    assert rerun == importing
    study = {name: runs for name, runs in rerun.items() if name not in EXTENSION_STAGES}
    assert sum(study.values()) <= most, rerun
    assert sum(_runs(stage, params) for name, stage in stages.items() if name not in EXTENSION_STAGES) == 39


def test_the_pretrainings_rerun_for_no_edit_of_the_retrievers_code():
    stages = _stages("default")
    pretrain = stages["pretrain"]["do"]["deps"]
    assert "qac/train/pretrain.py" in pretrain and "qac/models/cocondenser.py" in pretrain
    assert not [dep for dep in pretrain if dep in ("qac/models/biencoder.py", "qac/train/finetune.py",
                                                   "qac/retrieval/dense.py", "qac/evaluation/metrics.py")]


def test_the_template_types_no_code_dep_and_the_render_writes_files_not_folders():
    template = yaml.safe_load((REPO / "profiles" / "pipeline.yaml").read_text(encoding="utf-8"))["stages"]
    typed = [dep for stage in template.values() for dep in stage.get("do", stage).get("deps") or []
             if str(dep).startswith(("qac/", "pipelines/"))]
    assert typed == []
    for name, stage in _stages("default").items():
        deps = stage.get("do", stage)["deps"]
        assert deps[0] == _script(stage), name
        code = [dep for dep in deps if dep.startswith(("qac/", "pipelines/"))]
        assert code == deps[:len(code)] and all((REPO / dep).is_file() for dep in code), name
        assert not [dep for dep in code if dep in NOT_RESULT_CODE or dep.startswith("qac/tracking/")], name


def test_the_tables_depend_on_the_data_files_their_code_reads():
    deps = _stages("default")["tables"]["deps"]
    assert {"qac/deviations.yaml", "qac/reporting/paper_results.yaml"} <= set(deps)


def _package(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_stage_code_follows_imports_that_can_run_and_stops_at_the_modules_that_cannot_change_a_result(tmp_path):
    _package(tmp_path, {
        "pipelines/_environment.py": "import qac\n",
        "pipelines/work.py": """\
            import _environment
            from qac.tracking import stage_run

            def main():
                from qac.data.reader import read
        """,
        "qac/__init__.py": '"""the package"""\n__version__ = "1"\n',
        "qac/tracking/__init__.py": "from qac.train.loop import PretrainSettings\n",   # a run's name only
        "qac/data/__init__.py": "",
        "qac/data/reader.py": """\
            from pathlib import Path
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from qac.models.big import Model

            TABLE = Path(__file__).with_name("table.yaml")

            def read():
                from .format import FIELDS
        """,
        "qac/data/format.py": "FIELDS = ()\n",
        "qac/data/table.yaml": "a: 1\n",
        "qac/data/unused.yaml": "b: 2\n",
        "qac/models/__init__.py": "",
        "qac/models/big.py": "import torch\n",
        "qac/train/__init__.py": "",
        "qac/train/loop.py": "PretrainSettings = None\n",
    })
    # the package markers hold no code; tracking/ runs, but its imports are not followed
    assert stage_code("pipelines/work.py", tmp_path) == [
        "pipelines/work.py", "qac/data/format.py", "qac/data/reader.py", "qac/data/table.yaml"]


def test_the_render_writes_the_code_at_the_head_of_each_stages_deps_and_keeps_the_template(tmp_path):
    _package(tmp_path, {
        "pipelines/one.py": "def main():\n    import qac.work\n",
        "qac/__init__.py": "",
        "qac/work.py": "X = 1\n",
    })
    template = textwrap.dedent("""\
        # the template's own comment
        stages:
          one:
            foreach: ${items}
            do:
              cmd: python pipelines/one.py --item ${key}
              deps:       # a note
                - data/${key}.txt
              outs:
                - out/${key}
        """)
    rendered = with_code_deps(template, tmp_path)
    assert rendered == template.replace("      deps:       # a note\n",
                                        "      deps:       # a note\n        - pipelines/one.py\n"
                                        "        - qac/work.py\n")
