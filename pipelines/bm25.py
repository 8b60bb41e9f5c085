"""Stage bm25: BM25 hard negatives for fine-tuning and the BM25 baseline row.

Writes data/<profile>/bm25/ (negatives.jsonl: retriever 1's training negatives;
runs/<dataset>/<split>.trec and .per_query.json of every evaluated split;
metrics.json) as one unit, with the MLflow run `bm25 · baseline`
(qac.stages.bm25).
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

from qac.params import load_params
from qac.stages.arguments import stage_arguments
from qac.console import StageClock, print_summary


def main(argv: list[str] | None = None) -> None:
    stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    from qac.stages.bm25 import bm25_baseline

    facts = bm25_baseline(load_params())
    print_summary("bm25", *facts, seconds=clock.seconds)


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
