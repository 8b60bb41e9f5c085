"""notebooks/analysis.ipynb runs top to bottom on a profile's DVC outputs, with no MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "analysis.ipynb"

# Per-query nDCG@10 of four queries; query context wins q1 and q2, ties q3, loses q4 (cocondenser).
PER_QUERY = {
    "cocondenser-passage": {"q1": 0.5, "q2": 0.0, "q3": 1.0, "q4": 1.0},
    "cocondenser-query-q4": {"q1": 1.0, "q2": 0.25, "q3": 1.0, "q4": 0.5},
    "none": {"q1": 0.0, "q2": 0.0, "q3": 0.5, "q4": 0.5},
}


@pytest.fixture()
def profile_outputs(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = {"profile": "smoke", "data_dir": "data", "train_dataset": "scifact",
              "tables": {"out_dir": "reports", "main_query_count": 4},
              "pretrain": {"variants": {"none": {"method": "none"},
                                        "cocondenser-passage": {"method": "cocondenser", "context_type": "passage",
                                                                "query_count": 4},
                                        "cocondenser-query-q4": {"method": "cocondenser", "context_type": "query",
                                                                 "query_count": 4}}}}
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
    # Win / tie / loss of query context, counted by hand from PER_QUERY: 2 wins, 1 tie, 1 loss.
    table = next(o for cell in notebook.cells for o in cell.get("outputs", [])
                 if "wins" in o.get("data", {}).get("text/plain", ""))
    row = table["data"]["text/plain"].splitlines()[1].split()
    assert row[-4:-1] == ["2", "1", "1"]                        # wins, ties, losses
    assert float(row[-1]) == pytest.approx((0.5 + 0.25 + 0.0 - 0.5) / 4, abs=1e-4)
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
