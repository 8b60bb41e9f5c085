"""Wall time per pipeline stage: runs `dvc repro` and times each stage it runs.

    python benchmarks/bench_stages.py --profile default [--force]

Runs ``dvc repro profiles/<profile>/dvc.yaml`` (``--force``: every stage,
even if up to date), and reads the
"Running stage" lines DVC prints as they arrive: a stage's time runs from its
line to the next one, so it includes process start-up and DVC's own
bookkeeping. Beside the table it measures the start-up floor every stage pays
(a fresh Python importing torch, transformers and MLflow, as each stage script
does), so the share of the total that is start-up, not work, is on record.
Writes the section ``stages-<profile>`` of reports/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict

from qac.benchmarking import machine_summary, markdown_table, write_section

_STAGE_LINE = re.compile(r"^Running stage '([^']+)'")


def timed_repro(profile: str, force: bool) -> tuple[list[tuple[str, float]], float]:
    """Run `dvc repro` on the profile, echo its output, return (stage, seconds) in run order and the total."""
    command = ["dvc", "repro", f"profiles/{profile}/dvc.yaml"] + (["--force"] if force else [])
    start = time.perf_counter()
    timings: list[tuple[str, float]] = []
    current, since = None, start
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        sys.stdout.write(line)
        match = _STAGE_LINE.match(line)
        if match:
            now = time.perf_counter()
            if current:
                timings.append((current, now - since))
            current, since = match.group(1).rsplit(":", 1)[-1], now
    if process.wait() != 0:
        raise SystemExit(f"dvc repro failed with exit code {process.returncode}")
    end = time.perf_counter()
    if current:
        timings.append((current, end - since))
    return timings, end - start


# What every stage script imports before it does any work.
_STAGE_IMPORTS = "import torch, transformers, mlflow, qac.config, qac.tracking"


def startup_seconds(repeats: int = 3) -> float:
    """Median wall time of a fresh interpreter importing what every stage imports."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", _STAGE_IMPORTS], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--force", action="store_true", help="rerun every stage")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    timings, total = timed_repro(args.profile, args.force)
    load_after = os.getloadavg()[0]
    floor = startup_seconds()
    per_group: dict[str, list[float]] = defaultdict(list)
    for stage, seconds in timings:
        per_group[stage.split("@")[0]].append(seconds)
    rows = [{"stage": stage, "runs": len(times), "seconds": round(sum(times), 1),
             "seconds per run": round(sum(times) / len(times), 1)} for stage, times in per_group.items()]
    body = [f"## Pipeline stages, profile `{args.profile}` (`benchmarks/bench_stages.py`)", "",
            f"Measured on {machine_summary()}. `dvc repro profiles/{args.profile}/dvc.yaml"
            f"{' --force' if args.force else ''}`; a stage's time runs",
            "from DVC's 'Running stage' line to the next one (process start-up included); `foreach` stages",
            "are summed over their variants.", "",
            markdown_table(rows), "", f"Total `dvc repro` wall time: {total:.0f} s ({total / 60:.1f} minutes), "
            f"load average {load_before:.1f} at the start and {load_after:.1f} at the end.", "",
            f"Start-up floor: a fresh Python importing what every stage imports takes {floor:.1f} s "
            f"(median of 3, measured after the run); {len(timings)} stage runs pay it, "
            f"{len(timings) * floor:.0f} s in all ({len(timings) * floor / total:.0%} of the total)."]
    write_section(f"stages-{args.profile}", "\n".join(body))
    print("\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
