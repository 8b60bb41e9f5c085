"""The command lines of the DVC stage scripts (``pipelines/*.py``): parsed here, with the console set up.

Every stage takes ``-v/--verbose``; a per-variant stage ``--variant`` (and
``--log-models`` where it can log models), a per-dataset stage ``--dataset``,
a sharded generation stage ``--shard``, ``--merge`` and ``--merge-only``. The
library never sees an ``argparse.Namespace``: a stage passes the values on.
"""

from __future__ import annotations

import argparse

from qac.console import VERBOSE_ENV, setup_console


def add_verbose_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``-v/--verbose`` to a stage's argument parser."""
    parser.add_argument("-v", "--verbose", action="store_true",
                        help=f"show library logs and warnings (also {VERBOSE_ENV}=1)")
    return parser


def _parsed(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = add_verbose_flag(parser).parse_args(argv)
    setup_console(args.verbose)
    return args


def stage_arguments(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of a stage without options of its own (``-v``), parsed, with the console set up for
    it: an unknown option or argument (and ``--help``) ends the stage before any work. ``argv`` None (a test
    calling ``main()``) parses no arguments; a stage run as a script gets its command line from
    :func:`qac.console.run_main`."""
    return _parsed(argparse.ArgumentParser(description=description), [] if argv is None else argv)


def variant_stage_arguments(description: str, argv: list[str] | None,
                            log_models_help: str | None = None) -> argparse.Namespace:
    """The command line of a per-variant stage (``--variant``, ``-v``, and ``--log-models`` with its help
    where the stage can log models), parsed, with the console set up for it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--variant", required=True, help="a key of pretrain.variants")
    if log_models_help:
        parser.add_argument("--log-models", action="store_true", help=log_models_help)
    return _parsed(parser, argv)


def dataset_stage_arguments(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of a per-dataset stage (``--dataset``, ``-v``), parsed, with the console set up for it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dataset", required=True, help="a name under `datasets` in params.yaml")
    return _parsed(parser, argv)


def sharded_stage_arguments(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line of a sharded generation stage (``--shard``, ``--merge``, ``--merge-only``, ``-v``),
    parsed, with the console set up for it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shard", help="i/n: generate only shard i of n (0-based); no merge unless --merge")
    parser.add_argument("--merge", action="store_true", help="with --shard: merge afterwards (all shards must be done)")
    parser.add_argument("--merge-only", action="store_true", help="only merge the committed chunks of all shards")
    return _parsed(parser, argv)
