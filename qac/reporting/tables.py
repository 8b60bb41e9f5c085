"""Tables 1-5 of the paper, rebuilt from the study's DVC outputs (:mod:`qac.reporting.lineage`).

Every cell holds our value, the paper's value for the row it maps to
(:mod:`qac.reporting.paper`), the file it came from, the MLflow run that
produced that file and, when it is missing, why. For each "with vs without
query-as-context" pair a difference cell carries the difference, the p-value
of a paired randomization test over the per-query values the evaluation
stage wrote, and the minimum detectable effect (MDE) of that comparison.

Units follow the paper: percentages in Tables 1, 3, 4 and 5, fractions
(nDCG@10) in Table 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from qac.evaluation.significance import compare_paired
from qac.params.vocabulary import CONTEXT_TYPES, PRETRAINING_METHODS
from qac.reporting import paper
from qac.reporting.lineage import Source, Study, Variant
from qac.tracking import metric_key
from qac.data.sources import subset_settings
from qac.deviations import recipe_summary
from qac.evaluation import annotation as study_annotation
from qac.reference import published_figure, published_name
from qac.retrieval.untuned import baseline_settings, start_encoder

if TYPE_CHECKING:
    from qac.params.sections import Params

PERCENT = "percent"
FRACTION = "fraction"
_SCALE = {PERCENT: 100.0, FRACTION: 1.0}
RETRIEVER_LABELS = {"r1": "retriever 1", "r2": "retriever 2",
                    "beir": "zero-shot retriever on MS MARCO hard negatives"}
# Pre-training methods with rows of their own, in table order (MASTER: qac.models.master).
PAPER_COLUMN_LABELS = {
    "mrr@10": "MS MARCO dev MRR@10",
    "r@50": "MS MARCO dev R@50 (hit rate)",
    "r@1k": "MS MARCO dev R@1k (hit rate)",
    "ndcg@10_dl19": "TREC DL19 nDCG@10",
    "ndcg@10_dl20": "TREC DL20 nDCG@10",
}


@dataclass(frozen=True)
class MetricColumn:
    """One in-domain column: where our value comes from and which paper column it stands beside.

    ``missing`` marks a column the profile cannot produce, with the reason
    shown in every cell (``"TREC DL 2020: not in the default profile"``).
    """

    label: str
    dataset: str | None = None
    split: str | None = None
    measure: str | None = None
    paper: str | None = None
    missing: str | None = None
    short: str | None = None     # the compact head of the LaTeX table (default: label)

    @property
    def header(self) -> str:
        if self.paper:
            return f"{self.label} [paper: {PAPER_COLUMN_LABELS.get(self.paper, self.paper)}]"
        return self.label

    @property
    def short_header(self) -> str:
        return self.short or self.label


@dataclass
class Cell:
    """One table cell. ``value`` and ``paper`` are in the table's unit.

    ``source`` is the DVC-tracked file the value was computed from (relative
    to ``data/<profile>/``) and ``run_id`` the MLflow run its record names. A
    difference cell (``difference=True``) holds with minus without
    query-as-context; ``run_id``/``source`` are the "with" side,
    ``compared_run_id``/``compared_source`` the "without" side, ``p_value``
    the paired randomization test over ``n_queries`` queries and ``mde`` the
    smallest difference that test could detect
    (:func:`qac.evaluation.significance.minimum_detectable_effect`).
    """

    value: float | None = None
    paper: float | None = None
    run_id: str | None = None
    metric: str | None = None
    note: str | None = None
    difference: bool = False
    p_value: float | None = None
    compared_run_id: str | None = None
    n_queries: int | None = None
    text: str | None = None  # a cell that holds words, not a number (Table 5's label source)
    caveat: str | None = None  # why the number is no finding (a poorly calibrated judge): printed instead of its test
    source: str | None = None
    compared_source: str | None = None
    mde: float | None = None
    recipe: str | None = None   # which recipe (qac/deviations.yaml) the run behind the value ran
    published: float | None = None   # a published figure of the same model used the same way (encoders.<spec>)
    cited: float | None = None   # a published figure of another configuration: shown beside ours, never compared
    seed_values: list[float] | None = None   # our value of each seed, where the variant ran several (table unit)
    std_error: float | None = None   # sampling error of ``value``: sd of the per-query values / sqrt(n), table unit
    ci: tuple[float, float] | None = None   # 95% paired bootstrap interval of a difference, table unit
    p_holm: float | None = None   # ``p_value`` after Holm's correction over the table's tests (reviewer_statistics)


@dataclass
class Table:
    key: str
    title: str
    unit: str
    columns: list[str]
    rows: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    paper_rows: dict[str, str] = field(default_factory=dict)   # our row -> the paper row it is compared with
    count_columns: set[str] = field(default_factory=set)       # columns of whole numbers
    row_info: dict[str, dict[str, Any]] = field(default_factory=dict)  # what a row is, for figures
    short_columns: dict[str, str] = field(default_factory=dict)        # column -> compact LaTeX head
    column_notes: dict[str, str] = field(default_factory=dict)         # compact head -> what it is
    baselines: dict[str, dict[str, float | None]] = field(default_factory=dict)  # method -> {column: value}
    column_retrievers: dict[str, str] = field(default_factory=dict)    # column -> r1/r2, where a table has both
    paper_side: bool = True      # cells print "ours / paper"; False: a table the paper has none of (ours only)

    def put(self, row: str, column: str, cell: Cell, paper_row: str | None = None) -> None:
        if row not in self.rows:
            self.rows.append(row)
        self.cells[(row, column)] = cell
        if paper_row:
            self.paper_rows[row] = paper_row

    def cell(self, row: str, column: str) -> Cell:
        return self.cells.get((row, column), Cell(note="not applicable"))


def columns_from_params(params: Params) -> list[MetricColumn]:
    """The profile's in-domain columns (``tables.in_domain_columns``); ``dataset: null`` is the train dataset."""
    specs = params.tables.in_domain_columns
    if not specs:
        raise ValueError("params.yaml: tables.in_domain_columns is empty; Tables 1, 3 and 4 need at least one column")
    columns = []
    for index, spec in enumerate(specs):
        if not spec.missing and not spec.measure:
            raise ValueError(f"params.yaml: tables.in_domain_columns[{index}]: give 'measure' or 'missing'")
        column = MetricColumn(label=spec.label, dataset=spec.dataset, split=spec.get("split"), measure=spec.measure,
                              paper=spec.paper, missing=spec.missing, short=spec.short)
        if not spec.missing:
            column = replace(column, dataset=spec.dataset or params.train_dataset, split=spec.split)
        columns.append(column)
    return columns


# ---------------------------------------------------------------- cell builders

@dataclass
class TableContext:
    """What every table builder needs: the outputs, the profile's columns and the test settings."""

    study: Study
    columns: list[MetricColumn]
    profile: str
    main_query_count: int | None
    zero_shot_datasets: list[str]
    zero_shot_retriever: str
    permutations: int
    seed: int
    params: Params

    @classmethod
    def from_params(cls, study: Study, params: Params) -> "TableContext":
        tables = params.tables
        return cls(study=study, columns=columns_from_params(params), profile=params.profile,
                   main_query_count=tables.main_query_count, zero_shot_datasets=list(params.zero_shot),
                   zero_shot_retriever=tables.zero_shot_retriever, permutations=tables.permutations,
                   seed=params.seed, params=params)

    def column(self, paper_key: str) -> MetricColumn | None:
        return next((column for column in self.columns if column.paper == paper_key), None)

    def query_variant(self, method: str, context_type: str = "query") -> Variant | None:
        """The query- (or mixed-) context variant of ``method`` shown in Tables 1, 2 and 4.

        Its C is ``tables.main_query_count`` (null: the largest C the profile
        has). A profile without a variant of that C gets None, and its cells
        say so: a variant of another C never stands in for it.
        """
        candidates = [v for v in self.study.variants() if v.method == method and v.context_type == context_type]
        if not candidates:
            return None
        if self.main_query_count is None:
            return max(candidates, key=lambda v: v.query_count or 0)
        return next((v for v in candidates if v.query_count == self.main_query_count), None)

    def variant(self, method: str, context_type: str) -> Variant | None:
        if context_type in ("query", "mixed"):
            return self.query_variant(method, context_type)
        candidates = [v for v in self.study.variants() if v.method == method and v.context_type == context_type]
        return max(candidates, key=lambda v: v.query_count or 0) if candidates else None

    def missing_reason(self, method: str, context_type: str) -> str:
        """What a cell says when :meth:`variant` finds no variant."""
        name = paper.METHOD_NAMES.get(method, method)
        if context_type in ("query", "mixed") and self.main_query_count is not None:
            return (f"no {context_type}-context {name} variant with C = {self.main_query_count} "
                    "(tables.main_query_count) in this profile")
        return f"no {context_type}-context {name} variant in this profile"

    def recipe(self, variant: Variant | None) -> str | None:
        """The recipe (qac/deviations.yaml) the variant's runs used: the profile's switches, its own overrides."""
        overrides = self.params.pretrain.variants.get(variant.name) if variant else None
        return recipe_summary(self.params, overrides or None)


def metric_cell(source: Source | None, dataset: str | None, split: str | None, measure: str | None, unit: str,
                paper_value: float | None, missing: str | None = None) -> Cell:
    """Our value of ``dataset/split/measure`` from ``source``'s per-query file (or why there is none)."""
    cell = Cell(paper=paper_value)
    if missing:
        cell.note = missing
        return cell
    cell.metric = metric_key(dataset, split, measure)
    if source is None:
        cell.note = "no evaluation output for this row in the profile's DVC outputs"
        return cell
    cell.run_id = source.run_id
    cell.source = source.relative(dataset, split)
    value = source.metric(dataset, split, measure)
    if value is None:
        cell.note = f"{source.name} was not evaluated with {measure} on {dataset} {split}"
    else:
        per_query = source.per_query(dataset, split, measure)
        cell.value = value * _SCALE[unit]
        cell.n_queries = len(per_query)
        cell.std_error = standard_error(per_query.values(), _SCALE[unit])
        seed_metrics = getattr(source, "seed_metrics", None)
        if seed_metrics is not None:
            cell.seed_values = [figure * _SCALE[unit] for figure in seed_metrics(dataset, split, measure)]
    return cell


def seed_spread(values: list[float] | None) -> float | None:
    """Sample standard deviation across seeds (n - 1); None below two seeds."""
    if not values or len(values) < 2:
        return None
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((value - mean) ** 2 for value in values) / (len(values) - 1))


def standard_error(values, scale: float = 1.0) -> float | None:
    """Standard error of the mean of ``values`` (sample sd, n - 1, over sqrt(n)) times ``scale``; None below 2."""
    values = [float(value) for value in values]
    if len(values) < 2:
        return None
    mean = math.fsum(values) / len(values)
    variance = math.fsum((value - mean) ** 2 for value in values) / (len(values) - 1)
    return math.sqrt(variance / len(values)) * scale


def difference_cell(ctx: TableContext, with_source: Source | None, without_source: Source | None,
                    dataset: str | None, split: str | None, measure: str | None, unit: str,
                    paper_with: float | None, paper_without: float | None, missing: str | None = None) -> Cell:
    """With minus without query-as-context, with the paired randomization p-value and the MDE."""
    cell = Cell(difference=True)
    if paper_with is not None and paper_without is not None:
        cell.paper = round(paper_with - paper_without, 6)
    if missing:
        cell.note = missing
        return cell
    if with_source is None or without_source is None:
        cell.note = "one of the two systems has no evaluation output"
        return cell
    cell.run_id, cell.compared_run_id = with_source.run_id, without_source.run_id
    cell.source, cell.compared_source = with_source.relative(dataset, split), without_source.relative(dataset, split)
    cell.metric = metric_key(dataset, split, measure)
    per_query_with = with_source.per_query(dataset, split, measure)
    per_query_without = without_source.per_query(dataset, split, measure)
    if not per_query_with or not per_query_without:
        cell.note = f"no per-query {measure} values for {dataset}/{split} in one of the two systems"
        return cell
    scale = _SCALE[unit]
    cell.value = (with_source.metric(dataset, split, measure) - without_source.metric(dataset, split, measure)) * scale
    # With several seeds, each query's values are averaged over the seeds first (SeededSource.per_query):
    # the test asks whether the seed-averaged systems differ; the seeds' spread of the difference is shown.
    result = compare_paired(per_query_with, per_query_without, ctx.permutations, ctx.seed)
    cell.p_value, cell.n_queries, cell.note = result.p_value, result.n_queries, result.note
    seeds_with = getattr(with_source, "seed_metrics", lambda *a: None)(dataset, split, measure)
    seeds_without = getattr(without_source, "seed_metrics", lambda *a: None)(dataset, split, measure)
    if seeds_with and seeds_without and len(seeds_with) == len(seeds_without):
        cell.seed_values = [(a - b) * scale for a, b in zip(seeds_with, seeds_without)]
    cell.mde = None if result.mde is None else result.mde * scale
    cell.ci = None if result.ci is None else (result.ci[0] * scale, result.ci[1] * scale)
    return cell


def _in_domain_cells(ctx: TableContext, table: Table, row: str, source: Source | None, unit: str, paper_of,
                     paper_row: str | None = None, recipe: str | None = None, note: str | None = None) -> None:
    for column in ctx.columns:
        cell = metric_cell(source, column.dataset, column.split, column.measure, unit, paper_of(column.paper),
                           column.missing)
        cell.recipe = recipe
        if note and cell.paper is None and cell.note is None:
            cell.note = note
        table.put(row, column.header, cell, paper_row)


def _cite_bm25_cells_of_other_runs(ctx: TableContext, table: Table) -> None:
    """The paper's BM25 cells that are not Anserini's tuned run (R@50 from RocketQA, TREC DL from neither
    Anserini setting): cited beside ours, never compared, even where our BM25 is that run."""
    cited = []
    for column in ctx.columns:
        cell = table.cells.get(("BM25", column.header))
        why = paper.PAPER_BM25_OTHER_SOURCES.get(column.paper)
        if cell is not None and cell.paper is not None and why:
            cell.cited, cell.paper = cell.paper, None
            cited.append(why)
    if cited:
        table.notes.append(f"BM25: the paper's row mixes sources ({'; '.join(cited)}): those cells are cited "
                           "beside ours, not compared; its MRR@10 and R@1k are Anserini's tuned run, as ours.")


def _cite_row(ctx: TableContext, table: Table, row: str, why: str) -> None:
    """Turn a row's paper values into cited ones (shown beside ours, never compared), keep those of like data
    only (:func:`_cite_like_for_like`) and say why in a note."""
    for (name, _), cell in table.cells.items():
        if name == row and cell.paper is not None:
            cell.cited, cell.paper = cell.paper, None
    kept = _cite_like_for_like(ctx, table, row)
    table.notes.append(f"{row}: {why}; {_cited_where(kept)}.")


def _cite_like_for_like(ctx: TableContext, table: Table, row: str) -> list[str]:
    """Drop the row's cited figures from every column of ours that is not on the paper column's own data and
    whole corpus: a figure cited there would read as one of that data (an MS MARCO figure beside SciFact's).
    Returns the names of the data whose figures stay (``MS MARCO dev``)."""
    kept = []
    for column in ctx.columns:
        cell = table.cells.get((row, column.header))
        if cell is None or cell.cited is None:
            continue
        if (paper.same_data(ctx.params, column.dataset, column.split, column.paper)
                and corpus_cut(ctx.params, column.dataset) is None):
            kept.append(paper.paper_column_data(column.paper))
        else:
            cell.cited = None
    return list(dict.fromkeys(kept))


def _cited_where(kept: list[str]) -> str:
    """Where a row's cited figures stand: the data they are of, or why none is shown."""
    if kept:
        return f"cited beside our columns on the same data only ({', '.join(kept)}, whole corpus)"
    return ("its figures are of MS MARCO (dev, TREC DL 2019 and 2020) and cited only beside a column of ours on "
            "that data and its whole corpus: none in this profile")


def _missing_row(ctx: TableContext, table: Table, row: str, reason: str, paper_of, paper_row: str | None) -> None:
    """A row the paper has but the profile cannot produce: every cell says why, beside the paper's value."""
    for column in ctx.columns:
        table.put(row, column.header, Cell(paper=paper_of(column.paper), note=reason), paper_row)


def _untuned_row(ctx: TableContext, table: Table, source: Source) -> None:
    """The start encoder, evaluated the way its model was trained, with its published figures beside ours."""
    spec = start_encoder(ctx.params)
    described = ctx.params.encoder(spec) is not None
    encoding = baseline_settings(ctx.params, spec) if described else None
    row = "start encoder, not fine-tuned"
    cut_datasets = {}
    for column in ctx.columns:
        cell = metric_cell(source, column.dataset, column.split, column.measure, PERCENT, None, column.missing)
        for figure in (encoding or {}).get("published") or []:
            if (figure["dataset"], figure["split"], figure["measure"]) == (column.dataset, column.split,
                                                                           column.measure):
                cell.published = float(figure["value"]) * _SCALE[PERCENT]
                table.paper_rows[row] = f"published: {figure['source']}"
                cut = corpus_cut(ctx.params, column.dataset)
                if cut is not None:
                    cut_datasets[column.dataset] = cut
        table.put(row, column.header, cell)
    for dataset, (documents, judged_kept) in cut_datasets.items():
        # A published figure is on the whole corpus; fewer distractors make retrieval easier.
        table.notes.append(
            f"The start encoder's published {dataset} figure is on the whole corpus; this profile cuts it to "
            f"{documents} documents{' (the judged ones kept)' if judged_kept else ''}, which makes retrieval "
            "easier, so the two are not like for like. benchmarks/bench_baseline.py evaluates the start encoder "
            "on the whole corpus with this project's encoding, search and metrics.")
    if encoding is not None:
        how = (f"{encoding['pooling']} pooling, {'normalised' if encoding['normalize'] else 'not normalised'}, "
               f"{encoding['query_max_len']}/{encoding['passage_max_len']} tokens")
        table.notes.append(f"The start encoder ({spec}) is evaluated the way its model was trained ({how}; "
                           "params encoders), beside its published figures; fine-tuned rows use finetune.pooling "
                           "and its lengths.")


def reference_row(spec: str) -> str:
    """Table 1's row of a released retriever evaluated as published (named as published, without its pin)."""
    return f"published checkpoint {published_name(spec)}"


def _reference_row(ctx: TableContext, table: Table, spec: str) -> None:
    """A released retriever (stage reference) beside its published figures: compared on the whole corpus,
    cited beside ours where the profile cuts the corpus (fewer distractors make retrieval easier)."""
    row = reference_row(spec)
    source = ctx.study.reference(spec)
    sources = set()
    for column in ctx.columns:
        figure = published_figure(ctx.params, spec, column.dataset, column.split, column.measure)
        like_for_like = figure is not None and corpus_cut(ctx.params, column.dataset) is None
        cell = metric_cell(source, column.dataset, column.split, column.measure, PERCENT,
                           float(figure["value"]) * _SCALE[PERCENT] if like_for_like else None, column.missing)
        if figure is not None and not like_for_like:
            cell.cited = float(figure["value"]) * _SCALE[PERCENT]
        if source is None and not column.missing:
            cell.note = "no reference/ output for this retriever: run the reference stage"
        if figure is not None:
            sources.add(figure["source"])
        table.put(row, column.header, cell)
    if sources:
        table.paper_rows[row] = "published: " + "; ".join(sorted(sources))
    table.notes.append(f"{row}: the released model evaluated as published (encoders.{published_name(spec)}: pooling, lengths; stage "
                       "reference); its published figures are compared where the corpus is whole, else cited.")


def corpus_cut(params: Params, dataset: str | None) -> tuple[int, bool] | None:
    """``(max_documents, keep_judged_documents)`` the prepare stage applied to ``dataset``, or None if uncut.

    A dataset's own entry overrides the profile-wide ``prepare`` settings
    (qac.data.sources.subset_settings, as the prepare stage reads them).
    """
    settings = subset_settings(params, dataset)
    if settings.max_documents is None:
        return None
    return settings.max_documents, settings.keep_judged_documents


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 dataset``, ``3 datasets``: a count with its noun in the right number."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def _retriever_row(variant: Variant, retriever: str) -> str:
    return f"{variant.label}, {RETRIEVER_LABELS[retriever]}"


def _describe_columns(table: Table, columns: list[MetricColumn], prefix: str = "", short_prefix: str = "") -> None:
    """Compact LaTeX heads for ``columns``, with what each one is (and the paper column beside it)."""
    for column in columns:
        short = short_prefix + column.short_header
        table.short_columns[prefix + column.header] = short
        if column.missing:
            continue   # its cells' footnote says why it is empty
        paper_column = f"; paper: {PAPER_COLUMN_LABELS.get(column.paper, column.paper)}" if column.paper else ""
        table.column_notes[short] = f"{column.dataset} {column.split} {column.measure}{paper_column}"


def _unshown_paper_columns(ctx: TableContext) -> list[str]:
    shown = {column.paper for column in ctx.columns}
    return [label for key, label in PAPER_COLUMN_LABELS.items() if key not in shown]


# ---------------------------------------------------------------- Table 1

def table1_in_domain(ctx: TableContext) -> Table:
    """Table 1: in-domain results of every retriever, baselines first."""
    table = Table("table1", "Table 1: in-domain retrieval", PERCENT, [c.header for c in ctx.columns])
    _describe_columns(table, ctx.columns)
    _in_domain_cells(ctx, table, "BM25", ctx.study.baseline("bm25"), PERCENT,
                     lambda col: paper.table1_value("bm25", None, "bm25", col),
                     paper.table1_paper_row("bm25", None, "bm25"))
    bm25_cited = paper.bm25_like_for_like(ctx.params)
    if bm25_cited:
        _cite_row(ctx, table, "BM25", bm25_cited)
    else:
        _cite_bm25_cells_of_other_runs(ctx, table)
    untuned = ctx.study.baseline("untuned")
    if untuned is not None:
        _untuned_row(ctx, table, untuned)
    for spec in ctx.params.reference_retrievers:
        _reference_row(ctx, table, spec)
    # The zero-shot retriever (Table 2's footnote recipe) has in-domain rows only where the profile trains it.
    retrievers = [r for r in RETRIEVER_LABELS if r != "beir" or ctx.zero_shot_retriever == "beir"]
    for variant in ctx.study.variants():
        if variant.method == "none":
            for retriever in retrievers:
                _in_domain_cells(ctx, table, _retriever_row(variant, retriever),
                                 ctx.study.finetuned(variant.name, retriever), PERCENT, lambda col: None,
                                 recipe=ctx.recipe(variant))
    for method in PRETRAINING_METHODS:
        passage, query = ctx.variant(method, "passage"), ctx.variant(method, "query")
        if passage is None and query is None:
            continue
        for retriever in retrievers:
            sources = {}
            for context, variant in (("passage", passage), ("query", query)):
                if variant is None:
                    name = f"{paper.METHOD_NAMES[method]} {context} context, {RETRIEVER_LABELS[retriever]}"
                    _missing_row(ctx, table, name, ctx.missing_reason(method, context),
                                 lambda col, c=context: paper.table1_value(method, c, retriever, col),
                                 paper.table1_paper_row(method, context, retriever))
                    continue
                sources[context] = ctx.study.finetuned(variant.name, retriever)
                _in_domain_cells(ctx, table, _retriever_row(variant, retriever), sources[context], PERCENT,
                                 lambda col, c=context, v=variant: paper.table1_value(method, c, retriever, col,
                                                                                      v.query_count),
                                 paper.table1_paper_row(method, context, retriever), recipe=ctx.recipe(variant),
                                 note=paper.configuration_note(context, variant.query_count))
                cited_row = paper.table1_cited_row(method, context, retriever)
                if cited_row:
                    for column in ctx.columns:
                        cell = table.cell(_retriever_row(variant, retriever), column.header)
                        cell.cited = paper.table1_cited_value(method, context, retriever, column.paper)
                    if _cite_like_for_like(ctx, table, _retriever_row(variant, retriever)):
                        table.paper_rows[_retriever_row(variant, retriever)] = f"cited: {cited_row}"
            if passage is None or query is None:
                continue
            row = f"Δ {paper.METHOD_NAMES[method]} query − passage context, {RETRIEVER_LABELS[retriever]}"
            for column in ctx.columns:
                table.put(row, column.header, difference_cell(
                    ctx, sources["query"], sources["passage"], column.dataset, column.split, column.measure,
                    PERCENT, paper.table1_value(method, "query", retriever, column.paper, query.query_count),
                    paper.table1_value(method, "passage", retriever, column.paper), column.missing))
    query_counts = {v.method: v.query_count for v in map(ctx.query_variant, PRETRAINING_METHODS) if v}
    table.notes.append(
        "Paper values are the paper's own reproductions (its rows 'coCondenser 120k' and 'CoT-MAE 50k'), "
        "trained with the same recipe as its QaC rows; its QaC rows equal its Table 3 rows for C=5. "
        "MASTER's figures (its own paper, without distillation: MRR@10 38.3 retriever 1, 40.4 and R@1k 98.8 "
        "retriever 2) come from SimLM's fine-tuning pipeline, not this recipe: shown as cited beside our "
        "passage-context MASTER rows in columns on MS MARCO dev with its whole corpus, never compared; the paper "
        "has no MASTER QaC row. "
        f"Our QaC rows use C = {query_counts or 'n/a'} (tables.main_query_count); a row of another C than "
        "the paper's is not compared with it.")
    if "beir" not in retrievers:
        table.notes.append(f"No rows for the {RETRIEVER_LABELS['beir']}: this profile does not train it "
                           f"(tables.zero_shot_retriever: {ctx.zero_shot_retriever}; beir runs the beir_retriever "
                           "stage).")
    unshown = _unshown_paper_columns(ctx)
    if unshown:
        table.notes.append(f"The paper's columns {', '.join(unshown)} have no counterpart in this profile "
                           "(tables.in_domain_columns).")
    return table


# ---------------------------------------------------------------- Table 2

def _zero_shot_split(source: Source | None, dataset: str) -> str:
    """The split a zero-shot dataset was evaluated on (``test`` when there are several)."""
    splits = source.splits(dataset) if source is not None else []
    return "test" if "test" in splits or not splits else splits[0]


def _paper_difference(with_: float | None, without: float | None) -> float | None:
    """The paper's difference of two printed values, None where it prints either not (MASTER)."""
    return None if with_ is None or without is None else round(with_ - without, 6)


def table2_zero_shot(ctx: TableContext) -> Table:
    """Table 2: zero-shot nDCG@10 per dataset, without (passage) and with (query) context."""
    methods = [m for m in PRETRAINING_METHODS if ctx.variant(m, "passage") or ctx.variant(m, "query")]
    columns = []
    retriever = ctx.zero_shot_retriever
    table = Table("table2", f"Table 2: zero-shot nDCG@10 ({RETRIEVER_LABELS.get(retriever, retriever)})",
                  FRACTION, columns)
    for method in methods:
        name = paper.METHOD_NAMES[method]
        columns += [f"{name} w/o (passage)", f"{name} w/ (query)", f"{name} Δ"]
        table.short_columns.update({f"{name} w/o (passage)": f"{name} w/o", f"{name} w/ (query)": f"{name} w/",
                                    f"{name} Δ": "Δ"})
    sums: dict[str, list[float]] = {column: [] for column in columns}
    paper_average_rows = []
    for dataset in ctx.zero_shot_datasets:
        for method in methods:
            name = paper.METHOD_NAMES[method]
            sources = {}
            for context, label in (("passage", f"{name} w/o (passage)"), ("query", f"{name} w/ (query)")):
                variant = ctx.variant(method, context)
                sources[context] = ctx.study.finetuned(variant.name, retriever) if variant else None
                query_count = variant.query_count if variant else paper.PAPER_QUERY_COUNT
                cell = metric_cell(sources[context], dataset, _zero_shot_split(sources[context], dataset), "nDCG@10",
                                   FRACTION, paper.table2_value(dataset, method, context, query_count),
                                   None if variant else ctx.missing_reason(method, context))
                cell.recipe = ctx.recipe(variant) if variant else None
                if cell.paper is None and cell.note is None:
                    cell.note = (paper.configuration_note(context, query_count)
                                 if paper.table2_value(dataset, method, context) is not None
                                 else f"{dataset} is not in the paper's Table 2")
                table.put(dataset, label, cell, dataset if cell.paper is not None else None)
                if cell.value is not None:
                    sums[label].append(cell.value)
            query = ctx.variant(method, "query")
            table.put(dataset, f"{name} Δ", difference_cell(
                ctx, sources["query"], sources["passage"], dataset, _zero_shot_split(sources["query"], dataset),
                "nDCG@10", FRACTION,
                paper.table2_value(dataset, method, "query", query.query_count if query else None),
                paper.table2_value(dataset, method, "passage")))
        if paper.table2_value(dataset, "cocondenser", "query") is not None:
            paper_average_rows.append(dataset)
    if ctx.zero_shot_datasets:
        for method in methods:
            name = paper.METHOD_NAMES[method]
            counts = {}
            for context, label in (("passage", f"{name} w/o (passage)"), ("query", f"{name} w/ (query)")):
                variant = ctx.variant(method, context)
                counts[context] = variant.query_count if variant else None
                complete = len(sums[label]) == len(ctx.zero_shot_datasets)
                table.put("average", label, paper_row="average", cell=Cell(
                    value=math.fsum(sums[label]) / len(sums[label]) if complete else None,
                    paper=paper.table2_value("average", method, context, counts[context]),
                    note=None if complete else "not every dataset has a value",
                    recipe=ctx.recipe(variant) if variant else None))
            without, with_ = table.cell("average", f"{name} w/o (passage)"), table.cell("average", f"{name} w/ (query)")
            paper_with = paper.table2_value("average", method, "query", counts["query"])
            table.put("average", f"{name} Δ", Cell(
                difference=True,
                value=None if without.value is None or with_.value is None else with_.value - without.value,
                paper=_paper_difference(paper_with, paper.table2_value("average", method, "passage")),
                note="mean of the per-dataset values: no per-query test"))
    table.notes.append(
        f"Our average is over the {plural(len(ctx.zero_shot_datasets), 'dataset')} above; the paper's is over "
        f"its 14 BEIR datasets ({len(paper_average_rows)} of ours {'is' if len(paper_average_rows) == 1 else 'are'} "
        "among them).")
    return table


# ---------------------------------------------------------------- Table 3

# Table 3's columns as (retriever, paper key), in the paper's order: retriever 1's MRR@10 and R@50, whose
# figures paper_results.yaml holds, then those the paper prints but paper_results.yaml lacks (a profile shows
# each whose paper key its tables.in_domain_columns has); and the columns with a Δ vs passage context.
TABLE3_R1_KEYS = ("mrr@10", "r@50")
TABLE3_EXTRA_COLUMNS = tuple(paper.TABLE3_UNPUBLISHED_COLUMNS.values())
TABLE3_DIFFERENCES = (("r1", "mrr@10"), ("r1", "r@50"), ("r2", "mrr@10"))


@dataclass(frozen=True)
class _Table3Column:
    retriever: str
    column: MetricColumn

    @property
    def prefix(self) -> str:
        # Retriever 1's MRR@10/R@50 heads stay bare, as they were before the other columns: `qac check` keys
        # cells by their heads, so recorded expected values keep their keys.
        return "" if self.retriever == "r1" else f"{RETRIEVER_LABELS[self.retriever]} "

    @property
    def header(self) -> str:
        return self.prefix + self.column.header

    @property
    def difference_header(self) -> str:
        return f"Δ {self.prefix}{self.column.label} vs passage context"

    @property
    def short_prefix(self) -> str:
        return f"R{self.retriever[1:]} "

    @property
    def published(self) -> bool:
        """Whether paper_results.yaml holds the paper's Table 3 figures of this column."""
        return self.retriever == "r1" and self.column.paper in TABLE3_R1_KEYS


def _table3_columns(ctx: TableContext) -> list[_Table3Column]:
    wanted = [("r1", key) for key in TABLE3_R1_KEYS] + list(TABLE3_EXTRA_COLUMNS)
    return [_Table3Column(retriever, ctx.column(key)) for retriever, key in wanted if ctx.column(key) is not None]


def table3_query_count(ctx: TableContext) -> Table:
    """Table 3: C = 1, 5, 10, 20 (what the profile has) generated queries per passage.

    Retriever 1's MRR@10 and R@50 beside the paper's figures; retriever 2's
    MRR@10 and R@50 and retriever 1's TREC DL 2019/2020 nDCG@10 (where the
    profile has those columns) with ours only: the paper prints them, but
    paper_results.yaml does not hold them.
    """
    specs = _table3_columns(ctx)
    differences = [spec for spec in specs if (spec.retriever, spec.column.paper) in TABLE3_DIFFERENCES]
    columns = [spec.header for spec in specs] + [spec.difference_header for spec in differences]
    table = Table("table3", "Table 3: number of generated queries per passage (retriever 1 where a column names "
                  "no retriever)", PERCENT, columns)
    for spec in specs:
        _describe_columns(table, [spec.column], spec.prefix, spec.short_prefix)
        table.column_retrievers[spec.header] = spec.retriever
    for spec in differences:
        table.short_columns[spec.difference_header] = f"Δ {spec.short_prefix}{spec.column.short_header}"
        table.column_retrievers[spec.difference_header] = spec.retriever

    def paper_value(spec: _Table3Column, method: str, query_count: int) -> float | None:
        return paper.table3_value(method, query_count, spec.column.paper, spec.retriever)

    def paper_difference(spec: _Table3Column, method: str, query_count: int) -> float | None:
        return _paper_difference(paper_value(spec, method, query_count),
                                 paper.table1_value(method, "passage", spec.retriever, spec.column.paper))

    for method in PRETRAINING_METHODS:
        passage = ctx.variant(method, "passage")
        passage_sources = {retriever: ctx.study.finetuned(passage.name, retriever) if passage else None
                           for retriever in ("r1", "r2")}
        if passage is not None:
            table.baselines[method] = {
                spec.header: metric_cell(passage_sources[spec.retriever], spec.column.dataset, spec.column.split,
                                         spec.column.measure, PERCENT, None, spec.column.missing).value
                for spec in specs}
        variants = sorted((v for v in ctx.study.variants() if v.method == method and v.context_type == "query"),
                          key=lambda v: v.query_count or 0)
        if not variants and passage is None:
            continue
        by_count = {v.query_count: v for v in variants}
        for query_count in sorted(set(by_count) | set(paper.TABLE3_QUERY_COUNTS)):
            row = f"{paper.METHOD_NAMES[method]} C={query_count}"
            paper_row = paper.table3_row(method, query_count)
            variant = by_count.get(query_count)
            if variant is None:
                # The paper's C that the profile has no variant for: every cell says so, never another C's value.
                reason = f"no query-context {paper.METHOD_NAMES[method]} variant with C = {query_count} in this profile"
                for spec in specs:
                    table.put(row, spec.header, Cell(paper=paper_value(spec, method, query_count), note=reason),
                              paper_row)
                for spec in differences:
                    table.put(row, spec.difference_header, Cell(
                        difference=True, paper=paper_difference(spec, method, query_count), note=reason), paper_row)
                continue
            sources = {retriever: ctx.study.finetuned(variant.name, retriever) for retriever in ("r1", "r2")}
            table.row_info[row] = {"method": method, "query_count": variant.query_count, "variant": variant.name}
            for spec in specs:
                column = spec.column
                cell = metric_cell(sources[spec.retriever], column.dataset, column.split, column.measure, PERCENT,
                                   paper_value(spec, method, query_count), column.missing)
                cell.recipe = ctx.recipe(variant)
                table.put(row, spec.header, cell, paper_row)
            for spec in differences:
                column = spec.column
                table.put(row, spec.difference_header, difference_cell(
                    ctx, sources[spec.retriever], passage_sources[spec.retriever], column.dataset, column.split,
                    column.measure, PERCENT, paper_value(spec, method, query_count),
                    paper.table1_value(method, "passage", spec.retriever, column.paper),
                    column.missing), paper_row)
    if not any(spec.published for spec in specs):
        table.notes.append("the profile's tables.in_domain_columns map no column to the paper's mrr@10 or r@50")
    if any(not spec.published for spec in specs):
        table.notes.append(
            "The paper's Table 3 also reports retriever 2 (MRR@10, R@50) and, from retriever 2, TREC DL 2019/2020 "
            "nDCG@10; paper_results.yaml holds those figures for C = 5 only (Table 1's retriever-2 QaC row): the "
            "other rows of these columns show this study's values only.")
    return table


# ---------------------------------------------------------------- Table 4

def table4_mixed_context(ctx: TableContext) -> Table:
    """Table 4: passage context vs query context vs the 50/50 mix of both."""
    wanted = [("r1", "mrr@10"), ("r1", "r@50"), ("r2", "mrr@10")]
    specs = [(retriever, ctx.column(key), key) for retriever, key in wanted if ctx.column(key) is not None]
    headers = [f"{RETRIEVER_LABELS[retriever]} {column.header}" for retriever, column, _ in specs]
    table = Table("table4", "Table 4: mixed context", PERCENT, headers)
    for retriever, column, _ in specs:
        _describe_columns(table, [column], f"{RETRIEVER_LABELS[retriever]} ", f"R{retriever[1:]} ")
    for method in PRETRAINING_METHODS:
        variants = {context: ctx.variant(method, context) for context in CONTEXT_TYPES}
        if not any(variants.values()):
            continue
        sources = {}
        for context, variant in variants.items():
            if variant is None:
                continue
            for (retriever, column, key), header in zip(specs, headers):
                sources[(context, retriever)] = source = ctx.study.finetuned(variant.name, retriever)
                cell = metric_cell(source, column.dataset, column.split, column.measure, PERCENT,
                                   paper.table4_value(method, context, retriever, key, variant.query_count),
                                   column.missing)
                cell.recipe = ctx.recipe(variant)
                if cell.paper is None and cell.note is None:
                    cell.note = paper.configuration_note(context, variant.query_count)
                table.put(variant.label, header, cell, paper.table4_row(method, context))
        for context, variant in variants.items():
            if variant is None:
                row = f"{paper.METHOD_NAMES[method]} {context} context"
                for (retriever, column, key), header in zip(specs, headers):
                    table.put(row, header, Cell(paper=paper.table4_value(method, context, retriever, key),
                                                note=ctx.missing_reason(method, context)),
                              paper.table4_row(method, context))
        for with_, without in (("mixed", "query"), ("mixed", "passage"), ("query", "passage")):
            if variants[with_] is None or variants[without] is None:
                continue
            row = f"Δ {paper.METHOD_NAMES[method]} {with_} − {without} context"
            for (retriever, column, key), header in zip(specs, headers):
                table.put(row, header, difference_cell(
                    ctx, sources[(with_, retriever)], sources[(without, retriever)], column.dataset, column.split,
                    column.measure, PERCENT,
                    paper.table4_value(method, with_, retriever, key, variants[with_].query_count),
                    paper.table4_value(method, without, retriever, key, variants[without].query_count),
                    column.missing))
    table.notes.append("The paper's Table 4 has no passage-context row; its passage values come from its Table 1 "
                       "reproductions.")
    return table


# ---------------------------------------------------------------- Table 5

def table5_annotation(ctx: TableContext) -> Table:
    """Table 5: share of highly correlated pairs, passage-passage vs passage-query."""
    table = Table("table5", "Table 5: pair correlation (annotation study)", PERCENT,
                  ["high correlation %", "pairs", "labels"], count_columns={"pairs"})
    table.short_columns.update({"high correlation %": "high corr. (%)"})
    found = ctx.study.annotation()
    labels = found.summary.get("labels", "unknown") if found else None
    per_document = study_annotation.labels_by_kind(found.labels_text) if found and found.labels_text else {}
    note = None if found else "no annotation/summary.json: run the annotation stage"
    run_id = found.run_id if found else None
    source = found.relative if found else None
    shares = (found.summary["shares"] if found else {})
    # The paper's shares are human majority labels: compared only with human labels, else shown beside.
    human = bool(found) and found.summary.get("label_source") == "human"
    for kind in study_annotation.PAIR_KINDS:
        share = (shares.get(kind) or {}).get("share")
        count = (shares.get(kind) or {}).get("pairs")
        share = None if share is None or (isinstance(share, float) and math.isnan(share)) else float(share)
        table.put(kind, "high correlation %", Cell(value=None if share is None else share * 100,
                                                   paper=paper.table5_value(kind) if human else None,
                                                   cited=None if human else paper.table5_value(kind),
                                                   run_id=run_id, source=source,
                                                   metric=study_annotation.share_metric(kind), note=note,
                                                   n_queries=None if share is None else count),
                  paper.table5_row(kind))
        table.put(kind, "pairs", Cell(value=None if count is None else float(count), paper=200.0, run_id=run_id,
                                      source=source, metric=study_annotation.count_metric(kind), note=note))
        table.put(kind, "labels", Cell(run_id=run_id, text=labels, note=note, source=source))
    row = "Δ passage-query − passage-passage"
    paper_diff = round(paper.table5_value("passage-query") - paper.table5_value("passage-passage"), 6)
    diff = Cell(difference=True, paper=paper_diff if human else None, cited=None if human else paper_diff)
    if found is not None:
        values = [table.cell(kind, "high correlation %").value for kind in study_annotation.PAIR_KINDS]
        diff.run_id = diff.compared_run_id = run_id
        diff.source = diff.compared_source = "annotation/labels.csv" if found.labels_text else source
        if None not in values:
            diff.value = values[1] - values[0]
        pq, pp = per_document.get("passage-query"), per_document.get("passage-passage")
        if pq and pp:
            result = compare_paired(pq, pp, ctx.permutations, ctx.seed)
            diff.p_value, diff.n_queries = result.p_value, result.n_queries
            diff.mde = None if result.mde is None else result.mde * 100
            diff.note = "paired by document; " + (result.note or f"{result.n_queries} documents")
        else:
            diff.note = "no annotation/labels.csv: no significance test"
    else:
        diff.note = "no annotation/summary.json: run the annotation stage"
    table.put(row, "high correlation %", diff)
    if found is not None and not human:
        _judge_calibration(table, row, found.summary.get("judge") or {})
    if labels:
        table.notes.append(f"Labels: {labels}. Paper: 3 human votes per pair (6 annotators in two groups), majority label.")
    if not human:
        table.notes.append(f"{paper.CITED_WHY['table5']}; ours are not human labels: the paper's are shown beside "
                           "(cited), not compared.")
    return table


# A judge's labels carry a finding only when it tells pairs apart well. Its calibration set is balanced
# (relevant vs random pairs), where accuracy a shrinks a true difference of shares to (2a - 1) of its size
# (Youden's J) before noise: below 80% the Δ of its labels is under 60% of the pairs' own and says more
# about the judge than about the pairs. A judgement, stated here so that every report applies the same one.
JUDGE_MIN_ACCURACY = 0.8


def _judge_calibration(table: Table, row: str, judge: dict[str, Any]) -> None:
    """The automatic judge's calibration beside its Δ; a Δ of a poorly calibrated judge's labels is no finding."""
    cell = table.cell(row, "high correlation %")
    accuracy, f1 = judge.get("accuracy"), judge.get("f1")
    if accuracy is None or f1 is None:
        cell.caveat = "no finding: the judge's calibration is not recorded"
        table.put(row, "labels", Cell(text="automatic judge, calibration not recorded"))
        return
    pairs = f"{judge.get('positives', '?')} relevant vs {judge.get('negatives', '?')} random pairs"
    where = f" of {judge['source']}" if judge.get("source") else ""
    table.put(row, "labels", Cell(text=f"automatic judge's calibration: accuracy {accuracy:.1%}, F1 {f1:.2f} "
                                       f"({pairs}{where})"))
    if accuracy < JUDGE_MIN_ACCURACY:
        cell.caveat = (f"no finding: judge accuracy {accuracy:.1%}, F1 {f1:.2f}, below "
                       f"{JUDGE_MIN_ACCURACY:.0%}")
        table.notes.append(f"{row}: the automatic judge separates relevant from random pairs with accuracy "
                           f"{accuracy:.1%} (F1 {f1:.2f}) on its calibration pairs, below {JUDGE_MIN_ACCURACY:.0%}: "
                           "its labels' Δ is shown without a test and is no finding about the pairs.")
