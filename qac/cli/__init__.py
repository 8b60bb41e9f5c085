"""The ``qac`` command: user-facing utilities around the pipeline.

Every command-line module of qac lives in this package and is named after the
command it implements: ``qac.cli.<subcommand>_command`` for each ``qac``
subcommand, which defines ``add_arguments(parser)`` and ``run(args) -> int``
(its docstring's first line is the subcommand's help), and ``<name>_command``
for the programs run with ``python -m`` (``hpo_worker_command``, a worker
`qac hpo` starts; ``dl19_subset_command``, a data builder).
``stage_arguments`` parses the DVC stage scripts' command lines. The library
below knows nothing of command lines: these modules parse arguments and call it.
Modules import heavy libraries (torch, mlflow) inside ``run`` so that
``qac --help`` stays fast.

Every subcommand runs with the libraries quiet (``qac.console.setup_console``)
and reports a user error as one paragraph with exit status 2; ``-v`` (before or
after the subcommand) or ``QAC_VERBOSE=1`` shows library logs and tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from qac.console import call_main, setup_console
from qac.errors import UserError

SUBCOMMANDS = {
    "profile": "qac.cli.profile_command",
    "eval": "qac.cli.eval_command",
    "tables": "qac.cli.tables_command",
    "check": "qac.cli.check_command",
    "annotate": "qac.cli.annotate_command",
    "hpo": "qac.cli.hpo_command",
    "deviations": "qac.cli.deviations_command",
    "runs": "qac.cli.runs_command",
    "repro": "qac.cli.repro_command",
    "metrics": "qac.cli.metrics_command",
    "export": "qac.cli.export_command",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qac", description="Query-as-context pre-training of dense passage retrievers: utilities."
    )
    _add_verbose(parser, False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        summary = (module.__doc__ or name).strip().splitlines()[0]
        sub = commands.add_parser(name, help=summary, description=(module.__doc__ or summary).strip(),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        _add_verbose(sub, False)
        sub.set_defaults(_module=module)
    return parser


def _add_verbose(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="show library logs, warnings and the traceback of an error (also QAC_VERBOSE=1)")


# Subcommands that read only the files named on their command line; every other one works on the checkout
# (profiles/, data/, reports/, mlflow.db) through paths relative to its root.
ANYWHERE = {"eval"}


def _run(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = any(arg in ("-v", "--verbose") for arg in argv)
    args = build_parser().parse_args([arg for arg in argv if arg not in ("-v", "--verbose")])
    setup_console(verbose)
    if args.command not in ANYWHERE:
        _require_checkout_root(args.command)
    return int(args._module.run(args) or 0)


def _require_checkout_root(command: str) -> None:
    """Refuse a checkout command run from one of the checkout's subfolders: its relative paths would miss
    the profile's files and report them as never made (``qac check`` would call a finished run "not run")."""
    from pathlib import Path

    here = Path.cwd()
    if _is_checkout_root(here):
        return
    root = next((folder for folder in here.parents if _is_checkout_root(folder)), None)
    if root is not None:
        raise UserError(f"qac {command} works on the checkout from its root, and {here} is a subfolder of it: "
                        f"run it in {root} (cd {root})")


def _is_checkout_root(folder) -> bool:
    return (folder / "profiles" / "base.yaml").is_file() and (folder / ".dvc").is_dir()


def main(argv: list[str] | None = None) -> int:
    """The ``qac`` command: a user error prints one paragraph and returns 2 (``qac.console.call_main``)."""
    return call_main(_run, list(sys.argv[1:] if argv is None else argv), prog="qac")
