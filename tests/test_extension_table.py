"""The LLM-query extension table from a study's DVC outputs (tests/dvc_study.py), every value by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dvc_study import PROFILE, RAW_PARAMS, mean, per_query, study_params, write_study

RR_1 = "r1 SciFact test RR@10"
# (variant, retriever) -> RR@10 and Hit@50 per query q1..q4
LLM = {
    ("cocondenser-llm-q5", "r1"): ([0.5, 0.5, 0.6, 0.6], [1, 1, 1, 1]),
    ("cocondenser-llm-q5", "r2"): ([0.6, 0.6, 0.6, 0.6], [1, 1, 1, 1]),
    ("cocondenser-llm-q5-unfiltered", "r1"): ([0.2, 0.2, 0.2, 0.2], [0, 1, 0, 1]),
    ("cocondenser-llm-q5-unfiltered", "r2"): ([0.3, 0.3, 0.3, 0.3], [1, 1, 1, 1]),
}
RECORD = {"generator": "tiny", "model": "tiny-llama:minilm", "revision": None, "query_count": 5, "passages": 40,
          "passages_with_queries": 38, "queries": 150, "generation": {"queries": 390, "candidates": 400},
          "filter": {"kept_share": 0.5, "kept_share/copies": 0.9, "kept_share/round_trip": 0.5556,
                     "judge/high_share/before": 0.55, "judge/high_share/after": 0.75}}


def _params():
    variants = {"cocondenser-llm-q5": {"method": "cocondenser", "context_type": "query", "query_count": 5,
                                       "generator": "tiny"},
                "cocondenser-llm-q5-unfiltered": {"method": "cocondenser", "context_type": "query",
                                                  "query_count": 5, "generator": "tiny", "filtered": False}}
    return study_params(llm_queries={"generators": {"tiny": {"model": "tiny-llama:minilm", "revision": None, "chat": False}},
                                     "variants": variants})


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    data = write_study(tmp_path_factory.mktemp("study"))
    for (variant, retriever), (rr, hit) in LLM.items():
        folder = data / "eval" / variant / retriever / "scifact"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "test.per_query.json").write_text(json.dumps(per_query({"RR@10": rr, "Hit@50": hit})))
    for variant in ("cocondenser-llm-q5", "cocondenser-llm-q5-unfiltered"):
        filtered = not variant.endswith("unfiltered")
        record = {**RECORD, "filtered": filtered, "filter": RECORD["filter"] if filtered else None}
        (data / "pretrain" / variant).mkdir(parents=True, exist_ok=True)
        (data / "pretrain" / variant / "queries.json").write_text(json.dumps(record))
    return data


@pytest.fixture(scope="module")
def tables(study):
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    params = _params()
    return {table.key: table for table in build_tables(load_study(params, study), params)}


def test_the_extension_table_follows_the_papers_five_and_only_there(tables):
    from qac.reporting.cell_plan import EXTENSION_LLM

    assert list(tables)[-1] == EXTENSION_LLM
    for key in ("table1", "table3", "table4"):
        assert not [row for row in tables[key].rows if "llm" in row.lower() or "tiny" in row]


def test_each_llm_variant_stands_beside_the_profiles_generator_and_passage_context(tables):
    from qac.reporting.cell_plan import EXTENSION_LLM, plan_extension_cells

    table = tables[EXTENSION_LLM]
    planned = {(cell.row, cell.column) for cell in plan_extension_cells(_params())}
    assert planned <= set(table.cells)
    llm = table.cell("coCondenser query C=5 tiny filtered", RR_1)
    assert llm.value == pytest.approx(100 * mean(LLM[("cocondenser-llm-q5", "r1")][0]))
    own = table.cell("coCondenser+QaC (C=5), the profile's query generator", RR_1)
    assert own.value == pytest.approx(100 * mean([0.3, 0.4, 0.5, 0.4]))
    delta = table.cell("Δ coCondenser query C=5 tiny filtered − coCondenser+QaC (C=5), the profile's query generator",
                       RR_1)
    assert delta.difference and delta.value == pytest.approx(llm.value - own.value)
    assert delta.p_value is not None and delta.p_holm is not None and delta.ci is not None
    versus = table.cell("Δ coCondenser query C=5 tiny filtered − unfiltered", "r2 SciFact test RR@10")
    assert versus.value == pytest.approx(30.0)
    passage = table.cell("Δ coCondenser query C=5 tiny unfiltered − coCondenser passage context", RR_1)
    assert passage.value == pytest.approx(100 * (0.2 - mean([0.2, 0.3, 0.4, 0.3])))
    # the profile's DL20 column is missing: its cells say so, as in Table 1
    assert table.cell("coCondenser query C=5 tiny filtered", "r1 TREC DL20 nDCG@10").note.startswith("TREC DL 2020")


def test_the_notes_say_what_queries_each_variant_read(tables):
    from qac.reporting.cell_plan import EXTENSION_LLM

    notes = " ".join(tables[EXTENSION_LLM].notes)
    assert "cocondenser-llm-q5: 150 queries of generator tiny" in notes and "38 with at least one" in notes
    assert "kept by the filters: all filters 50.0%, copies 90.0%, round_trip 55.6%" in notes
    assert "55.0% of the first queries highly correlated before filtering and 75.0% after" in notes
    assert "cocondenser-llm-q5-unfiltered: 150 queries" in notes and "unfiltered." in notes


def test_the_generator_report_lists_the_llm_figures(study):
    from qac.reporting.generator_report import generator_rows
    from qac.reporting.lineage import load_study

    rows = {(source, metric): value for source, metric, value in generator_rows(load_study(_params(), study))}
    assert rows[("pretrain/cocondenser-llm-q5/queries.json", "filter/kept_share")] == 0.5
    assert rows[("pretrain/cocondenser-llm-q5/queries.json", "used/queries")] == 150
    assert ("pretrain/cocondenser-llm-q5-unfiltered/queries.json", "filter/kept_share") not in rows


def test_a_profile_without_llm_variants_has_no_extension_table(study):
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    params = study_params()
    assert RAW_PARAMS["profile"] == PROFILE
    assert [table.key for table in build_tables(load_study(params, study), params)][-1] == "table5"


def test_its_cells_print_ours_alone_as_the_paper_has_no_such_table(tables):
    from qac.reporting.cell_plan import EXTENSION_LLM
    from qac.reporting.render import to_latex, to_markdown

    table = tables[EXTENSION_LLM]
    text = to_markdown(table)
    assert "| coCondenser query C=5 tiny filtered | 55.0 | 100.0 |" in text and " / –" not in text
    assert "ours / paper" not in to_latex(table) and " / --" not in to_latex(table)
    assert " / " in to_markdown(tables["table1"])
