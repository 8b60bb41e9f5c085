"""`qac eval` and the TREC/BEIR file readers and writer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qac.evaluation.trec_io import read_beir_qrels, read_qrels, read_run, read_trec_qrels, write_run

QAC = str(Path(sys.executable).parent / "qac")


def qac_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([QAC, "eval", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture()
def files(tmp_path):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 2\nq1 0 d2 1\nq2 0 d3 1\nq3 0 d9 1\n")
    run = tmp_path / "run.trec"
    # q1: d2 (rel 1) then d1 (rel 2); q2: d3 at rank 2; q3 not retrieved.
    run.write_text("q1 Q0 d2 1 3.0 x\nq1 Q0 d1 2 2.0 x\nq2 Q0 d5 1 5.0 x\nq2 Q0 d3 2 4.0 x\n")
    return qrels, run


def test_eval_prints_measures_over_all_judged_queries(files):
    qrels, run = files
    result = qac_eval("--qrels", str(qrels), "--run", str(run), "--metrics", "RR@10", "Hit@1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"RR@10": pytest.approx((1 + 0.5 + 0) / 3), "Hit@1": pytest.approx(1 / 3)}


def test_queries_of_the_run_without_judgements_are_left_out_and_said(files):
    """trec_eval's mean is over the judged queries: extra run queries change no value, and a note says so."""
    qrels, run = files
    before = json.loads(qac_eval("--qrels", str(qrels), "--run", str(run), "--metrics", "RR@10").stdout)
    run.write_text(run.read_text() + "".join(f"x{i} Q0 d1 1 1.0 x\n" for i in range(50)))
    result = qac_eval("--qrels", str(qrels), "--run", str(run), "--metrics", "RR@10")
    assert result.returncode == 0 and json.loads(result.stdout) == before
    assert result.stderr.startswith(f"qac eval: note: 50 of the 52 queries of {run} are not judged in {qrels}")


def test_eval_threshold_and_per_query(files):
    qrels, run = files
    result = qac_eval("--qrels", str(qrels), "--run", str(run), "--metrics", "RR", "--rel-threshold", "2",
                      "--per-query")
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["per_query"]["RR"] == {"q1": 0.5, "q2": 0.0, "q3": 0.0}
    assert output["aggregate"]["RR"] == pytest.approx(0.5 / 3)


def test_eval_reads_beir_qrels_and_drops_identical_ids(tmp_path):
    qrels = tmp_path / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 q1 1 9 x\nq1 Q0 d1 2 1 x\n")
    plain = json.loads(qac_eval("--qrels", str(qrels), "--run", str(run), "--metrics", "RR").stdout)
    dropped = json.loads(qac_eval("--qrels", str(qrels), "--run", str(run), "--metrics", "RR",
                                  "--ignore-identical-ids").stdout)
    assert (plain["RR"], dropped["RR"]) == (0.5, 1.0)


def test_eval_reports_bad_lines_with_file_and_line(files):
    qrels, run = files
    run.write_text("q1 Q0 d1 1 3.0 x\nq1 Q0 d2 two 2.0 x\n")
    result = qac_eval("--qrels", str(qrels), "--run", str(run))
    assert result.returncode == 2
    assert f"{run}:2: field 'rank'" in result.stderr


def test_run_file_round_trip_keeps_exact_scores_and_trec_order(tmp_path):
    run = {"q1": {"a": 0.1 + 0.2, "b": 0.30000000000000004, "c": 1 / 3}, "q2": {"z": 1.0}}
    path = tmp_path / "run.trec"
    write_run(path, run, tag="test")
    assert read_run(path) == run
    lines = path.read_text().splitlines()
    assert [line.split()[2] for line in lines[:3]] == ["c", "b", "a"]   # tie a/b: larger id first
    assert [line.split()[3] for line in lines[:3]] == ["1", "2", "3"]


def test_failed_write_leaves_no_file(tmp_path):
    path = tmp_path / "run.trec"
    with pytest.raises(ValueError):
        write_run(path, {"q": {"d": "not a number"}})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, message", [
    ("q1 0 d1\n", "expected 4 whitespace-separated fields"),
    ("q1 0 d1 high\n", "field 'rel'"),
    ("q1 0 d1 1\nq1 0 d1 0\n", "judged 1 on line 1 and 0 here"),
])
def test_trec_qrels_errors_name_the_line(tmp_path, content, message):
    path = tmp_path / "qrels.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        read_trec_qrels(path)
    assert str(path) in str(error.value)


def test_beir_qrels_need_the_header_and_three_fields(tmp_path):
    path = tmp_path / "test.tsv"
    path.write_text("q1\td1\t1\n")
    with pytest.raises(ValueError, match=":1: expected the header"):
        read_beir_qrels(path)
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\n")
    with pytest.raises(ValueError, match=":3: expected 3 tab-separated fields"):
        read_beir_qrels(path)
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert read_qrels(path) == {"q1": {"d1": 1}}


def test_duplicate_run_entries_are_rejected(tmp_path):
    path = tmp_path / "run.trec"
    path.write_text("q1 Q0 d1 1 3.0 x\nq1 Q0 d1 2 2.0 x\n")
    with pytest.raises(ValueError, match=":2: field 'docid': document 'd1' appears twice"):
        read_run(path)
