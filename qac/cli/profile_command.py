"""Profiles: render their parameters and pipeline, show them, print a profile's plan.

  qac profile list                 # profiles, their folders, whether each is rendered and current
  qac profile render [NAME ...]    # write profiles/NAME/params.yaml and dvc.yaml (all profiles by default)
  qac profile show NAME            # print profiles/NAME/params.yaml
  qac profile plan NAME            # every stage of the profile's pipeline, in run order, with its command
  qac profile plan NAME --cells    # every numeric cell of the paper's Tables 1-5: the run that produces it
  qac profile plan NAME --cost     # GPU-hours per stage and variant from the latest GPU benchmark figures,
                                   # beside what the profile's runs in the MLflow store measured
  qac profile plan NAME --cells --cost  # the cells, and each extension table cell with the GPU-hours of its runs
  qac profile plan NAME --slurm DIR  # an sbatch script per stage, chained along the DVC graph (docs/cluster.md)
  qac profile validate [NAME|FILE ...]  # check params files against the schema (all profiles by default)
  qac profile pin NAME [--dry-run] # write the hub's current commit of each unpinned hub model into profiles/NAME.yaml
  qac profile docs [--check]       # write docs/parameters.md from the schema (--check: fail if stale)

A profile is a folder profiles/NAME/ with its own params.yaml, dvc.yaml and
dvc.lock; run it with `dvc repro profiles/NAME/dvc.yaml` (or `make smoke`,
`make repro`). Rendering merges profiles/base.yaml with profiles/NAME.yaml;
it never replaces a params file edited by hand unless given --force.
`plan` needs no data, so it shows the paper's whole study on any machine.
`validate` checks every key's type and range and the rules across keys
(qac/params/) without running anything; every stage does the same
before it loads a model. Exit status 2 when a file breaks the schema.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qac.errors import USER_ERROR_EXIT, UserError
from qac.params import PROFILE_NAMES, profile_params_path, profiles_root, read_yaml
from qac.cli.tables_command import folder_problem
from qac.config import (HandEditedParams, _write_text, params_current, params_hand_edited, profile_files,
                        render_profile, render_profile_files)
from qac.gpu_cost import load_rates, print_cost
from qac.names import output_option_problem
from qac.params.pinning import pin_profile
from qac.pipeline_plan import print_plan
from qac.reporting.cell_plan import print_cell_plan
from qac.reporting.measured_cost import measured_beside


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="profiles and whether their files are current")
    render = actions.add_parser("render", help="write profiles/NAME/params.yaml and dvc.yaml")
    render.add_argument("names", nargs="*", metavar="NAME",
                        help=f"profiles to render (default: all of {', '.join(PROFILE_NAMES)})")
    render.add_argument("--force", action="store_true", help="replace a params file that was edited by hand")
    show = actions.add_parser("show", help="print a profile's params.yaml")
    show.add_argument("name", choices=PROFILE_NAMES)
    plan = actions.add_parser("plan", help="the profile's stages in run order, with their commands")
    plan.add_argument("name", choices=PROFILE_NAMES)
    view = plan.add_mutually_exclusive_group()     # each is a plan of its own; one is shown
    view.add_argument("--cells", action="store_true",
                      help="each numeric cell of the paper's Tables 1-5: its variant, stage outputs and recipe "
                           "(exit 1 if one is missing)")
    plan.add_argument("--cost", action="store_true",
                      help="GPU-hours per stage and variant from the latest GPU benchmark figures "
                           "(reports/bench_gpu.json; the device and date are printed), beside the device-hours "
                           "the profile's runs in the MLflow store measured; with --cells: the extension tables' "
                           "cells with the GPU-hours of their runs")
    plan.add_argument("--figures", metavar="JSON", help="with --cost: another bench_gpu.json")
    view.add_argument("--slurm", metavar="DIR", help="write one sbatch script per stage, submit.sh (chained along "
                      "the DVC graph) and sweep.sbatch into DIR, an empty folder or one of scripts rendered "
                      "before (docs/cluster.md)")
    validate = actions.add_parser("validate", help="check params files against the schema, running nothing")
    validate.add_argument("targets", nargs="*", metavar="NAME|FILE",
                          help=f"a profile ({', '.join(PROFILE_NAMES)}) or a params file (default: every profile)")
    pin = actions.add_parser("pin", help="pin each hub model of a profile to the hub's current commit")
    pin.add_argument("name", choices=PROFILE_NAMES)
    pin.add_argument("--dry-run", action="store_true", help="print the commits; write nothing")
    docs = actions.add_parser("docs", help="write docs/parameters.md from the schema")
    docs.add_argument("--out", default="docs/parameters.md", help="where to write (default: docs/parameters.md)")
    docs.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file is stale")


def _list() -> int:
    for name in PROFILE_NAMES:
        path = profile_params_path(name)
        if not path.exists():
            state = "not rendered"
        elif params_current(path, render_profile(name)):
            state = "current"
        elif params_hand_edited(path):
            state = "edited by hand"
        else:
            state = "stale: run `qac profile render`"
        print(f"{name:8} {path.parent}/  {state}")
    return 0


def _render(names: list[str], force: bool) -> int:
    unknown = [name for name in names if name not in PROFILE_NAMES]
    if unknown:
        print(f"qac profile render: unknown profile {', '.join(unknown)}; choose from {', '.join(PROFILE_NAMES)}",
              file=sys.stderr)
        return 2
    status = 0
    for name in names or PROFILE_NAMES:
        try:
            changed = render_profile_files(name, force=force)
        except HandEditedParams as error:
            print(f"qac profile render: {error}", file=sys.stderr)
            status = USER_ERROR_EXIT       # the user's edit, theirs to keep or give up (--force)
            continue
        print(f"{name}: " + (", ".join(str(path) for path in changed) + " written" if changed else "up to date"))
    return status


def _validate(targets: list[str]) -> int:
    from pathlib import Path

    # here, not at the top: it loads pydantic
    from qac.params import load_params, profile_params_path
    # here, not at the top: it loads pydantic
    from qac.params import ParamsError
    # here, not at the top: it loads pydantic
    from qac.params.model_sources import uninstalled_problems

    status = 0
    for target in targets or PROFILE_NAMES:
        path = profile_params_path(target) if target in PROFILE_NAMES and not Path(target).is_file() else Path(target)
        try:
            params = load_params(path)
        except ParamsError as error:
            print(error, file=sys.stderr)
            status = 2
            continue
        variants = len(params["pretrain"]["variants"])
        print(f"{path}: valid (profile {params['profile']}, {variants} pre-training variants)")
        for problem in uninstalled_problems(params):    # valid, but `qac repro` here would stop at it
            print(f"{path}: to run it here, {problem.key}: {problem.message}", file=sys.stderr)
    return status


def _pin(name: str, dry_run: bool) -> int:
    # here, not at the top: it loads pydantic
    from qac.params import profiles_root, validate_params

    pins = pin_profile(profiles_root() / f"{name}.yaml", validate_params(render_profile(name)), write=not dry_run)
    if not pins:
        print(f"profile {name}: every hub model is pinned already")
        return 0
    for pin in pins:
        print(f"{pin.name}@{pin.commit}  ({len(pin.keys)} key{'s' if len(pin.keys) != 1 else ''}: "
              f"{', '.join(pin.keys)})")
    if dry_run:
        print(f"profile {name}: {len(pins)} hub models to pin; nothing written (--dry-run)")
        return 0
    print(f"profile {name}: {len(pins)} hub models pinned in profiles/{name}.yaml")
    # The profile and those rendered over it read the file just written.
    written = profiles_root() / f"{name}.yaml"
    return _render([other for other in PROFILE_NAMES if written in profile_files(other, profiles_root())],
                   force=False)


def parameters_doc_text() -> str:
    """docs/parameters.md as the schema and profiles/base.yaml make it now."""
    # here, not at the top: it loads pydantic
    from qac.params.documentation import parameters_markdown

    base = read_yaml((profiles_root() / "base.yaml").read_text(encoding="utf-8"))
    return parameters_markdown(base)


def _docs(out: str, check: bool) -> int:
    from pathlib import Path

    text, path = parameters_doc_text(), Path(out)
    if path.exists() and not path.is_file():
        raise UserError(f"--out {out}: {'a folder' if path.is_dir() else 'not a regular file'}; name the Markdown "
                        "file to write (default: docs/parameters.md)")
    current = path.exists() and path.read_text(encoding="utf-8") == text
    if check:
        print(f"{path}: " + ("current" if current else "stale: run `qac profile docs`"))
        return 0 if current else 1
    if not current:
        _write_text(path, text)
    print(f"{path}: " + ("up to date" if current else "written"))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "validate":
        return _validate(args.targets)
    if args.action == "pin":
        return _pin(args.name, args.dry_run)
    if args.action == "docs":
        return _docs(args.out, args.check)
    if args.action == "list":
        return _list()
    if args.action == "render":
        return _render(args.names, args.force)
    if args.action == "show":
        print(profile_params_path(args.name).read_text(encoding="utf-8"), end="")
        return 0
    if args.cost and args.slurm:
        raise UserError("--cost and --slurm: one plan at a time (--cost goes alone or with --cells)")
    if args.figures is not None and not args.cost:
        raise UserError(f"--figures {args.figures}: only with --cost (the figures the GPU-hours are costed from)")
    if args.cells:
        # here, not at the top: it loads pydantic
        from qac.params import validate_params

        rates = None
        if args.cost:             # --cells --cost: the extension tables' cells with the GPU-hours of their runs

            rates = load_rates(args.figures)
        return print_cell_plan(validate_params(render_profile(args.name)), rates)
    if args.slurm:
        return _slurm(args.name, args.slurm)
    if args.cost:
        return print_cost(args.name, args.figures, measured_beside)

    return print_plan(args.name)


# What `--slurm DIR` may already hold: what an earlier rendering wrote there.
RENDERED_SCRIPTS = ("submit.sh", "sweep.sbatch", "*.sbatch", "logs")


def slurm_folder_problem(out_dir: str) -> str | None:
    """Why the scripts cannot go into ``out_dir``, or None: it is a folder to write into (the project's rule
    for one), not a file nor beneath one, and it holds nothing but scripts rendered before (new ones would
    be mixed in among other files)."""
    folder = Path(out_dir)
    problem = output_option_problem(out_dir) or folder_problem(folder)
    if problem or not folder.is_dir():
        return problem
    others = sorted(entry.name for entry in folder.iterdir()
                    if not any(entry.match(pattern) for pattern in RENDERED_SCRIPTS))
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        return (f"holds other files ({shown}); give an empty folder or one that holds only the scripts of an "
                "earlier rendering, so the scripts are not mixed in among them")
    return None


def _slurm(name: str, out_dir: str) -> int:
    # here, not at the top: it loads pydantic
    from qac.cluster import write_slurm_scripts
    # here, not at the top: it loads pydantic
    from qac.params import load_params, profile_params_path
    # here, not at the top: it loads pydantic
    from qac.params.model_sources import pin_problems
    # looked up when called: tests stand in for it
    from qac.pipeline_plan import stage_graph

    problem = slurm_folder_problem(out_dir)
    if problem:         # before the params are read: nothing is written
        raise UserError(f"--slurm {out_dir}: {problem}")
    params_file = profile_params_path(name)
    params = load_params(params_file, running=False)       # scripts can be written before the pins
    written = write_slurm_scripts(name, params, stage_graph(name), out_dir, Path.cwd(), where=str(params_file))
    jobs = len(written) - 2
    print(f"profile {name}: {jobs} job scripts, submit.sh and sweep.sbatch in {out_dir}; "
          f"submit with `bash {Path(out_dir) / 'submit.sh'}`")
    unpinned = pin_problems(params)
    if unpinned:
        print(f"profile {name}: {len(unpinned)} hub models are not pinned, and every job that loads one stops at "
              f"its start until they are (`qac profile validate {name}` names them; `qac profile pin {name}`)",
              file=sys.stderr)
    return 0
