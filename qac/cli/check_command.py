"""Check the profile's results against its expected values, one line per cell.

Rebuilds Tables 1-5 and the query generator's checkable figures
(qac/reporting/generator_report.py) from the DVC outputs under
data/<profile>/ (no MLflow store needed) and compares every cell listed in
the profile's expected file (params `check.expected`, e.g.
profiles/expected/smoke.yaml). The file's kind says how (see
qac/reporting/check.py): a *rerun* check (smoke, default: the profile's own
recorded run) says whether the outputs have the recorded bytes, move within
the spread other machines were measured to give, or differ, and names both
machines; a *reproduction* check (paper: the published figures) says per cell
reproduced / within noise / differs and which basis decided it (rounding,
training noise from seeds or the prior in params, float noise for a
deterministic row), then the family's verdict. Every profile also gets one
`CLAIM` line per claim of the paper (qac/reporting/claims.yaml). Exits 0 when
the family passes, 1 when it does not (or, for a reproduction, a claim is
contradicted), 2 when the profile has not run or its files are wrong.

`qac check --record` writes the expected file from the current outputs (for
the paper profile: from the paper's published values); `--machine-runs` adds
other machines' records of the same profile as the measured basis of its
bands (benchmarks/bench_kernel_sets.py makes them).
"""

from __future__ import annotations

import argparse
import os
import sys

from qac.reporting.machine import machine_environment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default=None, help="params file (default: $QAC_PARAMS, else "
                        "profiles/$QAC_PROFILE/params.yaml, else the default profile)")
    parser.add_argument("--data", default=None, help="the profile's DVC outputs (default: data/<profile>)")
    parser.add_argument("--expected", default=None, help="expected-values file (default: params check.expected)")
    parser.add_argument("--record", action="store_true",
                        help="write the expected file from the current outputs instead of checking")
    parser.add_argument("--from-paper", action="store_true",
                        help="with --record: the paper's values of the same cells (the paper profile's default)")
    parser.add_argument("--machine-runs", nargs="+", default=(), metavar="FILE",
                        help="with --record: other machines' records of this profile (their `qac check --record` "
                             "files), kept as the measured spread of a rerun")
    parser.add_argument("--failures-only", action="store_true",
                        help="print only the cells outside their bands, the claims and the summary")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    # here, not at the top: it loads pydantic
    from qac.params import load_params
    # here, not at the top: it loads numpy, scipy
    from qac.reporting import check
    # here, not at the top: it loads numpy
    from qac.reporting.generator_report import checked_table
    # here, not at the top: it loads numpy
    from qac.reporting.claims import CONTRADICTED, claims_summary, judge_claims
    # here, not at the top: it loads numpy
    from qac.reporting.lineage import load_study
    # here, not at the top: it loads numpy
    from qac.reporting.table_set import build_tables
    # here, not at the top: it loads numpy
    from qac.reporting.tables import TableContext

    def tables_of(study):
        return [*build_tables(study, params), checked_table(study)]

    params = load_params(args.params, running=False)
    path = Path(args.expected or params.check.expected or "")
    if not args.expected and not params.check.expected:
        print("qac check: params has no check.expected (the expected-values file of the profile)", file=sys.stderr)
        return 2
    if os.path.lexists(path) and not path.is_file():
        # Recording writes a file in its place: a folder there (and all it holds) would be replaced.
        kind = "a folder" if path.is_dir() else "not a regular file"
        print(f"qac check: {path.as_posix()} ({'--expected' if args.expected else 'check.expected'}) is {kind}, "
              "not an expected-values file: name the YAML file itself (such as profiles/expected/smoke.yaml)",
              file=sys.stderr)
        return 2
    if args.record:
        return _record(args, params, path, tables_of)
    if not path.is_file():
        print(f"qac check: no expected file {path.as_posix()}; record one with `qac check --record` "
              "after a run you trust", file=sys.stderr)
        return 2
    profile, kind, expected = check.load_expected_document(path)
    if profile and profile != params["profile"]:
        print(f"qac check: {path.as_posix()} holds profile {profile!r}, params are {params['profile']!r}",
              file=sys.stderr)
        return 2
    study = load_study(params, args.data)
    tables = tables_of(study)
    if kind == check.REPRODUCTION:
        outcomes = check.judge(tables, expected, params.check.training_noise)
    else:
        outcomes = check.compare(tables, expected)
    if expected and all(outcome.ours is None for outcome in outcomes):
        print(f"qac check: profile {params['profile']!r} has no outputs to check under {study.root.as_posix()} "
              f"(none of the {len(expected)} expected cells has a value): run it first, "
              f"`dvc repro profiles/{params['profile']}/dvc.yaml`", file=sys.stderr)
        return 2
    for outcome in outcomes:
        if not (args.failures_only and outcome.ok):
            print(outcome.line())
    claim_results = judge_claims(TableContext.from_params(study, params))
    for result in claim_results:
        print(result.line())
    print(claims_summary(claim_results))
    if kind == check.REPRODUCTION:
        verdict = check.reproduction_verdict(outcomes)
        for shift in verdict.shifts:
            if not (args.failures_only and not shift.fails):
                print(shift.line())
        print(check.reproduction_summary(outcomes, path, verdict))
        contradicted = any(result.verdict == CONTRADICTED for result in claim_results)
        return 0 if verdict.ok and not contradicted else 1
    document = check.read_document(path)
    verdict = check.rerun_verdict(outcomes, check.same_bytes(document, check.source_hashes(tables, study.root)))
    print(check.summary_line(outcomes, path, verdict))
    print(check.rerun_advice(verdict, document, machine_environment()))
    return 0 if outcomes and verdict.ok else 1


def _record(args: argparse.Namespace, params, path, tables_of) -> int:
    # here, not at the top: it loads numpy, scipy
    from qac.reporting import check
    # here, not at the top: it loads numpy
    from qac.reporting.lineage import load_study

    from_paper = args.from_paper or params["profile"] == "paper"
    study = load_study(params, args.data, declared_variants=from_paper)
    tables = tables_of(study)
    machine_runs = [check.read_machine_run(run) for run in args.machine_runs]
    if from_paper:
        document = check.record(tables, params["profile"], from_paper=True)
    else:
        document = check.record(tables, params["profile"], environment=machine_environment(),
                                sources=check.source_hashes(tables, study.root), machine_runs=machine_runs)
    if not document["cells"]:
        print(f"qac check: no cells to record under {args.data or 'data/' + params['profile']}: "
              "run the pipeline first", file=sys.stderr)
        return 2
    dropped = _cells_without_outputs(path, document) if not from_paper else []
    if dropped:
        data = args.data or f"data/{params['profile']}"
        shown = "; ".join(f"{cell.table} / {cell.row} / {cell.column}" for cell in dropped[:5])
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        print(f"qac check: {len(dropped)} cell{'s' if len(dropped) > 1 else ''} of {path.as_posix()} would be "
              f"dropped because the outputs behind them are missing under {data} "
              f"({shown}{more}). Run the profile first (`dvc repro profiles/{params['profile']}/dvc.yaml`) and "
              f"record again; {path.as_posix()} is left as it is (delete it first to record only the cells there "
              "are).", file=sys.stderr)
        return 2
    check.write_expected(document, path)
    runs = f", with {len(machine_runs)} other machine runs as the measured spread" if machine_runs else ""
    print(f"qac check: recorded {len(document['cells'])} cells in {path.as_posix()}{runs}")
    return 0


def _cells_without_outputs(path, document) -> list:
    """The cells of the expected file at ``path`` that ``document`` (a new record) no longer holds: recording
    would drop them from a tracked file because their outputs are gone, not because their values changed."""
    # here, not at the top: it loads numpy, scipy
    from qac.reporting import check

    if not path.is_file():
        return []
    _, _, recorded = check.load_expected_document(path)
    kept = {(cell["table"], cell["row"], cell["column"]) for cell in document["cells"]}
    return [cell for cell in recorded if (cell.table, cell.row, cell.column) not in kept]
