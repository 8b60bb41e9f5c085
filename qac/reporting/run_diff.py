"""How two runs differ: parameters, code, data, environment and headline metrics, with paired tests.

``qac runs diff A B`` puts two MLflow runs side by side and shows only what
differs: parameters (MLflow params), code (``qac.git_commit``, the dirty flag
and the MD5 of every qac module each run imported, ``code/qac_modules.json``),
data (the ``qac.input_md5.*`` tags, the hashes DVC uses), environment (host,
the other ``qac.*`` tags), then every metric. An evaluation metric
(``<dataset>/<split>/<measure>``) whose per-query values both runs logged
(``per_query/<dataset>/<split>.json``) gets the paired randomization test and
the 95% bootstrap interval of B − A (:func:`qac.evaluation.significance.compare_paired`):
that says whether the difference is more than the noise of the queries.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qac.evaluation.significance import ALPHA, compare_paired

CODE_ARTIFACT = "code/qac_modules.json"
_EVALUATION = re.compile(r"^(?P<dataset>[^/]+)/(?P<split>[^/]+)/(?P<measure>[^/]+)$")
# Tags that differ between any two runs and say nothing about what ran.
_BOOKKEEPING = ("mlflow.runName", "mlflow.parentRunId", "qac.pid", "mlflow.source.name", "mlflow.user",
                "mlflow.log-model.history", "qac.swept")


@dataclass
class RunDiff:
    runs: tuple[str, str]
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)       # section, key, A, B
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"runs": list(self.runs),
                "differences": [dict(zip(("section", "key", "a", "b"), row)) for row in self.rows],
                "metrics": self.metrics}


def _section(tag: str) -> str:
    if tag.startswith("qac.input_md5.") or tag.startswith("qac.input."):
        return "data"
    if tag in ("qac.git_commit", "qac.git_dirty", "mlflow.source.git.commit"):
        return "code"
    return "environment"


def _code(client, run_id: str) -> dict[str, str]:
    """``{module: MD5}`` the run logged, or {} where it logged none."""
    try:
        with tempfile.TemporaryDirectory() as folder:
            return json.loads(Path(client.download_artifacts(run_id, CODE_ARTIFACT, folder)).read_text())
    except Exception:      # MLflow raises its own and OS errors for an absent artifact: no record of the code
        return {}


def _per_query(client, run_id: str, dataset: str, split: str) -> dict | None:
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = client.download_artifacts(run_id, f"per_query/{dataset}/{split}.json", folder)
            return json.loads(Path(path).read_text())
    except Exception:      # not logged (a training run, or a store without artifacts): no test, said so
        return None


def _differing(section: str, a: dict, b: dict, skip=()) -> list[tuple[str, str, str, str]]:
    keys = sorted((set(a) | set(b)) - set(skip))
    return [(section, key, str(a.get(key, "–")), str(b.get(key, "–"))) for key in keys if a.get(key) != b.get(key)]


def diff_runs(client, run_a: str, run_b: str, permutations: int = 10_000, seed: int = 0) -> RunDiff:
    """What differs between the MLflow runs ``run_a`` and ``run_b`` (the module's doc)."""
    a, b = client.get_run(run_a), client.get_run(run_b)
    diff = RunDiff((run_a, run_b))
    diff.rows += _differing("params", a.data.params, b.data.params)
    tags = [(key, a.data.tags.get(key), b.data.tags.get(key)) for key in sorted(set(a.data.tags) | set(b.data.tags))
            if key not in _BOOKKEEPING and a.data.tags.get(key) != b.data.tags.get(key)]
    diff.rows += [(_section(key), key, str(x if x is not None else "–"), str(y if y is not None else "–"))
                  for key, x, y in tags]
    diff.rows += _differing("code", _code(client, run_a), _code(client, run_b))
    for key in sorted(set(a.data.metrics) | set(b.data.metrics)):
        diff.metrics.append(metric_row(client, key, run_a, run_b, a.data.metrics.get(key), b.data.metrics.get(key),
                                       permutations, seed))
    return diff


def metric_row(client, key: str, run_a: str, run_b: str, value_a, value_b, permutations: int, seed: int) -> dict:
    """One metric of both runs; an evaluation metric with both runs' per-query values gets the paired test."""
    row = {"metric": key, "a": value_a, "b": value_b,
           "delta": None if value_a is None or value_b is None else value_b - value_a}
    match = _EVALUATION.match(key)
    if match and row["delta"] is not None:
        per_a, per_b = (_per_query(client, run, match["dataset"], match["split"]) for run in (run_a, run_b))
        measure = match["measure"].replace("_at_", "@")     # metric keys spell @ as _at_ (qac.tracking)
        if per_a and per_b and measure in per_a and measure in per_b:
            result = compare_paired(per_b[measure], per_a[measure], permutations, seed)
            row.update(p_value=result.p_value, ci=result.ci, n_queries=result.n_queries)
    return row


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_diff(diff: RunDiff, width: int = 120) -> str:
    """The diff as text no wider than ``width``: differing rows, then the metrics (B − A, p, CI)."""
    side = (width - 36) // 2
    lines = [f"A {diff.runs[0]}", f"B {diff.runs[1]}", ""]
    if diff.rows:
        lines.append(f"{'':11} {'key':<22} {'A':<{side}} B")
        lines += [f"{section:<11} {_cut(key, 22):<22} {_cut(x, side):<{side}} {_cut(y, side)}"
                  for section, key, x, y in diff.rows]
    else:
        lines.append("parameters, code, data and environment: the same")
    lines += ["", f"{'metric':<30} {'A':>8} {'B':>8} {'B − A':>8}  paired test of B against A over the queries"]
    for row in diff.metrics:
        a, b, d = (("–" if row[k] is None else f"{row[k]:.4f}") for k in ("a", "b", "delta"))
        test = ""
        if row.get("p_value") is not None:
            verdict = "more than query noise" if row["p_value"] < ALPHA else "within query noise"
            ci = "" if row.get("ci") is None else f", CI [{row['ci'][0]:+.4f}, {row['ci'][1]:+.4f}]"
            test = f"p={row['p_value']:.2g}{ci}: {verdict}"
        lines.append(_cut(f"{_cut(row['metric'], 30):<30} {a:>8} {b:>8} {d:>8}  {test}", width))
    return "\n".join(line.rstrip() for line in lines) + "\n"
