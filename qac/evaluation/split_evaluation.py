"""Evaluate a run on a dataset split and record the result in the active MLflow run.

Every retriever (BM25, the untuned encoder, retrievers 1 and 2) is reported the
same way, so tables and significance tests read one layout: metrics
``<dataset>/<split>/<measure>`` (through ``qac.tracking.metric_key``) and the
per-query values as the artifact ``per_query/<dataset>/<split>.json``
(``{measure: {qid: value}}``).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from qac.evaluation.metrics import EvalResult, evaluate
from qac.tracking import log_evaluation as log_to_run

TRAIN_SPLIT = "train"
SUBSETS_FILE = "subsets.json"   # beside a dataset's per-query files: the sub-collections averaged into one figure


def evaluation_splits(dataset) -> list[str]:
    """The splits of a ``qac.data`` dataset that are evaluated: every split except ``train``."""
    return [split for split in dataset.splits if split != TRAIN_SPLIT]


def evaluate_split(dataset, split: str, run, measures: Iterable[str]) -> EvalResult:
    """Evaluate ``run`` on ``dataset``'s ``split`` with its ``rel_threshold`` and ``ignore_identical_ids``."""
    return evaluate(dataset.qrels[split], run, measures, rel_threshold=dataset.rel_threshold(split),
                    ignore_identical_ids=dataset.ignore_identical_ids)


def log_evaluation(result: EvalResult, dataset_name: str, split: str) -> dict[str, float]:
    """Log ``result`` to the active MLflow run; returns the metrics as logged (mangled keys)."""
    return log_to_run(result, dataset_name, split)


def evaluate_and_log(dataset, split: str, run, measures: Iterable[str]) -> EvalResult:
    """Evaluate ``run`` on ``dataset``'s ``split`` and log metrics and per-query values to the active MLflow run."""
    result = evaluate_split(dataset, split, run, measures)
    log_evaluation(result, dataset.name, split)
    return result


def combine_subsets(results: Mapping[str, EvalResult]) -> EvalResult:
    """One result for a dataset of sub-collections (CQADupStack's forums), as BEIR reports it.

    Each measure's aggregate is the mean of the sub-collections' means (every
    forum weighs the same, whatever its number of queries); the per-query
    values are kept, their ids prefixed ``<subset>/`` so they stay apart.
    """
    if not results:
        raise ValueError("no sub-collection results to combine")
    measures = list(next(iter(results.values())).aggregate)
    aggregate = {measure: math.fsum(result.aggregate[measure] for result in results.values()) / len(results)
                 for measure in measures}
    per_query = {measure: {f"{subset}/{qid}": value for subset, result in results.items()
                           for qid, value in result.per_query[measure].items()} for measure in measures}
    return EvalResult(aggregate, per_query)


def subset_mean(per_query: Mapping[str, float], subsets: Iterable[str]) -> float:
    """The mean of per-subset means of per-query values keyed ``<subset>/<qid>`` (:func:`combine_subsets`)."""
    groups: dict[str, list[float]] = {subset: [] for subset in subsets}
    for qid, value in per_query.items():
        subset = qid.split("/", 1)[0]
        if subset not in groups:
            raise ValueError(f"query {qid!r} belongs to none of the sub-collections {sorted(groups)}")
        groups[subset].append(value)
    means = [math.fsum(values) / len(values) for values in groups.values() if values]
    return math.fsum(means) / len(means)
