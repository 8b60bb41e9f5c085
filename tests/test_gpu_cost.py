"""`qac profile plan NAME --cost`: GPU-hours per stage and variant from the GPU benchmark's figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qac.config import render_profile
from qac.gpu_cost import Rates, load_rates, pair_rate, stage_costs
from qac.params import validate_params, with_values


def paper_params():
    return validate_params(render_profile("paper"))


def figures(**overrides) -> dict:
    """A results file as benchmarks/bench_gpu.py writes it (the figures the projection reads)."""
    rows = [{"method": m, "recipe": "ours", "context": c, "pairs/s": rate}
            for (m, c), rate in {("cocondenser", "query"): 3000.0, ("cocondenser", "passage"): 1800.0,
                                 ("cotmae", "query"): 2600.0, ("cotmae", "passage"): 1500.0,
                                 ("master", "query"): 1200.0, ("master", "passage"): 700.0}.items()]
    rows.append({"method": "cocondenser", "recipe": "release", "context": "passage", "pairs/s": 900.0})
    data = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-26 07:10 UTC", "dry_run": False, "sections": {
        "pretrain": {"status": "done", "rows": rows},
        "grad_cache": {"status": "done", "time ratio": 1.2, "chunk": 64},
        "encoding": {"status": "done", "passages/s": 12000.0},
        "generation": {"status": "done", "rows": [{"passages/s": 40.0}]},
        "search": {"status": "failed", "error": "OutOfMemoryError"}}}
    data.update(overrides)
    return data


def test_each_variant_costs_its_own_pair_length_with_grad_cache_and_master():
    params = paper_params()
    rates = Rates.from_figures(figures(), "reports/bench_gpu.json")
    costs = {(row["stage"], row["variant"]): row for row in stage_costs(params, rates)}
    pretrain = {variant: row["hours"] for (stage, variant), row in costs.items() if stage == "pretrain"}
    # the paper's variants; the LLM-query extension is costed apart (tests/test_extension_plan.py)
    assert set(pretrain) == {name for name, v in params.pretrain.variants.items()
                             if v.method != "none" and name not in params.llm_queries.variants}
    steps, batch = 120_000, 2048
    # coCondenser variants cache gradients at the paper's chunk: the measured overhead applies
    assert pretrain["cocondenser-query-q5"] == pytest.approx(steps * batch / (3000 / 1.2) / 3600)
    assert pretrain["cocondenser-passage"] == pytest.approx(steps * batch / (1800 / 1.2) / 3600)
    # CoT-MAE has no in-batch loss: no caching; passage pairs are the more work
    assert pretrain["cotmae-passage"] == pytest.approx(50_000 * 16_384 / 1500 / 3600)
    assert pretrain["cotmae-passage"] > pretrain["cotmae-query-q5"]
    # mixed contexts: half the pairs at each rate (harmonic mean)
    assert pretrain["cotmae-mixed"] == pytest.approx((pretrain["cotmae-passage"] + pretrain["cotmae-query-q5"]) / 2)
    # all three MASTER variants, at MASTER's rates
    assert pretrain["master-passage"] == pytest.approx(steps * batch / 700 / 3600)
    assert pretrain["master-passage-no-dor"] == pretrain["master-passage"]
    assert "upper bound" in costs[("pretrain", "master-passage-no-dor")]["basis"]
    assert costs[("generate queries", "per million split passages")]["hours"] == pytest.approx(1e6 / 40 / 3600)


def test_fine_tuning_and_table_2_cost_what_the_paper_profile_runs():
    """Retriever 1 on the triples' ~400k queries, retriever 2 on all ~503k; Table 2's four beir_retriever
    trainings (10 epochs, passages at 350 tokens) and their BEIR encodings at 350 tokens."""
    params = paper_params()
    rates = Rates.from_figures(figures(), "reports/bench_gpu.json")
    costs = {(row["stage"], row["variant"]): row for row in stage_costs(params, rates)}
    per_query = 16 + 32 / 144                      # 15 negatives, a positive and a 32-token query
    finetune = 3 * (400_000 + 502_939) * per_query * 3 / 12000 / 3600
    assert costs[("finetune (r1 and r2)", "cotmae-passage")]["hours"] == pytest.approx(finetune)
    length = 350 / 144
    beir = 4 * 10 * 502_939 * (2 * length + 32 / 144) * 3 / 12000 / 3600
    assert costs[("beir_retriever (Table 2's retriever)", "4 variants")]["hours"] == pytest.approx(beir)
    assert costs[("encode BEIR (zero-shot)", "4 variants")]["hours"] == pytest.approx(
        4 * length * 25_000_000 / 12000 / 3600)

    judged = with_values(params, {"finetune.r1_queries": "judged", "tables.zero_shot_retriever": "r1"})
    costs = {(row["stage"], row["variant"]): row for row in stage_costs(judged, rates)}
    assert costs[("finetune (r1 and r2)", "cotmae-passage")]["hours"] == pytest.approx(
        3 * 2 * 502_939 * per_query * 3 / 12000 / 3600)
    assert not any(stage.startswith("beir_retriever") for stage, _ in costs)
    assert costs[("encode BEIR (zero-shot)", "4 variants")]["hours"] == pytest.approx(4 * 25_000_000 / 12000 / 3600)


def test_the_cost_names_the_device_and_date_or_says_there_are_no_figures(tmp_path):
    path = tmp_path / "bench_gpu.json"
    path.write_text(json.dumps(figures()), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "qac.cli", "profile", "plan", "paper", "--cost", "--figures",
                             str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "NVIDIA H100 80GB HBM3, measured 2026-11-26 07:10 UTC" in result.stdout
    assert "| pretrain | master-query-q5 |" in result.stdout and "GPU-hours" in result.stdout

    fallback = load_rates(tmp_path / "missing.json")
    assert not fallback.measured and "no GPU figures yet" in fallback.source
    rate, how = pair_rate(fallback, {"method": "cocondenser", "context_type": "passage", "grad_cache_chunk": 64})
    assert "GradCache" in how and rate < fallback.pretrain[("cocondenser", "passage")]

    dry = tmp_path / "dry.json"
    dry.write_text(json.dumps(figures(dry_run=True, device="cpu")), encoding="utf-8")
    assert "dry run" in load_rates(dry).source and not load_rates(dry).measured


def test_a_rate_the_figures_lack_is_said_not_guessed():
    """A benchmark stopped inside its pre-training section (status running) keeps the rows it finished;
    the variants whose rates are missing say so, with no hours."""
    data = figures()
    data["sections"]["pretrain"]["status"] = "running"
    data["sections"]["pretrain"]["rows"] = [r for r in data["sections"]["pretrain"]["rows"] if r["method"] != "master"]
    data["sections"]["pretrain"]["rows"].append({"method": "master", "recipe": "ours", "context": "query",
                                                 "error": "OutOfMemoryError: CUDA out of memory"})
    costs = {row["variant"]: row for row in stage_costs(paper_params(), Rates.from_figures(data, "f.json"))
             if row["stage"] == "pretrain"}
    assert costs["cotmae-passage"]["hours"] > 0
    assert costs["master-passage"]["hours"] is None and "no rate for ('master', 'passage')" in costs[
        "master-passage"]["basis"]


def test_rates_come_from_the_sections_batch_and_a_section_stopped_at_its_cap():
    """Rows at another batch (how the rate scales) are not the projection's rates; a pre-training section
    stopped at its wall cap (status failed) still lends the rows it finished."""
    data = figures()
    pretrain = data["sections"]["pretrain"]
    pretrain.update(status="failed", error="SectionStopped: stopped at its cap of 180 s", batch_size=128)
    for row in pretrain["rows"]:
        row["pairs/step"] = 128
    pretrain["rows"].append({"method": "cocondenser", "recipe": "ours", "context": "passage", "pairs/step": 256,
                             "pairs/s": 9999.0})
    rates = Rates.from_figures(data, "f.json")
    assert rates.pretrain[("cocondenser", "passage")] == 1800.0
    assert rates.pretrain[("master", "passage")] == 700.0


def test_each_row_names_the_device_and_date_of_the_figures_it_uses():
    """A benchmark file can merge runs of several days: each row names the section its rate was measured in."""
    data = figures()
    data["date"] = "2026-11-26 07:10 UTC and 2026-11-27 09:00 UTC"
    data["sections"]["generation"]["measured"] = "2026-11-27 09:00 UTC"
    for name in ("pretrain", "grad_cache", "encoding"):
        data["sections"][name]["measured"] = "2026-11-26 07:10 UTC"
    costs = {(row["stage"], row["variant"]): row for row in stage_costs(paper_params(), Rates.from_figures(data, "f"))}
    device = "NVIDIA H100 80GB HBM3"
    assert costs[("pretrain", "cotmae-passage")]["figures"] == f"{device}, pretrain 2026-11-26 07:10 UTC"
    assert costs[("pretrain", "cocondenser-passage")]["figures"] == (
        f"{device}, pretrain 2026-11-26 07:10 UTC and grad_cache 2026-11-26 07:10 UTC")
    assert costs[("generate queries", "per million split passages")]["figures"] == f"{device}, generation 2026-11-27 09:00 UTC"
    assert all(row["figures"].startswith(device) for row in costs.values())
    fallback = stage_costs(paper_params(), Rates.fallback())
    assert all(row["figures"].startswith("not measured: H100 (assumed)") or row["figures"] == "none" for row in fallback)
