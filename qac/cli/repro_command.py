"""Run a profile's pipeline through DVC with independent stages side by side (``qac repro --jobs 2 smoke``).

The same stages, outputs, cache and dvc.lock as ``dvc repro profiles/<name>/dvc.yaml``
(each stage is DVC's ``repro --single-item``; see qac/parallel_repro.py), with up to
``--jobs`` stages running at once. Only the
stages DVC reports changed and those downstream of them start; an unchanged
stage is skipped by DVC. The first failure stops new starts; the stages running
finish, and the command ends with the failed stage's output (exit status 1).
Each stage keeps the threads it has under `dvc repro`, so the outputs are the same.
DVC itself runs each stage in a forked copy of this command, which imported DVC
once; with HF_HUB_OFFLINE set (as the make targets set it), each stage's process
hands its work to a copy forked from a server that has imported torch,
transformers and MLflow once (qac/launcher.py), which saves most of a small
stage's start-up. ``--no-preload`` starts every stage, and DVC, as a fresh Python.
``--jobs 1`` runs them one at a time, in DVC's order.
"""

from __future__ import annotations

import argparse

from qac.errors import UserError
from qac.names import checked_plain_name
from qac.parallel_repro import reproduce, shown_output
from qac.params.locations import DEFAULT_PROFILE, profile_params_path
from qac.params.yaml_io import key_lines
from qac.tracking import study_run_id


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", nargs="?", default=None,
                        help="profile name (default: $QAC_PROFILE, else the default profile)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="stages at once (default 2)")
    parser.add_argument("-f", "--force", action="store_true", help="run every stage, changed or not")
    parser.add_argument("--no-preload", dest="preload", action="store_false",
                        help="start every stage, and DVC, as a fresh Python, without the server that has "
                             "imported torch, transformers and MLflow once (qac/launcher.py)")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    name = checked_plain_name(args.profile or os.environ.get("QAC_PROFILE", DEFAULT_PROFILE), "the profile name")
    if args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, not {args.jobs}")
    params_file = profile_params_path(name)
    pipeline = params_file.parent / "dvc.yaml"
    if not pipeline.is_file():
        raise UserError(f"{pipeline}: no such pipeline (profile {name!r}; `qac profile list` names the "
                         f"profiles, `qac profile render {name}` writes a new one's files)")
    # here, not at the top: it loads pydantic
    from qac.params import load_params

    params = load_params(params_file)          # bad parameters stop here, before any stage starts
    # here, not at the top: it loads pydantic
    from qac.params.errors import ParamsError
    # here, not at the top: it loads pydantic
    from qac.params.model_sources import uninstalled_problems

    missing = uninstalled_problems(params)     # so does a packaged model that is not installed
    if missing:
        raise ParamsError(params_file, missing, key_lines(params_file.read_text(encoding="utf-8")))

    def started(stage: str) -> None:
        print(f"Starting stage '{stage}'", flush=True)

    def finished(done) -> None:
        text = shown_output(done.output)
        status = "done" if done.returncode == 0 else f"FAILED (exit status {done.returncode})"
        print(f"Stage '{done.name}' {status} in {done.seconds:.1f} s" + (f"\n{text}" if text else ""), flush=True)

    root = pipeline.resolve().parents[2]      # profiles/<name>/dvc.yaml lies two folders below the repository
    outcome, stages = reproduce(pipeline, root, args.jobs, args.force, on_start=started, on_finish=finished,
                                before_first_start=lambda: _open_study_run(params), preload=args.preload)
    if not outcome.finished:
        print(f"repro {name}: every stage up to date ({stages} stages)")
        return 0
    ran = len(outcome.finished)
    if outcome.failed:
        failed = ", ".join(stage.name for stage in outcome.failed)
        left = f"; not started: {', '.join(outcome.not_started)}" if outcome.not_started else ""
        print(f"repro {name}: {failed} failed (output above); {ran - len(outcome.failed)} stage(s) finished"
              f"{left}. Fix it and run the same command again: finished stages are cached and not rerun.",
              file=sys.stderr)
        return 1
    print(f"repro {name}: {ran} stage(s) checked or run, {stages - ran} up to date, in "
          f"{outcome.seconds:.0f} s with {args.jobs} at once")
    return 0


def _open_study_run(params) -> None:
    """The profile's study run, created now so that stages starting together find one (when the store works)."""
    # looked up when called: tests stand in for it
    from qac.tracking.store import tracking_uri, usable_store

    if usable_store("the pipeline", tracking_uri()):
        study_run_id(params)
