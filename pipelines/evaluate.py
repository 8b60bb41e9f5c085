"""DVC stage ``evaluate@<variant>``: dense retrieval with r1 and r2 on every evaluation set.

For each retriever of the variant (r1, r2; for the variant ``none`` with
``evaluate.untuned_baseline`` also the start encoder) and each dataset
(``train_dataset`` in-domain, then every ``zero_shot`` one), every split except
``train`` is searched, each retriever encoded as its folder says
(:mod:`qac.stages.evaluate`). Writes, as one unit,
``data/<profile>/eval/<variant>/<retriever>/<dataset>/<split>.trec`` and
``<split>.per_query.json``, plus ``metrics/eval/<variant>.json``; the metrics go
into each retriever's fine-tuning run (the untuned encoder gets its own run).
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> None:
    from qac.stages.arguments import variant_stage_arguments
    from qac.console import StageClock, print_summary

    args = variant_stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    from qac.config import checked_variant
    from qac.params import load_params
    from qac.stages.evaluate import evaluate_variant

    params = load_params()
    variant = checked_variant(params, args.variant)
    outcome = evaluate_variant(params, variant)
    print_summary(f"evaluate@{variant}", *outcome.facts(params), seconds=clock.seconds)


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
