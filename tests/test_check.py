"""`qac check`: expected cells with tolerances, recorded from a run and checked against the DVC outputs."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import yaml

from dvc_study import HIT50, PROFILE, RAW_PARAMS, RR, write_study

from qac.params import validate_params

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A working directory with data/smoke/ (tests/dvc_study.py) and a params file naming expected/smoke.yaml."""
    write_study(tmp_path)
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def qac(*argv: str) -> int:
    from qac.cli import main

    return main(["check", "--params", "params.yaml", *argv])


def summary_of(lines: list[str]) -> str:
    """The rerun check's summary line (the cells; the advice and the claims follow or precede it)."""
    return next(line for line in lines if line.startswith("check: ") and "cells within tolerance" in line)


def test_recorded_values_pass_and_every_cell_is_printed(project, capsys):
    assert qac("--record") == 0
    document = yaml.safe_load((project / "expected" / "smoke.yaml").read_text())
    assert document["profile"] == PROFILE
    bm25 = next(c for c in document["cells"] if c["table"] == "table1" and c["row"] == "BM25" and c["column"] == RR)
    # mean RR@10 0.25 over 4 queries; its band is derived at check time (no other machine recorded here)
    assert bm25 == {"table": "table1", "row": "BM25", "column": RR, "value": pytest.approx(25.0), "unit": "percent",
                    "n": 4}
    pairs = next(c for c in document["cells"] if c["table"] == "table5" and c["column"] == "pairs")
    assert pairs["unit"] == "count" and pairs["tolerance"] == 0.0
    # the machine that recorded it and the hashes of the outputs it read
    assert document["environment"]["torch_kernels"] and document["environment"]["libraries"]["torch"]
    assert document["sources"] and all(len(digest) == 64 for digest in document["sources"].values())
    capsys.readouterr()

    assert qac() == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [line for line in lines if line.startswith(("OK   ", "OUT  ", "FAIL "))]
    assert len(cells) == len(document["cells"]) and all(line.startswith("OK   ") for line in cells)
    assert summary_of(lines) == (f"check: reproduced (same bytes): {len(document['cells'])} of "
                                 f"{len(document['cells'])} cells within tolerance; trained cells outside 0 (a "
                                 "faithful rerun may miss 3), counts and deterministic rows outside 0, missing 0 "
                                 "(expected/smoke.yaml)")
    assert lines[-1] == "check: every output has the recorded bytes: nothing to do."
    claims = [line for line in lines if line.startswith("CLAIM ")]
    assert len(claims) == 10 and lines[lines.index(summary_of(lines)) - 1].startswith("claims: ")


def test_recording_again_with_outputs_missing_keeps_the_file_and_names_the_cells(project, capsys):
    """A rerun's expected file is tracked: a record that would drop cells because a variant's outputs are gone
    is refused, not written."""
    assert qac("--record") == 0
    expected = project / "expected" / "smoke.yaml"
    before = expected.read_bytes()
    shutil.rmtree(project / "data" / PROFILE / "eval" / "cocondenser-query-q5")
    capsys.readouterr()
    assert qac("--record") == 2
    err = capsys.readouterr().err
    assert re.search(r"qac check: \d+ cells? of expected/smoke.yaml would be dropped because the outputs behind "
                     r"them are missing", err), err
    assert "is left as it is" in err and expected.read_bytes() == before
    expected.unlink()                       # deleted first: what there is gets recorded
    assert qac("--record") == 0


def test_a_cell_moved_outside_its_tolerance_fails(project, capsys):
    assert qac("--record") == 0
    # coCondenser's query-context retriever 1: RR@10 0.3, 0.4, 0.5, 0.4 (mean 40) becomes 1.0 on every query:
    # the mean moves by 2.4 queries' worth (60 points), beyond the band of 2 queries' worth (50 points); its
    # hits 1, 1, 1, 0 (75) become 0: 3 queries' worth.
    path = project / "data" / PROFILE / "eval" / "cocondenser-query-q5" / "r1" / "scifact" / "test.per_query.json"
    values = json.loads(path.read_text())
    values["RR@10"] = {qid: 1.0 for qid in values["RR@10"]}
    values["Hit@50"] = {qid: 0.0 for qid in values["Hit@50"]}
    path.write_text(json.dumps(values))
    capsys.readouterr()
    assert qac() == 1
    lines = capsys.readouterr().out.splitlines()
    outside = [line for line in lines if line.startswith(("OUT ", "FAIL"))]
    basis = "; basis: float noise (2 queries' worth; no other machine measured)"
    # The same retriever's RR@10 and R@50 are shown in Tables 1, 3 and 4; nothing else moved. Six misses where a
    # faithful rerun of this family misses at most three.
    assert outside == [
        f"OUT  table1 | coCondenser+QaC (C=5), retriever 1 | {RR}: 100 (expected 40 ± 50){basis}",
        f"OUT  table1 | coCondenser+QaC (C=5), retriever 1 | {HIT50}: 0 (expected 75 ± 50){basis}",
        f"OUT  table3 | coCondenser C=5 | {RR}: 100 (expected 40 ± 50){basis}",
        f"OUT  table3 | coCondenser C=5 | {HIT50}: 0 (expected 75 ± 50){basis}",
        f"OUT  table4 | coCondenser+QaC (C=5) | retriever 1 {RR}: 100 (expected 40 ± 50){basis}",
        f"OUT  table4 | coCondenser+QaC (C=5) | retriever 1 {HIT50}: 0 (expected 75 ± 50){basis}"]
    assert summary_of(lines).startswith("check: NOT reproduced (differs): ")
    assert "; trained cells outside 6 (a faithful rerun may miss 3), counts and deterministic rows outside 0, " \
           "missing 0" in summary_of(lines)
    assert lines[-1].startswith("check: 6 trained cells outside their bands (a faithful rerun on another machine "
                                "misses at most 3): more than another machine moves them.")
    assert "`dvc status profiles/smoke/dvc.yaml`" in lines[-1]


def test_a_cell_within_its_tolerance_passes(project, capsys):
    assert qac("--record") == 0
    # One query of four changes by its whole range: 1/4 of the range, inside 2/4. The bytes differ.
    path = project / "data" / PROFILE / "bm25" / "runs" / "scifact" / "test.per_query.json"
    values = json.loads(path.read_text())
    values["RR@10"]["q1"] = 1.0
    path.write_text(json.dumps(values))
    capsys.readouterr()
    assert qac("--failures-only") == 0
    lines = capsys.readouterr().out.splitlines()
    assert summary_of(lines).startswith("check: reproduced (within the noise of another machine)")
    assert lines[-1].startswith("check: the outputs differ from the recorded run's bytes (1 cell moved) but stay "
                                "within what other machines were measured to move them. Recorded on ")
    # the same machine recorded it: the advice says so
    assert "this machine matches the recording's CPU, kernels and libraries" in lines[-1]


def test_a_missing_cell_fails(project, capsys):
    assert qac("--record") == 0
    shutil.rmtree(project / "data" / PROFILE / "eval" / "cotmae-passage" / "r2")
    assert qac("--failures-only") == 1
    out = capsys.readouterr().out
    assert "FAIL table1 | CoT-MAE passage context, retriever 2 | " + RR + ": missing (no evaluation output" in out
    # Table 1's RR@10 and R@50 of that retriever, and Table 4's retriever 2 RR@10: no miss is allowed for them
    assert "outside 0 (a faithful rerun may miss 3), counts and deterministic rows outside 0, missing 3" in \
        summary_of(out.splitlines())
    assert summary_of(out.splitlines()).startswith("check: NOT reproduced (differs)")


def test_table3_retriever_2_cells_are_recorded_and_checked_and_an_older_file_without_them_passes(project, capsys):
    assert qac("--record") == 0
    path = project / "expected" / "smoke.yaml"
    document = yaml.safe_load(path.read_text())
    table3 = {(c["row"], c["column"]): c for c in document["cells"] if c["table"] == "table3"}
    # Retriever 2 of coCondenser C=5: RR@10 0.6, 0.4, 0.6, 0.4 (50); retriever 1's cell keeps its key.
    assert table3[("coCondenser C=5", f"retriever 2 {RR}")]["value"] == pytest.approx(50.0)
    assert table3[("coCondenser C=5", RR)]["value"] == pytest.approx(40.0)
    assert not any(column.startswith("Δ") or "DL20" in column for _, column in table3)   # differences, missing
    # A file recorded before Table 3 had retriever 2's columns: checked on its own cells, and it passes.
    older = [c for c in document["cells"] if not (c["table"] == "table3" and c["column"].startswith("retriever 2"))]
    assert len(older) == len(document["cells"]) - 2
    path.write_text(yaml.safe_dump({**document, "cells": older}))
    capsys.readouterr()
    assert qac() == 0
    assert summary_of(capsys.readouterr().out.splitlines()).startswith(
        f"check: reproduced (same bytes): {len(older)} of {len(older)}")
    # Recorded, Table 3's retriever 2 cells fail when retriever 2's output is gone; retriever 1's still pass.
    path.write_text(yaml.safe_dump(document))
    shutil.rmtree(project / "data" / PROFILE / "eval" / "cocondenser-query-q5" / "r2")
    assert qac("--failures-only") == 1
    failures = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL table3")]
    assert [line.split(": missing (no evaluation output")[0] for line in failures] == [
        f"FAIL table3 | coCondenser C=5 | retriever 2 {RR}", f"FAIL table3 | coCondenser C=5 | retriever 2 {HIT50}"]


def test_without_an_expected_file_check_says_how_to_record_one(project, capsys):
    assert qac() == 2
    assert "record one with `qac check --record`" in capsys.readouterr().err


def test_tolerance_is_two_queries_worth_of_the_measure():
    from qac.reporting.check import tolerance

    assert tolerance("percent", 300) == pytest.approx(2 * 100 / 300)    # SciFact test: 0.67 points
    assert tolerance("fraction", 43) == pytest.approx(2 / 43)
    assert tolerance("percent", 6980, rounding=0.05) == pytest.approx(0.05 + 200 / 6980)
    assert tolerance("count", 10) == 0.0
    assert tolerance("percent", None) is None


def test_bad_expected_file_names_the_cell_and_field(tmp_path):
    from qac.reporting.check import load_expected

    path = tmp_path / "expected.yaml"
    path.write_text(yaml.safe_dump({"profile": "smoke", "cells": [
        {"table": "table1", "row": "BM25", "column": "x", "value": 1.0, "unit": "percent"},
        {"table": "table1", "row": "BM25", "column": "y", "value": "high", "unit": "percent"}]}))
    with pytest.raises(ValueError, match=r"expected.yaml:\d+: cells\[1\]: field 'value' must be a finite number, "
                                         r"got 'high'"):
        load_expected(path)
    path.write_text(yaml.safe_dump({"cells": [{"table": "table1", "row": "BM25", "value": 1.0, "unit": "percent"}]}))
    with pytest.raises(ValueError, match=r"expected.yaml:2: cells\[0\]: field 'column' missing"):
        load_expected(path)


@pytest.mark.parametrize("text, message", [
    ("cells: [\n", r"expected.yaml:2: not valid YAML"),
    ("cells:\n- {table: t, row: r, column: c, value: .nan, unit: percent}\n", r":2: cells\[0\]: field 'value' must be a "
                                                                            r"finite number, got nan"),
    ("cells:\n- {table: t, row: r, column: c, value: true, unit: percent}\n", r"got True"),
    ("cells:\n- table: t\n  row: r\n  column: c\n  value: 1.0e-5\n  unit: percent\n  tolerance: -1\n",
     r":7: cells\[0\]: a tolerance cannot be negative"),
    ("cells:\n- {table: t, row: r, column: c, value: 1, unit: percent}\ncells: []\n", r"'cells' is written twice"),
    ("kind: rerun\n", r"expected a mapping with a 'cells' list"),
])
def test_a_broken_expected_file_is_one_paragraph_naming_its_line(tmp_path, text, message):
    """Read by `qac check` before it looks at any output: a user error (one paragraph, exit status 2)."""
    from qac.errors import UserError
    from qac.reporting.check import load_expected

    path = tmp_path / "expected.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_expected(path)


@pytest.mark.parametrize("text, message", [
    ("cells:\n- {table: t, row: r, column: c, value: 1, unit: percent}\n"
     "- {table: t, row: r, column: c, value: 2, unit: percent}\n",
     r"expected.yaml:3: cells\[1\]: the cell t / r / c is listed twice \(first as cells\[0\]\)"),
    ("profile: smoke\ntolerances: 3\ncells: []\n", r"expected.yaml:2: unknown fields \['tolerances'\]"),
    ("slack_queries: -2\ncells: []\n", r"expected.yaml:1: field 'slack_queries' must be a positive number, got -2"),
    ("cells:\n- table: t\n  row: r\n  column: c\n  value: 1.0\n  unit: percent\n  n: -5\n",
     r"expected.yaml:7: cells\[0\]: field 'n' \(the queries behind the cell\) must be a positive whole number, "
     r"got -5"),
])
def test_an_expected_file_with_a_cell_twice_an_unknown_field_or_a_bad_count_is_refused(tmp_path, text, message):
    """Each would be read silently otherwise: the second of two cells wins, a misspelt field is ignored, a negative
    slack or query count makes a tolerance no value can meet."""
    from qac.errors import UserError
    from qac.reporting.check import load_expected

    path = tmp_path / "expected.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_expected(path)


def test_record_into_a_folder_is_refused_and_leaves_the_folder_as_it_was(project, capsys):
    """`--expected` naming a folder: recording would replace it (and all it holds) with a file."""
    folder = project / "expected"
    folder.mkdir()
    (folder / "smoke.yaml").write_text("kept\n")
    (folder / "notes.txt").write_text("mine\n")
    assert qac("--record", "--expected", "expected") == 2
    assert "expected (--expected) is a folder, not an expected-values file" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "smoke.yaml"]
    assert (folder / "smoke.yaml").read_text() == "kept\n" and (folder / "notes.txt").read_text() == "mine\n"


def test_an_expected_value_written_as_yaml_1_2_writes_it_is_a_number(tmp_path):
    from qac.reporting.check import load_expected

    path = tmp_path / "expected.yaml"
    path.write_text("cells:\n- {table: t, row: r, column: c, value: 5e-1, unit: fraction, tolerance: 1e-2}\n")
    (cell,) = load_expected(path)[1]
    assert (cell.value, cell.tolerance) == (0.5, 0.01)


def test_paper_profile_expects_the_papers_values():
    """profiles/expected/paper.yaml is what `qac check --record` writes for the paper profile from the paper."""
    from qac.config import render_profile
    from qac.reporting.check import load_expected, record
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    params = validate_params(render_profile("paper", REPO_ROOT / "profiles"))
    path = REPO_ROOT / params.check.expected
    profile, cells = load_expected(path)
    assert profile == "paper"
    tables = build_tables(load_study(params, REPO_ROOT / "no-such-outputs", declared_variants=True), params)
    recorded = record(tables, "paper", from_paper=True)["cells"]
    assert [(c.table, c.row, c.column, c.value) for c in cells] == [
        (c["table"], c["row"], c["column"], c["value"]) for c in recorded]
    by_key = {(c.table, c.row): c for c in cells if c.column.startswith("MS MARCO dev MRR@10")}
    # The paper's Table 1: coCondenser+QaC 120k retriever 1, MRR@10 37.4, printed to 0.1.
    qac_r1 = by_key[("table1", "coCondenser+QaC (C=5), retriever 1")]
    assert (qac_r1.value, qac_r1.rounding, qac_r1.tolerance) == (37.4, 0.05, None)
    # BM25: compared only where the paper's cell is Anserini's tuned run (MRR@10 18.7, R@1k 85.7); its R@50 is
    # RocketQA's and its TREC DL cells match neither Anserini setting: cited, never expected.
    assert sorted(c.column.split(" [")[0] for c in cells if c.row == "BM25") == [
        "MS MARCO dev MRR@10", "MS MARCO dev R@1k (hit rate)"]
    # A released retriever's figures published to two decimals are expected to those decimals.
    cotmae = [c for c in cells if c.row == "published checkpoint caskcsg/cotmae_base_msmarco_retriever"]
    assert [(c.value, c.rounding) for c in cotmae] == [(39.44, 0.005), (87.03, 0.005), (98.67, 0.005)]


def test_every_profile_names_its_expected_file():
    from qac.config import render_profile

    for name in ("smoke", "default", "paper"):
        assert render_profile(name, REPO_ROOT / "profiles")["check"]["expected"] == f"profiles/expected/{name}.yaml"


def test_the_generators_means_and_counts_are_checked_too(project, capsys):
    metrics_path = project / "data" / PROFILE / "metrics" / "query_generator.json"
    metrics = {"rougeL": 0.25, "candidates": 40, "heldout_pairs": 20, "judge/anchors": 8,
               "judge/high_share/passage-query": 0.875, "judge/high_share/passage-passage": 0.75,
               "pairs/train": 100, "mode": "train"}
    metrics_path.write_text(json.dumps(metrics))
    assert qac("--record") == 0
    cells = {(c["row"], c["column"]): c for c in yaml.safe_load((project / "expected" / "smoke.yaml").read_text())[
        "cells"] if c["table"] == "generator"}
    # means over items hold two items' worth: ROUGE-L over 40 candidates, the judge's shares over 8 anchors
    assert cells[("query_generator/rougeL", "value")] == {
        "table": "generator", "row": "query_generator/rougeL", "column": "value", "value": 0.25, "unit": "fraction",
        "n": 40}
    assert cells[("query_generator/judge/high_share/passage-query", "value")]["n"] == 8
    assert cells[("query_generator/pairs/train", "count")]["tolerance"] == 0.0
    assert cells[("queries/unique_ratio", "value")]["n"] == 40        # tests/dvc_study.py: 40 candidates
    assert ("query_generator/heldout_pairs", "count") not in cells    # not among CHECKED_COUNTS
    capsys.readouterr()

    metrics.update({"rougeL": 0.25 + 2.5 / 40, "pairs/train": 99})
    metrics_path.write_text(json.dumps(metrics))
    assert qac("--failures-only") == 1
    failures = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("FAIL", "OUT "))]
    assert failures == ["OUT  generator | query_generator/rougeL | value: 0.3125 (expected 0.25 ± 0.05); basis: "
                        "float noise (2 queries' worth; no other machine measured)",
                        "FAIL generator | query_generator/pairs/train | count: 99 (expected 100 ± 0); basis: count "
                        "(counts match exactly)"]


# ---------------------------------------------------------------- reproduction checks (the paper profile)

@pytest.fixture(scope="module")
def paper_params(tmp_path_factory):
    """The paper profile's params, its randomization tests cut to 100 permutations (the check reads no p-value)."""
    from qac.config import render_profile

    params = render_profile("paper", REPO_ROOT / "profiles")
    params["tables"]["permutations"] = 100
    path = tmp_path_factory.mktemp("paper") / "params.yaml"
    path.write_text(yaml.safe_dump(params), encoding="utf-8")
    return validate_params(params), path


PAPER_EXPECTED = REPO_ROOT / "profiles" / "expected" / "paper.yaml"


def check_paper(params_path: Path, data: Path, capsys) -> tuple[int, list[str], str]:
    from qac.cli import main

    capsys.readouterr()
    status = main(["check", "--params", str(params_path), "--data", str(data), "--expected", str(PAPER_EXPECTED)])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def test_reproduction_check_passes_a_faithful_paper_run(paper_params, tmp_path, capsys):
    from paper_simulation import write_paper_outputs

    from qac.reporting.check import load_expected_document

    params, params_path = paper_params
    write_paper_outputs(params, tmp_path)
    status, lines, _ = check_paper(params_path, tmp_path, capsys)
    _, kind, expected = load_expected_document(PAPER_EXPECTED)
    cells = lines[:len(expected)]
    assert kind == "reproduction"
    # Every published cell's per-query values average to the published figure: reproduced, to its rounding.
    assert all(line.startswith("REPRODUCED ") and line.endswith("; basis: rounding") for line in cells)
    assert status == 0
    assert lines[-1].startswith(f"check (reproduction of published figures): reproduced: {len(expected)} reproduced")
    assert sum(line.startswith("CLAIM ") for line in lines) == 10


def test_reproduction_check_fails_a_run_one_and_a_half_mrr_points_short(paper_params, tmp_path, capsys):
    """MRR@10 1.5 points under the paper everywhere: beyond every trained cell's training-noise band (0.05 rounding
    + z_0.995 x 0.3 x sqrt(2) = 1.14 points) and far beyond the deterministic rows' float noise; R@50 0.3 points
    over it stays within noise."""
    from paper_simulation import write_paper_outputs

    params, params_path = paper_params
    write_paper_outputs(params, tmp_path, shift={"RR@10": -1.5, "Hit@50": +0.3})
    status, lines, _ = check_paper(params_path, tmp_path, capsys)
    assert status == 1
    verdicts = {line.split(":")[0]: line for line in lines if line.split(" ")[0] in (
        "REPRODUCED", "WITHIN", "DIFFERS", "MISSING")}
    mrr = {key: line for key, line in verdicts.items() if "MS MARCO dev MRR@10" in key}
    r50 = {key: line for key, line in verdicts.items() if "MS MARCO dev R@50" in key}
    rest = {key: line for key, line in verdicts.items() if key not in mrr and key not in r50}
    # Table 1's BM25, 2 reference and 8 trained rows, Table 3's 8 retriever-1 rows and 2 retriever-2 rows of C = 5,
    # Table 4's; BM25's R@50 is RocketQA's figure, cited and not compared
    assert len(mrr) == 11 + 10 + 12 and len(r50) == 10 + 10 + 6
    for key, line in mrr.items():
        assert line.startswith("DIFFERS "), line
        gap, band = map(float, re.search(r"\|Δ\| ([0-9.]+) > band ([0-9.]+)\)", line).groups())
        assert abs(gap - 1.5) < 0.02
        if "| BM25 |" in key or "published checkpoint" in key:
            assert band < 0.1 and "basis: rounding + float noise" in line
        else:
            assert 1.0 < band < 1.3 and "basis: training noise prior" in line and "prior: estimate" in line
    for line in r50.values():
        assert line.startswith("WITHIN NOISE ") or "published checkpoint" in line or "| BM25 |" in line, line
    # TREC DL, R@1k and Table 2 did not move.
    assert rest and all(line.startswith("REPRODUCED ") and line.endswith("basis: rounding") for line in rest.values())
    shifted = [line for line in lines if line.startswith("FAIL shared shift | msmarco-passage dev RR@10: ")]
    assert shifted, "a shortfall every MRR@10 cell shares is judged as one"
    assert lines[-1].startswith("check (reproduction of published figures): NOT reproduced: ")


def test_a_profile_that_never_ran_is_told_to_run(paper_params, tmp_path, capsys):
    _, params_path = paper_params
    status, lines, err = check_paper(params_path, tmp_path / "nothing-here", capsys)
    # One paragraph saying to run the profile, not a line per cell.
    assert status == 2 and lines == []
    assert err.startswith("qac check: profile 'paper' has no outputs to check under ")
    assert err.rstrip().endswith("run it first, `dvc repro profiles/paper/dvc.yaml`")


def test_three_seeds_give_the_band_a_t_quantile_and_fewer_take_the_prior():
    from qac.reporting import noise
    from qac.reporting.check import Expected, Judgement

    cell = Expected("table1", "row", "MRR@10", 38.2, "percent", rounding=0.05)
    seeds = (37.6, 38.0, 38.4)    # sd 0.4: t(2 df) at 0.99 two-sided = 9.925; x 0.4 x sqrt(1 + 1/3)
    band = noise.training_band("percent", 0.05, seeds, 0.003, "a prior")
    assert band.basis == "seed spread" and band.size == pytest.approx(0.05 + 9.925 * 0.4 * math.sqrt(4 / 3), rel=1e-3)
    judged = Judgement(cell, 37.4, band)
    assert judged.verdict == "within noise" and judged.basis == "seed spread"
    assert "t(2 df) 9.92 x sd 0.4 of 3 seeds x sqrt(1 + 1/3)" in judged.line()
    # Two seeds: the prior's sd, z at 0.99, x sqrt(1 + 1/2); its source is named.
    band = noise.training_band("percent", 0.05, (37.6, 38.0), 0.003, "a prior")
    assert band.basis == "training noise prior" and band.size == pytest.approx(0.05 + 2.5758 * 0.3 * math.sqrt(1.5),
                                                                              rel=1e-3)
    assert "prior: a prior" in Judgement(cell, 37.4, band).line()
    assert Judgement(cell, 37.4, band).verdict == "within noise"
    assert Judgement(cell, 36.9, band).verdict == "differs"
    assert Judgement(cell, 38.24, band).verdict == "reproduced"
    assert Judgement(cell, 37.0).line().endswith("no seeds and no training-noise prior: no noise band; basis: "
                                                 "rounding")