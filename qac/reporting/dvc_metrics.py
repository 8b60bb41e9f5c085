"""A stage's DVC metrics, one file per kind: results in ``metrics/<stage>.json``, timing in ``metrics/timing/``.

``dvc metrics show`` lists the result files dvc.yaml declares as metrics
(counts, quality, retrieval measures), which are the same on every machine;
wall-clock time and throughput, which are not, go to
``metrics/timing/<stage>.json`` (a plain output: ``dvc metrics show
data/<profile>/metrics/timing/<stage>.json`` shows it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from qac.io import write_json


def is_timing(key: str) -> bool:
    """``seconds``, ``*_seconds`` and ``*_per_second*`` keys: wall-clock figures."""
    return key == "seconds" or key.endswith("_seconds") or "_per_second" in key


def write_stage_metrics(metrics_dir: str | os.PathLike, stage: str, metrics: Mapping[str, Any]) -> None:
    """Write ``<metrics_dir>/<stage>.json`` (results) and ``<metrics_dir>/timing/<stage>.json`` (timing)."""
    metrics_dir = Path(metrics_dir)
    write_json(metrics_dir / f"{stage}.json", {k: v for k, v in metrics.items() if not is_timing(k)})
    write_json(metrics_dir / "timing" / f"{stage}.json", {k: v for k, v in metrics.items() if is_timing(k)})
