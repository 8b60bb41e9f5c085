"""Build the ``msmarco-dl19-subset`` dataset (BEIR layout) from the public MS MARCO and TREC DL files.

``python -m qac.cli.dl19_subset_command --collection collection.tsv --topics msmarco-test2019-queries.tsv.gz
--qrels 2019qrels-pass.txt --out ../shared/data/msmarco-dl19-subset``; what it keeps is
:mod:`qac.data.dl19_subset`'s to say.
"""

from __future__ import annotations

import argparse
import sys

from qac.data.dl19_subset import DEFAULT_OTHERS, build_dl19_subset
from qac.cli.tables_command import folder_problem
from qac.errors import UserError


def check_options(args: argparse.Namespace) -> None:
    """Before the collection is read: a count of extra passages, and a folder the files can go into."""
    from pathlib import Path

    if args.others < 0:
        raise UserError(f"--others {args.others}: expected a count of passages >= 0 (0: the judged relevant "
                        "passages alone)")
    problem = folder_problem(Path(args.out))
    if problem:
        raise UserError(f"--out {args.out}: {problem}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collection", required=True, help="MS MARCO collection.tsv[.gz] (pid<TAB>text)")
    parser.add_argument("--topics", required=True, help="DL19 topics msmarco-test2019-queries.tsv[.gz]")
    parser.add_argument("--qrels", required=True, help="DL19 passage qrels 2019qrels-pass.txt (TREC format)")
    parser.add_argument("--out", required=True, help="output folder (BEIR layout)")
    parser.add_argument("--others", type=int, default=DEFAULT_OTHERS,
                        help=f"passages beyond the relevant ones (default {DEFAULT_OTHERS})")
    args = parser.parse_args(argv)
    check_options(args)
    counts = build_dl19_subset(args.collection, args.topics, args.qrels, args.out, args.others)
    print(f"msmarco-dl19-subset: {counts['documents']} passages ({counts['relevant']} judged relevant), "
          f"{counts['queries']} queries, {counts['qrels']} qrels -> {args.out}")
    if counts["others"] < counts["others_asked"]:
        print(f"note: {counts['others']} passages beyond the relevant ones, not the {counts['others_asked']} asked "
              "(--others): the collection has no more", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
