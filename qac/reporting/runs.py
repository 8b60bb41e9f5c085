"""Read the study's MLflow runs and find the one behind each table row.

Tables are built only from what the stages logged: metrics
``<dataset>/<split>/<measure>`` (mangled by :func:`qac.tracking.metric_key`),
per-query artifacts ``per_query/<dataset>/<split>.json`` and the tags of
docs/architecture.md. When a stage ran more than once, the most recent
finished run counts; the tables name the run id of every cell, so which one
was used is never in doubt.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qac.tracking import metric_key

FINISHED = "FINISHED"


@dataclass(frozen=True)
class RunRecord:
    """The parts of an MLflow run the reports use."""

    run_id: str
    name: str
    tags: dict[str, str]
    metrics: dict[str, float]
    params: dict[str, str]
    start_time: int
    status: str = FINISHED

    @property
    def parent_id(self) -> str | None:
        return self.tags.get("mlflow.parentRunId")

    def metric(self, dataset: str, split: str, measure: str) -> float | None:
        return self.metrics.get(metric_key(dataset, split, measure))


@dataclass(frozen=True)
class Variant:
    """A pre-training condition: method, context type and query count C."""

    name: str
    method: str
    context_type: str | None
    query_count: int | None

    @property
    def label(self) -> str:
        from qac.reporting.paper import METHOD_NAMES

        method = METHOD_NAMES.get(self.method, self.method)
        if self.method == "none":
            return method
        if self.context_type == "query":
            return f"{method}+QaC (C={self.query_count})"
        if self.context_type == "mixed":
            return f"{method} mixed context (C={self.query_count})"
        return f"{method} passage context"


def _record(run) -> RunRecord:
    return RunRecord(
        run_id=run.info.run_id,
        name=run.info.run_name or run.data.tags.get("mlflow.runName", ""),
        tags=dict(run.data.tags),
        metrics=dict(run.data.metrics),
        params=dict(run.data.params),
        start_time=int(run.info.start_time or 0),
        status=run.info.status,
    )


def load_runs(experiment: str, tracking_uri: str | None = None) -> list[RunRecord]:
    """Every finished run of ``experiment`` (``qac-<profile>``), newest first."""
    import mlflow

    from qac.tracking import tracking_uri as default_uri

    uri = tracking_uri or default_uri()
    mlflow.set_tracking_uri(uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        raise LookupError(f"no MLflow experiment {experiment!r} at {uri}")
    runs = mlflow.search_runs([found.experiment_id], output_format="list", order_by=["start_time DESC"])
    return [_record(run) for run in runs if run.info.status == FINISHED]


def _as_int(value: str | None) -> int | None:
    return int(value) if value not in (None, "", "None") else None


@dataclass
class StudyRuns:
    """The runs of one experiment, indexed by what the tables ask for."""

    runs: list[RunRecord]
    tracking_uri: str | None = None
    _by_id: dict[str, RunRecord] = field(init=False, repr=False)
    _per_query: dict[tuple[str, str, str], dict] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        # Newest first, so the first match of a search is the latest rerun.
        self.runs = sorted(self.runs, key=lambda run: run.start_time, reverse=True)
        self._by_id = {run.run_id: run for run in self.runs}

    def get(self, run_id: str | None) -> RunRecord | None:
        return self._by_id.get(run_id) if run_id else None

    def _latest(self, **tags: str) -> RunRecord | None:
        for run in self.runs:
            if all(run.tags.get(key) == value for key, value in tags.items()):
                return run
        return None

    def variant_of(self, run: RunRecord) -> Variant:
        """A fine-tuning or pre-training run's condition, from its tags or its parent pre-training run's."""
        sources = [run.tags]
        parent = self.get(run.parent_id)
        if parent is not None:
            sources.append(parent.tags)

        def tag(key: str) -> str | None:
            return next((source[key] for source in sources if source.get(key) not in (None, "")), None)

        method = tag("qac.method") or ("none" if tag("qac.variant") == "none" else None)
        if method is None:
            raise ValueError(f"MLflow run {run.run_id} ({run.name}): no qac.method tag on it or its parent run")
        context = tag("qac.context_type")
        return Variant(name=tag("qac.variant") or run.name, method=method,
                       context_type=None if method == "none" or context in (None, "None") else context,
                       query_count=_as_int(tag("qac.query_count")) if method != "none" else None)

    def variants(self) -> list[Variant]:
        """Every condition with a fine-tuned retriever, in a stable order."""
        seen: dict[str, Variant] = {}
        for run in self.runs:
            if run.tags.get("qac.kind") == "finetune" and run.tags.get("qac.retriever") in ("r1", "r2"):
                variant = self.variant_of(run)
                seen.setdefault(variant.name, variant)
        order = {"none": 0, "cocondenser": 1, "cotmae": 2}
        contexts = {"passage": 0, "query": 1, "mixed": 2}
        return sorted(seen.values(), key=lambda v: (order.get(v.method, 9), contexts.get(v.context_type or "", -1),
                                                    v.query_count or 0, v.name))

    def finetuned(self, variant: str, retriever: str) -> RunRecord | None:
        """The latest ``finetune/<retriever>/<variant>`` run."""
        return self._latest(**{"qac.kind": "finetune", "qac.retriever": retriever, "qac.variant": variant})

    def baseline(self, retriever: str) -> RunRecord | None:
        """The latest baseline run: ``bm25`` or ``untuned`` (the start encoder, not fine-tuned)."""
        return self._latest(**{"qac.retriever": retriever})

    def pretrain(self, variant: str) -> RunRecord | None:
        return self._latest(**{"qac.kind": "pretrain", "qac.variant": variant})

    def named(self, name: str) -> RunRecord | None:
        return next((run for run in self.runs if run.name == name), None)

    def per_query(self, run: RunRecord, dataset: str, split: str, measure: str) -> dict[str, float] | None:
        """``{qid: value}`` from the run's ``per_query/<dataset>/<split>.json``, or None if not logged."""
        key = (run.run_id, dataset, split)
        if key not in self._per_query:
            self._per_query[key] = self._download_json(run, f"per_query/{dataset}/{split}.json")
        values = self._per_query[key]
        if values is None or measure not in values:
            return None
        return {str(qid): float(value) for qid, value in values[measure].items()}

    def _download_json(self, run: RunRecord, artifact: str) -> Any:
        text = self.artifact_text(run, artifact)
        return None if text is None else json.loads(text)

    def artifact_text(self, run: RunRecord, artifact: str) -> str | None:
        """A small text artifact of ``run``, or None when it was not logged."""
        import mlflow

        client = mlflow.MlflowClient(self.tracking_uri)
        folder = artifact.rsplit("/", 1)[0] if "/" in artifact else None
        if artifact not in {entry.path for entry in client.list_artifacts(run.run_id, folder)}:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            local = client.download_artifacts(run.run_id, artifact, tmp)
            return Path(local).read_text(encoding="utf-8")

    def metric_history(self, run: RunRecord, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` pairs of a metric logged over training."""
        import mlflow

        history = mlflow.MlflowClient(self.tracking_uri).get_metric_history(run.run_id, key)
        return sorted((point.step, point.value) for point in history)
