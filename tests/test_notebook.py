"""notebooks/analysis.ipynb runs top to bottom on a profile's DVC outputs, with no MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "analysis.ipynb"

# Per-query nDCG@10 of four queries. coCondenser ran two seeds (42 and the copies "-seed43"), as Table 1 reads
# them: each query's value averaged over the seeds. Pooled, query context scores q1 0.5, q2 0.625, q3 1, q4 0.75
# against passage context's 0.5, 0, 1, 1: one win, two ties, one loss, mean Δ (0.625 - 0.25) / 4. Seed 42 alone
# would give two wins and mean 0.0625; the seed-43 copy in its place, mean 0.125.
PER_QUERY = {
    "cocondenser-passage": {"q1": 0.5, "q2": 0.0, "q3": 1.0, "q4": 1.0},
    "cocondenser-passage-seed43": {"q1": 0.5, "q2": 0.0, "q3": 1.0, "q4": 1.0},
    "cocondenser-query-q4": {"q1": 1.0, "q2": 0.25, "q3": 1.0, "q4": 0.5},
    "cocondenser-query-q4-seed43": {"q1": 0.0, "q2": 1.0, "q3": 1.0, "q4": 1.0},
    "master-passage": {"q1": 0.2, "q2": 0.2, "q3": 0.2, "q4": 0.2},
    "master-query-q4": {"q1": 0.4, "q2": 0.2, "q3": 0.2, "q4": 0.0},
    "none": {"q1": 0.0, "q2": 0.0, "q3": 0.5, "q4": 0.5},
}
VARIANTS = {"none": {"method": "none"},
            "cocondenser-passage": {"method": "cocondenser", "context_type": "passage", "query_count": 4},
            "cocondenser-passage-seed43": {"method": "cocondenser", "context_type": "passage", "query_count": 4,
                                           "seed": 43, "seed_of": "cocondenser-passage"},
            "cocondenser-query-q4": {"method": "cocondenser", "context_type": "query", "query_count": 4},
            "cocondenser-query-q4-seed43": {"method": "cocondenser", "context_type": "query", "query_count": 4,
                                            "seed": 43, "seed_of": "cocondenser-query-q4"},
            "master-passage": {"method": "master", "context_type": "passage", "query_count": 4},
            "master-query-q4": {"method": "master", "context_type": "query", "query_count": 4}}


@pytest.fixture()
def profile_outputs(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = {"profile": "smoke", "data_dir": "data", "train_dataset": "scifact", "seed": 42,
              "tables": {"out_dir": "reports", "main_query_count": 4}, "pretrain": {"variants": VARIANTS}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    for variant, values in PER_QUERY.items():
        folder = tmp_path / "data" / "smoke" / "eval" / variant / "r1" / "scifact"
        folder.mkdir(parents=True)
        (folder / "test.per_query.json").write_text(json.dumps({"nDCG@10": values}), encoding="utf-8")
    datasets = tmp_path / "data" / "smoke" / "datasets" / "scifact"
    datasets.mkdir(parents=True)
    (datasets / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": f"claim {q}"}) + "\n" for q in ("q1", "q2", "q3", "q4")), encoding="utf-8")
    reports = tmp_path / "reports" / "smoke"
    (reports / "figures").mkdir(parents=True)
    (reports / "tables.md").write_text("# Query-as-context pre-training: results\n\n### Table 1: in-domain\n",
                                       encoding="utf-8")
    plt.plot([0, 1], [1, 0])
    plt.savefig(reports / "figures" / "loss.png")
    plt.close("all")
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def _outputs_text(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            for kind in ("text/markdown", "text/plain", "text/html"):
                parts.append(output.get("data", {}).get(kind, ""))
    return "\n".join(parts)


def test_analysis_notebook_executes_on_dvc_outputs(profile_outputs):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(profile_outputs)}}).execute()
    text = _outputs_text(notebook)
    assert "### Table 1: in-domain" in text
    # Win / tie / loss of query context per method, over the runs Table 1 compares (seeds pooled; see PER_QUERY).
    table = next(o for cell in notebook.cells for o in cell.get("outputs", [])
                 if "wins" in o.get("data", {}).get("text/plain", ""))
    rows = {line.split()[1]: line.split() for line in table["data"]["text/plain"].splitlines()[1:]}
    assert sorted(rows) == ["cocondenser", "master"]
    assert rows["cocondenser"][2:6] == ["cocondenser-passage", "cocondenser-query-q4", "42/43", "42/43"]
    assert rows["cocondenser"][-4:-1] == ["1", "2", "1"]                # wins, ties, losses
    assert float(rows["cocondenser"][-1]) == pytest.approx((0.625 - 0.25) / 4, abs=1e-4)
    assert rows["master"][-4:-1] == ["1", "2", "1"] and float(rows["master"][-1]) == pytest.approx(0.0, abs=1e-4)
    assert "claim q1" in text and "claim q4" in text          # the queries that moved most
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 3                                   # the report's figure + two analysis plots


def test_the_notebook_says_which_outputs_are_missing_and_how_to_build_them(profile_outputs):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    (profile_outputs / "reports" / "smoke" / "tables.md").unlink()
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.raises(CellExecutionError) as stopped:
        NotebookClient(notebook, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(profile_outputs)}}).execute()
    assert "reports/smoke/tables.md not found: build profile smoke first (`qac repro smoke`" in str(stopped.value)
