"""What another machine changes: a profile run from fresh clones under each CPU kernel set this machine offers.

    python benchmarks/bench_kernel_sets.py run --profile smoke [--kernels native,avx2,default] [--keep DIR]
    python benchmarks/bench_kernel_sets.py judge --profile smoke --runs DIR [--expected FILE] [--report FILE]

``run`` clones the committed tree once per kernel set into a folder beside the
project (so that ``../shared`` is found as from the project), runs ``make
<target>`` there (``make smoke`` for the smoke profile, ``make repro`` for the
default one) with torch's and MKL's kernels chosen by environment variables
(``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``), and records every
checkable cell of the finished run with the machine it ran on
(``qac check --record`` into ``DIR/<kernel set>.yaml``). Those files are what
``qac check --record --machine-runs DIR/*.yaml`` turns into the rerun check's
measured basis (profiles/expected/<profile>.yaml: ``machine_runs``).

``judge`` checks each recorded run against the expected file (default: the
profile's own, ``check.expected``), leaving each run out of the basis it is
judged by (a basis measured on a run cannot vouch for that run), and writes
the table into the section ``kernel_sets_<profile>`` of reports/benchmarks.md:
for each run, the CPU, the kernels, the seconds ``make`` took, the check's
outcome with the run in the basis and left out of it.

The clones use the project's installed ``.venv`` (the same libraries; a link,
with PYTHONPATH naming the clone's own code) rather than installing one each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"smoke": "smoke", "default": "repro"}
# torch's kernel set and MKL's instruction set for each name (None: the machine's own choice).
KERNEL_SETS = {
    "native": {},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def _clone(name: str, profile: str) -> Path:
    work = REPO.parent / f".kernel-set-{profile}-{name}"
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(work)], check=True)
    (work / ".venv").symlink_to(REPO / ".venv")
    # make's install rule compares its stamp with these two files: a fresh checkout is newer than the
    # shared venv's stamp, and installing again would point the shared venv's editable qac at the clone.
    for name_ in ("pyproject.toml", "constraints.txt"):
        os.utime(work / name_, (0, 0))
    return work


def _add_environment(path: Path, env: dict, name: str, seconds: float) -> None:
    """Name the machine and kernels the recorded run ran on inside its record (``environment``)."""
    import json

    import yaml

    probe = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", ENVIRONMENT_PROBE],
                           env={**env, "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True, check=True)
    environment = {**json.loads(probe.stdout), "kernel_set": name, "seconds": round(seconds)}
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document = {key: value for key, value in document.items() if key != "cells"} | {"environment": environment,
                                                                                    "cells": document["cells"]}
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=120), encoding="utf-8")


# Run under the kernel set's environment: what torch itself reports it uses there.
ENVIRONMENT_PROBE = """
import json
from qac.reporting.machine import machine_environment
print(json.dumps(machine_environment()))
"""


def run(args: argparse.Namespace) -> int:
    out = Path(args.keep).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in args.kernels.split(","):
        if name not in KERNEL_SETS:
            sys.exit(f"bench_kernel_sets: unknown kernel set {name!r} (known: {', '.join(KERNEL_SETS)})")
    for name in args.kernels.split(","):
        work = _clone(name, args.profile)
        env = {**os.environ, **KERNEL_SETS[name], "PYTHONPATH": str(work), "HF_HUB_OFFLINE": "1"}
        start = time.monotonic()
        done = subprocess.run(["make", TARGETS[args.profile]], cwd=work, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - start
        (out / f"{name}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        record = subprocess.run([str(work / ".venv" / "bin" / "qac"), "check", "--record", "--expected",
                                 str(out / f"{name}.yaml")],
                                cwd=work, env={**env, "QAC_PROFILE": args.profile}, capture_output=True, text=True)
        if record.returncode == 0:
            _add_environment(out / f"{name}.yaml", env, name, seconds)
        print(f"{name}: make {TARGETS[args.profile]} exit {done.returncode} in {seconds:.0f} s; "
              f"record exit {record.returncode} {record.stderr.strip()[-300:]}", flush=True)
    return 0


def judge(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    from qac.benchmarking import machine_summary, markdown_table, write_section
    from qac.reporting import check

    runs = sorted(Path(args.runs).glob("*.yaml"))
    if not runs:
        sys.exit(f"bench_kernel_sets: no recorded runs under {args.runs}")
    report = Path(args.report).resolve() if args.report else None
    os.chdir(REPO)
    from qac.params import load_params

    params = load_params(f"profiles/{args.profile}/params.yaml")
    expected_path = Path(args.expected or params.check.expected)
    document = check.read_document(expected_path)
    rows = []
    for path in runs:
        machine_run = check.read_machine_run(path)
        verdict_in = check.judge_machine_run(document, machine_run)
        left_out = check.leave_out(document, machine_run)
        verdict_out = check.judge_machine_run(left_out, machine_run)
        rows.append({"run": path.stem, "CPU": machine_run.environment.get("cpu", "?"),
                     "kernels (torch / MKL)": f"{machine_run.environment.get('torch_kernels', '?')} / "
                                              f"{machine_run.environment.get('mkl_instructions') or 'own'}",
                     "make seconds": machine_run.environment.get("seconds", "?"),
                     "cells moved": verdict_in.moved, "outcome (run in basis)": verdict_in.outcome,
                     "outcome (run left out)": verdict_out.outcome,
                     "cells outside (left out)": f"{verdict_out.outside} of {verdict_out.cells} "
                                                 f"(allowed {verdict_out.allowed})"})
    body = (f"## Reruns under other kernel sets: {args.profile} profile\n\nMeasured on {machine_summary()}; "
            f"judged against {expected_path.as_posix()} (`benchmarks/bench_kernel_sets.py`). A run left out of "
            "the measured basis is judged by the spread of the others alone.\n\n" + markdown_table(rows))
    write_section(f"kernel_sets_{args.profile}", body, *([report] if report else []))
    print(markdown_table(rows))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("--profile", choices=sorted(TARGETS), default="smoke")
    run_parser.add_argument("--kernels", default="native,avx2,default")
    run_parser.add_argument("--keep", required=True, help="folder for the recorded runs and make's logs")
    judge_parser = commands.add_parser("judge")
    judge_parser.add_argument("--profile", choices=sorted(TARGETS), default="smoke")
    judge_parser.add_argument("--runs", required=True)
    judge_parser.add_argument("--expected", default=None)
    judge_parser.add_argument("--report", default=None, help="the report file (default: reports/benchmarks.md)")
    args = parser.parse_args()
    return run(args) if args.command == "run" else judge(args)


if __name__ == "__main__":
    sys.exit(main())
