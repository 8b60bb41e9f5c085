"""Tables 1-5 from a study's DVC outputs (tests/dvc_study.py): every expected cell is computed here by hand."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from dvc_study import (BM25, DL20, HIT50, PARAMS, PROFILE, RAW_PARAMS, RR, SEED, ZERO_SHOT, mean, run_id,
                       study_params, write_study)
from stages import load_stage

# z_0.975 + z_0.80 for a two-sided test at p < 0.05 with 80% power
Z = 1.959963984540054 + 0.8416212335729143


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_study(tmp_path_factory.mktemp("study"))


@pytest.fixture(scope="module")
def tables(data):
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    return {table.key: table for table in build_tables(load_study(PARAMS, data), PARAMS)}


def test_table1_cells_hold_our_value_the_papers_the_file_and_the_run(tables):
    from qac.reporting.render import cell_text

    table = tables["table1"]
    cell = table.cell("coCondenser+QaC (C=5), retriever 1", RR)
    assert cell.value == pytest.approx(40.0)           # mean RR@10 0.40, in percent
    assert cell.paper == 37.4                          # paper: coCondenser+QaC 120k retriever1, MRR@10
    assert cell.run_id == run_id("finetune/r1/cocondenser-query-q5")   # from finetune/<variant>/r1/mlflow_run.json
    assert cell.source == "eval/cocondenser-query-q5/r1/scifact/test.per_query.json"
    assert cell.n_queries == 4
    assert table.paper_rows["coCondenser+QaC (C=5), retriever 1"] == "coCondenser+QaC 120k retriever1"
    bm25 = table.cell("BM25", HIT50)
    # The paper's BM25 is Anserini's (k1 0.82, b 0.68, title-less); the fixture's is not: cited, not compared,
    # and only beside a column on the paper's own data: its 59.2 is MS MARCO dev's, this column SciFact's.
    assert (bm25.value, bm25.paper, bm25.cited, bm25.run_id) == (pytest.approx(50.0), None, None,
                                                                 run_id("baseline/bm25"))
    (note,) = [note for note in table.notes if note.startswith("BM25: the paper's BM25 is Anserini's (k1 0.82, b 0.68")]
    assert note.endswith("its figures are of MS MARCO (dev, TREC DL 2019 and 2020) and cited only beside a column "
                         "of ours on that data and its whole corpus: none in this profile.")
    assert cell_text(table, HIT50, bm25) == "50.0 / –"
    assert bm25.source == "bm25/runs/scifact/test.per_query.json"
    untuned = table.cell("start encoder, not fine-tuned", RR)
    assert untuned.value == pytest.approx(5.0) and untuned.run_id == run_id("eval/untuned/none")
    assert table.cell("no pre-training, retriever 2", RR).value == pytest.approx(20.0)


def test_rows_follow_the_declared_variants_that_were_evaluated(tables):
    rows = tables["table1"].rows
    assert not any(row.startswith("coCondenser+QaC (C=1)") for row in rows)   # Table 1 shows the largest C
    assert not any("CoT-MAE mixed" in row for row in rows)                    # declared, never evaluated
    assert rows[:4] == ["BM25", "start encoder, not fine-tuned", "no pre-training, retriever 1",
                        "no pre-training, retriever 2"]


def test_table1_difference_has_the_p_value_and_the_minimum_detectable_effect(tables):
    cell = tables["table1"].cell("Δ coCondenser query − passage context, retriever 1", RR)
    assert cell.difference
    assert cell.value == pytest.approx(10.0)
    assert cell.paper == pytest.approx(37.4 - 37.0)
    assert (cell.run_id, cell.compared_run_id) == (run_id("finetune/r1/cocondenser-query-q5"),
                                                   run_id("finetune/r1/cocondenser-passage"))
    assert cell.n_queries == 4
    # Every query gains 0.1: only 2 of the 16 sign assignments reach |mean| 0.1, exact p = 0.125.
    assert cell.p_value == pytest.approx(0.125, abs=0.02)
    assert cell.mde is None    # identical differences (to float noise): sd 0 says nothing about power
    r2 = tables["table1"].cell("Δ coCondenser query − passage context, retriever 2", RR)
    # Differences +0.1, -0.1, +0.1, -0.1 average 0: every assignment reaches it, p = 1.
    assert r2.value == pytest.approx(0.0, abs=1e-9) and r2.p_value == pytest.approx(1.0)
    # sd = sqrt(4 * 0.1**2 / 3); MDE = Z * sd / sqrt(4), in percent.
    assert r2.mde == pytest.approx(100 * Z * math.sqrt(0.04 / 3) / 2)


def test_a_cited_figure_stands_only_beside_a_column_on_the_papers_own_data():
    from qac.params import load_params, profile_params_path
    from qac.reporting.paper import same_data

    paper_profile = load_params(profile_params_path("paper"), running=False)
    assert same_data(paper_profile, "msmarco-passage", "dev", "mrr@10")
    assert same_data(paper_profile, "msmarco-passage", "dl19", "ndcg@10_dl19")
    assert not same_data(paper_profile, "msmarco-passage", "dev", "ndcg@10_dl19")     # another split
    assert not same_data(PARAMS, "scifact", "test", "mrr@10")                         # another dataset
    assert not same_data(PARAMS, "scifact", "test", None)


def test_minimum_detectable_effect_by_hand():
    from qac.evaluation.significance import minimum_detectable_effect

    # d = 1, 2, 3, 4, 5: mean 3, sample sd sqrt(10 / 4); MDE = Z * sd / sqrt(5).
    assert minimum_detectable_effect([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(Z * math.sqrt(2.5) / math.sqrt(5))
    assert minimum_detectable_effect([0.3]) is None
    # no spread (identical systems, or the same difference on every query): no power estimate, not 0
    assert minimum_detectable_effect([0.0, 0.0, 0.0]) is None
    assert minimum_detectable_effect([0.25, 0.25]) is None


def test_cells_that_cannot_be_produced_say_why(tables):
    table = tables["table1"]
    missing_column = table.cell("BM25", DL20)
    assert missing_column.value is None and missing_column.note == "TREC DL 2020: not in the smoke profile"
    assert (missing_column.paper, missing_column.cited) == (None, None)   # the paper's 47.7 is TREC DL 2020's
    missing_run = table.cell("CoT-MAE+QaC (C=5), retriever 2", RR)
    assert missing_run.value is None and "no evaluation output" in missing_run.note
    diff = table.cell("Δ CoT-MAE query − passage context, retriever 2", RR)
    assert diff.value is None and "no evaluation output" in diff.note


def test_table1_names_the_paper_columns_it_does_not_show(tables):
    note = " ".join(tables["table1"].notes)
    assert "MS MARCO dev R@1k (hit rate), TREC DL19 nDCG@10 have no counterpart" in note


def test_table2_zero_shot_without_and_with_query_context(tables):
    table = tables["table2"]
    with_query = table.cell("nfcorpus", "coCondenser w/ (query)")
    assert with_query.value == pytest.approx(0.5) and with_query.paper == 0.330
    assert with_query.run_id == run_id("finetune/r1/cocondenser-query-q5")
    assert table.cell("cranfield", "CoT-MAE w/o (passage)").paper is None
    assert "not in the paper" in table.cell("cranfield", "CoT-MAE w/o (passage)").note
    diff = table.cell("nfcorpus", "coCondenser Δ")
    assert diff.value == pytest.approx(0.2) and diff.p_value is not None
    assert diff.paper == pytest.approx(0.330 - 0.333)
    average = table.cell("average", "CoT-MAE w/ (query)")
    assert average.value == pytest.approx((0.2 + 0.3) / 2) and average.paper == 0.456


def test_table3_query_counts_and_the_passage_baseline(tables):
    table = tables["table3"]
    # Every C of the paper's Table 3 has a row; those the study lacks say so and hold only the paper's value.
    assert table.rows == ["coCondenser C=1", "coCondenser C=5", "coCondenser C=10", "coCondenser C=20",
                          "CoT-MAE C=1", "CoT-MAE C=5", "CoT-MAE C=10", "CoT-MAE C=20"]
    missing = table.cell("CoT-MAE C=10", RR)
    assert (missing.value, missing.paper) == (None, 38.5) and "no query-context CoT-MAE variant with C = 10" in missing.note
    c1 = table.cell("coCondenser C=1", RR)
    assert c1.value == pytest.approx(30.0) and c1.paper == 37.7
    assert c1.run_id == run_id("finetune/r1/cocondenser-query-q1")
    assert table.cell("coCondenser C=5", HIT50).value == pytest.approx(75.0)
    assert table.cell("coCondenser C=5", HIT50).paper == 87.3           # the paper's C = 5 row, never another C's
    delta = table.cell("coCondenser C=1", "Δ SciFact test R@50 (hit rate) vs passage context")
    assert delta.value == pytest.approx(0.0) and delta.p_value == pytest.approx(1.0)
    assert table.baselines["cocondenser"][RR] == pytest.approx(30.0)    # passage context, retriever 1
    assert table.baselines["cotmae"][HIT50] == pytest.approx(50.0)


R2_RR, R2_HIT50 = f"retriever 2 {RR}", f"retriever 2 {HIT50}"
R2_DELTA = "Δ retriever 2 SciFact test RR@10 vs passage context"


def test_table3_shows_retriever_2_and_the_dl_columns_the_profile_has(tables):
    table = tables["table3"]
    # Retriever 1's heads are those it had before the other columns: recorded expected values keep their keys.
    # The fixture's only TREC DL column is DL20 (marked missing); there is no DL19 column. The paper's Table 3
    # TREC DL figures are retriever 2's.
    dl20_r2 = "retriever 2 " + DL20
    assert table.columns == [RR, HIT50, R2_RR, R2_HIT50, dl20_r2, f"Δ {RR.split(' [')[0]} vs passage context",
                             "Δ SciFact test R@50 (hit rate) vs passage context", R2_DELTA]
    # coCondenser C=5: retriever 1 RR@10 0.3, 0.4, 0.5, 0.4 (40); retriever 2 0.6, 0.4, 0.6, 0.4 (50).
    r1, r2 = table.cell("coCondenser C=5", RR), table.cell("coCondenser C=5", R2_RR)
    assert r1.value == pytest.approx(40.0) and r2.value == pytest.approx(50.0)
    assert r2.run_id == run_id("finetune/r2/cocondenser-query-q5")
    assert r2.source == "eval/cocondenser-query-q5/r2/scifact/test.per_query.json"
    assert table.cell("coCondenser C=5", R2_HIT50).value == pytest.approx(100.0)
    # The paper's retriever-2 and DL figures of Table 3 for C = 5 are its Table 1 retriever-2 QaC row.
    assert (r1.paper, r2.paper, table.cell("coCondenser C=5", R2_HIT50).paper) == (37.4, 39.4, 88.6)
    dl20 = table.cell("coCondenser C=5", dl20_r2)
    assert (dl20.value, dl20.paper, dl20.note) == (None, 71.8, "TREC DL 2020: not in the smoke profile")
    notes = [note for note in table.notes if "retriever 2" in note]
    assert notes == ["The paper's Table 3 also reports retriever 2 (MRR@10, R@50) and, from retriever 2, TREC DL "
                     "2019/2020 nDCG@10; paper_results.yaml holds those figures for C = 5 only (Table 1's retriever-2 "
                     "QaC row): the other rows of these columns show this study's values only."]
    # Retriever 2's Δ is against the passage variant's retriever 2 (0.5 on every query): +0.1, -0.1, +0.1, -0.1.
    delta = table.cell("coCondenser C=5", R2_DELTA)
    assert delta.difference and delta.value == pytest.approx(0.0) and delta.paper == pytest.approx(39.4 - 38.8)
    assert (delta.run_id, delta.compared_run_id) == (run_id("finetune/r2/cocondenser-query-q5"),
                                                     run_id("finetune/r2/cocondenser-passage"))
    assert table.cell("coCondenser C=5", f"Δ {RR.split(' [')[0]} vs passage context").paper == \
        pytest.approx(37.4 - 37.0)                                     # the paper's C = 5 row minus its passage row
    # A variant without a retriever 2 output says so; it never shows retriever 1's value.
    assert table.cell("coCondenser C=1", R2_RR).value is None
    assert "no evaluation output" in table.cell("coCondenser C=1", R2_RR).note
    assert table.cell("CoT-MAE C=5", R2_RR).value is None and table.cell("CoT-MAE C=5", RR).value is not None
    # A C without a variant says so in every cell, the new columns and the differences included.
    for column in table.columns:
        cell = table.cell("CoT-MAE C=10", column)
        assert cell.value is None and "no query-context CoT-MAE variant with C = 10" in cell.note, column
    assert table.cell("CoT-MAE C=10", RR).paper == 38.5 and table.cell("CoT-MAE C=10", R2_RR).paper is None
    assert table.baselines["cocondenser"][R2_RR] == pytest.approx(50.0)   # passage context, retriever 2
    assert table.column_retrievers[R2_RR] == "r2" and table.column_retrievers[dl20_r2] == "r2"
    assert (table.short_columns[R2_RR], table.short_columns[R2_DELTA], table.short_columns[dl20_r2]) == \
        ("R2 RR@10", "Δ R2 RR@10", "R2 TREC DL20 nDCG@10")


def _table3(params, data):
    from qac.reporting.lineage import load_study
    from qac.reporting.tables import TableContext, table3_query_count

    return table3_query_count(TableContext.from_params(load_study(params, data), params))


def test_table3_dl_columns_appear_exactly_where_the_profile_has_them(data):
    from qac.config import render_profile

    repo = Path(__file__).resolve().parent.parent
    for name in ("smoke", "default"):      # these profiles have no TREC DL column: Table 3 shows none
        columns = render_profile(name, repo / "profiles")["tables"]["in_domain_columns"]
        table = _table3(study_params(tables={**RAW_PARAMS["tables"], "in_domain_columns": columns}), data)
        assert not any("DL" in column for column in table.columns), name
        assert sum(column.startswith("retriever 2 ") for column in table.columns) == 2
    paper_columns = render_profile("paper", repo / "profiles")["tables"]["in_domain_columns"]
    assert {c["paper"] for c in paper_columns} >= {"ndcg@10_dl19", "ndcg@10_dl20"}
    # The paper profile's kind of columns, read from this study's SciFact files: DL19 stands on RR@10 here (the
    # study has no TREC DL split), and its cells must hold retriever 2's value, never retriever 1's.
    columns = RAW_PARAMS["tables"]["in_domain_columns"][:2] + [
        {"label": "TREC DL19 nDCG@10", "short": "DL19", "dataset": "scifact", "split": "test", "measure": "RR@10",
         "paper": "ndcg@10_dl19"},
        {"label": "TREC DL20 nDCG@10", "short": "DL20", "dataset": "scifact", "split": "dl20", "measure": "nDCG@10",
         "paper": "ndcg@10_dl20"}]
    table = _table3(study_params(tables={**RAW_PARAMS["tables"], "in_domain_columns": columns}), data)
    dl19, dl20 = "retriever 2 TREC DL19 nDCG@10 [paper: TREC DL19 nDCG@10]", "retriever 2 " + DL20
    assert table.columns[:6] == [RR, HIT50, R2_RR, R2_HIT50, dl19, dl20]
    assert table.cell("coCondenser C=5", dl19).value == pytest.approx(50.0)     # retriever 2's, not retriever 1's 40
    assert table.cell("coCondenser C=5", dl19).paper == 73.1        # Table 1: coCondenser+QaC 120k retriever2, DL19
    assert table.cell("coCondenser C=1", dl19).paper is None        # the paper's C = 1 DL figure is not held
    assert "was not evaluated with nDCG@10 on scifact dl20" in table.cell("coCondenser C=5", dl20).note
    assert table.short_columns[dl19] == "R2 DL19"
    assert "no query-context coCondenser variant with C = 10" in table.cell("coCondenser C=10", dl19).note
    assert not any(column.startswith("Δ TREC") for column in table.columns)   # Δ: retriever 1's MRR@10 and R@50, retriever 2's MRR@10


def test_table4_mixed_context(tables):
    table = tables["table4"]
    mixed = table.cell("coCondenser mixed context (C=5)", f"retriever 1 {RR}")
    assert mixed.value == pytest.approx(35.0) and mixed.paper == 37.4
    assert mixed.run_id == run_id("finetune/r1/cocondenser-mixed")
    passage = table.cell("coCondenser passage context", f"retriever 2 {RR}")
    assert passage.paper == 38.8                       # borrowed from the paper's Table 1 reproduction
    diff = table.cell("Δ coCondenser mixed − query context", f"retriever 1 {RR}")
    assert diff.value == pytest.approx(-5.0) and diff.paper == pytest.approx(0.0)
    assert diff.p_value == pytest.approx(0.125, abs=0.02)
    assert table.short_columns[f"retriever 1 {RR}"] == "R1 RR@10"


def test_table5_annotation(tables):
    table = tables["table5"]
    pp, pq = table.cell("passage-passage", "high correlation %"), table.cell("passage-query", "high correlation %")
    # The paper's shares are human labels, the fixture's the automatic judge's: cited beside ours, not compared.
    assert (pp.value, pp.paper, pp.cited, pp.n_queries) == (pytest.approx(25.0), None, 35.5, 4)
    assert (pq.value, pq.paper, pq.cited) == (pytest.approx(75.0), None, 56.5)   # Table 5: 113 of 200 (the text's 56.6 fits no count)
    assert any("human majority labels" in note and "not compared" in note for note in table.notes)
    assert pp.run_id == run_id("annotation/table5") and pp.source == "annotation/summary.json"
    assert table.cell("passage-query", "labels").text == "automatic judge: test labels"
    assert table.cell("passage-query", "pairs").value == 4
    diff = table.cell("Δ passage-query − passage-passage", "high correlation %")
    # Per document (pq - pp): 0, 1, 1, 0 -> sign flips of the two 1s: |mean| 0.5 reached by 2 of 4, p = 0.5.
    assert diff.value == pytest.approx(50.0) and diff.p_value == pytest.approx(0.5, abs=0.03)
    # sd of (0, 1, 1, 0) = sqrt(1 / 3); MDE = Z * sd / 2, in percent.
    assert diff.mde == pytest.approx(100 * Z * math.sqrt(1 / 3) / 2)
    assert (diff.paper, diff.cited) == (None, pytest.approx(21.0))    # the paper's Δ is of human labels too


@pytest.mark.parametrize("accuracy, f1, finding", [(0.59, 0.41, False), (0.92, 0.91, True)])
def test_table5_shows_the_judges_delta_with_its_calibration_and_no_test_when_it_is_poor(tmp_path, accuracy, f1,
                                                                                          finding):
    from qac.reporting.lineage import load_study
    from qac.reporting.render import cell_text
    from qac.reporting.table_set import build_tables

    data = write_study(tmp_path)
    summary_path = data / "annotation" / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    summary["judge"].update(accuracy=accuracy, f1=f1)
    summary_path.write_text(json.dumps(summary), encoding="utf-8")
    table = {t.key: t for t in build_tables(load_study(PARAMS, data), PARAMS)}["table5"]
    row = "Δ passage-query − passage-passage"
    calibration = table.cell(row, "labels").text
    assert calibration == (f"automatic judge's calibration: accuracy {accuracy:.1%}, F1 {f1:.2f} "
                           "(50 relevant vs 50 random pairs of scifact train qrels)")
    shown = cell_text(table, "high correlation %", table.cell(row, "high correlation %"), row=row)
    if finding:
        assert shown.startswith("+50.00 (p=") and "MDE" in shown
    else:
        assert shown == f"+50.00 (no finding: judge accuracy {accuracy:.1%}, F1 {f1:.2f}, below 80%) / +21.0 cited"
        assert any(note.startswith(row) and "no finding" in note for note in table.notes)
    assert shown.endswith("/ +21.0 cited")


def test_p_values_are_the_evaluation_packages_randomization_test(tables):
    from qac.evaluation.significance import randomization_test

    with_query = {f"q{i + 1}": v for i, v in enumerate(ZERO_SHOT["cotmae-query-q5"]["cranfield"])}
    without = {f"q{i + 1}": v for i, v in enumerate(ZERO_SHOT["cotmae-passage"]["cranfield"])}
    cell = tables["table2"].cell("cranfield", "CoT-MAE Δ")
    assert cell.p_value == randomization_test(with_query, without, trials=PARAMS.tables.permutations, seed=SEED)


def test_queries_of_one_system_only_are_left_out_of_the_test():
    from qac.evaluation.significance import compare_paired

    result = compare_paired({"a": 1.0, "b": 1.0, "c": 0.0}, {"a": 0.0, "b": 0.0}, permutations=200)
    assert result.n_queries == 2 and "1 queries" in result.note
    # Both shared queries gain 1: 2 of the 4 sign assignments reach |mean| 1, p about 0.5.
    assert result.p_value == pytest.approx(0.5, abs=0.1)


def record_folder(source: str) -> str:
    """Where the stage that produced ``source`` left its run record (docs/architecture.md)."""
    parts = source.split("/")
    if parts[0] == "bm25":
        return "bm25"
    if parts[2] == "untuned":
        return "/".join(parts[:3])
    return f"finetune/{parts[1]}/{parts[2]}"


def report_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_report_files_are_traceable_to_the_dvc_outputs(data, tmp_path):
    from qac.reporting.profile_report import write_report

    report = write_report(PARAMS, tmp_path / "reports", data)
    folder = tmp_path / "reports" / PROFILE
    assert report.directory == folder
    text = (folder / "tables.md").read_text(encoding="utf-8")
    for line in ("**Profile**: smoke (SCALED DOWN", "**Data**", "**Models**", "data/smoke/.runs/report_runs.csv",
                 "**Differences**", "MDE", "### Table 1", "### Table 5", "TREC DL 2020: not in the smoke profile"):
        assert line in text
    assert "40.0 / 37.4" in text                               # ours / paper
    assert "+10.00 (p=0.1" in text                             # difference (a digit finer than values) with its p-value
    for key in ("table1", "table2", "table3", "table4", "table5"):
        assert (folder / f"{key}.csv").is_file()
    for figure in ("query_count.png", "zero_shot.png", "pretrain_loss.png"):
        assert (folder / "figures" / figure).stat().st_size > 1000
    rows = list(csv.DictReader(io.StringIO((folder / "table1.csv").read_text(encoding="utf-8"))))
    values = [row for row in rows if row["kind"] == "value" and row["ours"]]
    # BM25, 2 x no pre-training, 4 coCondenser and 3 CoT-MAE retrievers with both measures; untuned: RR@10 only
    assert len(values) == 2 * 10 + 1
    # The runs behind the cells: bookkeeping beside the DVC outputs, never in the tracked report.
    runs = {(row["table"], row["row"], row["column"]): row
            for row in csv.DictReader(io.StringIO((data / ".runs" / "report_runs.csv").read_text(encoding="utf-8")))}
    assert "run_id" not in rows[0]
    for row in values:   # every number is the mean of the per-query file it names, from the run its record names
        measure = {"RR_at_10": "RR@10", "Hit_at_50": "Hit@50"}[row["metric"].rsplit("/", 1)[1]]
        per_query = json.loads((data / row["source"]).read_text())[measure]
        assert float(row["ours"]) == pytest.approx(100 * mean(list(per_query.values())))
        record = json.loads((data / ".runs" / record_folder(row["source"]) / "mlflow_run.json").read_text())
        link = runs[(row["table"], row["row"], row["column"])]
        assert (link["run_id"], link["git_commit"]) == (record["run_id"], record["git_commit"])
    diffs = [row for row in rows if row["kind"] == "difference" and row["p_value"]]
    assert diffs and all(runs[(row["table"], row["row"], row["column"])]["compared_run_id"] and row["compared_source"]
                         for row in diffs)
    # an MDE wherever the per-query differences vary, none where they are all the same (to float noise:
    # 0.3 - 0.2 and 0.2 - 0.1 are "the same" gain of 0.1)
    for row in diffs:
        measure = {"RR_at_10": "RR@10", "Hit_at_50": "Hit@50"}[row["metric"].rsplit("/", 1)[1]]
        with_, without = (json.loads((data / row[side]).read_text())[measure] for side in ("source", "compared_source"))
        assert bool(row["mde"]) == (len({round(with_[qid] - without[qid], 9) for qid in with_}) > 1)
    assert any(row["mde"] for row in diffs)


def test_outputs_hold_no_clock_no_local_path_no_tracking_uri(data, tmp_path):
    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path / "reports", data)
    for name, content in report_files(tmp_path / "reports" / PROFILE).items():
        if name.endswith((".md", ".csv", ".tex", ".tsv")):
            text = content.decode("utf-8")
            assert str(tmp_path) not in text and str(Path.home()) not in text, name
            assert "sqlite" not in text and "Tables generated" not in text and "UTC" not in text, name


def test_two_builds_are_byte_identical(data, tmp_path, monkeypatch):
    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path / "first", data)
    monkeypatch.chdir(tmp_path)   # another working directory (and a later clock) changes nothing
    write_report(PARAMS, tmp_path / "second", data)
    first, second = report_files(tmp_path / "first" / PROFILE), report_files(tmp_path / "second" / PROFILE)
    assert sorted(first) == sorted(second)
    for name in first:
        if not name.endswith(".png"):
            assert first[name] == second[name], name


def test_latex_is_booktabs_with_compact_heads_and_no_paths(data, tmp_path):
    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path, data)
    tex = (tmp_path / PROFILE / "table1.tex").read_text(encoding="utf-8")
    assert [line for line in tex.splitlines() if line in (r"\toprule", r"\midrule", r"\bottomrule")] == [
        r"\toprule", r"\midrule", r"\bottomrule"]
    head = tex.splitlines()[tex.splitlines().index(r"\toprule") + 1]
    assert head == r" & RR@10 & R@50 (hit) & TREC DL20 nDCG@10 \\"
    assert "40.0 / 37.4" in tex and r"+10.00 / +0.4" in tex    # p = 0.125: no significance mark
    assert "data/" not in tex and ".json" not in tex and "run" not in tex.split(r"\bottomrule")[0]


def test_building_needs_no_mlflow_store(data, tmp_path, monkeypatch, capsys):
    import yaml

    from qac.cli import main

    store = tmp_path / "no-store" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    assert main(["tables", "--params", str(params_path), "--data", str(data), "--out", str(tmp_path / "out"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no MLflow store (sqlite store): report not logged to MLflow" in out
    assert str(store) not in out
    assert (tmp_path / "out" / PROFILE / "table3.csv").is_file()
    assert not store.exists()                                  # looking did not create a store


@pytest.mark.parametrize("out", ["../report", "reports/../../report", "/tmp/../report"])
def test_a_report_folder_outside_the_working_folder_is_refused_before_any_work(out, tmp_path, monkeypatch, capsys):
    """'..' would write beside the checkout; an absolute folder is a deliberate choice of another disk."""
    from qac.cli import main

    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert main(["tables", "--params", str(tmp_path / "absent.yaml"), "--out", out]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"qac: error: --out {out!r}: expected a relative path inside its folder")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["work"] and not any((tmp_path / "work").iterdir())


def test_tables_stage_writes_the_report(data, tmp_path, monkeypatch, mlflow_store):
    import shutil

    import yaml

    shutil.copytree(data, tmp_path / "data" / PROFILE)
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump({**RAW_PARAMS, "tables": {**RAW_PARAMS["tables"], "out_dir": "out"}}),
                           encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QAC_PARAMS", str(params_path))
    assert load_stage("tables").main() == 0
    assert (tmp_path / "out" / PROFILE / "tables.md").is_file()
    assert (tmp_path / "out" / PROFILE / "plots" / "in_domain.csv").is_file()


def test_failed_report_leaves_the_previous_one(data, tmp_path, monkeypatch):
    from qac.reporting import render
    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path, data)
    before = (tmp_path / PROFILE / "tables.md").read_text(encoding="utf-8")
    headline = tmp_path / "headline" / f"{PROFILE}.json"
    headline_before = headline.read_bytes()

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(render, "to_latex", broken)
    with pytest.raises(RuntimeError):
        write_report(PARAMS, tmp_path, data)
    assert (tmp_path / PROFILE / "tables.md").read_text(encoding="utf-8") == before
    assert headline.read_bytes() == headline_before
    # the report and its headline metrics beside it, no staging folder or file left
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".")) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([PROFILE, "headline"])


def test_bad_column_spec_is_named():
    from qac.reporting.tables import columns_from_params

    with pytest.raises(ValueError, match=r"in_domain_columns\[0\]"):
        columns_from_params(study_params(tables={"in_domain_columns": [{"label": "x"}]}))


def test_malformed_per_query_file_is_named(data, tmp_path):
    import shutil

    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    copy = tmp_path / "smoke"
    shutil.copytree(data, copy)
    broken = copy / "eval" / "cotmae-passage" / "r2" / "scifact" / "test.per_query.json"
    broken.write_text('{"RR@10": {"q1": 0.4,\n}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"cotmae-passage/r2/scifact/test.per_query.json:2: malformed JSON at column 1"):
        build_tables(load_study(PARAMS, copy), PARAMS)


def test_plot_data_for_dvc_plots(data, tmp_path):
    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path, data)
    plots = tmp_path / PROFILE / "plots"
    in_domain = list(csv.DictReader(io.StringIO((plots / "in_domain.csv").read_text())))
    assert list(in_domain[0]) == ["system", "RR_at_10", "Hit_at_50"]
    assert in_domain[0]["system"] == "BM25" and float(in_domain[0]["RR_at_10"]) == pytest.approx(25.0)
    counts = (plots / "query_count" / "cocondenser.csv").read_text().splitlines()
    # Retriever 2's measures carry the prefix r2_, so retriever 1's RR_at_10 (dvc.yaml's y) stays retriever 1's.
    assert counts == ["query_count,RR_at_10,Hit_at_50,r2_RR_at_10,r2_Hit_at_50", "1,30.0,50.0,,", "5,40.0,75.0,50.0,100.0"]
    losses = (plots / "pretrain_loss" / "cotmae-query-q5.tsv").read_text().splitlines()
    assert losses == ["step\tloss\tmlm", "1\t12.0\t6.0", "2\t10.0\t5.0", "3\t9.0\t4.5"]
    assert not (plots / "pretrain_loss" / "none.tsv").exists()


def test_bm25_row_uses_the_bm25_per_query_file(tables):
    assert tables["table1"].cell("BM25", RR).value == pytest.approx(100 * mean(BM25[0]))


def test_tables_use_the_recorded_runs_and_the_report_goes_to_the_study_run(data, tmp_path, mlflow_store, capsys):
    """A newer run of the same stage in the store changes nothing: the records name the runs."""
    import shutil

    import mlflow

    from qac.reporting.lineage import load_study
    from qac.reporting.profile_report import log_to_study_run, write_report

    mlflow.set_tracking_uri(mlflow_store)
    client = mlflow.MlflowClient(mlflow_store)
    experiment = client.create_experiment(f"qac-{PROFILE}", artifact_location=(tmp_path / "artifacts").as_uri())
    study_run = client.create_run(experiment, run_name=f"study/{PROFILE}", tags={"qac.role": "study"}).info.run_id
    pretrain = client.create_run(experiment, run_name="pretrain/cocondenser/passage/q4",
                                 tags={"mlflow.parentRunId": study_run, "qac.kind": "pretrain",
                                       "qac.variant": "cocondenser-passage"}).info.run_id
    # The pre-training record names that run; the other records name runs this store never held.
    record_path = tmp_path / "smoke"
    shutil.copytree(data, record_path)
    record_file = record_path / ".runs" / "pretrain" / "cocondenser-passage" / "mlflow_run.json"
    record_file.write_text(json.dumps({**json.loads(record_file.read_text()), "run_id": pretrain}))
    newer = client.create_run(experiment, run_name="finetune/r1/cocondenser-passage",
                              tags={"mlflow.parentRunId": pretrain, "qac.kind": "finetune", "qac.retriever": "r1",
                                    "qac.variant": "cocondenser-passage"}).info.run_id
    client.log_metric(newer, "scifact/test/RR_at_10", 0.99)

    report = write_report(PARAMS, tmp_path / "reports", record_path)
    cell = next(t for t in report.tables if t.key == "table1").cell("coCondenser passage context, retriever 1", RR)
    assert cell.run_id == run_id("finetune/r1/cocondenser-passage") != newer
    assert cell.value == pytest.approx(30.0)
    line = log_to_study_run(load_study(PARAMS, record_path), report.directory, mlflow_store)
    assert line == f"tables: report logged to MLflow study run {study_run}"
    logged = {entry.path for entry in client.list_artifacts(study_run)}
    assert {"tables.md", "table1.csv", "table1.tex", "figures"} <= logged


def test_the_query_generators_quality_is_reported_from_its_stage_metrics(data, tmp_path):
    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path, data)
    text = (tmp_path / PROFILE / "tables.md").read_text(encoding="utf-8")
    assert "### Query generator quality (stage metrics)" in text
    assert "| metrics/query_generator.json | rougeL | 0.250 |" in text
    assert "| metrics/queries.json | duplicate_candidates | 2 |" in text
    # Every numeric field, as written; words and run ids are not numbers.
    assert (tmp_path / PROFILE / "generator.csv").read_text().splitlines() == [
        "source,metric,value",
        "metrics/query_generator.json,heldout_pairs,20.0",
        "metrics/query_generator.json,rougeL,0.25",
        "metrics/query_generator.json,self_retrieval/generated,0.6",
        "metrics/queries.json,candidates,40.0",
        "metrics/queries.json,duplicate_candidates,2.0",
        "metrics/queries.json,unique_ratio,0.95"]


def test_other_runs_with_the_same_values_give_a_byte_identical_report(data, tmp_path):
    """Run ids and commits are bookkeeping: a retrain that reproduces every value changes no report file."""
    import shutil

    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path / "first", data)
    rerun = tmp_path / "rerun" / PROFILE
    shutil.copytree(data, rerun)
    for path in (rerun / ".runs").glob("**/mlflow_run.json"):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "run_id": "f" * 32, "git_commit": "a" * 40, "git_dirty": True}))
    write_report(PARAMS, tmp_path / "second", rerun)
    first, second = report_files(tmp_path / "first" / PROFILE), report_files(tmp_path / "second" / PROFILE)
    assert sorted(first) == sorted(second)
    assert all(first[name] == second[name] for name in first), [n for n in first if first[n] != second[n]]
    assert "f" * 32 in (rerun / ".runs" / "report_runs.csv").read_text()   # the links moved, beside the report


@pytest.mark.parametrize("prepare, dataset_entry, note", [
    ({}, {}, None),
    ({"max_documents": 1000, "keep_judged_documents": True}, {}, "cuts it to 1000 documents (the judged ones kept)"),
    ({"max_documents": 1000}, {"max_documents": 50, "keep_judged_documents": False}, "cuts it to 50 documents,"),
    ({"max_documents": 1000}, {"max_documents": None}, None),          # the dataset's own entry: keep every document
])
def test_a_published_figure_beside_a_cut_corpus_says_it_is_not_like_for_like(data, prepare, dataset_entry, note):
    """The start encoder's published figure is on the whole corpus; a profile that cuts the corpus says so."""
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    datasets = {**RAW_PARAMS["datasets"], "scifact": {**RAW_PARAMS["datasets"]["scifact"], **dataset_entry}}
    encoders = {"tiny:minilm": {"pooling": "mean", "normalize": True, "query_max_len": 16, "passage_max_len": 64,
                                "published": [{"dataset": "scifact", "split": "test", "measure": "RR@10",
                                               "value": 0.5, "source": "a model card"}]}}
    params = study_params(prepare=prepare, datasets=datasets, encoders=encoders)
    table = next(t for t in build_tables(load_study(params, data), params) if t.key == "table1")
    cell = table.cell("start encoder, not fine-tuned", RR)
    assert cell.published == pytest.approx(50.0) and cell.value == pytest.approx(5.0)
    cut_notes = [line for line in table.notes if "published scifact figure is on the whole corpus" in line]
    if note is None:
        assert not cut_notes
    else:
        assert len(cut_notes) == 1 and note in cut_notes[0] and "bench_baseline.py" in cut_notes[0]
