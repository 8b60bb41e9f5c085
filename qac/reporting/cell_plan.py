"""Which run produces each numeric cell of the paper's Tables 1-5, before anything runs.

``qac profile plan NAME --cells`` prints, for every number of
``paper_results.yaml``, the variant (method, context type, C) and retriever
whose outputs produce it, the stages and the DVC outputs, and the recipe the
runs follow (qac/deviations.yaml). Only the profile's parameters are read, so
a user sees on any machine, before spending a GPU-hour, that every cell is
covered by a run of the paper's configuration.

A cell is one of:

- ``produced``: a run of the study yields it (a variant of the same method,
  context type and C as the paper's row, or the BM25 / annotation stages);
- ``derived``: computed from produced cells (Table 2's average);
- ``cited``: a row the paper copies from another publication (ANCE, the
  original coCondenser and CoT-MAE papers, ...), or a figure of another
  configuration than the profile runs: MASTER's own paper (SimLM's
  fine-tuning pipeline), the paper's BM25 (Anserini, k1 0.82 / b 0.68,
  title-less) where the profile's BM25 is not that, Table 5's human labels
  where the profile's are the automatic judge's. The tables show a cited
  figure beside ours; `qac check` never compares it;
- ``missing``: the profile has no run of that configuration; ``reason`` says
  what is lacking. A cell is never taken from a run of another configuration.

The paper's Table 3 also prints retriever 2's MRR@10 and R@50 and (from
retriever 2) TREC DL 2019/2020 nDCG@10, figures ``paper_results.yaml``'s
Table 3 does not hold (:data:`qac.reporting.paper.TABLE3_UNPUBLISHED_COLUMNS`):
those cells are planned too (:func:`plan_unpublished_cells`), their paper
values for C = 5 taken from Table 1's retriever-2 QaC row, none for the other C.

Only a ``produced`` cell with a paper value is compared (``compared``); its
run is the paper's configuration for that cell: the same method, context
type, C and retriever.

Extensions of the study are planned apart (:func:`plan_extension_cells`):
the variants of ``llm_queries.variants`` (queries from a prompted LLM,
filtered or not) fill a table of their own, one row per variant and
retriever, the profile's in-domain columns, beside the paper's run of the
same method, context type and C (the profile's own generator's queries:
doc2query in the paper profile). They have no paper value, so nothing
compares them; no paper cell reads them (``find`` skips
them), and ``--cost`` gives each cell the GPU-hours of its runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qac.reporting import paper
from qac.deviations import recipe_summary
from qac.gpu_cost import LLM_GENERATION, extension_costs, variant_hours
from qac.reference import published_figure, reference_slug

if TYPE_CHECKING:
    from qac.params.sections import Params

PRODUCED, DERIVED, CITED, MISSING = "produced", "derived", "cited", "missing"

# Table 1 rows the paper produced itself (BM25 and its reproductions and QaC runs); the rest are cited.
_TABLE1_PRODUCED = {row: key for key, row in paper._TABLE1_ROWS.items()}
_TABLE1_CITED = {row: key for key, row in paper._TABLE1_CITED_ROWS.items()}
# Table 4: (method, context type) of each row; the "not mixed" rows are the query-context runs.
_TABLE4_ROWS = {row: key for key, row in paper._TABLE4_ROWS.items()}
_TABLE4_COLUMNS = {column: key for key, column in paper._TABLE4_COLUMNS.items()}
_TABLE2_COLUMNS = {column: (method, ("passage", "query")[index])
                   for method, columns in paper._TABLE2_COLUMNS.items() for index, column in enumerate(columns)}
_TABLE5_ROWS = {row: kind for kind, row in paper._TABLE5_ROWS.items()}


@dataclass
class PlannedCell:
    table: str
    row: str                       # the paper's row
    column: str                    # the paper's column
    paper: float | None            # None: a cell the paper prints but paper_results.yaml lacks
    status: str
    variant: str | None = None
    context_type: str | None = None
    query_count: int | None = None
    method: str | None = None
    retriever: str | None = None
    stages: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    recipe: str | None = None
    reason: str | None = None
    seeds: list[int] = field(default_factory=list)   # the seeds the cell's value averages (one run per seed)

    @property
    def compared(self) -> bool:
        """Whether `qac check` compares our value with the paper's (produced, with a paper value)."""
        return self.status == PRODUCED and self.paper is not None


class _Profile:
    """The parts of a profile's parameters the plan needs."""

    def __init__(self, params: Params):
        self.params = params
        self.name = params.profile
        self.root = f"{params.data_dir}/{self.name}"
        extensions = params.llm_queries.variants          # planned apart: plan_extension_cells
        self.variants = {name: spec for name, spec in params.pretrain.variants.items()
                         if name not in extensions and spec.seed_of not in extensions}
        self.columns = {spec.paper: spec for spec in params.tables.in_domain_columns if spec.paper}
        self.zero_shot = list(params.zero_shot)
        self.zero_shot_variants = params.evaluate.zero_shot_variants
        self.zero_shot_retrievers = params.evaluate.zero_shot_retrievers
        self.zero_shot_retriever = params.tables.zero_shot_retriever

    def find(self, method: str, context_type: str, query_count: int | None) -> str | None:
        """The variant of exactly this configuration (any C for passage context), or None."""
        for name, spec in self.variants.items():
            if spec.seed_of:    # a seed copy is read with its variant
                continue
            if spec.method != method or spec.context_type != context_type:
                continue
            if context_type == "passage" or spec.query_count == query_count:
                return name
        return None

    def recipe(self, variant: str | None) -> str:
        return recipe_summary(self.params, self.variants.get(variant) if variant else None)

    def variant_cell(self, cell: PlannedCell, method: str, context_type: str, query_count: int | None,
                     retriever: str, dataset: str | None, split: str | None, reason: str | None = None) -> PlannedCell:
        cell.method, cell.context_type, cell.retriever = method, context_type, retriever
        cell.query_count = query_count if context_type != "passage" else None
        variant = self.find(method, context_type, query_count)
        if variant is None:
            configuration = f"{context_type} context" + (f", C = {query_count}" if context_type != "passage" else "")
            cell.status, cell.reason = MISSING, f"no {paper.METHOD_NAMES[method]} variant with {configuration}"
            return cell
        if reason:
            cell.status, cell.reason, cell.variant = MISSING, reason, variant
            return cell
        cell.status, cell.variant, cell.recipe = PRODUCED, variant, self.recipe(variant)
        runs = self.seed_runs(variant)
        cell.seeds = [seed for _, seed in runs]
        cell.stages = [f"{stage}@{name}" for name, _ in runs for stage in ("pretrain", "finetune", "evaluate")]
        cell.outputs = [path for name, _ in runs for path in (
            f"{self.root}/eval/{name}/{retriever}/{dataset}/{split}.per_query.json",
            f"{self.root}/finetune/{name}/{retriever}")]
        return cell

    def seed_runs(self, variant: str) -> list[tuple[str, int]]:
        """``(variant name, seed)`` of each run behind ``variant``: itself, then its seed copies."""
        names = [variant] + [name for name, spec in self.variants.items() if spec.seed_of == variant]
        return [(name, self.variants[name].seed or self.params.seed) for name in names]

    def in_domain(self, column: str) -> tuple[str | None, str | None, str | None]:
        """``(dataset, split, reason)`` of the profile's column standing for the paper's ``column``."""
        spec = self.columns.get(column)
        if spec is None:
            return None, None, f"the profile has no column for the paper's {column} (tables.in_domain_columns)"
        if spec.missing:
            return None, None, spec.missing
        return spec.dataset or self.params.train_dataset, spec.split, None


def plan_cells(params: Params) -> list[PlannedCell]:
    """Every numeric cell of ``paper_results.yaml`` with the run of this profile that produces it."""
    profile = _Profile(params)
    published = paper.load_paper_results()
    cells: list[PlannedCell] = []
    for table_key, table in published.items():
        for row, values in table["rows"].items():
            for column, value in zip(table["columns"], values):
                if value is None:
                    continue
                cell = PlannedCell(table_key, row, column, float(value), MISSING)
                cells.append(_plan(profile, cell))
    return cells


def plan_unpublished_cells(params: Params) -> list[PlannedCell]:
    """The cells of the paper's Table 3 whose figures ``paper_results.yaml`` lacks, with the run of this profile.

    Retriever 2's MRR@10 and R@50 and retriever 1's TREC DL 2019/2020
    nDCG@10 of each of its rows (method, C); ``paper`` is None.
    """
    profile = _Profile(params)
    cells = []
    for row in paper.load_paper_results()["table3_query_count"]["rows"]:
        method, query_count = _table3_configuration(row)
        for column, (retriever, key) in paper.TABLE3_UNPUBLISHED_COLUMNS.items():
            dataset, split, reason = profile.in_domain(key)
            published = paper.table3_value(method, query_count, key, retriever)
            cells.append(profile.variant_cell(PlannedCell("table3_query_count", row, column, published, MISSING),
                                              method, "query", query_count, retriever, dataset, split, reason))
    return cells


def plan_reference_cells(params: Params) -> list[PlannedCell]:
    """Table 1's reference rows: each released retriever (``reference_retrievers``) and each of its published
    figures the profile has a column for, produced by stage ``reference``; compared on a whole corpus, cited
    where the profile cuts it."""
    # here, not at the top: it loads numpy
    from qac.reporting.tables import corpus_cut

    profile = _Profile(params)
    cells = []
    for spec in params.reference_retrievers:
        for key, column in profile.columns.items():
            if column.missing:
                continue
            dataset, split, _ = profile.in_domain(key)
            figure = published_figure(params, spec, dataset, split, column.measure)
            if figure is None:
                continue
            cell = PlannedCell("reference", spec, key, float(figure["value"]) * 100, PRODUCED, retriever="reference",
                               stages=["reference"], recipe=f"as published: encoders.{spec}; {figure['source']}",
                               outputs=[f"{profile.root}/reference/{reference_slug(spec)}/{dataset}/{split}"
                                        ".per_query.json"])
            if corpus_cut(params, dataset) is not None:
                cell.status, cell.reason = CITED, (f"the published figure is on the whole {dataset} corpus; this "
                                                   "profile cuts it: cited, not compared")
            cells.append(cell)
    return cells


EXTENSION_LLM = "extension_llm_queries"
LLM_FILTERED = "filtered.arrow"          # what filter_llm_queries writes (qac.stages.llm_queries.FILTERED, above)
EXTENSION_RETRIEVERS = ("r1", "r2")


def extension_row(spec) -> str:
    """The extension table's row of an ``llm_queries.variants`` entry (``coCondenser query C=5 qwen25-3b filtered``)."""
    return (f"{paper.METHOD_NAMES.get(spec.method, spec.method)} {spec.context_type} C={spec.query_count} "
            f"{spec.generator} " + ("filtered" if spec.filtered else "unfiltered"))


def extension_column(retriever: str, column) -> str:
    """The extension table's column of retriever ``r1``/``r2`` and an in-domain column (``r2 MS MARCO dev MRR@10``)."""
    return f"{retriever} {column.label}"


def plan_extension_cells(params: Params) -> list[PlannedCell]:
    """The LLM-query extension table: for each ``llm_queries.variants`` entry and retriever, a cell per in-domain
    column the profile has, produced by its generator's stages and its own pre-training, fine-tuning and
    evaluation; ``reason`` names the paper's run it stands beside (same method, context type and C)."""
    profile, cells = _Profile(params), []
    for name, spec in params.llm_queries.variants.items():
        generator = spec.generator
        baseline = profile.find(spec.method, spec.context_type, spec.query_count)
        queries = f"{profile.root}/llm_queries/{generator}/" + (LLM_FILTERED if spec.filtered else "queries.arrow")
        stages = [f"generate_llm_queries@{generator}"] + ([f"filter_llm_queries@{generator}"] if spec.filtered else [])
        stages += [f"{stage}@{name}" for stage in ("pretrain_llm", "finetune_llm", "evaluate_llm")]
        row = extension_row(spec)
        for retriever in EXTENSION_RETRIEVERS:
            for key, column in profile.columns.items():
                dataset, split, reason = profile.in_domain(key)
                cell = PlannedCell(EXTENSION_LLM, row, extension_column(retriever, column), None, MISSING,
                                   variant=name, method=spec.method, context_type=spec.context_type, query_count=spec.query_count,
                                   retriever=retriever)
                if reason:
                    cell.reason = reason
                else:
                    cell.status, cell.stages, cell.recipe = PRODUCED, list(stages), profile.recipe(name)
                    cell.outputs = [queries, f"{profile.root}/eval/{name}/{retriever}/{dataset}/{split}.per_query.json"]
                    cell.reason = (f"beside {baseline or 'no paper run of this configuration'} "
                                   "(the profile's own generator's queries)")
                cells.append(cell)
    return cells


def _table3_configuration(row: str) -> tuple[str, int]:
    """``(method, C)`` of a row of the paper's Table 3 (``coCondenser q=5``)."""
    match = re.fullmatch(r"(.+) q=(\d+)", row)
    return {name: key for key, name in paper.METHOD_NAMES.items()}[match.group(1)], int(match.group(2))


def _plan(profile: _Profile, cell: PlannedCell) -> PlannedCell:
    if cell.table == "table1_main":
        key = _TABLE1_PRODUCED.get(cell.row)
        if key is None:
            cited = _TABLE1_CITED.get(cell.row)
            cell.status, cell.reason = CITED, "the paper cites this row from another publication"
            if cited:
                cell.method, cell.context_type, cell.retriever = cited
                cell.reason = paper.CITED_WHY[cited[0]]
            return cell
        method, context_type, retriever = key
        dataset, split, reason = profile.in_domain(cell.column)
        if method == "bm25":
            if reason:
                cell.status, cell.reason = MISSING, reason
                return cell
            different = paper.bm25_like_for_like(profile.params)
            if different:
                cell.status, cell.retriever, cell.reason = CITED, "bm25", different
                return cell
            cell.status, cell.retriever, cell.stages = PRODUCED, "bm25", ["bm25"]
            cell.outputs = [f"{profile.root}/bm25/runs/{dataset}/{split}.per_query.json"]
            cell.recipe = profile.recipe(None)
            return cell
        return profile.variant_cell(cell, method, context_type, paper.PAPER_QUERY_COUNT, retriever, dataset, split,
                                    reason)
    if cell.table == "table2_beir":
        method, context_type = _TABLE2_COLUMNS[cell.column]
        retriever = profile.zero_shot_retriever
        if cell.row == "average":
            cell.status, cell.method, cell.context_type = DERIVED, method, context_type
            cell.reason = "mean of the column's datasets"
            return cell
        reason = None
        variant = profile.find(method, context_type, paper.PAPER_QUERY_COUNT)
        if cell.row not in profile.zero_shot:
            reason = f"{cell.row} is not among the profile's zero_shot datasets"
        elif profile.zero_shot_variants is not None and variant not in profile.zero_shot_variants:
            reason = f"{variant} is not in evaluate.zero_shot_variants"
        elif (retriever != "beir" and profile.zero_shot_retrievers is not None
              and retriever not in profile.zero_shot_retrievers):
            reason = f"{retriever} is not in evaluate.zero_shot_retrievers"
        planned = profile.variant_cell(cell, method, context_type, paper.PAPER_QUERY_COUNT, retriever, cell.row,
                                       "test", reason)
        if retriever == "beir" and planned.status == PRODUCED:   # the beir_retriever stage trains and scores it
            planned.stages = [f"pretrain@{planned.variant}", "beir_retriever"]
            planned.outputs = [f"{profile.root}/beir/{planned.variant}/eval/{cell.row}/test.per_query.json"]
        return planned
    if cell.table == "table3_query_count":
        method, query_count = _table3_configuration(cell.row)
        dataset, split, reason = profile.in_domain(cell.column)
        return profile.variant_cell(cell, method, "query", query_count, "r1", dataset, split, reason)
    if cell.table == "table4_mixed_context":
        method, context_type = _TABLE4_ROWS[cell.row]
        retriever, column = _TABLE4_COLUMNS[cell.column]
        dataset, split, reason = profile.in_domain(column)
        return profile.variant_cell(cell, method, context_type, paper.PAPER_QUERY_COUNT, retriever, dataset, split,
                                    reason)
    if cell.table == "table5_pair_correlation":
        annotation = profile.params.annotation
        cell.stages = ["annotation"]
        cell.outputs = [f"{profile.root}/annotation/summary.json"]
        cell.context_type = _TABLE5_ROWS.get(cell.row)
        if annotation.human_sheets:
            cell.status, cell.recipe = PRODUCED, "human labels: " + ", ".join(annotation.human_sheets)
        else:
            cell.status = CITED
            cell.reason = (f"{paper.CITED_WHY['table5']}; this profile labels with the automatic judge "
                           f"({annotation.judge}) until people label the sheet: shown beside, "
                           "not compared")
        return cell
    cell.reason = f"table {cell.table} is not one of the paper's Tables 1-5"
    return cell


def describe(cell: PlannedCell) -> str:
    """One line: the cell, what produces it, and the recipe."""
    published = "–" if cell.paper is None else f"{cell.paper:g}"
    head = f"{cell.table:22} {cell.row[:44]:44} {cell.column:14} {published:>7}  {cell.status:8}"
    if cell.status == PRODUCED:
        what = cell.variant or ", ".join(cell.stages)
        if cell.retriever and cell.variant:
            what += f" {cell.retriever}"
        if len(cell.seeds) > 1:
            what += f" x {len(cell.seeds)} seeds ({', '.join(map(str, cell.seeds))}: mean and spread)"
        return f"{head} {what}  <- {', '.join(cell.outputs)}  [{cell.recipe}]"
    return f"{head} {cell.reason}"


def _counts(cells: list[PlannedCell]) -> dict[str, int]:
    return {status: sum(cell.status == status for cell in cells) for status in (PRODUCED, DERIVED, CITED, MISSING)}


def print_extension_plan(params: Params, rates=None) -> None:
    """The extension tables' cells (LLM queries), each with the GPU-hours of its runs when ``rates`` is given
    (:func:`qac.gpu_cost.extension_costs`): its variant's pre-training, fine-tuning and encodings, and its
    generator's generation per million split passages (shared by the variants on that generator)."""
    cells = plan_extension_cells(params)
    if not cells:
        return
    hours: dict[str, str] = {}
    if rates is not None:
        rows = extension_costs(params, rates)
        generation = {row["variant"]: row["hours"] for row in rows if row["stage"] == LLM_GENERATION}
        for name, spec in params.llm_queries.variants.items():
            runs, generate = variant_hours(rows, name), generation.get(spec.generator)
            hours[name] = ("GPU-hours: " + (f"{runs:,.0f}" if runs is not None else "n/a")
                           + " (pre-training, fine-tuning, encodings; " + ("" if rates.measured else "NOT ")
                           + f"measured rates, {rates.device}) + "
                           + (f"{generate:,.1f}" if generate is not None else "n/a")
                           + f" per million split passages ({spec.generator}'s generation, shared by its variants: "
                             "FLOPs at 35% MFU, not measured)")
    counts = _counts(cells)
    print(f"profile {params['profile']}: {len(cells)} cells of the extension table {EXTENSION_LLM} "
          "(LLM-query variants, no paper value, never among the paper's cells): "
          + ", ".join(f"{count} {status}" for status, count in counts.items() if count))
    for cell in cells:
        line = describe(cell) + (f"  {cell.reason}" if cell.status == PRODUCED else "")
        print(line + (f"  {hours[cell.variant]}" if cell.variant in hours else ""))


def print_cell_plan(params: Params, rates=None) -> int:
    """Print the plan, then the extension tables' cells (with their GPU-hours when ``rates`` is given); exit
    status 1 when a cell of the paper is missing (one with a paper value or one without)."""
    cells, unpublished = plan_cells(params), plan_unpublished_cells(params)
    counts, unpublished_counts = _counts(cells), _counts(unpublished)
    runs = len({stage for cell in cells for stage in cell.stages if stage.startswith("pretrain@")})
    print(f"profile {params['profile']}: {len(cells)} numeric cells of the paper's Tables 1-5: "
          + ", ".join(f"{count} {status}" for status, count in counts.items())
          + f"; they read {runs} pre-trained runs (variant x seed)")
    for cell in cells:
        print(describe(cell))
    print(f"profile {params['profile']}: {len(unpublished)} cells of the paper's Table 3 beyond "
          "paper_results.yaml's Table 3 (retriever 2's MRR@10 and R@50 and TREC DL 2019/2020 nDCG@10; paper values "
          "for C = 5 from Table 1's retriever-2 QaC row, – for the other C): "
          + ", ".join(f"{count} {status}" for status, count in unpublished_counts.items() if status in (PRODUCED, MISSING)))
    for cell in unpublished:
        print(describe(cell))
    references = plan_reference_cells(params)
    print(f"profile {params['profile']}: {len(references)} cells of reference rows (released retrievers evaluated as "
          "published, stage reference; their published figures): "
          + ", ".join(f"{count} {status}" for status, count in _counts(references).items() if count))
    for cell in references:
        print(describe(cell))
    print_extension_plan(params, rates)
    return 1 if counts[MISSING] or unpublished_counts[MISSING] else 0
