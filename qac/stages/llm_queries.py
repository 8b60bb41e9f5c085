"""The LLM-query stages: generate_llm_queries@<g>, filter_llm_queries@<g> and pretrain_llm@<variant>.

``data/<profile>/llm_queries/<g>/`` holds what generator ``g``
(``llm_queries.generators.<g>``) wrote: ``queries.arrow`` (the schema of
``queries.arrow``: pid, queries, row i for passage i), ``prompts.json``
(the model, its revision, the templates, the few-shot examples and the type of
each candidate, so that every prompt can be rebuilt), ``metrics/queries.json``;
the filter stage adds ``filtered.arrow`` and ``metrics/filter.json`` (the kept
share of each filter and overall, and Table 5's judge on the first query
before and after filtering). Generation runs through the chunk store of
:mod:`qac.querygen.shards` as ``generate_queries`` does: sharded, resumable,
byte-identical on a rerun.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from qac.config import profile_dir
from qac.errors import UserError

FILTERED = "filtered.arrow"


def query_dir(params, generator: str) -> Path:
    """``data/<profile>/llm_queries/<generator>/``."""
    return profile_dir(params) / "llm_queries" / generator


def variant_queries(params, variant: str) -> Path:
    """The queries file an LLM-query variant pre-trains on."""
    spec = params.llm_queries.variants[variant]
    return query_dir(params, spec.generator) / (FILTERED if spec.filtered else "queries.arrow")


def checked_generator(params, name: str):
    from qac.params import params_path

    generators = params.llm_queries.generators
    if name not in generators:
        raise UserError(f"{params_path()}: llm_queries.generators has no entry {name!r} (declared: "
                        f"{', '.join(generators) or 'none'})")
    return generators[name]


def prompt_book(params):
    """The prompts of every generator: the templates and ``shots`` examples drawn from the training queries."""
    from qac.llm_queries.prompts import PromptBook, check_templates, draw_examples
    from qac.params import params_path
    from qac.querygen.generator_pairs import build_pairs

    section = params.llm_queries.generation
    problems = check_templates(section.query_types, section.templates, section.example_template)
    if problems:
        raise UserError(f"{params_path()}: llm_queries.generation." + "; ".join(problems))
    examples = []
    if section.shots:
        if not params.train_dataset:
            raise UserError(f"{params_path()}: llm_queries.generation.shots {section.shots} needs train_dataset "
                            "(the training queries the examples come from); set shots: 0 for zero-shot prompts")
        datasets = profile_dir(params) / "datasets"
        pairs = [(p.doc_id, p.source, p.target) for p in build_pairs(datasets, params.train_dataset,
                                                                     [params.train_dataset], False) if p.kind == "query"]
        try:
            examples = draw_examples(pairs, section.shots, params.seed)
        except ValueError as error:
            raise UserError(f"{params_path()}: llm_queries.generation.shots: {error}") from None
    return PromptBook(query_types=tuple(section.query_types), templates=dict(section.templates),
                      example_template=section.example_template, examples=tuple(examples),
                      passage_tokens=section.passage_tokens, example_tokens=section.example_tokens)


def causal_settings(params, name: str):
    from qac.llm_queries.causal_lm import CausalSettings

    entry, section = checked_generator(params, name), params.llm_queries.generation
    sampling = {key: section[key] for key in ("queries_per_passage", "top_p", "top_k", "temperature",
                                              "repeat_penalty", "min_new_tokens", "max_new_tokens",
                                              "drop_duplicates", "drop_empty")}
    return CausalSettings(model=entry.model, revision=entry.revision, gguf_file=entry.gguf_file, chat=entry.chat,
                          prompts=prompt_book(params), seed=params.seed, **sampling)


def generate_llm_queries(params, name: str, *, shard=None, merge=False, merge_only=False) -> dict | None:
    """Generate ``queries.arrow`` and ``prompts.json`` of generator ``name``; the summary in the merging process."""
    import torch

    from qac.distributed import autocast_dtype, init_distributed
    from qac.io import atomic_path
    from qac.llm_queries.causal_lm import CausalQueryGenerator, describe, load_causal_generator, resolve_decode
    from qac.stages.generation import run_sharded_generation
    from qac.tracking.lifecycle import tracked_stage

    section = params.llm_queries.generation
    data, out_dir = profile_dir(params), query_dir(params, name)
    passages = data / "passages.arrow"
    if not passages.exists():
        raise UserError(f"{passages} not found: run the split_passages stage first")
    settings = causal_settings(params, name)
    ctx = init_distributed()
    dtype = autocast_dtype(section.dtype, ctx.device)
    decode = resolve_decode(section.decode, torch.device(ctx.device))
    # The batch and the loop shape the logits, so they are part of the chunks' fingerprint (resume stays exact).
    compute = {"dtype": str(dtype or "float32"), "batch_size": section.batch_size, "decode": decode,
               "sync_every": section.sync_every}
    stage = f"generate_llm_queries@{name}"

    def open_run():
        return tracked_stage(params, stage, stage, kind="querygen",
                             stage_params={**describe(settings), **{k: section[k] for k in section}, **compute},
                             inputs={"passages": passages}, output=out_dir / "queries.arrow", root=data)

    def make_generator():
        model, tokenizer = load_causal_generator(settings.model, settings.revision, settings.gguf_file, ctx.device,
                                                 seed=params.seed)
        return CausalQueryGenerator(model, tokenizer, settings, autocast_dtype=dtype, sync_every=section.sync_every,
                                    decode=decode)

    out_dir.mkdir(parents=True, exist_ok=True)
    merged = run_sharded_generation(ctx, shard=shard, merge=merge, merge_only=merge_only, stage=stage,
                                    passages_path=passages, output=out_dir / "queries.arrow",
                                    source=settings.model, settings=settings, section=section, compute=compute,
                                    open_run=open_run, make_generator=make_generator,
                                    summarize=lambda totals: totals.summary())
    if merged is None:
        return None
    with atomic_path(out_dir / "prompts.json") as tmp:
        tmp.write_text(json.dumps(describe(settings), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return merged[0]


def _read_queries(path: Path) -> tuple[list[str], list[list[str]]]:
    from qac.data.arrowstore import open_queries

    table = open_queries(path)
    return table.column("pid").to_pylist(), table.column("queries").to_pylist()


def _passage_texts(path: Path, rows: int) -> list[str]:
    from qac.data.arrowstore import open_passages

    return open_passages(path).slice(0, rows).column("text").to_pylist()


def filter_llm_queries(params, name: str) -> dict[str, Any]:
    """Write ``filtered.arrow`` of generator ``name`` and its figures (kept shares, Table 5's judge)."""
    from qac.data.arrowstore import write_queries
    from qac.llm_queries.filtering import Bm25Passages, EncoderPassages, FilterSettings, apply_filters
    from qac.querygen.shards import passages_tokenizer
    from qac.reporting.dvc_metrics import write_stage_metrics
    from qac.tracking.lifecycle import tracked_stage

    checked_generator(params, name)
    data, out_dir = profile_dir(params), query_dir(params, name)
    raw, passages_path = out_dir / "queries.arrow", data / "passages.arrow"
    if not raw.exists():
        raise UserError(f"{raw} not found: run generate_llm_queries@{name} first")
    section = params.llm_queries.filter
    settings = FilterSettings(**{field: section[field] for field in FilterSettings.__dataclass_fields__})
    stage = f"filter_llm_queries@{name}"
    with tracked_stage(params, stage, stage, kind="query_filter", stage_params=dict(section),
                       inputs={"queries": raw, "passages": passages_path}, output=out_dir / FILTERED,
                       root=data) as tracking:
        pids, queries = _read_queries(raw)
        texts = _passage_texts(passages_path, len(pids))
        encoder = {}

        def retriever(kind: str):
            if kind == "bm25":
                return encoder.setdefault("bm25", Bm25Passages(texts))
            if "encoder" not in encoder:
                from qac.evaluation.annotation import EncoderCosineJudge

                judge = EncoderCosineJudge(params.pretrain.common.init, max_length=params.split.max_len)
                encoder["encoder"] = EncoderPassages(texts, judge)
            return encoder["encoder"]

        kept, figures = apply_filters(queries, texts, settings, retriever)
        if section.judge_passages:
            figures.update(judge_effect(params, texts, queries, kept))
        write_queries(out_dir / FILTERED, ({"pid": pid, "queries": q} for pid, q in zip(pids, kept)),
                      *passages_tokenizer(passages_path))
        tracking.log_metrics(figures)
        write_stage_metrics(out_dir / "metrics", "filter", figures)
    return figures


def judge_effect(params, passages: list[str], before: list[list[str]], after: list[list[str]]) -> dict[str, float]:
    """Table 5's measure on ``judge_passages`` passages drawn with the seed among those with a query: the share
    the automatic judge calls highly correlated of (passage, first query) pairs, before and after filtering (a
    passage left without a query is a low pair), their difference and its paired test."""
    from qac.data.prepared import load_prepared
    from qac.evaluation.annotation import EncoderCosineJudge, calibration_pairs
    from qac.evaluation.significance import compare_paired

    annotation, seed = params.annotation, params.seed
    eligible = [i for i, texts in enumerate(before) if texts]
    sample = sorted(random.Random(seed).sample(eligible, min(params.llm_queries.filter.judge_passages, len(eligible))))
    if not sample or not params.train_dataset:
        return {}
    dataset_dir = profile_dir(params) / "datasets" / params.train_dataset
    judge = EncoderCosineJudge(annotation.judge_model, max_length=annotation.judge_max_len)
    positives, negatives = calibration_pairs(dataset_dir, annotation.calibration_split, annotation.calibration_pairs,
                                             seed, load_prepared(dataset_dir).rel_threshold(annotation.calibration_split))
    threshold = judge.calibrate(positives, negatives).threshold

    def high(lists) -> dict[str, float]:
        pairs = [(passages[i], lists[i][0]) for i in sample if lists[i]]
        scores = iter(judge.scores(pairs))
        return {str(i): float(next(scores) >= threshold) if lists[i] else 0.0 for i in sample}

    first_before, first_after = high(before), high(after)
    comparison = compare_paired(first_after, first_before, params.tables.permutations, seed)
    share_before = sum(first_before.values()) / len(sample)
    share_after = sum(first_after.values()) / len(sample)
    figures = {"judge/passages": len(sample), "judge/threshold": threshold,
               "judge/high_share/before": share_before, "judge/high_share/after": share_after,
               "judge/difference": share_after - share_before}
    if comparison.p_value is not None:
        figures["judge/difference/p_value"] = comparison.p_value
    return figures
