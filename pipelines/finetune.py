"""DVC stage ``finetune@<variant>``: two-stage fine-tuning of one pre-trained encoder.

Retriever 1 trains on the BM25 hard negatives, mines negatives for retriever 2
and searches the in-domain evaluation splits with the corpus vectors it mined
with; retriever 2 trains on the mined negatives (:mod:`qac.stages.finetune`).
Writes ``data/<profile>/finetune/<variant>/`` as one unit: ``r1/``, ``r2/``
(Hugging Face encoder folders with tokenizer that are also sentence-transformers
model folders: pooling, normalisation and lengths), ``mined_negatives.jsonl`` and ``r1_runs/``.
Each retriever is an MLflow run ``r1|r2 · <method> · <context> · C=<count>``
(recorded in ``data/<profile>/.runs/finetune/<variant>/<r>/``) nested under the
pre-training run when this store holds it (else under the study run);
``--log-models`` (or ``mlflow.log_models``) adds the encoder as an artifact.
Only the train split of ``train_dataset`` is read. Runs alone or under ``torchrun``.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> None:
    from qac.stages.arguments import variant_stage_arguments
    from qac.console import StageClock, print_summary

    args = variant_stage_arguments(__doc__.splitlines()[0], argv,
                                   log_models_help="log r1 and r2 to MLflow as artifacts (also mlflow.log_models in params)")
    clock = StageClock()

    from qac.config import checked_variant
    from qac.params import load_params
    from qac.stages.finetune import fine_tune_variant

    params = load_params()
    variant = checked_variant(params, args.variant)
    outcome = fine_tune_variant(params, variant, log_models=args.log_models)
    print_summary(f"finetune@{variant}", *outcome.facts(), seconds=clock.seconds)


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
