"""The LLM-query extension table: query-as-context on queries from a prompted LLM, beside the profile's generator.

The paper's question, asked again with another generator: does pre-training
with query context still beat passage context, and by more or less, when the
queries come from a prompted causal LM (``llm_queries``) instead of the
profile's own generator (doc2query T5 in the paper profile)? For each
``llm_queries.variants`` entry the table holds

- the LLM-query variant (its row named as :func:`qac.reporting.cell_plan.extension_row`
  names it, so that the planned cells are the table's cells);
- the profile's variant of the same method, context and C on its own generator's
  queries, and the method's passage-context variant;
- Δ rows with a paired test, CI and Holm's correction as in Tables 1-5: the LLM
  variant minus the profile's generator, minus passage context, and filtered
  minus unfiltered where both ran;

in each retriever's in-domain columns. What the variant's queries were (how
many the generator wrote, the share its filters kept) comes from the record
the pre-training wrote beside its encoder (``pretrain/<variant>/queries.json``,
:func:`qac.stages.pretrain_llm.queries_record`). The extension never stands in
for a cell of the paper's tables (:func:`qac.reporting.lineage.load_study`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qac.deviations import recipe_summary
from qac.reporting import paper
from qac.reporting.cell_plan import EXTENSION_LLM, EXTENSION_RETRIEVERS, extension_column, extension_row
from qac.reporting.lineage import Variant, read_json
from qac.reporting.tables import PERCENT, RETRIEVER_LABELS, Table, TableContext, difference_cell, metric_cell

if TYPE_CHECKING:
    from qac.params.sections import Params

QUERIES_RECORD = "queries.json"      # pretrain/<variant>/queries.json (qac.stages.pretrain_llm)


def _columns(ctx: TableContext) -> list[tuple[str, Any]]:
    """``(retriever, in-domain column)`` of every column the extension table has: those with a paper key, as
    the cell plan has them."""
    return [(retriever, column) for retriever in EXTENSION_RETRIEVERS for column in ctx.columns if column.paper]


def _same_configuration(ctx: TableContext, method: str, context_type: str, query_count: int | None) -> Variant | None:
    """The profile's own variant of exactly this configuration (any C for passage context)."""
    for variant in ctx.study.variants():
        if variant.method == method and variant.context_type == context_type and (
                context_type == "passage" or variant.query_count == query_count):
            return variant
    return None


def queries_figures(ctx: TableContext, name: str) -> dict[str, Any] | None:
    """The record of the queries LLM-query variant ``name`` pre-trained on, or None before it ran."""
    path = ctx.study.root / "pretrain" / name / QUERIES_RECORD
    return read_json(path) if path.is_file() else None


def _put_row(ctx: TableContext, table: Table, row: str, name: str | None, recipe: str | None) -> None:
    for retriever, column in _columns(ctx):
        source = ctx.study.finetuned(name, retriever) if name else None
        cell = metric_cell(source, column.dataset, column.split, column.measure, PERCENT, None, column.missing)
        cell.recipe = recipe
        table.put(row, extension_column(retriever, column), cell)


def _put_difference(ctx: TableContext, table: Table, row: str, with_name: str, without_name: str) -> None:
    for retriever, column in _columns(ctx):
        table.put(row, extension_column(retriever, column), difference_cell(
            ctx, ctx.study.finetuned(with_name, retriever), ctx.study.finetuned(without_name, retriever),
            column.dataset, column.split, column.measure, PERCENT, None, None, column.missing))


def _queries_note(name: str, record: dict[str, Any] | None) -> str:
    if record is None:
        return f"{name}: not pre-trained yet (no pretrain/{name}/{QUERIES_RECORD})"
    generation, filtering = record.get("generation") or {}, record.get("filter") or {}
    parts = [f"{name}: {record.get('queries', '?')} queries of generator {record.get('generator')} "
             f"({record.get('model')}, revision {record.get('revision')}) over {record.get('passages', '?')} passages, "
             f"{record.get('passages_with_queries', '?')} with at least one"]
    if generation.get("queries") is not None:
        parts.append(f"the generator wrote {int(generation['queries'])}")
    if record.get("filtered") and filtering:
        shares = [f"{key.split('/', 1)[1] if '/' in key else 'all filters'} {value:.1%}"
                  for key, value in sorted(filtering.items()) if key.startswith("kept_share")]
        parts.append("kept by the filters: " + ", ".join(shares))
        if "judge/high_share/before" in filtering and "judge/high_share/after" in filtering:
            parts.append(f"Table 5's judge calls {filtering['judge/high_share/before']:.1%} of the first queries "
                         f"highly correlated before filtering and {filtering['judge/high_share/after']:.1%} after")
    elif not record.get("filtered"):
        parts.append("unfiltered")
    return "; ".join(parts) + "."


def extension_llm_table(ctx: TableContext) -> Table | None:
    """The extension table of the profile's ``llm_queries.variants``; None when it declares none."""
    params: Params = ctx.params
    variants = params.llm_queries.variants
    if not variants:
        return None
    columns = _columns(ctx)
    table = Table(EXTENSION_LLM, "Extension: query-as-context with queries from a prompted LLM", PERCENT,
                  [extension_column(retriever, column) for retriever, column in columns], paper_side=False)
    for retriever, column in columns:
        header = extension_column(retriever, column)
        table.short_columns[header] = f"R{retriever[1:]} {column.short_header}"
        table.column_retrievers[header] = retriever
    shown: set[str] = set()
    for name, spec in variants.items():
        method_name = paper.METHOD_NAMES.get(spec.method, spec.method)
        own = _same_configuration(ctx, spec.method, spec.context_type, spec.query_count)
        passage = _same_configuration(ctx, spec.method, "passage", None)
        baselines = [(own, f"{own.label}, the profile's query generator" if own else None),
                     (passage, passage.label if passage else None)]
        for variant, row in baselines:
            if variant is not None and row not in shown:
                _put_row(ctx, table, row, variant.name, ctx.recipe(variant))
                shown.add(row)
        row = extension_row(spec)
        _put_row(ctx, table, row, name, recipe_summary(params, params.pretrain.variants.get(name)))
        table.row_info[row] = {"method": spec.method, "query_count": spec.query_count, "variant": name}
        for variant, label in baselines:
            if variant is not None:
                _put_difference(ctx, table, f"Δ {row} − {label}", name, variant.name)
        if own is None:
            table.notes.append(f"{row}: the profile has no {spec.context_type}-context {method_name} variant with "
                               f"C = {spec.query_count} on its own generator's queries to stand beside it.")
        table.notes.append(_queries_note(name, queries_figures(ctx, name)))
    for name, spec in variants.items():
        if not spec.filtered:
            continue
        twin = next((other for other, o in variants.items() if not o.filtered and (o.method, o.context_type,
                     o.query_count, o.generator) == (spec.method, spec.context_type, spec.query_count,
                                                     spec.generator)), None)
        if twin is not None:
            _put_difference(ctx, table, f"Δ {extension_row(spec)} − unfiltered", name, twin)
    table.notes.append(
        "Rows of the LLM-query variants (llm_queries.variants) are extensions of the study: never compared with "
        "the paper's figures, never part of Tables 1-5. Each LLM variant runs the recipe of the profile's own "
        f"variants; {', '.join(RETRIEVER_LABELS[r] for r in EXTENSION_RETRIEVERS)} as in Table 1.")
    return table
