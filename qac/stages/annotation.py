"""Stage `annotation`: the Table 5 annotation study (sheet for people, labels, MLflow run).

Reads data/<profile>/passages.arrow and queries.arrow, writes
data/<profile>/annotation/ (sheet.csv, key.csv, labels.csv, summary.json) and logs
the MLflow run `annotation/table5` (its record: data/<profile>/.runs/annotation/). Labels come from
the automatic judge until `annotation.human_sheets` lists filled sheets.
"""

from __future__ import annotations

import json
from pathlib import Path

from qac.config import profile_dir
from qac.params import load_params
from qac.stages.arguments import stage_arguments
from qac.console import StageClock, print_summary
from qac.io import atomic_path
from qac.evaluation import annotation
from qac.tracking.lifecycle import tracked_stage


def main(argv: list[str] | None = None) -> int:
    stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()
    params = load_params()
    settings = params.annotation
    data = profile_dir(params)
    dataset_dir = data / "datasets" / params.train_dataset
    split = settings.calibration_split
    dataset_meta = dataset_dir / "dataset.json"
    rel_threshold = 1
    if dataset_meta.exists():
        rel_threshold = int(json.loads(dataset_meta.read_text(encoding="utf-8")).get("rel_threshold", {}).get(split, 1))
    with atomic_path(data / "annotation", directory=True) as out:
        summary = annotation.run_study(
            data / "passages.arrow", data / "queries.arrow", dataset_dir, out,
            documents=settings.documents, seed=params.seed, judge_model=settings.judge_model,
            calibration_split=split, calibration_pairs_max=settings.calibration_pairs, rel_threshold=rel_threshold,
            human_sheets=settings.human_sheets, judge_max_length=settings.judge_max_len)
        with tracked_stage(params, "annotation", annotation.RUN_NAME, kind="annotation", stage_params=settings,
                           inputs={"passages": data / "passages.arrow", "queries": data / "queries.arrow",
                                   "calibration_dataset": dataset_dir},
                           tags={annotation.LABELS_TAG: summary["labels"],
                                 "qac.annotation.label_source": summary["label_source"]},
                           output=data / "annotation", root=data) as tracking:
            metrics = {}
            for kind, share in summary["shares"].items():
                metrics[annotation.share_metric(kind)] = share["share"]
                metrics[annotation.count_metric(kind)] = share["pairs"]
            metrics["judge/threshold"] = summary["judge"]["threshold"]
            metrics["judge/calibration_accuracy"] = summary["judge"]["accuracy"]
            if summary["human"]:
                metrics["human/fleiss_kappa"] = summary["human"]["fleiss_kappa"]
                metrics["human/percent_agreement"] = summary["human"]["percent_agreement"]
            tracking.log_metrics(metrics)
            tracking.log_artifacts(Path(out) / annotation.LABELS_FILE, Path(out) / "summary.json")
    shares = summary["shares"]
    print_summary("annotation", f"{summary['documents']} documents",
                  "high correlation " + ", ".join(f"{kind} {value['share']:.1%}" for kind, value in shares.items()),
                  f"labels: {summary['labels']}", seconds=clock.seconds)
    return 0

