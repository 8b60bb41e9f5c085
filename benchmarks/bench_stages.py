"""Wall time per pipeline stage: runs `dvc repro` and times each stage it runs.

    python benchmarks/bench_stages.py --profile default [--force]

Runs ``dvc repro profiles/<profile>/dvc.yaml`` (``--force``: every stage,
even if up to date), and reads the
"Running stage" lines DVC prints as they arrive: a stage's time runs from its
line to the next one, so it includes process start-up and DVC's own
bookkeeping. Writes the section ``stages-<profile>`` of reports/benchmarks.md.
"""

from __future__ import annotations

import argparse
import re
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--force", action="store_true", help="rerun every stage")
    args = parser.parse_args()
    timings, total = timed_repro(args.profile, args.force)
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
            markdown_table(rows), "", f"Total `dvc repro` wall time: {total:.0f} s ({total / 60:.1f} minutes)."]
    write_section(f"stages-{args.profile}", "\n".join(body))
    print("\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
