"""Holm's correction, the paired bootstrap interval of a Δ, and Judged@10: each against a hand computation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from qac.evaluation.judged import judged_at_k
from qac.evaluation.significance import compare_paired, holm_adjust, paired_confidence_interval
from qac.reporting.reviewer_statistics import add_judged_note, correct_within_table
from qac.reporting.tables import Cell, Table


def test_holm_multiplies_the_sorted_p_values_by_the_tests_left_and_keeps_them_monotone():
    # sorted: 0.01 * 4 = 0.04, 0.02 * 3 = 0.06, 0.03 * 2 = 0.06, 0.5 * 1 = 0.5; in the input order
    assert holm_adjust([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    # sorted: 0.04 * 3 = 0.12, then 0.05 * 2 = 0.10 would fall below it: monotone, so 0.12; capped at 1 below
    assert holm_adjust([0.05, 0.04, 0.9]) == pytest.approx([0.12, 0.12, 0.9])
    assert holm_adjust([0.6, 0.7]) == [1.0, 1.0]
    assert holm_adjust([]) == []


def test_the_bootstrap_interval_holds_the_mean_and_shrinks_as_queries_are_added():
    rng = np.random.default_rng(1)
    few, many = rng.normal(0.02, 0.3, 50), rng.normal(0.02, 0.3, 5000)
    low, high = paired_confidence_interval(few, seed=3)
    assert low < few.mean() < high
    # the percentile interval of a mean: about 2 * 1.96 * sd / sqrt(n)
    assert high - low == pytest.approx(2 * 1.96 * few.std(ddof=1) / np.sqrt(50), rel=0.15)
    wide_low, wide_high = paired_confidence_interval(many, seed=3)
    assert wide_high - wide_low < (high - low) / 5
    assert paired_confidence_interval([0.1, 0.1, 0.1]) == pytest.approx((0.1, 0.1))
    assert paired_confidence_interval([0.1]) is None
    with pytest.raises(ValueError):
        paired_confidence_interval([0.1, 0.2], level=1.0)


def test_a_comparison_carries_the_interval_of_with_minus_without():
    with_values = {f"q{i}": 0.5 + 0.1 * (i % 3) for i in range(30)}
    without = {f"q{i}": 0.4 for i in range(30)}
    result = compare_paired(with_values, without, permutations=2000, seed=0)
    mean = float(np.mean([with_values[q] - without[q] for q in with_values]))
    assert result.ci[0] < mean < result.ci[1] and result.ci[0] > 0


def test_judged_at_10_counts_any_label_in_the_top_10_over_k():
    qrels = {"a": {"d1": 0, "d2": 2, "d9": 1}, "b": {"x": 1}, "c": {"z": 3}}
    run = {"a": {f"d{i}": float(20 - i) for i in range(1, 13)},     # d1..d10 in the top 10: d1, d2, d9 judged
           "b": {"x": 1.0, "y": 0.5}}                                 # two retrieved: 1 judged of k = 10
    assert judged_at_k(qrels, run, 10) == {"a": 0.3, "b": 0.1, "c": 0.0}
    tied = {"a": {"d1": 1.0, "d3": 1.0}}                              # trec_eval's order: d3 before d1
    assert judged_at_k({"a": {"d1": 1}}, tied, 1) == {"a": 0.0}
    with pytest.raises(ValueError):
        judged_at_k(qrels, run, 0)


def _table(p_values):
    table = Table("t", "T", "percent", ["c"])
    for index, p in enumerate(p_values):
        table.put(f"Δ {index}", "c", Cell(value=1.0, difference=True, p_value=p))
    table.put("plain", "c", Cell(value=3.0))
    return table


def test_a_tables_tests_are_corrected_as_one_family_and_the_note_counts_them():
    table = _table([0.01, 0.04, 0.3])
    correct_within_table(table)
    assert [table.cell(f"Δ {i}", "c").p_holm for i in range(3)] == pytest.approx([0.03, 0.08, 0.3])
    assert table.cell("plain", "c").p_holm is None
    assert "Holm-Bonferroni over this table's 3 paired tests" in table.notes[-1]
    assert "2 below 0.05 before the correction, 1 after" in table.notes[-1]
    empty = Table("e", "E", "percent", ["c"])
    correct_within_table(empty)
    assert empty.notes == []


def test_the_judged_note_reads_each_rows_run_on_a_graded_split_only(tmp_path):
    from qac.evaluation.trec_io import write_run

    root = tmp_path / "data" / "smoke"
    for dataset, threshold in (("dl19", 2), ("scifact", 1)):
        folder = root / "datasets" / dataset
        (folder / "qrels").mkdir(parents=True)
        (folder / "dataset.json").write_text(json.dumps({"rel_threshold": {"test": threshold}}))
        (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t3\nq1\td2\t0\n")
        write_run(root / "eval" / "v" / "r1" / dataset / "test.trec", {"q1": {"d1": 2.0, "d2": 1.5, "d3": 1.0}})
    table = Table("table1", "T1", "percent", ["DL19", "SciFact"])
    for column, dataset in (("DL19", "dl19"), ("SciFact", "scifact")):
        table.put("r1 v", column, Cell(value=50.0, source=f"eval/v/r1/{dataset}/test.per_query.json"))
        table.put("Δ", column, Cell(value=1.0, difference=True, source=f"eval/v/r1/{dataset}/test.per_query.json"))
    columns = [SimpleNamespace(header="DL19", dataset="dl19", split="test", measure="nDCG@10", missing=None),
               SimpleNamespace(header="SciFact", dataset="scifact", split="test", measure="nDCG@10", missing=None)]
    add_judged_note(table, SimpleNamespace(study=SimpleNamespace(root=root), columns=columns,
                                           params=SimpleNamespace(train_dataset="scifact")))
    assert len(table.notes) == 1      # the graded split only; the Δ row has no run of its own
    assert table.notes[0].startswith("Judged@10 on dl19/test") and table.notes[0].endswith("r1 v 0.20.")


def test_built_tables_carry_the_interval_and_the_correction_in_cells_markdown_and_csv(tmp_path):
    import csv
    import io

    from dvc_study import PARAMS, write_study

    from qac.reporting.lineage import load_study
    from qac.reporting.render import to_csv, to_markdown
    from qac.reporting.table_set import build_tables

    tables = {table.key: table for table in build_tables(load_study(PARAMS, write_study(tmp_path)), PARAMS)}
    table2 = tables["table2"]
    tested = [cell for cell in table2.cells.values() if cell.difference and cell.p_value is not None]
    assert len(tested) >= 2
    assert holm_adjust([cell.p_value for cell in tested]) == [cell.p_holm for cell in tested]
    # the difference of the means equals the mean difference up to float noise
    assert all(cell.ci[0] - 1e-9 <= cell.value <= cell.ci[1] + 1e-9 for cell in tested)
    assert "Holm-Bonferroni" in to_markdown(table2) and "95% CI [" in to_markdown(table2)
    rows = [row for row in csv.DictReader(io.StringIO(to_csv(table2))) if row["p_value"]]
    assert all(row["p_holm"] and row["ci_low"] and row["ci_high"] for row in rows)
