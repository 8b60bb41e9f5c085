"""Search pre-training hyper-parameters with Optuna: create or resume a study and run its trials.

  qac hpo                               # the study of the default profile's `hpo` section, 1 worker
  QAC_PROFILE=smoke qac hpo --workers 2 # the smoke profile's study, two workers
  qac hpo --workers 2 --gpus 0,1        # two workers, one GPU each
  qac hpo --storage postgresql://u@db/optuna   # a shared database: run this on several machines
  qac hpo --report-only                 # redraw reports/hpo/<study>/ from the stored trials

Each trial pre-trains the variant `hpo.variant` with the trial's values,
fine-tunes retriever 1 briefly and scores it on dev queries carved from the
training queries (never the test split). Trials run as separate jobs, report
their dev metric as they go, and are stopped early when the pruner says so.
Running the same command again resumes the study. Live view:
`optuna-dashboard <journal file or database URL>` (pip install 'qac[dashboard]').
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from qac.config import write_params
from qac.console import command_logger
from qac.errors import UserError
from qac.hpo.preflight import check_dev_split, check_search_space, parse_gpu_ids
from qac.hpo.space import SpaceError
from qac.hpo.study import (DEFAULT_JOB, FAIL_REASON_ATTR, HpoSettings, STORAGE_ENV, SettingsError, WORKER_ATTR,
                           ensure_study_mlflow_run, load_stored_study, make_pruner, open_study, storage_location,
                           study_dir, this_process_owner)
from qac.hpo.study_report import log_report_to_mlflow, write_study_report
from qac.hpo.trial_job import required_inputs
from qac.hpo.worker import gpu_slots, run_worker_pool
from qac.names import output_option_problem
from qac.redaction import redact_url, redact_values

if TYPE_CHECKING:
    from qac.params.sections import Params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default=None, help="parameters file (default: $QAC_PARAMS, else "
                        "profiles/$QAC_PROFILE/params.yaml, else profiles/default/params.yaml)")
    parser.add_argument("--study-name", help="override hpo.study_name")
    parser.add_argument("--storage", help="override hpo.storage: a journal file path or a database URL")
    parser.add_argument("--n-trials", type=int, help="override hpo.n_trials (the study's total, resumes included)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    parser.add_argument("--gpus", default="", help="comma-separated GPU ids shared out among the workers, e.g. 0,1")
    parser.add_argument("--launcher", choices=("python", "torchrun"), help="override hpo.launcher")
    parser.add_argument("--nproc-per-node", type=int, help="override hpo.nproc_per_node (torchrun processes per trial)")
    parser.add_argument("--report-dir", help="where the report goes (default: <hpo.report_dir>/<study name>)")
    parser.add_argument("--report-only", action="store_true", help="run no trials; rewrite the report")


# The command-line options that set hpo keys (--n-trials sets hpo.n_trials).
OVERRIDES = ("study_name", "storage", "n_trials", "launcher", "nproc_per_node")


def apply_overrides(params: Params, args: argparse.Namespace) -> Params:
    """``params`` with the command line's overrides of ``hpo`` keys set (checked as a file's are)."""
    # here, not at the top: it loads pydantic
    from qac.params import with_values

    return with_values(params, {f"hpo.{option}": getattr(args, option) for option in OVERRIDES
                                if getattr(args, option) is not None})


def check_inputs(params: dict, variant: str) -> None:
    """Refuse to start trials whose inputs are missing, naming each file and the stage that writes it."""
    missing = [f"{path}: missing (written by the DVC stage {stage}; run `dvc repro {stage}`)"
               for path, stage in required_inputs(params, variant).items() if not path.exists()]
    if missing:
        raise SettingsError("the trials' inputs are not there:\n  " + "\n  ".join(missing))


def check_gpus(gpus: list[str], workers: int, settings) -> None:
    """A torchrun trial needs one GPU per process in its worker's slot."""
    if not gpus or settings.launcher != "torchrun":
        return
    smallest = min(len(slot.split(",")) for slot in gpu_slots(gpus, workers))
    if smallest < settings.nproc_per_node:
        raise SettingsError(f"a trial runs on hpo.nproc_per_node = {settings.nproc_per_node} GPUs, but "
                            f"--gpus {','.join(gpus)} gives each of {workers} workers only {smallest}")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    log = command_logger("qac.hpo", "hpo")

    # here, not at the top: it loads pydantic
    from qac.params import ParamsError, load_params, params_path, validate_params

    if args.workers < 1:
        print(f"error: --workers must be at least 1, got {args.workers}")
        return 2
    report_dir_problem = None if args.report_dir is None else output_option_problem(args.report_dir)
    if report_dir_problem:
        print(f"error: --report-dir {args.report_dir!r}: {report_dir_problem}")
        return 2
    path = args.params or params_path()
    params = load_params(args.params)
    try:
        params = apply_overrides(params, args)
        validate_params(params, path)   # the command line's overrides obey the schema too
    except ParamsError as error:
        options = {f"hpo.{name}": name for name in OVERRIDES if getattr(args, name) is not None}
        given = [problem for problem in error.problems if problem.key in options]
        if not given:
            raise
        raise UserError("; ".join(f"--{options[problem.key].replace('_', '-')} {getattr(args, options[problem.key])}: "
                                  f"{problem.message}" for problem in given)) from None
    try:
        gpus = parse_gpu_ids(args.gpus)
        settings = HpoSettings.from_params(params)
        make_pruner(settings)
        if args.report_only:
            # Reading only: the stored study as it is, its params copy untouched.
            study = load_stored_study(params, settings)
        else:
            check_search_space(params, settings, path)
            if settings.job == DEFAULT_JOB:
                check_inputs(params, settings.variant)
                check_dev_split(params, settings, path)
            check_gpus(gpus, args.workers, settings)
            study = open_study(params, settings)
    except (SettingsError, SpaceError) as error:
        print(f"error: {error}")
        return 2
    if not args.report_only:
        # Workers read this copy, so an edit to params.yaml during the study cannot change it midway.
        # It holds the storage URL without credentials; the workers get the full one in their
        # environment (qac.hpo.study.storage_with_credentials).
        params_file = study_dir(params, settings) / "params.yaml"
        write_params(redact_values(params), params_file)
    if settings.storage:
        os.environ[STORAGE_ENV] = settings.storage
    location = redact_url(storage_location(params, settings))
    run_id = ensure_study_mlflow_run(params, study, settings)
    log.info("study %s (%s), MLflow run %s; live view: optuna-dashboard %s",
             settings.study_name, location, run_id, location)

    status, failed_run = 0, None
    if not args.report_only:
        outcome = run_worker_pool(params_file, params, settings, workers=args.workers, gpus=gpus)
        if outcome["orphaned_trials"]:
            log.warning("trials failed because their worker died: %s", outcome["orphaned_trials"])
        if any(exit["returncode"] > 0 for exit in outcome["worker_exits"]):
            status = 1
        failed_run = every_trial_failed(study, {exit["pid"] for exit in outcome["worker_exits"]})

    report_dir = Path(args.report_dir) if args.report_dir else \
        Path(params.hpo.report_dir) / settings.study_name
    summary = write_study_report(study, settings.metric, report_dir)
    log_report_to_mlflow(run_id, summary, report_dir)
    states = ", ".join(f"{count} {state}" for state, count in summary["states"].items() if count)
    print(f"study {settings.study_name}: {summary['trials']} trials ({states}); report in {report_dir}")
    if summary["best"] is not None:
        best = summary["best"]
        print(f"best: trial {best['number']}, dev {settings.metric} = {best['value']:.4f}, params {best['params']}")
    if failed_run:
        print(f"error: {failed_run}")
        status = 1
    return status


def every_trial_failed(study, worker_pids: set[int]) -> str | None:
    """When every trial this run's workers ran failed: what to print (the first failure's reason), else None."""
    from optuna.trial import TrialState

    host = this_process_owner()["host"]
    ran = [trial for trial in study.get_trials(deepcopy=False)
           if (trial.user_attrs.get(WORKER_ATTR) or {}).get("host") == host
           and trial.user_attrs[WORKER_ATTR].get("pid") in worker_pids]
    if not ran or any(trial.state != TrialState.FAIL for trial in ran):
        return None
    reason = ran[0].user_attrs.get(FAIL_REASON_ATTR, "no reason recorded")
    return (f"every trial of this run failed ({len(ran)} of {len(ran)}); trial {ran[0].number}: {reason}")
