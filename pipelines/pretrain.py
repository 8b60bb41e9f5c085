"""DVC stage ``pretrain@<variant>``: pre-train (or, for method none, export) one encoder.

Writes ``data/<profile>/pretrain/<variant>/`` as one unit: ``encoder/`` (the
Hugging Face folder fine-tuning starts from), ``checkpoint/`` (everything
needed to resume) and ``losses.tsv``. An interrupted run resumes from
``data/<profile>/.work/pretrain/<variant>/`` when its settings and inputs are
unchanged (:mod:`qac.stages.pretrain`). Runs alone or under ``torchrun``.
The MLflow run is ``C=<count> · <context> · <method> · pretrain``; with
``--log-models`` (or ``mlflow.log_models``) the encoder is logged as its artifact.
"""

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
    from qac.stages.pretrain import pretrain_variant, result_facts

    summary = pretrain_variant(load_params(), args.variant, log_models=args.log_models)
    print_summary(f"pretrain@{args.variant}", *result_facts(summary), seconds=clock.seconds)


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
