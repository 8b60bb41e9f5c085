"""The ``qac`` command: user-facing utilities around the pipeline.

Each subcommand lives in its own module, which defines ``add_arguments(parser)``
and ``run(args) -> int``; its docstring's first line is the subcommand's help.
Modules import heavy libraries (torch, mlflow) inside ``run`` so that
``qac --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "profile": "qac.profile_cli",
    "eval": "qac.evaluation.cli",
    "tables": "qac.reporting.cli",
    "check": "qac.reporting.check_cli",
    "annotate": "qac.reporting.annotation_cli",
    "hpo": "qac.hpo.cli",
    "deviations": "qac.deviations_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qac", description="Query-as-context pre-training of dense passage retrievers: utilities."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        summary = (module.__doc__ or name).strip().splitlines()[0]
        sub = commands.add_parser(name, help=summary, description=(module.__doc__ or summary).strip(),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
