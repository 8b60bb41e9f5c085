"""DVC stage ``pretrain_llm@<variant>``: pre-train an LLM-query variant (qac.stages.pretrain_llm)."""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> None:
    from qac.stages.arguments import variant_stage_arguments
    from qac.console import StageClock, print_summary

    args = variant_stage_arguments(__doc__.splitlines()[0], argv,
                                   log_models_help="log the encoder to MLflow as an artifact (also mlflow.log_models in params)")
    clock = StageClock()

    from qac.params import load_params
    from qac.stages.pretrain_llm import pretrain_llm_variant
    from qac.stages.pretrain import result_facts

    summary = pretrain_llm_variant(load_params(), args.variant, log_models=args.log_models)
    print_summary(f"pretrain_llm@{args.variant}", *result_facts(summary), seconds=clock.seconds)


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
