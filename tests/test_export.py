"""`qac export`: the evaluated study's retrievers, runs and results in the field's formats, read back by its tools."""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_evaluate_stage import evaluated  # noqa: F401  (fixture)
from test_finetune_stage import shared_mlflow_store  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def exported(evaluated, tmp_path_factory):  # noqa: F811
    from qac.params import validate_params
    from qac.reporting.export import export_profile

    root, raw = evaluated
    params = validate_params(raw, complete=False)
    out = tmp_path_factory.mktemp("export") / "smoke"
    export_profile(params, out, root / "data" / "smoke", repo=root)
    return out, root / "data" / "smoke", params


def test_the_manifest_lists_every_file_with_its_md5(exported):
    from qac.io import file_md5

    out, _, _ = exported
    files = json.loads((out / "MANIFEST.json").read_text())["files"]
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"MANIFEST.json"}
    assert set(files) == on_disk
    assert all(files[name]["md5"] == file_md5(out / name) for name in files)
    for part in ("retrievers/none/r1/README.md", "retrievers/none/r2/modules.json", "ranx/comparison.md",
                 "lineage/runs"):
        assert any(name.startswith(part) for name in files), part


def test_each_exported_retriever_has_a_card_with_its_facts(exported):
    out, data, params = exported
    card = (out / "retrievers" / "none" / "r1" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    record = json.loads((data / ".runs" / "finetune" / "none" / "r1" / "mlflow_run.json").read_text())
    for fact in (record["run_id"], record["git_commit"], "| lr |", f"| batch_size | {params.finetune.batch_size} |",
                 "encode_query", f"cut at {params.finetune.query_max_len} tokens", "InfoNCE", "| torch |",
                 "qac repro"):
        assert fact in card, fact


def test_mteb_reads_every_result_file_with_the_stages_figures(exported):
    mteb = pytest.importorskip("mteb")
    from mteb.models import ModelMeta

    from qac.evaluation.mteb_results import mteb_task_name

    out, data, _ = exported
    results = sorted((out / "results" / "mteb").glob("*/*/*.json"))
    tasks = [path for path in results if path.name != "model_meta.json"]
    assert {path.parent.parent.name for path in tasks} == {"qac__smoke-none-r1", "qac__smoke-none-r2"}
    for path in tasks:
        result = mteb.TaskResult.from_disk(path)
        retriever = path.parent.parent.name.rsplit("-", 1)[1]
        dataset = next(d.name for d in (data / "eval" / "none" / retriever).iterdir()
                       if mteb_task_name(d.name) == path.stem)
        for split, entries in result.scores.items():
            ours = json.loads((data / "eval" / "none" / retriever / dataset / f"{split}.per_query.json").read_text())
            main = "nDCG@10" if "nDCG@10" in ours else next(iter(ours))
            assert entries[0]["main_score"] == pytest.approx(np.mean(list(ours[main].values())))
    for meta in (path for path in results if path.name == "model_meta.json"):
        model = ModelMeta.model_validate_json(meta.read_text())
        assert model.revision == meta.parent.name and model.n_parameters > 0


def test_runs_carry_ir_metadata_and_read_back_as_the_stages_runs(exported):
    from qac.evaluation.trec_io import read_ir_metadata, read_run

    out, data, _ = exported
    runs = sorted((out / "runs").rglob("*.trec"))
    assert runs
    for path in runs:
        relative = path.relative_to(out / "runs")
        assert read_run(path) == read_run(data / "eval" / relative)
        metadata = read_ir_metadata(path)
        assert metadata["tag"] == ".".join(relative.parts[:2])
        assert metadata["method"]["retrieval"][0]["query tokens"] > 0
        assert {"platform", "implementation", "data"} <= set(metadata)
    assert read_ir_metadata(data / "eval" / relative) is None       # the stage's own runs stay plain


def test_ranx_files_hold_the_qrels_and_runs_and_the_report_letters_every_run(exported):
    from qac.evaluation.trec_io import read_run

    out, data, _ = exported
    for qrels in (out / "ranx").rglob("qrels.json"):
        dataset, split = qrels.parent.parent.name, qrels.parent.name
        for run in (qrels.parent / "runs").glob("*.json"):
            variant, retriever = run.stem.rsplit(".", 1)
            assert json.loads(run.read_text()) == read_run(data / "eval" / variant / retriever / dataset / f"{split}.trec")
    report = (out / "ranx" / "comparison.md").read_text()
    assert "| a | none.r1 |" in report and "| b | none.r2 |" in report


def test_the_comparison_letters_the_runs_a_run_beats_by_the_paired_test():
    from qac.reporting.comparison import comparison_table

    queries = [f"q{i}" for i in range(8)]
    # a beats b on every query by 0.5: 2 of the 2**8 sign assignments are as extreme, p = 1/128 < 0.05;
    # c differs from b on one query only (p = 1), and from a by 0.5 on seven queries (p = 2/128 < 0.05)
    per_query = {"a": {"RR@10": {q: 1.0 for q in queries}},
                 "b": {"RR@10": {q: 0.5 for q in queries}},
                 "c": {"RR@10": {q: 1.0 if q == "q0" else 0.5 for q in queries}}}
    lines = comparison_table(per_query, ["RR@10"], permutations=4000).splitlines()
    assert lines[2] == "| a | a | 1.0000 ^bc^ |"
    assert lines[3] == "| b | b | 0.5000 |"
    assert lines[4] == "| c | c | 0.5625 |"
