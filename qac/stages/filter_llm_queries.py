"""The filter_llm_queries@<g> stage: choose among generator ``g``'s queries, and measure what the choice did.

Reads ``data/<profile>/llm_queries/<g>/queries.arrow`` and writes
``filtered.arrow`` beside it (the same schema, each passage's kept queries in
their order) and ``metrics/filter.json``: the kept share of each filter and
overall (:func:`qac.llm_queries.filtering.apply_filters`), Table 5's judge on
the first query before and after filtering (:func:`judge_effect`) and ROUGE-L
against the real training queries of the passages' documents, before and
after (:func:`rouge_against_claims`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from qac.config import profile_dir
from qac.errors import UserError
from qac.stages.llm_queries import FILTERED, checked_generator, query_dir
from qac.data.prepared import load_prepared
from qac.evaluation.annotation import EncoderCosineJudge, calibration_pairs
from qac.llm_queries.filtering import Bm25Passages, EncoderPassages, FilterSettings, apply_filters
from qac.querygen.quality import rouge_l_scores
from qac.reporting.dvc_metrics import write_stage_metrics
from qac.tracking.lifecycle import tracked_stage


def _read_queries(path: Path) -> tuple[list[str], list[list[str]]]:
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import open_queries

    table = open_queries(path)
    return table.column("pid").to_pylist(), table.column("queries").to_pylist()


def _passage_texts(path: Path, rows: int) -> list[str]:
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import open_passages

    return open_passages(path).slice(0, rows).column("text").to_pylist()


def filter_llm_queries(params, name: str) -> dict[str, Any]:
    """Write ``filtered.arrow`` of generator ``name`` and its figures (kept shares, Table 5's judge)."""
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import write_queries
    # here, not at the top: it loads numpy, pyarrow, torch
    from qac.querygen.shards import passages_tokenizer

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
                judge = EncoderCosineJudge(params.pretrain.common.init, max_length=params.split.max_len)
                encoder["encoder"] = EncoderPassages(texts, judge)
            return encoder["encoder"]

        kept, figures = apply_filters(queries, texts, settings, retriever)
        if section.judge_passages:
            figures.update(judge_effect(params, texts, queries, kept))
        figures.update(rouge_against_claims(params, pids, queries, kept))
        write_queries(out_dir / FILTERED, ({"pid": pid, "queries": q} for pid, q in zip(pids, kept)),
                      *passages_tokenizer(passages_path))
        tracking.log_metrics(figures)
        write_stage_metrics(out_dir / "metrics", "filter", figures)
    return figures


def judge_effect(params, passages: list[str], before: list[list[str]], after: list[list[str]]) -> dict[str, float]:
    """Table 5's measure on ``judge_passages`` passages drawn with the seed among those with a query: the share
    the automatic judge calls highly correlated of (passage, first query) pairs, before and after filtering (a
    passage left without a query is a low pair), their difference and its paired test."""
    # here, not at the top: it loads numpy
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


def rouge_against_claims(params, pids: list[str], before: list[list[str]], after: list[list[str]]) -> dict[str, float]:
    """ROUGE-L of the generated queries against real training queries, before and after filtering: for every
    passage whose document ``train_dataset``'s training qrels judge for a query (``doc_id#n`` pids), each of its
    queries scored against the best of its document's real queries, averaged over the queries; with the number
    of such passages. The same measure the query generator's report gives for held-out pairs, here on the
    pre-training passages the queries were written for. {} without training queries for any passage."""
    # looked up when called: tests stand in for it
    from qac.querygen.generator_pairs import build_pairs

    # The stage declares datasets/<train_dataset> a dependency; a study without it (a stand-in) has no claims.
    if not params.train_dataset or not (profile_dir(params) / "datasets" / params.train_dataset).is_dir():
        return {}
    claims: dict[str, list[str]] = {}
    for pair in build_pairs(profile_dir(params) / "datasets", params.train_dataset, [params.train_dataset], False):
        if pair.kind == "query":
            claims.setdefault(pair.doc_id, []).append(pair.target)
    judged = [i for i, pid in enumerate(pids) if pid.rpartition("#")[0] in claims]
    if not judged:
        return {}

    def mean_best(lists: list[list[str]]) -> tuple[float | None, int]:
        pairs = [(query, claim) for i in judged for query in lists[i] for claim in claims[pids[i].rpartition("#")[0]]]
        scores = iter(rouge_l_scores([query for query, _ in pairs], [claim for _, claim in pairs]))
        best = [max(next(scores) for _ in claims[pids[i].rpartition("#")[0]]) for i in judged for _ in lists[i]]
        return (sum(best) / len(best) if best else None), len(best)

    figures: dict[str, float] = {"rougeL/passages": len(judged)}
    for name, lists in (("before", before), ("after", after)):
        value, count = mean_best(lists)
        figures[f"rougeL/queries/{name}"] = count
        if value is not None:
            figures[f"rougeL/{name}"] = value
    return figures
