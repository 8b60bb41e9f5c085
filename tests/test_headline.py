"""The headline metrics file: a few dozen cells of Tables 1-5, named by table, row and column, for `dvc exp show`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dvc_study import ANNOTATION, BM25, IN_DOMAIN, PARAMS, PROFILE, ZERO_SHOT, mean, write_study

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    return write_study(tmp_path_factory.mktemp("headline"))


@pytest.fixture(scope="module")
def headline(study):
    from qac.reporting.headline import headline_metrics
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    return headline_metrics(build_tables(load_study(PARAMS, study), PARAMS))


def flat(headline) -> dict[str, float]:
    return {f"{table}.{row}.{column}": value for table, rows in headline.items()
            for row, columns in rows.items() for column, value in columns.items()}


@pytest.mark.parametrize("label, name", [
    ("coCondenser+QaC (C=4), retriever 1", "cocondenser-query-q4-r1"),
    ("Δ coCondenser query − passage context, retriever 2", "Δcocondenser-query-passage-r2"),
    ("start encoder, not fine-tuned", "untuned"),
    ("no pre-training, zero-shot retriever on MS MARCO hard negatives", "none-beir"),
    ("CoT-MAE C=20", "cotmae-q20"),
    ("MASTER w/o (passage)", "master-passage"),
    ("high correlation %", "high%"),
    ("SciFact test RR@10 [paper: MS MARCO dev MRR@10]", "scifact-test-rr@10"),
])
def test_short_names_keep_what_tells_rows_apart(label, name):
    from qac.reporting.headline import short_name

    assert short_name(label) == name


def test_the_headline_holds_each_tables_lead_cells_computed_by_hand(headline):
    values = flat(headline)
    assert values["table1.bm25.RR@10"] == pytest.approx(100 * mean(BM25[0]))
    rr = {key: 100 * mean(measures[0]) for key, measures in IN_DOMAIN.items()}
    assert values["table1.cocondenser-query-q5-r1.RR@10"] == pytest.approx(rr["cocondenser-query-q5", "r1"])
    assert values["table1.Δcocondenser-query-passage-r1.RR@10"] == pytest.approx(
        rr["cocondenser-query-q5", "r1"] - rr["cocondenser-passage", "r1"])
    # Table 2: the average over the zero-shot datasets, without, with and the difference (fractions).
    average = {variant: mean([mean(values) for values in datasets.values()]) for variant, datasets in ZERO_SHOT.items()}
    assert values["table2.average.cocondenser-passage"] == pytest.approx(average["cocondenser-passage"])
    assert values["table2.average.cotmae-Δ"] == pytest.approx(average["cotmae-query-q5"] - average["cotmae-passage"])
    assert values["table3.cocondenser-q1.r1-RR@10"] == pytest.approx(rr["cocondenser-query-q1", "r1"])
    assert values["table4.cocondenser-mixed-q5.RR@10"] == pytest.approx(rr["cocondenser-mixed", "r1"])
    high = {kind: 100 * mean([pair[i] == "high" for pair in ANNOTATION])
            for i, kind in enumerate(("passage-passage", "passage-query"))}
    assert values["table5.passage-query.high%"] == pytest.approx(high["passage-query"])
    assert values["table5.Δpassage-query-passage-passage.high%"] == pytest.approx(
        high["passage-query"] - high["passage-passage"])


def test_the_headline_is_a_few_dozen_short_names_without_missing_cells(headline):
    values = flat(headline)
    assert 20 <= len(values) <= 60
    assert all(isinstance(value, float) for value in values.values())   # cells without a value are left out
    assert all(re.fullmatch(r"table[1-5]\.[\w@%Δ.-]+", name) and len(name) <= 48 for name in values), values


def test_the_report_writes_the_headline_beside_the_profile_folder_as_its_tables_print(study, headline, tmp_path):
    import csv

    from qac.reporting.profile_report import write_report

    write_report(PARAMS, tmp_path / "reports", study)
    written = json.loads((tmp_path / "reports" / "headline" / f"{PROFILE}.json").read_text(encoding="utf-8"))
    assert flat(written).keys() == flat(headline).keys()
    assert flat(written) == pytest.approx(flat(headline), abs=0.051)    # rounded as printed: 0.1 points, 0.001
    with open(tmp_path / "reports" / PROFILE / "table1.csv", encoding="utf-8", newline="") as handle:
        bm25 = next(line for line in csv.DictReader(handle) if line["row"] == "BM25" and line["kind"] == "value")
    assert written["table1"]["bm25"]["RR@10"] == float(bm25["ours"])


@pytest.mark.parametrize("profile", ["smoke", "default", "paper"])
def test_the_headline_is_the_profiles_only_dvc_metrics_file_and_it_is_cached(profile):
    """Cached, so `dvc checkout` and `dvc exp apply` restore it; the only metrics file, so `dvc exp show` is narrow."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        stages = repo.stage.collect(str(REPO / "profiles" / profile / "dvc.yaml"))
        metrics = [(stage.name, out) for stage in stages for out in stage.outs if out.metric]
        dvcfile = next(iter(stages)).dvcfile
    assert [(name, Path(out.fs_path).relative_to(REPO).as_posix(), out.use_cache) for name, out in metrics] == [
        ("tables", f"reports/headline/{profile}.json", True)]
    assert not dvcfile.metrics   # no top-level metrics beside it
