"""Seeds as an axis of the study: a variant run with several seeds reads as one row, mean and spread."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from dvc_study import PROFILE, RAW_PARAMS, RR, mean, per_query, run_id, study_params, write_study

REPO = Path(__file__).resolve().parent.parent


def test_rendering_expands_a_variants_seeds_into_copies_and_leaves_the_first_as_it_was():
    from qac.config import expand_seeds

    params = {"seed": 42, "pretrain": {"variants": {
        "none": {"method": "none"},
        "a": {"method": "cocondenser", "context_type": "query", "query_count": 4, "seeds": [42, 43, 44]},
        "b": {"method": "cotmae", "context_type": "passage", "seeds": [7, 8]},
        "c": {"method": "cotmae", "context_type": "query", "query_count": 4}}}}
    variants = expand_seeds(copy.deepcopy(params))["pretrain"]["variants"]
    assert list(variants) == ["none", "a", "a-seed43", "a-seed44", "b", "b-seed8", "c"]
    # The first seed is the top-level one: the variant's entry is as it was, so its DVC stages do not rerun.
    assert variants["a"] == {"method": "cocondenser", "context_type": "query", "query_count": 4}
    assert variants["a-seed44"] == {**variants["a"], "seed": 44, "seed_of": "a"}
    assert variants["b"]["seed"] == 7 and variants["b-seed8"]["seed"] == 8
    assert variants["c"] == params["pretrain"]["variants"]["c"]
    # The profile's seeds: every pre-trained variant (no copy of `none`, which trains nothing); a variant's own win.
    variants = expand_seeds({**copy.deepcopy(params), "seeds": [42, 5]})["pretrain"]["variants"]
    assert list(variants) == ["none", "a", "a-seed43", "a-seed44", "b", "b-seed8", "c", "c-seed5"]


def test_the_smoke_profile_runs_its_headline_comparison_with_two_seeds():
    from qac.config import render_profile, variant_seed
    from qac.params.loading import load_params

    params = load_params(REPO / "profiles" / "smoke" / "params.yaml")
    assert render_profile("smoke", REPO / "profiles")["pretrain"] == params.pretrain.to_dict()
    copies = {name: spec.seed_of for name, spec in params.pretrain.variants.items() if spec.seed_of}
    assert copies == {"cocondenser-passage-seed43": "cocondenser-passage",
                      "cocondenser-query-q4-seed43": "cocondenser-query-q4"}
    assert [variant_seed(params, name) for name in ("cocondenser-passage", "cocondenser-passage-seed43")] == [42, 43]


def test_a_seed_copy_must_repeat_its_variant(tmp_path):
    import yaml

    from qac.params.errors import ParamsError
    from qac.params.loading import load_params

    params = yaml.safe_load((REPO / "profiles" / "smoke" / "params.yaml").read_text())
    variants = params["pretrain"]["variants"]
    variants["cocondenser-query-q4-seed43"]["query_count"] = 1
    variants["cocondenser-passage-seed43"]["seed_of"] = "no-such-variant"
    variants["cotmae-passage"]["seeds"] = [1, 2]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError) as error:
        load_params(path)
    text = str(error.value)
    assert "pretrain.variants.cocondenser-query-q4-seed43.seed_of" in text and "but for its seed" in text
    assert "pretrain.variants.cocondenser-passage-seed43.seed_of" in text and "'no-such-variant'" in text
    assert "pretrain.variants.cotmae-passage.seeds" in text and "qac profile render" in text


def test_a_seed_copy_may_not_repeat_a_seed_of_its_group(tmp_path):
    """Two runs of one variant on one seed would count one run twice in the mean and spread across seeds."""
    import yaml

    from qac.params.errors import ParamsError
    from qac.params.loading import load_params

    params = yaml.safe_load((REPO / "profiles" / "smoke" / "params.yaml").read_text())
    variants = params["pretrain"]["variants"]
    variants["cocondenser-passage-seed43"]["seed"] = params["seed"]          # the origin's seed (the top-level one)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(ParamsError) as error:
        load_params(path)
    text = str(error.value)
    assert "pretrain.variants.cocondenser-passage-seed43.seed" in text and "'cocondenser-passage'" in text
    rows = path.read_text().splitlines()
    start = rows.index("    cocondenser-passage-seed43:")
    line = next(number for number, row in enumerate(rows[start:], start + 1) if row.strip().startswith("seed:"))
    assert text.startswith(f"{path}:{line}: parameter pretrain.variants.cocondenser-passage-seed43.seed:")


@pytest.mark.parametrize("written, found", [("[3, 3]", "[3, 3]"), ("[]", "[]"), ("[a]", "['a']"), ("5", "5")])
@pytest.mark.parametrize("where", ["profile", "variant"])
def test_rendering_refuses_seeds_that_are_not_distinct_integers(tmp_path, written, found, where):
    import shutil

    from qac.config import render_profile
    from qac.params.errors import ParamsError

    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    source = profiles / "smoke.yaml"
    text = source.read_text()
    if where == "profile":
        text += f"seeds: {written}\n"
        key = "seeds"
    else:
        old = "cocondenser-query-q4:   {method: cocondenser, context_type: query, query_count: 4, seeds: [42, 43]}"
        assert old in text
        text = text.replace(old, old.replace("[42, 43]", written))
        key = "pretrain.variants.cocondenser-query-q4.seeds"
    source.write_text(text)
    line = next(number for number, row in enumerate(text.splitlines(), 1) if f"seeds: {written}" in row)
    with pytest.raises(ParamsError) as error:
        render_profile("smoke", profiles)
    message = str(error.value)
    assert message.startswith(f"{source}:{line}: parameter {key}: expected ") and f"found {found}" in message


def test_rendering_never_replaces_a_declared_variant_with_a_seed_copy(tmp_path):
    import shutil

    from qac.config import render_profile
    from qac.params.errors import ParamsError

    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    source = profiles / "smoke.yaml"
    old = "    cocondenser-query-q4:   {method: cocondenser, context_type: query, query_count: 4, seeds: [42, 43]}\n"
    text = source.read_text()
    assert old in text
    source.write_text(text.replace(old, old + "    cocondenser-query-q4-seed43: {method: cotmae}\n"))
    with pytest.raises(ParamsError) as error:
        render_profile("smoke", profiles)
    assert "pretrain.variants.cocondenser-query-q4.seeds" in str(error.value)
    assert "'cocondenser-query-q4-seed43', a variant declared already" in str(error.value)


@pytest.fixture()
def seeded_study(tmp_path):
    """tests/dvc_study.py's study, with coCondenser's passage and C = 5 query variants run again with seed 9."""
    write_study(tmp_path)
    variants = dict(RAW_PARAMS["pretrain"]["variants"])
    for name in ("cocondenser-passage", "cocondenser-query-q5"):
        variants[f"{name}-seed9"] = {**variants[name], "seed": 9, "seed_of": name}
    params = study_params(pretrain={**RAW_PARAMS["pretrain"], "variants": variants})
    data = tmp_path / "data" / PROFILE
    # Seed 9's retriever 1 RR@10 per query (the first seed's: passage 0.2 0.3 0.4 0.3, query 0.3 0.4 0.5 0.4).
    seed9 = {"cocondenser-passage": [0.4, 0.3, 0.2, 0.3], "cocondenser-query-q5": [0.5, 0.6, 0.7, 0.6]}
    for name, rr in seed9.items():
        folder = data / "eval" / f"{name}-seed9" / "r1" / "scifact"
        folder.mkdir(parents=True)
        (folder / "test.per_query.json").write_text(json.dumps(per_query({"RR@10": rr, "Hit@50": [1, 1, 1, 1]})))
        for retriever in ("r2",):   # retriever 2 as the first seed's, so those cells have both seeds too
            source = data / "eval" / name / retriever
            target = data / "eval" / f"{name}-seed9" / retriever
            target.mkdir(parents=True)
            for path in source.rglob("*.json"):
                (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                (target / path.relative_to(source)).write_text(path.read_text())
    return params, data, seed9


def test_a_seeded_variant_is_one_row_with_the_mean_and_each_seeds_value(seeded_study):
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    params, data, seed9 = seeded_study
    study = load_study(params, data)
    assert "cocondenser-passage-seed9" not in [v.name for v in study.variants()]   # no row of its own
    assert study.seeds("cocondenser-passage") == [3, 9]                          # the fixture's seed 3, then 9
    table1 = {table.key: table for table in build_tables(study, params)}["table1"]
    cell = table1.cell("coCondenser+QaC (C=5), retriever 1", RR)
    first, second = 100 * mean([0.3, 0.4, 0.5, 0.4]), 100 * mean(seed9["cocondenser-query-q5"])
    assert cell.seed_values == [pytest.approx(first), pytest.approx(second)]
    assert cell.value == pytest.approx((first + second) / 2) and cell.run_id == run_id("finetune/r1/cocondenser-query-q5")
    # The sampling error is over the seed-averaged per-query values: 0.4 0.5 0.6 0.5, sd sqrt(2/3 * 0.01) ...
    averaged = [0.4, 0.5, 0.6, 0.5]
    sd = math.sqrt(sum((v - 0.5) ** 2 for v in averaged) / 3)
    assert cell.std_error == pytest.approx(100 * sd / 2)
    # The paired test compares seed-averaged per-query values (query 0.4 0.5 0.6 0.5 vs passage 0.3 0.3 0.3 0.3):
    # +0.1 .. +0.3 on every query; the difference's spread is per seed: (40 - 30) and (60 - 30).
    delta = table1.cell("Δ coCondenser query − passage context, retriever 1", RR)
    assert delta.value == pytest.approx(100 * (0.5 - 0.3)) and delta.n_queries == 4
    assert delta.p_value == pytest.approx(2 / 16, abs=0.03)      # all four differences positive
    assert delta.seed_values == [pytest.approx(10.0), pytest.approx(30.0)]
    # A variant run with one seed is as before.
    assert table1.cell("CoT-MAE passage context, retriever 1", RR).seed_values is None


def test_tables_show_the_spread_and_a_missing_seed_leaves_the_row_empty(seeded_study):
    import shutil

    from qac.reporting.lineage import load_study
    from qac.reporting.render import cell_text
    from qac.reporting.table_set import build_tables

    params, data, _ = seeded_study
    table1 = build_tables(load_study(params, data), params)[0]
    cell = table1.cell("coCondenser+QaC (C=5), retriever 1", RR)
    # 40 and 60: mean 50, sd across seeds 14.14 (as precise as a difference)
    assert cell_text(table1, RR, cell).startswith("50.0 ±14.14 (2 seeds) / 37.4")
    shutil.rmtree(data / "eval" / "cocondenser-query-q5-seed9")
    table1 = build_tables(load_study(params, data), params)[0]
    cell = table1.cell("coCondenser+QaC (C=5), retriever 1", RR)
    assert cell.value is None and "no evaluation output" in cell.note   # never the first seed alone


def test_the_reproduction_check_takes_the_prior_below_three_seeds(seeded_study):
    from qac.reporting.check import Expected, judge
    from qac.reporting.lineage import load_study
    from qac.reporting.table_set import build_tables

    params, data, _ = seeded_study
    tables = build_tables(load_study(params, data), params)
    expected = Expected("table1", "coCondenser+QaC (C=5), retriever 1", RR, 37.4, "percent", rounding=0.05)
    # Ours 50 over seeds 40 and 60: two seeds cannot measure a spread, so the prior in params decides.
    [judged] = judge(tables, [expected], params.check.training_noise)
    assert judged.basis == "training noise prior" and "x sqrt(1 + 1/2); prior: estimate" in judged.line()
    assert judged.verdict == "differs"
    [judged] = judge(tables, [expected])        # no prior either: the rounding alone
    assert judged.band is None and judged.verdict == "differs"


def test_the_cell_plan_counts_the_seeds():
    from qac.config import render_profile
    from qac.params import validate_params
    from qac.reporting.cell_plan import plan_cells

    params = validate_params(render_profile("smoke", REPO / "profiles"))
    cell = next(c for c in plan_cells(params) if c.table == "table1_main" and c.row.startswith("coCondenser 120k "
                                                                                               "retriever1"))
    assert cell.variant == "cocondenser-passage" and cell.seeds == [42, 43]
    assert cell.stages[:4] == ["pretrain@cocondenser-passage", "finetune@cocondenser-passage",
                               "evaluate@cocondenser-passage", "pretrain@cocondenser-passage-seed43"]
    assert "data/smoke/eval/cocondenser-passage-seed43/r1/scifact/test.per_query.json" in cell.outputs
