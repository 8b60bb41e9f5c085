"""notebooks/analysis.ipynb runs top to bottom on a store filled with a smoke-like study."""

from __future__ import annotations

from pathlib import Path

import yaml

from test_tables import PARAMS, study  # noqa: F401  (the module-scoped MLflow study fixture)

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "analysis.ipynb"


def test_analysis_notebook_executes(study, tmp_path, monkeypatch):  # noqa: F811
    import nbformat
    from nbclient import NotebookClient

    uri, ids = study
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(PARAMS), encoding="utf-8")
    monkeypatch.setenv("QAC_PARAMS", str(params_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()

    def text(cell):
        parts = []
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            for kind in ("text/markdown", "text/plain", "text/html"):
                parts.append(output.get("data", {}).get(kind, ""))
        return "\n".join(parts)

    outputs = "\n".join(text(cell) for cell in notebook.cells if cell.cell_type == "code")
    assert "**Profile**: smoke (SCALED DOWN" in outputs
    assert "### Table 1" in outputs and "### Table 5" in outputs
    assert "40.0 / 37.4" in outputs
    assert ids["finetune/r1/cocondenser-query-q4"] in outputs          # the run-id view of Table 1
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 3
