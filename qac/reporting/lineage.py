"""The study's results as DVC tracks them: per-query files and run records under ``data/<profile>/``.

Every number of the report comes from a file a DVC stage wrote (see
docs/architecture.md), never from the MLflow store:

- ``eval/<variant>/<retriever>/<dataset>/<split>.per_query.json``
  (``{measure: {qid: value}}``) for retrievers ``r1``, ``r2`` and ``untuned``;
  the measure's value is the mean over the queries, as trec_eval reports it;
- ``bm25/runs/<dataset>/<split>.per_query.json`` for the BM25 baseline;
- ``annotation/summary.json`` and ``annotation/labels.csv`` for Table 5;
- ``pretrain/<variant>/losses.tsv`` for the loss curves.

The run record of each output (``.runs/<output>/mlflow_run.json`` for
``finetune/<variant>/<r>``, ``eval/<variant>/untuned``, ``bm25``, ``annotation``,
``pretrain/<variant>``; outside the DVC outputs, see qac.tracking) names the
MLflow run and git commit that produced it. The tables keep that run id beside
each number as a link into MLflow (``.runs/report_runs.csv``), nothing more:
no tracked report carries it, and an absent record is a link left out.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from qac.data.errors import DataFormatError
from qac.evaluation.split_evaluation import SUBSETS_FILE, subset_mean
from qac.params.vocabulary import FINETUNED_RETRIEVERS
from qac.tracking import RECORDS_DIR, RUN_RECORD, record_path
from qac.train.step_log import LOSSES_FILE
from qac.config import profile_dir
from qac.pipeline_plan import stage_writing
from qac.reference import REFERENCE_DIR, reference_slug
from qac.reporting.paper import METHOD_NAMES

if TYPE_CHECKING:
    from qac.params.sections import Params, PretrainVariant

PER_QUERY_SUFFIX = ".per_query.json"
_METHOD_ORDER = {"none": 0, "cocondenser": 1, "cotmae": 2}
_CONTEXT_ORDER = {"passage": 0, "query": 1, "mixed": 2}


def read_json(path: Path) -> Any:
    """A JSON file, or a :class:`DataFormatError` naming the file, line and column of the defect (a truncated
    or damaged stage output; the message names the stage that rebuilds it)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DataFormatError(path, error.lineno, None, f"malformed JSON at column {error.colno} ({error.msg}), "
                                                        "truncated or damaged") from None
    except UnicodeDecodeError as error:
        raise DataFormatError(path, None, None, f"not UTF-8 text (byte {error.start}): damaged") from None


def read_record(root: Path, folder: Path) -> dict[str, Any] | None:
    """The run record of the output ``folder`` (under ``root``), checked to name a run; None if absent."""
    path = record_path(root, folder)
    if not path.is_file():
        return None
    try:
        record = read_json(path)
    except DataFormatError as error:
        raise DataFormatError(path, error.line, error.field, error.problem + _record_fix(folder)) from None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        raise DataFormatError(path, None, "run_id", "missing or not a string" + _record_fix(folder))
    return record


def _record_fix(folder: Path) -> str:
    """What to do with a damaged run record: bookkeeping beside the outputs, not one of them (DVC cannot
    restore it, and the numbers do not need it)."""
    writer = stage_writing(folder)
    return (f"; it only links {folder} to its MLflow run: delete it (the tables then show that output without a "
            f"run) or rerun {'the DVC stage ' + writer[1] if writer else 'the stage that writes it'}")


@dataclass(frozen=True)
class Variant:
    """A pre-training condition: method, context type and query count C (from ``pretrain.variants``)."""

    name: str
    method: str
    context_type: str | None
    query_count: int | None
    seed_of: str | None = None    # a seed copy: the variant it repeats with another seed (one row with it)

    @property
    def label(self) -> str:
        method = METHOD_NAMES.get(self.method, self.method)
        if self.method == "none":
            return method
        if self.context_type == "query":
            return f"{method}+QaC (C={self.query_count})"
        if self.context_type == "mixed":
            return f"{method} mixed context (C={self.query_count})"
        return f"{method} passage context"

    @classmethod
    def from_params(cls, name: str, spec: PretrainVariant) -> "Variant":
        if spec.method == "none":
            return cls(name, "none", None, None)
        return cls(name, spec.method, spec.context_type, spec.query_count, spec.seed_of)

    @property
    def order(self) -> tuple:
        return (_METHOD_ORDER.get(self.method, 9), _CONTEXT_ORDER.get(self.context_type or "", -1),
                self.query_count or 0, self.name)


class _Recorded:
    """An output with the ``mlflow_run.json`` record (``record``) of the run that produced it."""

    record: dict[str, Any] | None

    @property
    def run_id(self) -> str | None:
        return self.record["run_id"] if self.record else None

    @property
    def git_commit(self) -> str | None:
        return (self.record or {}).get("git_commit")


@dataclass
class Source(_Recorded):
    """One system's evaluation outputs and the MLflow run they belong to.

    ``folder`` holds ``<dataset>/<split>.per_query.json``; ``record`` is the
    ``mlflow_run.json`` of the run that produced the evaluated system (None if
    the stage wrote none).
    """

    name: str
    root: Path
    folder: Path
    record: dict[str, Any] | None = None
    record_path: Path | None = None
    _cache: dict[tuple[str, str], dict | None] = field(default_factory=dict, repr=False)

    def path(self, dataset: str, split: str) -> Path:
        return self.folder / dataset / f"{split}{PER_QUERY_SUFFIX}"

    def relative(self, dataset: str, split: str) -> str:
        """The per-query file's path under ``data/<profile>/``, as the CSV cites it."""
        return self.path(dataset, split).relative_to(self.root).as_posix()

    def _load(self, dataset: str, split: str) -> dict | None:
        key = (dataset, split)
        if key not in self._cache:
            path = self.path(dataset, split)
            values = read_json(path) if path.is_file() else None
            if values is not None:
                values = _checked_per_query(path, values)
            self._cache[key] = values
        return self._cache[key]

    def per_query(self, dataset: str, split: str, measure: str) -> dict[str, float] | None:
        """``{qid: value}`` of ``measure``, or None when the stage did not evaluate it."""
        values = self._load(dataset, split)
        if values is None or measure not in values:
            return None
        return dict(values[measure])

    def metric(self, dataset: str, split: str, measure: str) -> float | None:
        """The mean over queries (trec_eval's aggregate); ``math.fsum`` so file order cannot change it.

        A dataset of sub-collections (``subsets.json`` beside its per-query
        files: CQADupStack's forums) is the mean of their means, as BEIR reports it.
        """
        values = self.per_query(dataset, split, measure)
        if not values:
            return None
        subsets_path = self.folder / dataset / SUBSETS_FILE
        if subsets_path.is_file():
            return subset_mean(values, read_json(subsets_path)["subsets"])
        return math.fsum(values.values()) / len(values)

    def splits(self, dataset: str) -> list[str]:
        folder = self.folder / dataset
        if not folder.is_dir():
            return []
        return sorted(p.name[:-len(PER_QUERY_SUFFIX)] for p in folder.iterdir() if p.name.endswith(PER_QUERY_SUFFIX))


# Every measure qac evaluates (RR, R, Hit, P, nDCG, AP) is a share in [0, 1]; a sum of floats may pass 1 by
# a few units in the last place.
_MEASURE_RANGE = (0.0, 1.0 + 1e-9)


def _checked_per_query(path: Path, values: Any) -> dict[str, dict[str, float]]:
    """A per-query file as the evaluation stage writes it: ``{measure: {qid: value}}``, every measure over the
    same queries, every value a finite share in [0, 1]; anything else is a damaged file, named with the
    measure and query, never a number in a table."""
    if not (isinstance(values, dict) and values and all(isinstance(v, dict) for v in values.values())):
        raise DataFormatError(path, None, None, "expected {measure: {qid: value}} with at least one measure")
    checked: dict[str, dict[str, float]] = {}
    queries = None
    for measure, scores in values.items():
        if not scores:
            raise DataFormatError(path, None, measure, "holds no queries")
        for qid, value in scores.items():
            # NaN or infinity would spread into every mean; a boolean or a string is a file some other
            # program wrote; a value outside [0, 1] is no value of these measures
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DataFormatError(path, None, measure, f"query {qid!r}: {value!r} is not a finite number")
            if not _MEASURE_RANGE[0] <= value <= _MEASURE_RANGE[1]:
                raise DataFormatError(path, None, measure, f"query {qid!r}: {value!r} is outside [0, 1], the "
                                                           "range of every measure")
        if queries is None:
            first, queries = measure, set(scores)
        elif set(scores) != queries:
            odd = sorted(set(scores) ^ queries)[0]
            side = first if odd in queries else measure
            raise DataFormatError(path, None, measure, f"query {odd!r} has a value of {side} only: every measure "
                                                       f"of a file covers the same queries ({first} has "
                                                       f"{len(queries)}, {measure} {len(scores)})")
        checked[measure] = {str(qid): float(value) for qid, value in scores.items()}
    return checked


class SeededSource:
    """One system trained with several seeds: a variant's outputs and its seed copies' (``<variant>-seed<s>``).

    Reads as a :class:`Source`: ``per_query`` is each query's value averaged
    over the seeds (so paired tests compare seed-averaged values), ``metric``
    the mean of the seeds' figures; ``seed_metrics`` gives each seed's figure
    for the spread. The record, run id and file cited are the first seed's.
    """

    def __init__(self, sources: list[Source], seeds: list[int]):
        self.sources, self.seeds = sources, seeds
        self.name, self.root, self.record = sources[0].name, sources[0].root, sources[0].record

    @property
    def run_id(self) -> str | None:
        return self.sources[0].run_id

    @property
    def git_commit(self) -> str | None:
        return self.sources[0].git_commit

    def path(self, dataset: str, split: str) -> Path:
        return self.sources[0].path(dataset, split)

    def relative(self, dataset: str, split: str) -> str:
        return self.sources[0].relative(dataset, split)

    def splits(self, dataset: str) -> list[str]:
        return self.sources[0].splits(dataset)

    def per_query(self, dataset: str, split: str, measure: str) -> dict[str, float] | None:
        """Each query's value averaged over the seeds; None unless every seed was evaluated on the same queries."""
        values = [source.per_query(dataset, split, measure) for source in self.sources]
        if any(v is None for v in values) or any(set(v) != set(values[0]) for v in values):
            return None
        return {qid: math.fsum(v[qid] for v in values) / len(values) for qid in values[0]}

    def seed_metrics(self, dataset: str, split: str, measure: str) -> list[float] | None:
        """Each seed's figure, in the order of ``seeds``; None unless every seed has one."""
        values = [source.metric(dataset, split, measure) for source in self.sources]
        return None if any(v is None for v in values) else values

    def metric(self, dataset: str, split: str, measure: str) -> float | None:
        values = self.seed_metrics(dataset, split, measure)
        return None if values is None else math.fsum(values) / len(values)


@dataclass(frozen=True)
class Annotation(_Recorded):
    """Table 5's outputs: ``annotation/summary.json``, ``labels.csv`` text and the run record."""

    summary: dict[str, Any]
    labels_text: str | None
    record: dict[str, Any] | None
    relative: str


class Study:
    """The DVC outputs of one profile, indexed by what the tables ask for."""

    def __init__(self, root: str | os.PathLike, variants: Mapping[str, PretrainVariant], profile: str,
                 declared_variants: bool, seed: int):
        self.root = Path(root)
        self.profile = profile
        self._variants = {name: Variant.from_params(name, spec) for name, spec in variants.items()}
        self._seeds = {name: spec.seed for name, spec in variants.items() if spec.seed is not None}
        self.seed = seed
        self._sources: dict[str, Source | None] = {}
        self.declared_variants = declared_variants   # rows for every declared variant, evaluated or not

    def variants(self) -> list[Variant]:
        """Every condition of ``pretrain.variants`` whose retrievers were evaluated, in a stable order.

        A seed copy is no condition of its own: it is read with its variant (:meth:`finetuned`).
        """
        found = [v for v in self._variants.values() if v.seed_of is None and (
                 self.declared_variants or any((self.root / "eval" / v.name / r).is_dir()
                                               for r in FINETUNED_RETRIEVERS))]
        return sorted(found, key=lambda v: v.order)

    def seed_copies(self, variant: str) -> list[Variant]:
        """The seed copies of ``variant`` (``seed_of: variant``), in declaration order."""
        return [v for v in self._variants.values() if v.seed_of == variant]

    def seeds(self, variant: str) -> list[int]:
        """The seeds ``variant`` runs with: its own (or the top-level seed) first, then its copies'."""
        return [self._seeds.get(name, self.seed) for name in [variant, *(v.name for v in self.seed_copies(variant))]]

    def variant(self, name: str) -> Variant | None:
        return self._variants.get(name)

    def _source(self, name: str, folder: Path, record_folder: Path) -> Source | None:
        if name not in self._sources:
            self._sources[name] = (Source(name, self.root, folder, read_record(self.root, record_folder),
                                          record_path(self.root, record_folder))
                                   if folder.is_dir() else None)
        return self._sources[name]

    def finetuned(self, variant: str, retriever: str) -> Source | SeededSource | None:
        """Retriever ``r1``/``r2`` of ``variant``: ``eval/<variant>/<r>/``, run from ``finetune/<variant>/<r>/``;
        ``beir`` (Table 2's zero-shot retriever): ``beir/<variant>/eval/``, run from ``beir/<variant>/encoder/``.

        A variant with seed copies reads as one :class:`SeededSource` over every seed, once every seed's
        output exists; until then as its own first seed alone would be wrong, so it is None.
        """
        copies = self.seed_copies(variant)
        if copies:
            sources = [self._single(name, retriever) for name in [variant, *(v.name for v in copies)]]
            return None if None in sources else SeededSource(sources, self.seeds(variant))
        return self._single(variant, retriever)

    def _single(self, variant: str, retriever: str) -> Source | None:
        if retriever == "beir":
            return self._source(f"beir/{variant}", self.root / "beir" / variant / "eval",
                                self.root / "beir" / variant / "encoder")
        return self._source(f"finetune/{retriever}/{variant}", self.root / "eval" / variant / retriever,
                            self.root / "finetune" / variant / retriever)

    def baseline(self, retriever: str) -> Source | None:
        """``bm25`` (``bm25/runs/``) or ``untuned``: the start encoder of the no-pre-training variant."""
        if retriever == "bm25":
            return self._source("baseline/bm25", self.root / "bm25" / "runs", self.root / "bm25")
        if retriever == "untuned":
            for variant in sorted(self._variants.values(), key=lambda v: v.order):
                folder = self.root / "eval" / variant.name / "untuned"
                if variant.method == "none" and folder.is_dir():
                    return self._source(f"eval/untuned/{variant.name}", folder, folder)
            return None
        raise ValueError(f"unknown baseline {retriever!r}: bm25 or untuned")

    def reference(self, spec: str) -> Source | None:
        """A released retriever evaluated as published: ``reference/<slug>/`` (stage reference, qac/reference.py)."""
        folder = self.root / REFERENCE_DIR / reference_slug(spec)
        return self._source(f"reference/{spec}", folder, folder)

    def pretrain_record(self, variant: str) -> dict[str, Any] | None:
        return read_record(self.root, self.root / "pretrain" / variant)

    def pretrain_losses(self, variant: str) -> list[dict[str, float]] | None:
        """Rows of ``pretrain/<variant>/losses.tsv`` (``step`` and each loss), or None when absent."""
        path = self.root / "pretrain" / variant / LOSSES_FILE
        return read_losses(path) if path.is_file() else None

    def annotation(self) -> Annotation | None:
        folder = self.root / "annotation"
        summary_path = folder / "summary.json"
        if not summary_path.is_file():
            return None
        summary = read_json(summary_path)
        if not isinstance(summary, dict) or not isinstance(summary.get("shares"), dict):
            raise DataFormatError(summary_path, None, "shares", "missing")
        labels = folder / "labels.csv"
        return Annotation(summary, labels.read_text(encoding="utf-8") if labels.is_file() else None,
                          read_record(self.root, folder), summary_path.relative_to(self.root).as_posix())

    def stage_metrics(self, stage: str) -> dict[str, Any] | None:
        """``metrics/<stage>.json`` (a stage's DVC metrics), or None when the stage wrote none."""
        path = self.root / "metrics" / f"{stage}.json"
        if not path.is_file():
            return None
        metrics = read_json(path)
        if not isinstance(metrics, dict):
            raise DataFormatError(path, None, None, "expected a JSON object of metrics")
        return metrics

    def stage_record(self, stage: str) -> dict[str, Any] | None:
        """The run record of the output a metrics stage describes (``query_generator``, ``queries``)."""
        output = {"query_generator": "generator", "queries": "queries.arrow"}.get(stage, stage)
        return read_record(self.root, self.root / output)

    def run_commits(self, run_ids: set[str]) -> dict[str, str | None]:
        """``{run id: git commit}`` of the records that name ``run_ids`` (those the tables used)."""
        found: dict[str, str | None] = {}
        for source in self._sources.values():
            if source is not None and source.run_id in run_ids:
                found[source.run_id] = source.git_commit
        annotation = self.annotation()
        if annotation is not None and annotation.run_id in run_ids:
            found[annotation.run_id] = annotation.git_commit
        return found

    def records(self) -> list[dict[str, Any]]:
        """Every run record of the profile's outputs (for finding the study run in MLflow)."""
        return [read_json(path) for path in sorted((self.root / RECORDS_DIR).glob(f"**/{RUN_RECORD}"))]


def read_losses(path: str | os.PathLike) -> list[dict[str, float]]:
    """A ``losses.tsv`` (header ``step<TAB>loss...``) as rows of floats; a bad cell names file and line."""
    import io

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataFormatError(path, None, None, f"not UTF-8 text (byte {error.start}): damaged") from None
    if text and not text.endswith("\n"):
        # The stage writes whole lines: a last line without its end is a cut file, whatever it parses as.
        raise DataFormatError(path, text.count("\n") + 1, None, "truncated: the last line is incomplete")
    rows = []
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t")
    if not reader.fieldnames or reader.fieldnames[0] != "step":
        raise DataFormatError(path, 1, None, f"header must start with 'step', got {reader.fieldnames}")
    for line, row in enumerate(reader, start=2):
        try:
            rows.append({key: float(value) for key, value in row.items()})
        except (TypeError, ValueError):
            raise DataFormatError(path, line, None, "a field is missing or not a number") from None
    return rows


def load_study(params: Params, root: str | os.PathLike | None = None,
               declared_variants: bool = False) -> Study:
    """The DVC outputs of the profile in ``params`` (``data/<profile>/`` unless ``root`` is given).

    The variants of ``llm_queries.variants`` (queries from a prompted LLM) are extensions of the study, not
    conditions of the paper's Tables 1-5: left out here, a coCondenser C = 5 on LLM queries never stands in for
    the paper's coCondenser C = 5 row (their cells: :func:`qac.reporting.cell_plan.plan_extension_cells`)."""
    extensions = params.llm_queries.variants
    variants = {name: spec for name, spec in params.pretrain.variants.items()
                if name not in extensions and spec.seed_of not in extensions}
    return Study(root or profile_dir(dict(params)), variants, params.profile, declared_variants, params.seed)
