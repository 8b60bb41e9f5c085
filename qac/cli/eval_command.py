"""Evaluate a TREC run file against qrels and print the measures as JSON.

Qrels may be TREC (``qid 0 docid rel``) or BEIR TSV (with its header). The mean
of each measure is taken over every judged query (a query missing from the
run counts 0). With ``--per-query`` the output is
``{"aggregate": {measure: mean}, "per_query": {measure: {qid: value}}}``.

Example: qac eval --qrels qrels.dl19-passage.txt --run run.trec --metrics nDCG@10 R@1000 --rel-threshold 2
"""

from __future__ import annotations

import argparse
import json
import sys

from qac.evaluation.metrics import DEFAULT_MEASURES, evaluate
from qac.evaluation.trec_io import read_qrels, read_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--qrels", required=True, help="qrels file (TREC or BEIR TSV)")
    parser.add_argument("--run", required=True, help="TREC run file: qid Q0 docid rank score tag")
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_MEASURES), metavar="MEASURE",
                        help="measures in ir-measures style: RR@10 R@1000 Hit@50 P@10 nDCG@10 AP "
                             f"(default: {' '.join(DEFAULT_MEASURES)})")
    parser.add_argument("--rel-threshold", type=int, default=1,
                        help="lowest label counted relevant by binary measures (TREC DL: 2)")
    parser.add_argument("--ignore-identical-ids", action="store_true",
                        help="drop retrieved documents whose id equals the query id (BEIR ArguAna, Quora)")
    parser.add_argument("--per-query", action="store_true", help="also print every per-query value")


def run(args: argparse.Namespace) -> int:
    try:
        qrels = read_qrels(args.qrels)
        run_ = read_run(args.run)
        result = evaluate(qrels, run_, args.metrics, rel_threshold=args.rel_threshold,
                          ignore_identical_ids=args.ignore_identical_ids)
    except (OSError, ValueError) as error:
        print(f"qac eval: error: {error}", file=sys.stderr)
        return 2
    unjudged = set(run_) - set(qrels)
    if not set(run_) & set(qrels):
        # Usually a mismatch of files (a dev run against test qrels); every value is then 0.
        print(f"qac eval: warning: no query of {args.run} is judged in {args.qrels}", file=sys.stderr)
    elif unjudged:
        # trec_eval's rule, said aloud: the mean is over the judged queries only
        example = sorted(unjudged)[0]
        print(f"qac eval: note: {len(unjudged)} of the {len(run_)} queries of {args.run} are not judged in "
              f"{args.qrels} (e.g. {example!r}) and are left out of every mean, as trec_eval leaves them out",
              file=sys.stderr)
    output = {"aggregate": result.aggregate, "per_query": result.per_query} if args.per_query else result.aggregate
    print(json.dumps(output, indent=2))
    return 0
