"""`qac profile plan NAME --cells`: every numeric cell of the paper's Tables 1-5 and the run that produces it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from qac.config import render_profile
from qac.params import validate_params, with_values
from qac.reporting.cell_plan import CITED, DERIVED, MISSING, PRODUCED, plan_cells, plan_unpublished_cells
from qac.reporting.paper import load_paper_results

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def paper_params():
    return validate_params(render_profile("paper", REPO / "profiles"))


def without_variant(params, name: str, **tables):
    """``params`` without pretrain variant ``name`` (and with ``tables`` keys set): a profile lacking a run."""
    variants = {key: spec.to_dict() for key, spec in params.pretrain.variants.items() if key != name}
    return with_values(params, {"pretrain.variants": variants, **{f"tables.{k}": v for k, v in tables.items()}})


def _paper_configuration(table: str, row: str, column: str) -> tuple[str, str, int | None]:
    """(method, context type, C) of a paper cell, read from the paper's own row and column names."""
    method = "cotmae" if row.startswith("CoT-MAE") or column.startswith("CoT-MAE") else "cocondenser"
    if row.startswith("MASTER"):      # MASTER's own paper, beside the query-as-context paper's rows
        method = "master"
    if table == "table1_main":
        return method, ("query", 5) if "+QaC" in row else ("passage", None)
    if table == "table2_beir":
        return method, ("query", 5) if column.endswith("_w") else ("passage", None)
    if table == "table3_query_count":
        return method, ("query", int(re.search(r"q=(\d+)", row).group(1)))
    if table == "table4_mixed_context":
        return method, ("query", 5) if row.endswith("not mixed") else ("mixed", 5)
    raise AssertionError(table)


def test_every_numeric_cell_of_the_paper_is_planned_once_and_none_is_missing(paper_params):
    published = load_paper_results()
    expected = {(table, row, column): value for table, spec in published.items()
                for row, values in spec["rows"].items() for column, value in zip(spec["columns"], values)
                if value is not None}
    cells = plan_cells(paper_params)
    assert len(cells) == len(expected) == len({(c.table, c.row, c.column) for c in cells})
    assert {(c.table, c.row, c.column): c.paper for c in cells} == expected
    assert [c for c in cells if c.status == MISSING] == []


def test_no_cell_is_borrowed_from_another_configuration(paper_params):
    variants = paper_params["pretrain"]["variants"]
    produced = [c for c in plan_cells(paper_params) if c.status == PRODUCED and c.variant]
    assert len(produced) > 100
    for cell in produced:
        method, (context_type, query_count) = _paper_configuration(cell.table, cell.row, cell.column)
        spec = variants[cell.variant]
        assert (spec["method"], spec["context_type"]) == (method, context_type), cell
        if context_type != "passage":
            assert spec["query_count"] == query_count, cell
        if cell.retriever == "beir":   # Table 2: the beir_retriever stage's zero-shot retriever of the variant
            assert cell.table == "table2_beir" and cell.stages[-1] == "beir_retriever", cell
            assert cell.outputs == [f"data/paper/beir/{cell.variant}/eval/{cell.row}/test.per_query.json"]
        else:   # the evaluation file and the fine-tuned model it scored
            assert cell.outputs == [f"data/paper/eval/{cell.variant}/{cell.retriever}/"
                                    + cell.outputs[0].split(f"/{cell.retriever}/", 1)[1],
                                    f"data/paper/finetune/{cell.variant}/{cell.retriever}"]
        assert cell.recipe.startswith("release recipe"), cell      # the paper profile runs what the authors ran


def test_cited_and_derived_cells_are_exactly_the_papers_borrowed_rows_and_the_average(paper_params):
    cells = plan_cells(paper_params)
    cited = {c.row for c in cells if c.status == CITED}
    assert "ANCE" in cited and "coCondenser (paper)" in cited and "CoT-MAE (paper)" in cited
    assert not any("repro" in row or "+QaC" in row for row in cited)
    assert {c.table for c in cells if c.status == CITED} == {"table1_main", "table5_pair_correlation"}
    assert {(c.table, c.row) for c in cells if c.status == DERIVED} == {("table2_beir", "average")}
    # Figures of another configuration than the profile runs are cited, never compared: MASTER's own paper
    # (SimLM's fine-tuning), Table 5's human labels (the profile's are the automatic judge's).
    master = {(c.row, c.column): c for c in cells if c.row.startswith("MASTER")}
    assert {key: c.paper for key, c in master.items()} == {
        ("MASTER (its paper, retriever1)", "mrr@10"): 38.3, ("MASTER (its paper, retriever2)", "mrr@10"): 40.4,
        ("MASTER (its paper, retriever2)", "r@1k"): 98.8}
    assert all(c.status == CITED and "SimLM" in c.reason for c in master.values())
    # The paper profile runs the paper's BM25 (Anserini's k1 0.82 / b 0.68, title-less, Lucene's analyzer as
    # close as bm25s allows): produced and compared. Another BM25 is only cited.
    assert {c.status for c in cells if c.row == "BM25"} == {PRODUCED}
    params = with_values(paper_params, {"bm25.k1": 0.9, "bm25.b": 0.4})
    bm25 = [c for c in plan_cells(params) if c.row == "BM25"]
    assert len(bm25) == 5 and all(c.status == CITED and "k1 0.9 (paper 0.82), b 0.4 (paper 0.68)" in c.reason
                                  for c in bm25)
    table5 = [c for c in cells if c.table == "table5_pair_correlation"]
    assert [c.paper for c in table5] == [35.5, 56.5]
    assert all(c.status == CITED and "human majority labels" in c.reason for c in table5)
    # With human labels, Table 5 is the paper's configuration, and produced.
    params = with_values(paper_params, {"annotation.human_sheets": ["annotation/group1.csv"]})
    assert {c.status for c in plan_cells(params) if c.table == "table5_pair_correlation"} == {PRODUCED}


def _paper_retriever(table: str, row: str, column: str) -> str:
    """The retriever of a paper cell, read from its row and column names (Table 3's DL columns are retriever 2's)."""
    if table == "table1_main":
        return "r2" if "retriever2" in row else "r1"
    if table == "table2_beir":
        return "beir"
    if table == "table3_query_count":
        return "r2" if column.startswith("r2_") or column.startswith("ndcg@10_dl") else "r1"
    return column[:2]    # table4: r1_mrr@10, r1_r@50, r2_mrr@10


def test_every_compared_cell_is_a_run_of_the_papers_configuration(paper_params):
    """Method, context type, C and retriever of each compared cell's run equal the paper's for that cell."""
    variants = paper_params["pretrain"]["variants"]
    compared = [c for c in plan_cells(paper_params) + plan_unpublished_cells(paper_params) if c.compared]
    assert len(compared) > 100
    for cell in (c for c in compared if c.row != "BM25"):
        method, (context_type, query_count) = _paper_configuration(cell.table, cell.row, cell.column)
        spec = variants[cell.variant]
        assert (spec["method"], spec["context_type"]) == (method, context_type), cell
        assert context_type == "passage" or spec["query_count"] == query_count, cell
        assert cell.retriever == _paper_retriever(cell.table, cell.row, cell.column), cell
    # Table 3's TREC DL cells come from retriever 2; those of C = 5 carry Table 1's retriever-2 QaC figures.
    dl = {(c.row, c.column): c for c in compared if c.column.startswith("ndcg@10_dl") and c.table.startswith("table3")}
    assert {key: c.paper for key, c in dl.items()} == {
        ("coCondenser q=5", "ndcg@10_dl19"): 73.1, ("coCondenser q=5", "ndcg@10_dl20"): 71.8,
        ("CoT-MAE q=5", "ndcg@10_dl19"): 71.5, ("CoT-MAE q=5", "ndcg@10_dl20"): 72.7}
    assert all(c.retriever == "r2" for c in dl.values())
    # BM25 is compared only where the profile runs the paper's BM25.
    bm25 = [c for c in compared if c.row == "BM25"]
    assert len(bm25) == 5 and all(c.outputs[0].startswith("data/paper/bm25/runs/msmarco-passage/") for c in bm25)
    assert {key: paper_params["bm25"][key] for key in ("k1", "b", "in_domain_title")} == {
        "k1": 0.82, "b": 0.68, "in_domain_title": False}
    params = with_values(paper_params, {"bm25.in_domain_title": True})
    assert not [c for c in plan_cells(params) if c.row == "BM25" and c.compared]


def test_a_missing_variant_is_reported_never_replaced_by_another_c(paper_params):
    params = without_variant(paper_params, "cotmae-query-q10")
    cells = [c for c in plan_cells(params) if c.table == "table3_query_count" and c.row == "CoT-MAE q=10"]
    assert [c.status for c in cells] == [MISSING, MISSING]
    assert all(c.variant is None and "C = 10" in c.reason for c in cells)


def test_table3_cells_the_paper_prints_but_paper_results_lacks_are_planned_from_their_own_runs(paper_params):
    """Retriever 2's MRR@10 and R@50 and TREC DL 2019/2020 nDCG@10 (retriever 2's) of each Table 3 row: paper
    values for C = 5 from Table 1's retriever-2 QaC row, none for the other C."""
    variants = paper_params["pretrain"]["variants"]
    cells = plan_unpublished_cells(paper_params)
    rows = list(load_paper_results()["table3_query_count"]["rows"])
    assert {(c.row, c.column) for c in cells} == {(row, column) for row in rows for column in
                                                  ("r2_mrr@10", "r2_r@50", "ndcg@10_dl19", "ndcg@10_dl20")}
    assert len(cells) == 4 * len(rows) == 32
    assert all(c.table == "table3_query_count" and c.status == PRODUCED for c in cells)
    assert {(c.row, c.column): c.paper for c in cells if c.paper is not None} == {
        ("coCondenser q=5", "r2_mrr@10"): 39.4, ("coCondenser q=5", "r2_r@50"): 88.6,
        ("coCondenser q=5", "ndcg@10_dl19"): 73.1, ("coCondenser q=5", "ndcg@10_dl20"): 71.8,
        ("CoT-MAE q=5", "r2_mrr@10"): 40.2, ("CoT-MAE q=5", "r2_r@50"): 88.8,
        ("CoT-MAE q=5", "ndcg@10_dl19"): 71.5, ("CoT-MAE q=5", "ndcg@10_dl20"): 72.7}
    for cell in cells:
        method, (context_type, query_count) = _paper_configuration(cell.table, cell.row, cell.column)
        spec = variants[cell.variant]
        assert (spec["method"], spec["context_type"], spec["query_count"]) == (method, "query", query_count), cell
        retriever = "r2"   # Table 3's TREC DL figures are retriever 2's
        split = {"ndcg@10_dl19": "dl19", "ndcg@10_dl20": "dl20"}.get(cell.column, "dev")
        assert cell.retriever == retriever
        assert cell.stages == [f"pretrain@{cell.variant}", f"finetune@{cell.variant}", f"evaluate@{cell.variant}"]
        assert cell.outputs == [f"data/paper/eval/{cell.variant}/{retriever}/msmarco-passage/{split}.per_query.json",
                                f"data/paper/finetune/{cell.variant}/{retriever}"]
    r2 = next(c for c in cells if (c.row, c.column) == ("CoT-MAE q=10", "r2_mrr@10"))
    assert r2.variant == "cotmae-query-q10" and r2.outputs[1] == "data/paper/finetune/cotmae-query-q10/r2"
    # A missing variant or column is reported, never replaced by another C's run or another column.
    params = without_variant(paper_params, "cotmae-query-q10", in_domain_columns=[
        c.to_dict() for c in paper_params.tables.in_domain_columns if c.paper != "ndcg@10_dl20"])
    missing = [c for c in plan_unpublished_cells(params) if c.status == MISSING]
    assert {(c.row, c.column) for c in missing} == (
        {("CoT-MAE q=10", column) for column in ("r2_mrr@10", "r2_r@50", "ndcg@10_dl19", "ndcg@10_dl20")}
        | {(row, "ndcg@10_dl20") for row in rows})
    assert all(c.variant is None for c in missing if c.row == "CoT-MAE q=10")
    assert "no column for the paper's ndcg@10_dl20" in next(c for c in missing if c.row == "coCondenser q=1").reason


def test_the_command_prints_every_cell_and_fails_where_one_is_missing():
    paper = subprocess.run([sys.executable, "-m", "qac.cli", "profile", "plan", "paper", "--cells"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert paper.returncode == 0, paper.stderr
    # 196 of the query-as-context paper and MASTER paper's MRR@10 beside them
    published = load_paper_results()
    total = sum(value is not None for table in published.values() for values in table["rows"].values()
                for value in values)
    assert f"{total} numeric cells" in paper.stdout and "0 missing" in paper.stdout
    assert "cotmae-query-q10 r1  <- data/paper/eval/cotmae-query-q10/r1/msmarco-passage/dev.per_query.json" \
        in paper.stdout
    # Table 3's cells without a paper value follow, with the fine-tuned retriever 2 behind each.
    assert ("32 cells of the paper's Table 3 beyond paper_results.yaml's Table 3 (retriever 2's MRR@10 and R@50 and "
            "TREC DL 2019/2020 nDCG@10; paper values for C = 5 from Table 1's retriever-2 QaC row, – for the other "
            "C): 32 produced, 0 missing") in paper.stdout
    line = next(line for line in paper.stdout.splitlines() if " CoT-MAE q=10 " in line and " r2_mrr@10 " in line)
    assert " – " in line and ("cotmae-query-q10 r2  <- data/paper/eval/cotmae-query-q10/r2/msmarco-passage/"
                              "dev.per_query.json, data/paper/finetune/cotmae-query-q10/r2") in line
    smoke = subprocess.run([sys.executable, "-m", "qac.cli", "profile", "plan", "smoke", "--cells"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert smoke.returncode == 1 and " missing " in smoke.stdout
    assert "no column for the paper's ndcg@10_dl19" in smoke.stdout   # the smoke profile has no TREC DL column
