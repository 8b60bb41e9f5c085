"""Every table of a profile's report: Tables 1-5 of the paper (:mod:`qac.reporting.tables`), then the
extension table of its ``llm_queries.variants`` (:mod:`qac.reporting.extension_table`), each with Holm's
correction over its own tests and Table 1 with Judged@10 (:mod:`qac.reporting.reviewer_statistics`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qac.reporting.extension_table import extension_llm_table
from qac.reporting.lineage import Study
from qac.reporting.reviewer_statistics import add_judged_note, correct_within_table
from qac.reporting.tables import (Table, TableContext, table1_in_domain, table2_zero_shot, table3_query_count,
                                  table4_mixed_context, table5_annotation)

if TYPE_CHECKING:
    from qac.params.sections import Params


def build_tables(study: Study, params: Params) -> list[Table]:
    """Tables 1-5 for the profile in ``params`` from the outputs in ``study``, then the extension table of its
    ``llm_queries.variants`` where it declares any (:mod:`qac.reporting.extension_table`)."""
    ctx = TableContext.from_params(study, params)
    tables = [table1_in_domain(ctx), table2_zero_shot(ctx), table3_query_count(ctx),
              table4_mixed_context(ctx), table5_annotation(ctx)]
    extension = extension_llm_table(ctx)
    if extension is not None:          # the profile's llm_queries.variants: after the paper's tables
        tables.append(extension)
    add_judged_note(tables[0], ctx)
    for table in tables:
        correct_within_table(table)
    return tables
