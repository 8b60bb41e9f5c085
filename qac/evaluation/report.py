"""Evaluate a run on a dataset split and record the result in the active MLflow run.

Every retriever (BM25, the untuned encoder, retrievers 1 and 2) is reported the
same way, so tables and significance tests read one layout: metrics
``<dataset>/<split>/<measure>`` (through ``qac.tracking.metric_key``) and the
per-query values as the artifact ``per_query/<dataset>/<split>.json``
(``{measure: {qid: value}}``).
"""

from __future__ import annotations

from typing import Iterable

from qac.evaluation.metrics import EvalResult, evaluate

TRAIN_SPLIT = "train"


def evaluation_splits(dataset) -> list[str]:
    """The splits of a ``qac.data`` dataset that are evaluated: every split except ``train``."""
    return [split for split in dataset.splits if split != TRAIN_SPLIT]


def evaluate_split(dataset, split: str, run, measures: Iterable[str]) -> EvalResult:
    """Evaluate ``run`` on ``dataset``'s ``split`` with its ``rel_threshold`` and ``ignore_identical_ids``."""
    return evaluate(dataset.qrels[split], run, measures, rel_threshold=dataset.rel_threshold(split),
                    ignore_identical_ids=dataset.ignore_identical_ids)


def log_evaluation(result: EvalResult, dataset_name: str, split: str) -> dict[str, float]:
    """Log ``result`` to the active MLflow run; returns the metrics as logged (mangled keys)."""
    import mlflow

    from qac.tracking import metric_key

    metrics = {metric_key(dataset_name, split, measure): value for measure, value in result.aggregate.items()}
    mlflow.log_metrics(metrics)
    mlflow.log_dict(result.per_query, f"per_query/{dataset_name}/{split}.json")
    return metrics


def evaluate_and_log(dataset, split: str, run, measures: Iterable[str]) -> EvalResult:
    """Evaluate ``run`` on ``dataset``'s ``split`` and log metrics and per-query values to the active MLflow run."""
    result = evaluate_split(dataset, split, run, measures)
    log_evaluation(result, dataset.name, split)
    return result
