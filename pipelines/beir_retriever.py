"""DVC stage ``beir_retriever``: Table 2's zero-shot retriever, trained as the paper's footnote 2 says.

Runs only when ``tables.zero_shot_retriever`` is ``beir`` (otherwise it writes
an empty output). For each variant Table 2 reports it trains the
``beir_retriever`` recipe from ``pretrain/<variant>/encoder`` and evaluates it
on every ``zero_shot`` dataset (:mod:`qac.stages.beir_retriever`).
Writes, as one unit, ``data/<profile>/beir/<variant>/encoder/`` (a retriever
folder that says how it encodes) and ``data/<profile>/beir/<variant>/eval/<dataset>/<split>.per_query.json``
and ``.trec``, plus ``data/<profile>/metrics/beir.json``.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> None:
    from qac.stages.arguments import stage_arguments
    from qac.console import StageClock, print_summary

    stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    from qac.params import load_params
    from qac.stages.beir_retriever import train_zero_shot_retrievers

    facts = train_zero_shot_retrievers(load_params())
    print_summary("beir_retriever", *facts, seconds=clock.seconds)


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
