"""Tables 1-5 of the paper, rebuilt from the study's MLflow runs.

Every cell holds our value, the paper's value for the row it maps to
(:mod:`qac.reporting.paper`), the MLflow run it came from and, when it is
missing, why. For each "with vs without query-as-context" pair a difference
cell carries the difference and the p-value of a paired randomization test
over the per-query metrics the evaluation stage logged as artifacts.

Units follow the paper: percentages in Tables 1, 3, 4 and 5, fractions
(nDCG@10) in Table 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from qac.reporting import paper
from qac.reporting.runs import RunRecord, StudyRuns, Variant
from qac.tracking import metric_key

PERCENT = "percent"
FRACTION = "fraction"
_SCALE = {PERCENT: 100.0, FRACTION: 1.0}
RETRIEVER_LABELS = {"r1": "retriever 1", "r2": "retriever 2"}
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

    @property
    def header(self) -> str:
        if self.paper:
            return f"{self.label} [paper: {PAPER_COLUMN_LABELS.get(self.paper, self.paper)}]"
        return self.label


@dataclass
class Cell:
    """One table cell. ``value`` and ``paper`` are in the table's unit.

    A difference cell (``difference=True``) holds with minus without
    query-as-context; ``run_id`` is the "with" run, ``compared_run_id`` the
    "without" run, and ``p_value`` the paired randomization test over
    ``n_queries`` queries.
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

    def put(self, row: str, column: str, cell: Cell, paper_row: str | None = None) -> None:
        if row not in self.rows:
            self.rows.append(row)
        self.cells[(row, column)] = cell
        if paper_row:
            self.paper_rows[row] = paper_row

    def cell(self, row: str, column: str) -> Cell:
        return self.cells.get((row, column), Cell(note="not applicable"))


def columns_from_params(params: Mapping[str, Any]) -> list[MetricColumn]:
    """The profile's in-domain columns (``tables.in_domain_columns``); ``dataset: null`` is the train dataset."""
    specs = params.get("tables", {}).get("in_domain_columns") or []
    if not specs:
        raise ValueError("params.yaml: tables.in_domain_columns is empty; Tables 1, 3 and 4 need at least one column")
    columns = []
    for index, spec in enumerate(specs):
        unknown = set(spec) - {"label", "dataset", "split", "measure", "paper", "missing"}
        if unknown or "label" not in spec:
            raise ValueError(f"params.yaml: tables.in_domain_columns[{index}]: needs 'label'; unknown keys {sorted(unknown)}")
        if not spec.get("missing") and not spec.get("measure"):
            raise ValueError(f"params.yaml: tables.in_domain_columns[{index}]: give 'measure' or 'missing'")
        spec = dict(spec)
        if not spec.get("missing"):
            spec["dataset"] = spec.get("dataset") or params.get("train_dataset")
            spec["split"] = spec.get("split") or "test"
        columns.append(MetricColumn(**spec))
    return columns


# ---------------------------------------------------------------- significance

def paired_p_value(with_values: Mapping[str, float], without_values: Mapping[str, float],
                   permutations: int = 10000, seed: int = 0) -> tuple[float | None, int, str | None]:
    """p-value of the paired two-sided randomization test for per-query ``{qid: value}`` of two systems.

    Returns ``(p, number of queries, note)``; the test is
    :func:`qac.evaluation.significance.randomization_test`. Queries present
    on one side only are left out, and the note says how many.
    """
    from qac.evaluation.significance import randomization_test

    shared = sorted(set(with_values) & set(without_values))
    note = None
    dropped = len(set(with_values) ^ set(without_values))
    if dropped:
        note = f"{dropped} queries evaluated for one system only were left out of the test"
    if len(shared) < 2:
        return None, len(shared), "fewer than 2 shared queries: no test"
    p_value = randomization_test({qid: with_values[qid] for qid in shared},
                                 {qid: without_values[qid] for qid in shared}, trials=permutations, seed=seed)
    return p_value, len(shared), note


# ---------------------------------------------------------------- cell builders

@dataclass
class TableContext:
    """What every table builder needs: the runs, the profile's columns and the test settings."""

    study: StudyRuns
    columns: list[MetricColumn]
    profile: str
    main_query_count: int | None = None
    zero_shot_datasets: list[str] = field(default_factory=list)
    zero_shot_retriever: str = "r1"
    permutations: int = 10000
    seed: int = 0

    @classmethod
    def from_params(cls, study: StudyRuns, params: Mapping[str, Any]) -> "TableContext":
        tables = params.get("tables", {})
        return cls(study=study, columns=columns_from_params(params), profile=params["profile"],
                   main_query_count=tables.get("main_query_count"),
                   zero_shot_datasets=list(params.get("zero_shot") or []),
                   zero_shot_retriever=tables.get("zero_shot_retriever", "r1"),
                   permutations=int(tables.get("permutations", 10000)), seed=int(params.get("seed", 0)))

    def column(self, paper_key: str) -> MetricColumn | None:
        return next((column for column in self.columns if column.paper == paper_key), None)

    def query_variant(self, method: str) -> Variant | None:
        """The query-context variant of ``method`` shown in Tables 1, 2 and 4."""
        candidates = [v for v in self.study.variants() if v.method == method and v.context_type == "query"]
        if not candidates:
            return None
        preferred = [v for v in candidates if v.query_count == self.main_query_count]
        return preferred[0] if preferred else max(candidates, key=lambda v: v.query_count or 0)

    def variant(self, method: str, context_type: str) -> Variant | None:
        if context_type == "query":
            return self.query_variant(method)
        candidates = [v for v in self.study.variants() if v.method == method and v.context_type == context_type]
        return max(candidates, key=lambda v: v.query_count or 0) if candidates else None


def metric_cell(run: RunRecord | None, dataset: str | None, split: str | None, measure: str | None, unit: str,
                paper_value: float | None, missing: str | None = None) -> Cell:
    """Our value of ``dataset/split/measure`` in ``run`` (or why there is none) beside the paper's."""
    cell = Cell(paper=paper_value)
    if missing:
        cell.note = missing
        return cell
    if run is None:
        cell.note = "no run for this row in the MLflow experiment"
        return cell
    cell.run_id = run.run_id
    cell.metric = metric_key(dataset, split, measure)
    value = run.metric(dataset, split, measure)
    if value is None:
        cell.note = f"run {run.run_id} ({run.name}) has no metric {cell.metric}"
    else:
        cell.value = value * _SCALE[unit]
    return cell


def difference_cell(ctx: TableContext, with_run: RunRecord | None, without_run: RunRecord | None,
                    dataset: str | None, split: str | None, measure: str | None, unit: str,
                    paper_with: float | None, paper_without: float | None, missing: str | None = None) -> Cell:
    """With minus without query-as-context, with the paired randomization p-value."""
    cell = Cell(difference=True)
    if paper_with is not None and paper_without is not None:
        cell.paper = round(paper_with - paper_without, 6)
    if missing:
        cell.note = missing
        return cell
    if with_run is None or without_run is None:
        cell.note = "one of the two runs is missing"
        return cell
    cell.run_id, cell.compared_run_id = with_run.run_id, without_run.run_id
    cell.metric = metric_key(dataset, split, measure)
    a, b = with_run.metric(dataset, split, measure), without_run.metric(dataset, split, measure)
    if a is None or b is None:
        cell.note = f"metric {cell.metric} missing in one of the two runs"
        return cell
    cell.value = (a - b) * _SCALE[unit]
    per_query_with = ctx.study.per_query(with_run, dataset, split, measure)
    per_query_without = ctx.study.per_query(without_run, dataset, split, measure)
    if per_query_with is None or per_query_without is None:
        cell.note = f"no per-query {measure} artifact per_query/{dataset}/{split}.json: no significance test"
        return cell
    cell.p_value, cell.n_queries, cell.note = paired_p_value(per_query_with, per_query_without,
                                                            ctx.permutations, ctx.seed)
    return cell


def _in_domain_cells(ctx: TableContext, table: Table, row: str, run: RunRecord | None, unit: str, paper_of,
                     paper_row: str | None = None) -> None:
    for column in ctx.columns:
        table.put(row, column.header, metric_cell(run, column.dataset, column.split, column.measure, unit,
                                                  paper_of(column.paper), column.missing), paper_row)


def _retriever_row(variant: Variant, retriever: str) -> str:
    return f"{variant.label}, {RETRIEVER_LABELS[retriever]}"


# ---------------------------------------------------------------- Table 1

def table1_in_domain(ctx: TableContext) -> Table:
    """Table 1: in-domain results of every retriever, baselines first."""
    table = Table("table1", "Table 1: in-domain retrieval", PERCENT, [c.header for c in ctx.columns])
    bm25 = ctx.study.baseline("bm25")
    _in_domain_cells(ctx, table, "BM25", bm25, PERCENT, lambda col: paper.table1_value("bm25", None, "bm25", col),
                     paper.table1_paper_row("bm25", None, "bm25"))
    if ctx.study.baseline("untuned") is not None:
        _in_domain_cells(ctx, table, "start encoder, not fine-tuned", ctx.study.baseline("untuned"), PERCENT,
                         lambda col: None)
    for variant in ctx.study.variants():
        if variant.method == "none":
            for retriever in ("r1", "r2"):
                _in_domain_cells(ctx, table, _retriever_row(variant, retriever),
                                 ctx.study.finetuned(variant.name, retriever), PERCENT, lambda col: None)
    for method in ("cocondenser", "cotmae"):
        passage, query = ctx.variant(method, "passage"), ctx.variant(method, "query")
        if passage is None and query is None:
            continue
        for retriever in ("r1", "r2"):
            runs = {}
            for context, variant in (("passage", passage), ("query", query)):
                if variant is None:
                    continue
                runs[context] = ctx.study.finetuned(variant.name, retriever)
                _in_domain_cells(ctx, table, _retriever_row(variant, retriever), runs[context], PERCENT,
                                 lambda col, c=context: paper.table1_value(method, c, retriever, col),
                                 paper.table1_paper_row(method, context, retriever))
            if passage is None or query is None:
                continue
            row = f"Δ {paper.METHOD_NAMES[method]} query − passage context, {RETRIEVER_LABELS[retriever]}"
            for column in ctx.columns:
                table.put(row, column.header, difference_cell(
                    ctx, runs["query"], runs["passage"], column.dataset, column.split, column.measure, PERCENT,
                    paper.table1_value(method, "query", retriever, column.paper),
                    paper.table1_value(method, "passage", retriever, column.paper), column.missing))
    query_counts = {v.method: v.query_count for v in (ctx.query_variant("cocondenser"), ctx.query_variant("cotmae")) if v}
    table.notes.append(
        "Paper values are the paper's own reproductions (its rows 'coCondenser 120k' and 'CoT-MAE 50k'), "
        "trained with the same recipe as its QaC rows; its QaC rows equal its Table 3 rows for C=5. "
        f"Our QaC rows use C = {query_counts or 'n/a'} (tables.main_query_count).")
    return table


# ---------------------------------------------------------------- Table 2

def _zero_shot_split(run: RunRecord | None, dataset: str) -> str | None:
    """The split a zero-shot dataset was evaluated on (``test`` when several)."""
    if run is None:
        return None
    prefix = f"{metric_key(dataset)}/"
    splits = sorted({key[len(prefix):].split("/")[0] for key in run.metrics if key.startswith(prefix)})
    return "test" if "test" in splits else (splits[0] if splits else None)


def table2_zero_shot(ctx: TableContext) -> Table:
    """Table 2: zero-shot nDCG@10 per dataset, without (passage) and with (query) context."""
    methods = [m for m in ("cocondenser", "cotmae") if ctx.variant(m, "passage") or ctx.variant(m, "query")]
    columns = []
    for method in methods:
        name = paper.METHOD_NAMES[method]
        columns += [f"{name} w/o (passage)", f"{name} w/ (query)", f"{name} Δ"]
    retriever = ctx.zero_shot_retriever
    table = Table("table2", f"Table 2: zero-shot nDCG@10 ({RETRIEVER_LABELS.get(retriever, retriever)})",
                  FRACTION, columns)
    sums: dict[str, list[float]] = {column: [] for column in columns}
    paper_average_rows = []
    for dataset in ctx.zero_shot_datasets:
        for method in methods:
            name = paper.METHOD_NAMES[method]
            runs = {}
            for context, label in (("passage", f"{name} w/o (passage)"), ("query", f"{name} w/ (query)")):
                variant = ctx.variant(method, context)
                runs[context] = ctx.study.finetuned(variant.name, retriever) if variant else None
                split = _zero_shot_split(runs[context], dataset) or "test"
                cell = metric_cell(runs[context], dataset, split, "nDCG@10", FRACTION,
                                   paper.table2_value(dataset, method, context),
                                   None if variant else f"no {context}-context {name} variant in this profile")
                if cell.paper is None and cell.note is None:
                    cell.note = f"{dataset} is not in the paper's Table 2"
                table.put(dataset, label, cell, dataset if cell.paper is not None else None)
                if cell.value is not None:
                    sums[label].append(cell.value)
            split = _zero_shot_split(runs["query"], dataset) or "test"
            table.put(dataset, f"{name} Δ", difference_cell(
                ctx, runs["query"], runs["passage"], dataset, split, "nDCG@10", FRACTION,
                paper.table2_value(dataset, method, "query"), paper.table2_value(dataset, method, "passage")))
        if paper.table2_value(dataset, "cocondenser", "query") is not None:
            paper_average_rows.append(dataset)
    if ctx.zero_shot_datasets:
        for method in methods:
            name = paper.METHOD_NAMES[method]
            for context, label in (("passage", f"{name} w/o (passage)"), ("query", f"{name} w/ (query)")):
                complete = len(sums[label]) == len(ctx.zero_shot_datasets)
                table.put("average", label, paper_row="average", cell=Cell(
                    value=sum(sums[label]) / len(sums[label]) if complete else None,
                    paper=paper.table2_value("average", method, context),
                    note=None if complete else "not every dataset has a value"))
            without, with_ = table.cell("average", f"{name} w/o (passage)"), table.cell("average", f"{name} w/ (query)")
            table.put("average", f"{name} Δ", Cell(
                difference=True,
                value=None if without.value is None or with_.value is None else with_.value - without.value,
                paper=round(paper.table2_value("average", method, "query") - paper.table2_value("average", method, "passage"), 6),
                note="mean of the per-dataset values: no per-query test"))
    table.notes.append(
        f"Our average is over the {len(ctx.zero_shot_datasets)} datasets above; the paper's is over its 14 BEIR "
        f"datasets ({len(paper_average_rows)} of ours are among them).")
    return table


# ---------------------------------------------------------------- Table 3

def table3_query_count(ctx: TableContext) -> Table:
    """Table 3: retriever 1 with C = 1, 5, 10, 20 (what the profile has) generated queries per passage."""
    measures = [ctx.column(key) for key in ("mrr@10", "r@50")]
    measures = [column for column in measures if column is not None]
    columns = [column.header for column in measures] + [f"Δ {column.label} vs passage context" for column in measures]
    table = Table("table3", "Table 3: number of generated queries per passage (retriever 1)", PERCENT, columns)
    for method in ("cocondenser", "cotmae"):
        passage = ctx.variant(method, "passage")
        passage_run = ctx.study.finetuned(passage.name, "r1") if passage else None
        variants = sorted((v for v in ctx.study.variants() if v.method == method and v.context_type == "query"),
                          key=lambda v: v.query_count or 0)
        for variant in variants:
            row = f"{paper.METHOD_NAMES[method]} C={variant.query_count}"
            run = ctx.study.finetuned(variant.name, "r1")
            table.row_info[row] = {"method": method, "query_count": variant.query_count, "variant": variant.name}
            for column in measures:
                table.put(row, column.header, metric_cell(
                    run, column.dataset, column.split, column.measure, PERCENT,
                    paper.table3_value(method, variant.query_count, column.paper), column.missing),
                    paper.table3_row(method, variant.query_count))
                table.put(row, f"Δ {column.label} vs passage context", difference_cell(
                    ctx, run, passage_run, column.dataset, column.split, column.measure, PERCENT,
                    paper.table3_value(method, variant.query_count, column.paper),
                    paper.table1_value(method, "passage", "r1", column.paper), column.missing))
    if not measures:
        table.notes.append("the profile's tables.in_domain_columns map no column to the paper's mrr@10 or r@50")
    return table


# ---------------------------------------------------------------- Table 4

def table4_mixed_context(ctx: TableContext) -> Table:
    """Table 4: passage context vs query context vs the 50/50 mix of both."""
    wanted = [("r1", "mrr@10"), ("r1", "r@50"), ("r2", "mrr@10")]
    specs = [(retriever, ctx.column(key), key) for retriever, key in wanted if ctx.column(key) is not None]
    headers = [f"{RETRIEVER_LABELS[retriever]} {column.header}" for retriever, column, _ in specs]
    table = Table("table4", "Table 4: mixed context", PERCENT, headers)
    for method in ("cocondenser", "cotmae"):
        variants = {context: ctx.variant(method, context) for context in ("passage", "query", "mixed")}
        if not any(variants.values()):
            continue
        runs = {}
        for context, variant in variants.items():
            if variant is None:
                continue
            row = f"{variant.label}"
            for (retriever, column, key), header in zip(specs, headers):
                runs[(context, retriever)] = run = ctx.study.finetuned(variant.name, retriever)
                table.put(row, header, metric_cell(run, column.dataset, column.split, column.measure, PERCENT,
                                                   paper.table4_value(method, context, retriever, key), column.missing),
                          paper.table4_row(method, context))
        for with_, without in (("mixed", "query"), ("mixed", "passage"), ("query", "passage")):
            if variants[with_] is None or variants[without] is None:
                continue
            row = f"Δ {paper.METHOD_NAMES[method]} {with_} − {without} context"
            for (retriever, column, key), header in zip(specs, headers):
                table.put(row, header, difference_cell(
                    ctx, runs[(with_, retriever)], runs[(without, retriever)], column.dataset, column.split,
                    column.measure, PERCENT, paper.table4_value(method, with_, retriever, key),
                    paper.table4_value(method, without, retriever, key), column.missing))
    table.notes.append("The paper's Table 4 has no passage-context row; its passage values come from its Table 1 "
                       "reproductions.")
    return table


# ---------------------------------------------------------------- Table 5

def table5_annotation(ctx: TableContext) -> Table:
    """Table 5: share of highly correlated pairs, passage-passage vs passage-query."""
    from qac.reporting import annotation

    table = Table("table5", "Table 5: pair correlation (annotation study)", PERCENT,
                  ["high correlation %", "pairs", "labels"], count_columns={"pairs"})
    run = ctx.study.named(annotation.RUN_NAME)
    labels = run.tags.get(annotation.LABELS_TAG, "unknown") if run else None
    per_document: dict[str, dict[str, float]] = {}
    if run is not None:
        text = ctx.study.artifact_text(run, annotation.LABELS_FILE)
        if text is not None:
            per_document = annotation.labels_by_kind(text)
    for kind in annotation.PAIR_KINDS:
        share = run.metrics.get(annotation.share_metric(kind)) if run else None
        count = run.metrics.get(annotation.count_metric(kind)) if run else None
        note = None if run else f"no MLflow run {annotation.RUN_NAME}: run the annotation stage"
        run_id = run.run_id if run else None
        table.put(kind, "high correlation %", Cell(value=None if share is None else share * 100,
                                                   paper=paper.table5_value(kind), run_id=run_id,
                                                   metric=annotation.share_metric(kind), note=note),
                  paper.table5_row(kind))
        table.put(kind, "pairs", Cell(value=count, paper=200.0, run_id=run_id,
                                      metric=annotation.count_metric(kind), note=note))
        table.put(kind, "labels", Cell(run_id=run_id, text=labels, note=note))
    row = "Δ passage-query − passage-passage"
    diff = Cell(difference=True, paper=round(paper.table5_value("passage-query") - paper.table5_value("passage-passage"), 6))
    if run is not None:
        shares = [run.metrics.get(annotation.share_metric(kind)) for kind in annotation.PAIR_KINDS]
        diff.run_id = diff.compared_run_id = run.run_id
        if None not in shares:
            diff.value = (shares[1] - shares[0]) * 100
        pq, pp = per_document.get("passage-query"), per_document.get("passage-passage")
        if pq and pp:
            diff.p_value, diff.n_queries, diff.note = paired_p_value(pq, pp, ctx.permutations, ctx.seed)
            diff.note = "paired by document; " + (diff.note or f"{diff.n_queries} documents")
        else:
            diff.note = f"no {annotation.LABELS_FILE} artifact: no significance test"
    else:
        diff.note = f"no MLflow run {annotation.RUN_NAME}"
    table.put(row, "high correlation %", diff)
    if labels:
        table.notes.append(f"Labels: {labels}. Paper: 3 human votes per pair (6 annotators in two groups), majority label.")
    return table


def build_tables(study: StudyRuns, params: Mapping[str, Any]) -> list[Table]:
    """Tables 1-5 for the profile in ``params`` from the runs in ``study``."""
    ctx = TableContext.from_params(study, params)
    return [table1_in_domain(ctx), table2_zero_shot(ctx), table3_query_count(ctx),
            table4_mixed_context(ctx), table5_annotation(ctx)]
