"""Wall time per pipeline stage, from the MLflow runs the stages logged.

    python benchmarks/bench_stages.py --profile default [--repro]

With ``--repro`` the script first runs ``dvc repro`` and also reports its
total wall time (the stages' own runs exclude process start-up, so the total
is the figure to compare with the 30-minute goal). Writes the section
``stages-<profile>`` of reports/benchmarks.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict

import mlflow

from qac.benchmarking import machine_summary, markdown_table, write_section
from qac.tracking import tracking_uri


def stage_durations(profile: str) -> list[dict]:
    mlflow.set_tracking_uri(tracking_uri())
    experiment = mlflow.get_experiment_by_name(f"qac-{profile}")
    if experiment is None:
        raise SystemExit(f"no MLflow experiment qac-{profile} at {tracking_uri()}: run the pipeline first")
    runs = mlflow.search_runs([experiment.experiment_id], output_format="list", max_results=5000,
                              order_by=["start_time DESC"])
    latest: dict[str, object] = {}
    for run in runs:  # newest first: keep each stage's latest completed run
        stage = run.data.tags.get("qac.stage")
        if stage and run.info.end_time and (stage, run.info.run_name) not in latest:
            latest[(stage, run.info.run_name)] = run
    per_stage: dict[str, float] = defaultdict(float)
    for (stage, _), run in latest.items():
        per_stage[stage] += (run.info.end_time - run.info.start_time) / 1000
    return [{"stage": stage, "seconds": round(seconds, 1)} for stage, seconds in sorted(per_stage.items())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--repro", action="store_true", help="run `dvc repro` first and time it")
    args = parser.parse_args()
    total = None
    if args.repro:
        start = time.perf_counter()
        subprocess.run(["dvc", "repro"], check=True)
        total = time.perf_counter() - start
    rows = stage_durations(args.profile)
    body = [f"## Pipeline stages, profile `{args.profile}`", "",
            f"Measured on {machine_summary()}. Seconds are each stage's MLflow run (start to end,",
            "process start-up excluded); a stage with several runs (fine-tuning r1 and r2) sums them.", "",
            markdown_table(rows + [{"stage": "sum of stages", "seconds": round(sum(r["seconds"] for r in rows), 1)}])]
    if total is not None:
        body += ["", f"`dvc repro` wall time: {total / 60:.1f} minutes."]
    write_section(f"stages-{args.profile}", "\n".join(body))
    print("\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
