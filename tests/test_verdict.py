"""The verdict's statistics: simulated paper-profile runs that carry the noise a faithful run has, shortfalls
that a faithful run does not have, the paper's claims, and reruns judged by a measured machine spread."""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from paper_simulation import QUERY_COUNTS, faithful_deviation, write_paper_outputs

from qac.params import validate_params

REPO_ROOT = Path(__file__).resolve().parent.parent
PAPER_EXPECTED = REPO_ROOT / "profiles" / "expected" / "paper.yaml"
SIMULATIONS = 300


def _paper_raw() -> dict:
    from qac.config import render_profile

    params = render_profile("paper", REPO_ROOT / "profiles")
    params["tables"]["permutations"] = 200
    return params


@pytest.fixture(scope="module")
def paper_params():
    return validate_params(_paper_raw())


def _tables(params, root):
    from qac.reporting.generator_report import checked_table
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    study = load_study(params, root)
    return study, [*build_tables(study, params), checked_table(study)]


@pytest.fixture(scope="module")
def faithful_tables(paper_params, tmp_path_factory):
    """Tables of a simulated paper run whose every per-query file averages to the published figure."""
    root = tmp_path_factory.mktemp("paper-outputs")
    write_paper_outputs(paper_params, root)
    return _tables(paper_params, root)[1]


@functools.cache
def _expected():
    from qac.reporting.check import read_document

    return read_document(PAPER_EXPECTED).cells


def _run_key(cell) -> tuple[str, str]:
    return cell.source, cell.metric


def _split_and_measure(cell) -> tuple[str, str]:
    parts = cell.metric.split("/")
    return parts[-2], parts[-1].replace("_at_", "@")


def simulate(tables, params, rng, scale: float = 1.0, shift=None):
    """A faithful run's tables: each run of ours (a per-query file and measure) moved off the published figure
    by the print's rounding and, for a trained run, training noise from the profile's prior (x ``scale``).

    A run's per-query values, with the measure's own support (RR in {0, 1/k}, hits in {0, 1}), can average to
    any target to within 1/(10 n): the check reads only their mean, so the mean is moved here, once per run
    (a run shown in Tables 1, 3 and 4 moves the same in each); ``test_a_faithful_run_written_as_files_passes``
    writes such values to files and checks them through the command. Only the expected cells are rebuilt.
    """
    from qac.reporting.check import deterministic_row
    from qac.reporting.tables import _SCALE, Table

    deviations: dict[tuple[str, str], float] = {}
    by_key = {table.key: table for table in tables}
    moved = {key: Table(table.key, table.title, table.unit, table.columns) for key, table in by_key.items()}
    for expected in _expected():
        table = by_key.get(expected.table)
        cell = table.cells.get((expected.row, expected.column)) if table else None
        if cell is None or cell.value is None or cell.source is None:
            continue
        key = _run_key(cell)
        if key not in deviations:
            split, measure = _split_and_measure(cell)
            deviation = faithful_deviation(params, measure, split, rng, deterministic_row(expected.row),
                                           rounding=expected.rounding / _SCALE[table.unit])
            deviations[key] = deviation if deterministic_row(expected.row) else deviation * scale
        extra = (shift or {}).get((expected.row, _split_and_measure(cell)[1]), 0.0)
        moved[expected.table].cells[(expected.row, expected.column)] = replace(
            cell, value=cell.paper + deviations[key] * _SCALE[table.unit] + extra)
    return list(moved.values())


def verdict_of(tables, params):
    from qac.reporting.check import judge, reproduction_verdict

    judgements = judge(tables, _expected(), params.check.training_noise)
    return judgements, reproduction_verdict(judgements)


def test_faithful_runs_with_training_noise_pass_at_least_95_percent_of_the_time(faithful_tables, paper_params):
    rng = np.random.default_rng(2023)
    passed = sum(verdict_of(simulate(faithful_tables, paper_params, rng), paper_params)[1].ok
                 for _ in range(SIMULATIONS))
    assert passed >= 0.95 * SIMULATIONS, f"{passed} of {SIMULATIONS} faithful runs passed"
    # The same check has power: runs twice as noisy as the prior are mostly refused.
    rng = np.random.default_rng(7)
    noisy = sum(verdict_of(simulate(faithful_tables, paper_params, rng, scale=2.0), paper_params)[1].ok
                for _ in range(50))
    assert noisy <= 10, f"{noisy} of 50 runs twice as noisy as a faithful one passed"


def test_a_faithful_run_written_as_files_passes(paper_params, tmp_path, capsys):
    """Per-query values with each measure's support, averaging to a faithful run's noisy figures, through the
    command: reproduced, and some cells only within noise (their basis named)."""
    from qac.cli import main

    write_paper_outputs(paper_params, tmp_path, noise_seed=11)
    params_path = tmp_path / "params.yaml"
    params_path.write_text(yaml.safe_dump(_paper_raw()))
    rr = json.loads(next(tmp_path.glob("eval/*/r1/msmarco-passage/dev.per_query.json")).read_text())["RR@10"]
    assert set(np.round(list(rr.values()), 12)) <= {0.0, *np.round([1 / k for k in range(1, 11)], 12)}
    assert len(rr) == QUERY_COUNTS["dev"]
    capsys.readouterr()
    status = main(["check", "--params", str(params_path), "--data", str(tmp_path), "--expected", str(PAPER_EXPECTED)])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0, "\n".join(line for line in lines if not line.startswith(("REPRODUCED", "WITHIN")))
    assert any(line.startswith("WITHIN NOISE ") and "basis: training noise prior" in line for line in lines)
    assert lines[-1].startswith("check (reproduction of published figures): reproduced: ")


def _shifted_cells(tables, predicate, points):
    """``{(row, measure): points}`` for every cell of Table 1/3/4 whose row and column satisfy ``predicate``."""
    shift = {}
    for table in tables:
        for (row, column), cell in table.cells.items():
            if cell.metric and not cell.difference and predicate(row, column):
                shift[(row, _split_and_measure(cell)[1])] = points
    return shift


def test_every_trained_dev_mrr_cell_1_5_points_short_fails(faithful_tables, paper_params):
    from qac.reporting.check import DIFFERS, deterministic_row

    shift = _shifted_cells(faithful_tables, lambda row, column: "MS MARCO dev MRR@10" in column
                           and not deterministic_row(row), -1.5)
    rng = np.random.default_rng(5)
    for _ in range(20):
        judgements, verdict = verdict_of(simulate(faithful_tables, paper_params, rng, scale=0.0, shift=shift),
                                         paper_params)
        mrr = [j for j in judgements if "MS MARCO dev MRR@10" in j.expected.column and not j.deterministic]
        assert mrr and all(j.verdict == DIFFERS for j in mrr)
        assert not verdict.ok


def test_a_reference_row_half_a_point_short_fails_where_a_trained_row_would_not(faithful_tables, paper_params):
    from qac.reporting.check import DIFFERS, WITHIN_NOISE

    reference = "published checkpoint Luyu/co-condenser-marco-retriever"
    trained = "coCondenser+QaC (C=5), retriever 1"
    shift = {(reference, "RR@10"): -0.5, (trained, "RR@10"): -0.5}
    judgements, verdict = verdict_of(simulate(faithful_tables, paper_params, np.random.default_rng(0), scale=0.0,
                                              shift=shift), paper_params)
    by_row = {(j.expected.table, j.expected.row): j for j in judgements if "MRR@10" in j.expected.column
              and j.expected.table == "table1"}
    assert by_row[("table1", reference)].verdict == DIFFERS
    assert "basis: rounding + float noise" in by_row[("table1", reference)].line()
    assert by_row[("table1", trained)].verdict == WITHIN_NOISE
    assert not verdict.ok and verdict.deterministic_misses == 1


def test_a_shortfall_every_cell_shares_fails_though_each_cell_is_within_noise(faithful_tables, paper_params):
    from qac.reporting.check import DIFFERS, deterministic_row

    shift = _shifted_cells(faithful_tables, lambda row, column: "MS MARCO dev MRR@10" in column
                           and not deterministic_row(row), -0.6)
    judgements, verdict = verdict_of(simulate(faithful_tables, paper_params, np.random.default_rng(1), scale=0.0,
                                              shift=shift), paper_params)
    assert not any(j.verdict == DIFFERS for j in judgements)
    failed = [shift for shift in verdict.shifts if shift.fails]
    assert [shift.group for shift in failed] == ["msmarco-passage dev RR@10"]
    assert failed[0].mean_deviation == pytest.approx(-0.6, abs=0.06) and not verdict.ok


# ---------------------------------------------------------------- claims

def _twin_folders(params, root):
    from qac.reporting.lineage import load_study
    from qac.reporting.tables import TableContext

    ctx = TableContext.from_params(load_study(params, root), params)
    for method in ("cocondenser", "cotmae"):
        passage, query = ctx.variant(method, "passage"), ctx.variant(method, "query")
        for folder in ("eval", "beir"):        # retrievers 1 and 2; Table 2's zero-shot retriever
            yield root / folder / passage.name, root / folder / query.name


def _claims(params, root):
    from qac.reporting.claims import judge_claims
    from qac.reporting.lineage import load_study
    from qac.reporting.tables import TableContext

    return {r.claim.id: r for r in judge_claims(TableContext.from_params(load_study(params, root), params))}


def test_query_context_equal_to_its_passage_twin_confirms_no_claim_of_a_gain(paper_params, tmp_path):
    from qac.reporting.claims import NOT_CONFIRMED

    write_paper_outputs(paper_params, tmp_path)
    for passage, query in _twin_folders(paper_params, tmp_path):
        shutil.rmtree(query)
        shutil.copytree(passage, query)
    results = _claims(paper_params, tmp_path)
    gains = [r for r in results.values() if r.claim.kind == "gain"]
    assert len(gains) == 6
    for result in gains:
        assert result.verdict == NOT_CONFIRMED, result.line()
        assert result.line().startswith(f"CLAIM {result.claim.id}: NOT CONFIRMED: Δ +0.0")


def test_the_claims_of_a_faithful_run_and_of_a_reversed_one(paper_params, tmp_path):
    from qac.reporting.claims import CONFIRMED, CONTRADICTED, NOT_TESTABLE

    write_paper_outputs(paper_params, tmp_path)
    results = _claims(paper_params, tmp_path)
    # The simulated systems are drawn independently per query (a real pair of runs is correlated, so its test
    # is stronger): CoT-MAE's +1.4 is seen, coCondenser's +0.4 lies below the test's MDE.
    assert results["qac-beats-passage-cotmae-r1"].verdict == CONFIRMED
    assert results["qac-beats-passage-cocondenser-r1"].verdict == NOT_TESTABLE
    assert "MDE" in results["qac-beats-passage-cocondenser-r1"].line()
    assert results["beir-average-rises-cotmae"].verdict == CONFIRMED
    assert "over 14 zero-shot datasets" in results["beir-average-rises-cotmae"].line()
    # Swap CoT-MAE's twins: the gain turns into a significant loss.
    for passage, query in list(_twin_folders(paper_params, tmp_path))[2:]:
        passage.rename(passage.with_name("swap"))
        query.rename(passage)
        passage.with_name("swap").rename(query)
    results = _claims(paper_params, tmp_path)
    assert results["qac-beats-passage-cotmae-r1"].verdict == CONTRADICTED


def test_claim_decisions_follow_the_interval_and_the_scaled_effect():
    from qac.reporting.claims import (CONFIRMED, CONTRADICTED, NOT_CONFIRMED, NOT_TESTABLE, Claim, Comparison,
                                      System, _decide)

    system = System("cocondenser", "query")
    gain = Claim("g", "Table 1", "a gain", "gain", system, system, "r1", "mrr@10", effect=0.4, baseline=37.0)
    level = Claim("l", "Table 3", "level", "level", system, system, "r1", "mrr@10", margin=1.0, baseline=37.0)
    no_gain = Claim("n", "Table 4", "no gain", "no_gain", system, system, "r1", "mrr@10", margin=1.0, baseline=37.0)
    assert _decide(gain, Comparison("", 0.5, 0.2, 0.01, 6980)) == CONFIRMED
    assert _decide(gain, Comparison("", -0.5, 0.2, 0.01, 6980)) == CONTRADICTED
    assert _decide(gain, Comparison("", 0.1, 0.2, 0.6, 6980)) == NOT_TESTABLE      # MDE 0.56 > 0.4
    assert _decide(gain, Comparison("", 0.01, 0.05, 0.8, 6980)) == NOT_CONFIRMED   # MDE 0.14 < 0.4
    # At a tenth of the paper's level the effect carried there is 0.04: the same test cannot see it.
    assert _decide(gain, Comparison("", 0.01, 0.05, 0.8, 6980), level=0.1) == NOT_TESTABLE
    assert _decide(level, Comparison("", 0.2, 0.3, 0.5, 6980)) == CONFIRMED        # 0.2 + 0.49 < 1
    assert _decide(level, Comparison("", 2.0, 0.3, 0.0001, 6980)) == CONTRADICTED  # 2 - 0.49 > 1
    assert _decide(level, Comparison("", 0.2, 0.7, 0.8, 6980)) == NOT_TESTABLE     # half-width 1.15 >= 1
    assert _decide(level, Comparison("", 0.8, 0.3, 0.01, 6980)) == NOT_CONFIRMED
    assert _decide(no_gain, Comparison("", -1.7, 0.3, 0.0001, 6980)) == CONFIRMED
    assert _decide(no_gain, Comparison("", 2.0, 0.3, 0.0001, 6980)) == CONTRADICTED


def test_a_gain_is_called_at_its_holm_adjusted_p_over_every_gain_tested(monkeypatch):
    """Ten claims at 0.05 each would find one by chance every other run: a gain is confirmed or contradicted
    only at its Holm-adjusted p over the family; an equivalence claim keeps its own interval."""
    from qac.reporting import claims as claims_module
    from qac.reporting.claims import (CONFIRMED, CONTRADICTED, NOT_CONFIRMED, NOT_TESTABLE, Claim, ClaimResult,
                                      Comparison, System, _decide)

    system = System("cocondenser", "query")
    gains = [Claim(f"g{i}", "Table 1", "a gain", "gain", system, system, "r1", "mrr@10", effect=0.4, baseline=37.0)
             for i in range(4)]
    level = Claim("l", "Table 3", "level", "level", system, system, "r1", "mrr@10", margin=1.0, baseline=37.0)
    # raw p 0.026 (a loss), 0.004, 0.3, 0.5: Holm gives 0.078, 0.016, 0.6, 0.6
    comparisons = {"g0": Comparison("", -0.4, 0.18, 0.026, 6980), "g1": Comparison("", 0.6, 0.2, 0.004, 6980),
                   "g2": Comparison("", 0.05, 0.05, 0.3, 6980), "g3": Comparison("", 0.03, 0.05, 0.5, 6980),
                   "l": Comparison("", 0.2, 0.3, 0.01, 6980)}

    def judged(claim, ctx):
        comparison = comparisons[claim.id]
        return ClaimResult(claim, _decide(claim, comparison), [(comparison, _decide(claim, comparison))], "m")

    monkeypatch.setattr(claims_module, "judge_claim", judged)
    results = {r.claim.id: r for r in claims_module.judge_claims(None, gains + [level])}
    assert _decide(gains[0], comparisons["g0"]) == CONTRADICTED          # alone, at its raw p
    assert results["g0"].verdict == NOT_TESTABLE and "p_holm=0.078" in results["g0"].line()
    assert results["g1"].verdict == CONFIRMED and "p_holm=0.016" in results["g1"].line()
    assert results["g2"].verdict == results["g3"].verdict == NOT_CONFIRMED
    assert results["l"].verdict == CONFIRMED and "p_holm" not in results["l"].line()


def test_a_broken_claims_file_is_one_paragraph_naming_the_claim_and_field(tmp_path):
    from qac.reporting.claims import ClaimsFileError, load_claims

    good = yaml.safe_load((REPO_ROOT / "qac" / "reporting" / "claims.yaml").read_text())
    assert len(load_claims()) == len(good["claims"]) == 10
    cases = {"kind": ("fancy", "claims[0].kind: 'fancy' is not one of gain, level, no_gain"),
             "effect": (-1, "claims[0].effect: a gain claim needs a positive finite effect, got -1"),
             "first": ({"method": "bert", "context": "query"}, "claims[0].first.method: 'bert' is not a pre-training"),
             "baseline": (None, "claims[0].baseline: the paper's figure of the second system")}
    for field, (value, message) in cases.items():
        document = yaml.safe_load((REPO_ROOT / "qac" / "reporting" / "claims.yaml").read_text())
        document["claims"][0][field] = value
        path = tmp_path / "claims.yaml"
        path.write_text(yaml.safe_dump(document))
        with pytest.raises(ClaimsFileError) as error:
            load_claims(path)
        assert str(error.value).startswith(f"{path}: {message}"), str(error.value)
        assert "\n" not in str(error.value)


# ---------------------------------------------------------------- reruns: the measured machine spread

@pytest.fixture()
def project(tmp_path, monkeypatch):
    from dvc_study import RAW_PARAMS, write_study

    write_study(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(RAW_PARAMS), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def qac(*argv: str) -> int:
    from qac.cli import main

    return main(["check", "--params", "params.yaml", *argv])


def _other_machine(project: Path, name: str, rr_change: dict[str, float], environment: dict) -> Path:
    """Record the study as another machine left it: ``rr_change`` sets single RR@10 values of one retriever."""
    from dvc_study import PROFILE

    path = project / "data" / PROFILE / "eval" / "cocondenser-passage" / "r1" / "scifact" / "test.per_query.json"
    before = path.read_text()
    values = json.loads(before)
    values["RR@10"].update(rr_change)
    path.write_text(json.dumps(values))
    out = project / f"{name}.yaml"
    assert qac("--record", "--expected", str(out)) == 0
    document = yaml.safe_load(out.read_text())
    document["environment"] = environment
    out.write_text(yaml.safe_dump(document))
    path.write_text(before)
    return out


def test_a_rerun_is_held_to_the_spread_other_machines_were_measured_to_give(project, capsys):
    from dvc_study import PROFILE, RR

    from qac.reporting.check import read_document

    other = _other_machine(project, "avx2", {"q1": 0.5}, {"cpu": "Another CPU", "torch_kernels": "AVX2"})
    assert qac("--record", "--machine-runs", str(other)) == 0
    document = read_document(project / "expected" / "smoke.yaml")
    assert document.machine_runs == [{"cpu": "Another CPU", "torch_kernels": "AVX2"}]
    cell = next(c for c in document.cells if c.row == "coCondenser passage context, retriever 1" and c.column == RR)
    assert cell.machine_values[0] != cell.value and len(cell.machine_values) == 1
    capsys.readouterr()
    assert qac() == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "check: reproduced (same bytes)" in line]
    # The other machine moved one query of that retriever by 0.2 of the range (5 points of the mean): the band of
    # its column widens past two queries' worth where the spread says so, and names the measured basis.
    path = project / "data" / PROFILE / "eval" / "cocondenser-passage" / "r1" / "scifact" / "test.per_query.json"
    values = json.loads(path.read_text())
    values["RR@10"]["q1"] = 0.5
    path.write_text(json.dumps(values))
    assert qac() == 0
    out = capsys.readouterr().out
    assert "check: reproduced (within the noise of another machine)" in out
    assert "Recorded on " in out and "torch 2." in out


def test_leaving_a_run_out_of_the_basis_judges_it_by_the_others(project):
    from qac.reporting.check import judge_machine_run, leave_out, read_document, read_machine_run

    first = _other_machine(project, "first", {"q1": 0.9}, {"cpu": "A", "torch_kernels": "AVX2"})
    second = _other_machine(project, "second", {"q1": 0.3}, {"cpu": "B", "torch_kernels": "DEFAULT"})
    assert qac("--record", "--machine-runs", str(first), str(second)) == 0
    document = read_document(project / "expected" / "smoke.yaml")
    run = read_machine_run(first)
    kept = leave_out(document, run)
    assert kept.machine_runs == [{"cpu": "B", "torch_kernels": "DEFAULT"}]
    assert all(len(c.machine_values) == 1 for c in kept.cells)
    assert judge_machine_run(document, run).moved > 0


def test_machine_values_must_match_the_machine_runs(project, capsys):
    from qac.reporting.check import ExpectedFileError, read_document

    path = project / "expected.yaml"
    path.write_text("kind: rerun\nmachine_runs: [{cpu: A}]\ncells:\n"
                    "- {table: t, row: r, column: c, value: 0.5, unit: fraction, machine_values: [0.4, 0.6]}\n")
    with pytest.raises(ExpectedFileError) as error:
        read_document(path)
    assert str(error.value).startswith(f"{path}:4: cells[0]: field 'machine_values' must list one number (or null) "
                                       "per entry of machine_runs (1)")


# ---------------------------------------------------------------- the recorded runs under other kernel sets
KERNEL_SET_RUNS = sorted((Path(__file__).resolve().parent.parent / "reports" / "kernel_sets" / "smoke").glob("*.yaml"))


@pytest.mark.parametrize("path", KERNEL_SET_RUNS, ids=[path.stem for path in KERNEL_SET_RUNS])
def test_each_recorded_kernel_set_run_passes_the_committed_check_with_itself_left_out(path):
    """The smoke profile's runs on other CPUs and kernel sets (benchmarks/bench_kernel_sets.py) are the
    rerun check's measured basis; each must also pass when the basis no longer holds it, else the basis
    only vouches for the runs it was measured on."""
    from qac.params import load_params
    from qac.reporting import check

    repo = path.parents[3]
    document = check.read_document(repo / load_params(repo / "profiles" / "smoke" / "params.yaml").check.expected)
    run = check.read_machine_run(path)
    verdict = check.judge_machine_run(check.leave_out(document, run), run)
    assert verdict.outcome in (check.SAME_BYTES, check.MACHINE_NOISE), (verdict.outcome, verdict.outside)
    assert verdict.cells == len(document.cells)


def test_a_deterministic_row_may_miss_only_where_a_measured_machine_moved_it():
    """BM25 scores alike on every machine measured: it may not move. The untuned encoder's R@50 flips a near
    tie at the cut-off under other kernels (measured): that is machine noise, counted like a trained miss."""
    from qac.reporting.check import DETERMINISTIC, Expected, Outcome

    column = "SciFact test R@50 (hit rate)"
    bm25 = Expected("table1", "BM25", column, 95.33, "percent", noise=DETERMINISTIC, machine_values=(95.33, 95.33))
    untuned = Expected("table1", "start encoder, not fine-tuned", column, 21.0, "percent", noise=DETERMINISTIC,
                       machine_values=(21.0, 20.67))
    assert Outcome(bm25, 94.0, 0.667).strict and not Outcome(bm25, 94.0, 0.667).ok
    assert not Outcome(untuned, 20.0, 0.667).strict
    assert Outcome(Expected("table1", "BM25", column, 95.33, "percent", noise=DETERMINISTIC), 94.0, 0.667).strict
