"""The paper's LLM-query extension: its own table's cells, planned and costed by `qac profile plan paper --cells
--cost`, beside the paper's coCondenser C = 5 run; the paper's own cells and expected cells are unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qac.config import render_profile
from qac.gpu_cost import LLM_GENERATION, Rates, extension_costs, llm_generation_cost, stage_costs
from qac.params import validate_params, with_values
from qac.reporting.cell_plan import (EXTENSION_LLM, PRODUCED, plan_cells, plan_extension_cells,
                                     plan_unpublished_cells)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def paper_params():
    return validate_params(render_profile("paper", REPO / "profiles"))


def without_extension(params):
    variants = {name: spec.to_dict() for name, spec in params.pretrain.variants.items()
                if name not in params.llm_queries.variants}
    return with_values(params, {"llm_queries.variants": {}, "llm_queries.generators": {},
                                "pretrain.variants": variants})


def cell_keys(cells):
    return [(c.table, c.row, c.column, c.paper, c.status, c.variant, c.retriever, tuple(c.stages), tuple(c.outputs))
            for c in cells]


def test_the_paper_declares_a_pinned_llm_generator_and_its_two_variants(paper_params):
    generators = paper_params.llm_queries.generators
    assert generators and all(len(g.revision or "") == 40 and g.parameters for g in generators.values())
    variants = paper_params.llm_queries.variants
    assert {spec.filtered for spec in variants.values()} == {True, False}
    assert all((spec.method, spec.context_type, spec.query_count) == ("cocondenser", "query", 5)
               for spec in variants.values())


def test_the_paper_cells_and_the_expected_cells_are_those_without_the_extension(paper_params):
    bare = without_extension(paper_params)
    assert cell_keys(plan_cells(paper_params)) == cell_keys(plan_cells(bare))
    assert cell_keys(plan_unpublished_cells(paper_params)) == cell_keys(plan_unpublished_cells(bare))
    names = set(paper_params.llm_queries.variants)
    assert not [c for c in plan_cells(paper_params) if c.variant in names]
    expected = (REPO / paper_params.check.expected).read_text(encoding="utf-8")
    assert not [name for name in names if name in expected]          # `qac check` reads none of them
    # and the paper's own stage costs are unchanged: the extension is costed apart
    rates = Rates.fallback()
    assert stage_costs(paper_params, rates) == stage_costs(bare, rates)


def test_the_paper_tables_read_no_extension_variant(paper_params):
    from qac.reporting.lineage import load_study

    shown = {variant.name for variant in load_study(paper_params, declared_variants=True).variants()}
    assert shown == set(without_extension(paper_params).pretrain.variants) - {
        name for name, spec in paper_params.pretrain.variants.items() if spec.seed_of}
    assert not shown & set(paper_params.llm_queries.variants)


def test_the_extension_table_has_a_cell_per_variant_retriever_and_column(paper_params):
    cells = plan_extension_cells(paper_params)
    columns = [spec for spec in paper_params.tables.in_domain_columns if spec.paper and not spec.missing]
    assert len(cells) == len(paper_params.llm_queries.variants) * 2 * len(columns) == 20
    assert {c.table for c in cells} == {EXTENSION_LLM} and all(c.status == PRODUCED and c.paper is None for c in cells)
    assert not any(c.compared for c in cells)
    filtered = next(c for c in cells if c.variant == "cocondenser-llm-q5" and c.column == "r2 MS MARCO dev MRR@10")
    assert filtered.stages == ["generate_llm_queries@qwen25-3b", "filter_llm_queries@qwen25-3b",
                               "pretrain_llm@cocondenser-llm-q5", "finetune_llm@cocondenser-llm-q5",
                               "evaluate_llm@cocondenser-llm-q5"]
    assert filtered.outputs == ["data/paper/llm_queries/qwen25-3b/filtered.arrow",
                                "data/paper/eval/cocondenser-llm-q5/r2/msmarco-passage/dev.per_query.json"]
    assert "beside cocondenser-query-q5" in filtered.reason
    from qac.reporting.cell_plan import LLM_FILTERED
    from qac.stages.llm_queries import FILTERED

    assert LLM_FILTERED == FILTERED
    unfiltered = next(c for c in cells if c.variant == "cocondenser-llm-q5-unfiltered")
    assert "filter_llm_queries@qwen25-3b" not in unfiltered.stages
    assert unfiltered.outputs[0] == "data/paper/llm_queries/qwen25-3b/queries.arrow"


def test_llm_generation_costs_two_flops_a_parameter_for_each_prompt_and_query_token(paper_params):
    section = paper_params.llm_queries.generation
    row = llm_generation_cost(paper_params, "qwen25-3b")
    # 10 candidates over 3 query types: 3 prompts a passage, each at most the passage's and 3 examples' budgets
    # plus 64 template tokens; 10 queries of at most 32 tokens.
    prompt = section.passage_tokens + section.shots * section.example_tokens + 64
    assert (section.queries_per_passage, section.max_new_tokens, len(section.query_types)) == (10, 32, 3)
    tokens = 3 * prompt + 10 * 32
    seconds = 1e6 * 2 * 3.09e9 * tokens / (0.35 * 989e12)
    assert row["hours"] == pytest.approx(seconds / 3600) and row["work"] == "1,000,000 passages"
    no_count = with_values(paper_params, {"llm_queries.generators.qwen25-3b.parameters": None})
    assert llm_generation_cost(no_count, "qwen25-3b")["hours"] is None


def test_each_extension_variant_costs_its_pretraining_finetuning_and_two_encodings(paper_params):
    rates = Rates.fallback()
    rows = extension_costs(paper_params, rates)
    assert [row["stage"] for row in rows].count(LLM_GENERATION) == 1
    paper_rows = {(row["stage"], row["variant"]): row for row in stage_costs(paper_params, rates)}
    own = {(row["stage"], row["variant"]): row for row in rows}
    # the same recipe as the paper's coCondenser C = 5: the same pre-training and fine-tuning hours
    for stage in ("pretrain", "finetune (r1 and r2)"):
        assert own[(stage, "cocondenser-llm-q5")]["hours"] == paper_rows[(stage, "cocondenser-query-q5")]["hours"]
    encode = own[("encode MS MARCO (r1: mining and evaluation, r2: evaluation)", "cocondenser-llm-q5")]
    assert encode["hours"] == pytest.approx(2 * 8_841_823 / rates.encode / 3600)


def test_plan_cells_cost_prints_each_extension_cell_with_its_hours():
    result = subprocess.run([sys.executable, "-m", "qac.cli", "profile", "plan", "paper", "--cells", "--cost"],
                            cwd=REPO, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(EXTENSION_LLM)]
    assert len(lines) == 20 and all("GPU-hours: " in line and " per million split passages" in line for line in lines)
    assert "20 cells of the extension table extension_llm_queries" in result.stdout
    plain = subprocess.run([sys.executable, "-m", "qac.cli", "profile", "plan", "paper", "--cells"], cwd=REPO,
                           capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0 and "GPU-hours" not in plain.stdout and EXTENSION_LLM in plain.stdout
