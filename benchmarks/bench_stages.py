"""Where a profile's `dvc repro` spends its seconds: per stage, its wall time, its imports and DVC's share.

    python benchmarks/bench_stages.py --profile smoke [--force]
    python benchmarks/bench_stages.py --profile smoke --log repro.log   # a log written with --save-log
    python benchmarks/bench_stages.py --profile smoke --stage tables --force   # one stage, quickly
    python benchmarks/bench_stages.py --profile smoke --jobs 2 --force        # as `make smoke`: `qac repro --jobs 2`

Runs ``dvc repro profiles/<profile>/dvc.yaml`` (``--force``: every stage, even
if up to date; for a run from an empty cache, delete ``data/<profile>`` and
``.dvc/cache`` first) with ``PYTHONPROFILEIMPORTTIME=1``, so that every Python
process prints what its imports cost, and reads DVC's output line by line as it
arrives, each line stamped with its arrival time. Per stage run:

- wall: from DVC's "Running stage" line to the next one (or the end);
- imports: the stage process's top-level imports (``-X importtime``), wherever
  they happen (a function's import counts when it runs);
- stage clock: the seconds the stage's own summary line reports (its work,
  from after the script's top-level imports to the summary);
- outside the clock: wall minus stage clock: starting Python and the
  script's top-level imports, the process's exit, and DVC's own bookkeeping
  (checking the stage's inputs, saving its outputs to the cache, rewriting the
  lock file);
- after the stage: from the stage's last line to the next "Running stage"
  line: the process's exit and DVC saving outputs and the lock.

``foreach`` stages are summed over their variants. Import timing costs a
few milliseconds per process (the lines it prints). Writes the section
``stages-<profile>`` of reports/benchmarks.md.
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
from dataclasses import dataclass, field
from pathlib import Path

from qac.benchmarking import machine_summary, markdown_table, write_section

_STAGE_LINE = re.compile(r"^Running stage '([^']+)'")
# `qac repro --jobs N` prints a stage's whole output when it ends, after this line with its wall time.
_RUNNER_LINE = re.compile(r"^Stage '([^']+)' (?:done|FAILED \(exit status -?\d+\)) in ([\d.]+) s$")
# "import time:   self [us] | cumulative | name"; a top-level import has one space before its name.
_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( +)(\S+)")
_SUMMARY_SECONDS = re.compile(r", (?:(\d+) h (\d+) min|(\d+) min (\d+) s|([\d.]+) s)$")


@dataclass
class StageRun:
    name: str                      # prepare@scifact
    started: float                 # arrival of its "Running stage" line
    ended: float = 0.0             # arrival of the next "Running stage" line, or the end
    last_line: float = 0.0         # arrival of the stage's last line of its own
    imports: float = 0.0           # seconds of top-level imports in its processes
    clock: float | None = None     # seconds its summary line reports
    modules: dict[str, float] = field(default_factory=dict)   # top-level import -> seconds
    measured: bool = False         # wall time as `qac repro` reported it (stages side by side)

    @property
    def group(self) -> str:
        return self.name.split("@")[0]

    @property
    def wall(self) -> float:
        return self.ended - self.started


def summary_seconds(line: str, stage: str) -> float | None:
    """The seconds at the end of ``stage``'s summary line (``..., 6.9 s``, ``1 min 05 s``), else None."""
    if not line.startswith(f"{stage}: "):
        return None
    match = _SUMMARY_SECONDS.search(line.rstrip())
    if not match:
        return None
    hours, minutes_h, minutes, seconds, plain = match.groups()
    if plain is not None:
        return float(plain)
    if minutes is not None:
        return int(minutes) * 60 + int(seconds)
    return int(hours) * 3600 + int(minutes_h) * 60


def parse_timed_lines(lines: list[tuple[float, str]], end: float) -> list[StageRun]:
    """Stage runs from ``(arrival seconds, line)`` of a `dvc repro` run with import timing on.

    Also reads `qac repro --jobs N`, whose stages run side by side and arrive each as one block after
    the runner's ``Stage '<name>' done in <s> s`` line: that line gives the stage's wall time.
    """
    runs: list[StageRun] = []
    measured: float | None = None      # the wall time the runner reported for the block that follows
    for at, line in lines:
        runner = _RUNNER_LINE.match(line)
        if runner:
            if runs and not runs[-1].measured:
                runs[-1].ended = at
            measured = float(runner.group(2))
            continue
        match = _STAGE_LINE.match(line)
        if match:
            if runs and not runs[-1].measured:
                runs[-1].ended = at
            runs.append(StageRun(match.group(1).rsplit(":", 1)[-1], at, last_line=at))
            if measured is not None:
                runs[-1].ended = runs[-1].last_line = at + measured
                runs[-1].measured, measured = True, None
            continue
        if not runs or measured is not None:
            continue   # DVC's own start-up (before each stage's block, when they run side by side)
        run = runs[-1]
        imported = _IMPORT_LINE.match(line)
        if imported:
            if len(imported.group(3)) == 1:    # top level: its cumulative time holds its children's
                seconds = int(imported.group(2)) / 1e6
                run.imports += seconds
                run.modules[imported.group(4)] = run.modules.get(imported.group(4), 0.0) + seconds
            if not run.measured:
                run.last_line = at
            continue
        seconds = summary_seconds(line, run.name)
        if seconds is not None:
            run.clock = seconds
        if line.strip() and not run.measured and not line.startswith(("Updating lock file", "Generating lock file",
                                                                      "> ")):
            run.last_line = at
    if runs and not runs[-1].measured:
        runs[-1].ended = end
    return runs


def repro_command(profile: str, force: bool, stages: list[str], jobs: int = 0) -> list[str]:
    """`dvc repro` of the profile, or of the named stages alone (``-s``); with ``jobs``, `qac repro --jobs`."""
    if jobs:
        if stages:
            raise SystemExit("--stage times one stage with `dvc repro`; leave out --jobs")
        return ["qac", "repro", "--jobs", str(jobs), *(["--force"] if force else []), profile]
    pipeline = f"profiles/{profile}/dvc.yaml"
    targets = [f"{pipeline}:{stage}" for stage in stages] if stages else [pipeline]
    return ["dvc", "repro", *(["-s"] if stages else []), *(["--force"] if force else []), *targets]


def timed_repro(command: list[str], save_log: Path | None) -> tuple[list[StageRun], float]:
    """Run ``command`` (`dvc repro ...`) with import timing on; the stage runs and the total seconds."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:
        lines.append((time.perf_counter() - start, line.rstrip("\n")))
        if not line.startswith("import time:"):
            sys.stdout.write(line)
    if process.wait() != 0:
        raise SystemExit(f"{' '.join(command[:2])} failed with exit code {process.returncode}")
    total = time.perf_counter() - start
    if save_log:
        save_log.write_text("".join(f"{at:.3f}\t{line}\n" for at, line in lines) + f"{total:.3f}\t\n",
                            encoding="utf-8")
    return parse_timed_lines(lines, total), total


def read_log(path: Path) -> tuple[list[StageRun], float]:
    """A log written by --save-log: ``seconds<TAB>line`` per line, the total on the last."""
    rows = [line.split("\t", 1) for line in path.read_text(encoding="utf-8").splitlines()]
    total = float(rows[-1][0])
    return parse_timed_lines([(float(at), text) for at, text in rows[:-1]], total), total


# What every stage script imports before it does any work.
_STAGE_IMPORTS = "import torch, transformers, mlflow, qac.config, qac.tracking"


def startup_seconds(repeats: int = 3) -> float:
    """Median wall time of a fresh interpreter importing what a training stage imports."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", _STAGE_IMPORTS], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_rows(runs: list[StageRun]) -> list[dict]:
    """One row per stage (``foreach`` variants summed), in run order, and a total row."""
    groups: dict[str, list[StageRun]] = defaultdict(list)
    for run in runs:
        groups[run.group].append(run)

    def row(name: str, members: list[StageRun]) -> dict:
        wall = sum(run.wall for run in members)
        clocked = [run for run in members if run.clock is not None]
        clock = sum(run.clock for run in clocked)
        return {"stage": name, "runs": len(members), "wall s": round(wall, 1),
                "wall s per run": round(wall / len(members), 1),
                "imports s": round(sum(run.imports for run in members), 1),
                "stage clock s": round(clock, 1) if clocked else "",
                "outside the clock s": round(sum(run.wall - run.clock for run in clocked), 1) if clocked else "",
                "after the stage s": round(sum(run.ended - run.last_line for run in members), 1)}

    rows = [row(name, members) for name, members in groups.items()]
    return rows + [row("all stages", runs)] if runs else rows


def heaviest_imports(runs: list[StageRun], top: int = 8) -> list[tuple[str, float, int]]:
    """``(module, seconds summed over stage runs, stage runs importing it)`` of the costliest top-level imports."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for run in runs:
        packages = set()
        for module, spent in run.modules.items():
            seconds[module.split(".")[0]] += spent
            packages.add(module.split(".")[0])
        for package in packages:
            count[package] += 1
    return sorted(((module, seconds[module], count[module]) for module in seconds), key=lambda item: -item[1])[:top]


def report(profile: str, runs: list[StageRun], total: float, command: str, load: tuple[float, float],
           floor: float | None) -> str:
    rows = stage_rows(runs)
    overall = rows[-1] if rows else {}
    imports = heaviest_imports(runs)
    body = [f"## Pipeline stages, profile `{profile}` (`benchmarks/bench_stages.py`)", "",
            f"Measured on {machine_summary()}. `{command}` with `PYTHONPROFILEIMPORTTIME=1`; a stage's wall time runs",
            "from DVC's 'Running stage' line to the next one; imports are the stage process's top-level imports;",
            "the stage clock is the time its summary line reports (its work); outside the clock is the rest (Python",
            "start-up and the script's top-level imports, exit, DVC checking inputs, caching outputs and rewriting the",
            "lock); after the stage is the part of it from the stage's last line on. `foreach` stages are summed over",
            "their variants.", "",
            markdown_table(rows), "",
            f"Total wall time: {total:.0f} s ({total / 60:.1f} minutes), load average {load[0]:.1f} at the "
            f"start and {load[1]:.1f} at the end."]
    if any(run.measured for run in runs):
        body += ["", "The stages ran side by side (`qac repro --jobs`): each wall time is the one the runner "
                     "reported, and they add up to more than the total."]
    if overall and total:
        # Side by side, the stage runs' seconds add up to more than the wall: shares are of their sum.
        whole, what = ((overall["wall s"], "stage-seconds") if any(run.measured for run in runs) else (total, "s"))
        body += ["", f"Of the {whole:.0f} {what}, the {len(runs)} stage runs' imports take {overall['imports s']} s "
                     f"({overall['imports s'] / whole:.0%}) and time outside the stage clocks "
                     f"{overall['outside the clock s'] or 0} s."]
    if imports:
        body += ["", "Costliest top-level imports, summed over the stage runs: " + ", ".join(
            f"{module} {spent:.1f} s ({count} runs)" for module, spent, count in imports) + "."]
    if floor is not None:
        body += ["", f"Start-up floor: a fresh Python importing `{_STAGE_IMPORTS.removeprefix('import ')}` takes "
                     f"{floor:.1f} s (median of 3, measured after the run)."]
    return "\n".join(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--force", action="store_true", help="rerun every stage")
    parser.add_argument("--save-log", type=Path, help="also write the timed output to this file")
    parser.add_argument("--log", type=Path, help="report from a log written by --save-log instead of running")
    parser.add_argument("--stage", action="append", default=[], help="time this stage alone (repeatable)")
    parser.add_argument("--jobs", type=int, default=0, choices=range(0, 65), metavar="N",
                        help="run `qac repro --jobs N` (stages side by side, as `make smoke`) instead of `dvc repro`")
    args = parser.parse_args()
    command = repro_command(args.profile, args.force, args.stage, args.jobs)
    load_before = os.getloadavg()[0]
    if args.log:
        runs, total = read_log(args.log)
        floor = None
    else:
        runs, total = timed_repro(command, args.save_log)
        floor = startup_seconds()
    if not runs:      # nothing to time: the report keeps its last measurement
        print(f"bench_stages.py: no stage ran: profile {args.profile} is up to date (`{' '.join(command)}` had "
              "nothing to do); pass --force to time every stage. reports/benchmarks.md is left as it is.",
              file=sys.stderr)
        return 1
    text = report(args.profile, runs, total, " ".join(command), (load_before, os.getloadavg()[0]), floor)
    write_section(f"stages-{args.profile}{'-' + '-'.join(args.stage) if args.stage else ''}", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
