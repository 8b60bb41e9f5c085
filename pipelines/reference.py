"""DVC stage ``reference``: publicly released retrievers evaluated as published (qac/stages/reference.py).

For each model spec in ``reference_retrievers`` (a hub name such as
``Luyu/co-condenser-marco-retriever``, or a local folder), the encoder is
loaded, the in-domain corpus encoded as ``encoders.<spec>`` says the model was
trained (pooling, normalisation, lengths; titles joined as
``finetune.title_join``) and every evaluation split searched (top
``evaluate.depth``) and scored with ``evaluate.metrics``. Writes, as one unit,
``data/<profile>/reference/<slug>/<dataset>/<split>.trec`` and
``.per_query.json`` and ``references.json`` (the specs evaluated); each
retriever's MLflow run (``reference · <spec>``) is recorded under
``data/<profile>/.runs/reference/<slug>/``. A profile without reference
retrievers writes the index alone.
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
    from qac.stages.reference import evaluate_references

    print_summary("reference", *evaluate_references(load_params()), seconds=clock.seconds)


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
