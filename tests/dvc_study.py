"""A small smoke-profile study as the DVC stages leave it under data/<profile>/, every value set here.

The files have the layout of docs/architecture.md: per-query metrics of each
evaluated retriever, the ``mlflow_run.json`` record of each output (under ``.runs/``), BM25's
per-query files, the annotation summary and labels, the pre-training loss
files. Means, differences and p-values in the tests are computed by hand
from the values below.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from qac.params import Params, validate_params

PROFILE = "smoke"
SEED = 3
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# What the study's params file says (the tests that run a command write it as YAML); PARAMS is it checked.
RAW_PARAMS = {
    "profile": PROFILE,
    "seed": SEED,
    "data_dir": "data",
    "train_dataset": "scifact",
    "pretrain_corpus": "scifact",
    "zero_shot": ["nfcorpus", "cranfield"],
    "datasets": {"scifact": {"format": "beir", "splits": ["train", "test"]},
                 "nfcorpus": {"format": "beir", "splits": ["test"]},
                 "cranfield": {"format": "beir", "splits": ["test"]}},
    "pretrain": {"common": {"init": "tiny:minilm", "steps": 6, "batch_size": 8, "cotmae_decoder": "paper"},
                 "variants": {
                     "none": {"method": "none"},
                     "cocondenser-passage": {"method": "cocondenser", "context_type": "passage", "query_count": 4},
                     "cocondenser-query-q1": {"method": "cocondenser", "context_type": "query", "query_count": 1},
                     "cocondenser-query-q5": {"method": "cocondenser", "context_type": "query", "query_count": 5},
                     "cocondenser-mixed": {"method": "cocondenser", "context_type": "mixed", "query_count": 5},
                     "cotmae-passage": {"method": "cotmae", "context_type": "passage", "query_count": 4},
                     "cotmae-query-q5": {"method": "cotmae", "context_type": "query", "query_count": 5},
                     # declared but never run: no rows for it
                     "cotmae-mixed": {"method": "cotmae", "context_type": "mixed", "query_count": 5},
                 }},
    "tables": {
        "permutations": 4000,
        "in_domain_columns": [
            {"label": "SciFact test RR@10", "short": "RR@10", "dataset": "scifact", "split": "test",
             "measure": "RR@10", "paper": "mrr@10"},
            {"label": "SciFact test R@50 (hit rate)", "short": "R@50 (hit)", "dataset": "scifact", "split": "test",
             "measure": "Hit@50", "paper": "r@50"},
            {"label": "TREC DL20 nDCG@10", "missing": "TREC DL 2020: not in the smoke profile", "paper": "ndcg@10_dl20"},
        ],
    },
    "check": {"expected": "expected/smoke.yaml"},
}


def study_params(**sections: Any) -> Params:
    """The study's parameters with ``sections`` (top-level keys) replacing its own, merged onto
    ``profiles/base.yaml`` and checked, as a partial params file is read."""
    return validate_params({**copy.deepcopy(RAW_PARAMS), **sections}, complete=False)


PARAMS = study_params()
RR = "SciFact test RR@10 [paper: MS MARCO dev MRR@10]"
HIT50 = "SciFact test R@50 (hit rate) [paper: MS MARCO dev R@50 (hit rate)]"
DL20 = "TREC DL20 nDCG@10 [paper: TREC DL20 nDCG@10]"

# (variant, retriever) -> (RR@10 per query of q1..q4, Hit@50 per query); means are what the tables show.
IN_DOMAIN = {
    ("none", "r1"): ([0.1, 0.1, 0.1, 0.1], [0.5, 0.5, 0.5, 0.5]),
    ("none", "r2"): ([0.2, 0.2, 0.2, 0.2], [0.5, 0.5, 0.5, 0.5]),
    ("cocondenser-passage", "r1"): ([0.2, 0.3, 0.4, 0.3], [1, 0, 1, 0]),
    ("cocondenser-query-q1", "r1"): ([0.3, 0.3, 0.3, 0.3], [1, 1, 0, 0]),
    # +0.1 on every query: the exact two-sided sign-flip p-value is 2 / 2**4 = 0.125.
    ("cocondenser-query-q5", "r1"): ([0.3, 0.4, 0.5, 0.4], [1, 1, 1, 0]),
    ("cocondenser-mixed", "r1"): ([0.25, 0.35, 0.45, 0.35], [1, 1, 1, 1]),
    ("cocondenser-passage", "r2"): ([0.5, 0.5, 0.5, 0.5], [1, 1, 1, 1]),
    ("cocondenser-query-q5", "r2"): ([0.6, 0.4, 0.6, 0.4], [1, 1, 1, 1]),
    ("cocondenser-mixed", "r2"): ([0.5, 0.5, 0.5, 0.5], [1, 1, 1, 1]),
    ("cotmae-passage", "r1"): ([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]),
    ("cotmae-query-q5", "r1"): ([0.2, 0.2, 0.3, 0.3], [0, 1, 1, 1]),
    ("cotmae-passage", "r2"): ([0.4, 0.4, 0.4, 0.4], [1, 1, 1, 1]),
    # ("cotmae-query-q5", "r2") is deliberately missing: its cells must say so.
}
# zero-shot nDCG@10 per query (3 queries) for retriever 1
ZERO_SHOT = {
    "cocondenser-passage": {"nfcorpus": [0.3, 0.3, 0.3], "cranfield": [0.2, 0.1, 0.3]},
    "cocondenser-query-q5": {"nfcorpus": [0.4, 0.5, 0.6], "cranfield": [0.2, 0.2, 0.2]},
    "cotmae-passage": {"nfcorpus": [0.1, 0.1, 0.1], "cranfield": [0.1, 0.1, 0.1]},
    "cotmae-query-q5": {"nfcorpus": [0.2, 0.2, 0.2], "cranfield": [0.3, 0.3, 0.3]},
}
BM25 = ([0.25, 0.25, 0.25, 0.25], [1, 1, 0, 0])
UNTUNED = [0.05, 0.05, 0.05, 0.05]
# Per document: passage-passage and passage-query labels (high/low).
ANNOTATION = [("high", "high"), ("low", "high"), ("low", "high"), ("low", "low")]
GENERATOR_METRICS = {"rougeL": 0.25, "self_retrieval/generated": 0.6, "heldout_pairs": 20, "mode": "train",
                     "model": "tiny:minilm"}
QUERIES_METRICS = {"candidates": 40, "duplicate_candidates": 2, "unique_ratio": 0.95}
LOSSES = {"cocondenser-passage": [6.0, 5.0, 4.5], "cocondenser-query-q1": [6.0, 4.0, 3.0],
          "cocondenser-query-q5": [6.0, 4.5, 3.5], "cocondenser-mixed": [6.0, 4.8, 4.0],
          "cotmae-passage": [12.0, 11.0, 10.5], "cotmae-query-q5": [12.0, 10.0, 9.0]}


def mean(values):
    return sum(values) / len(values)


def run_id(name: str) -> str:
    """A stable 32-hex run id per output (MLflow's shape), so tests can name the run of a record."""
    import hashlib

    return hashlib.md5(name.encode()).hexdigest()


def _json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _record(folder: Path, name: str, **extra) -> None:
    """The run record of the output ``folder`` (``data/<profile>/<output>``), where qac.tracking keeps it."""
    data = next(parent for parent in folder.parents if parent.parent.name == "data")
    _json(data / ".runs" / folder.relative_to(data) / "mlflow_run.json", {"run_id": run_id(name), "tracking_uri": "sqlite:////elsewhere/mlflow.db",
                                       "git_commit": COMMIT, "git_dirty": False, **extra})


def per_query(measures: dict[str, list[float]]) -> dict:
    return {measure: {f"q{i + 1}": float(v) for i, v in enumerate(values)} for measure, values in measures.items()}


def write_study(root: Path) -> Path:
    """Write data/smoke/ under ``root``; returns the profile folder."""
    data = root / "data" / PROFILE
    for (variant, retriever), (rr, hit) in IN_DOMAIN.items():
        folder = data / "eval" / variant / retriever
        _json(folder / "scifact" / "test.per_query.json", per_query({"RR@10": rr, "Hit@50": hit}))
        if retriever == "r1":
            for dataset, ndcg in ZERO_SHOT.get(variant, {}).items():
                _json(folder / dataset / "test.per_query.json", per_query({"nDCG@10": ndcg}))
        _record(data / "finetune" / variant / retriever, f"finetune/{retriever}/{variant}", variant=variant,
                retriever=retriever)
    untuned = data / "eval" / "none" / "untuned"
    _json(untuned / "scifact" / "test.per_query.json", per_query({"RR@10": UNTUNED}))
    _record(untuned, "eval/untuned/none", variant="none", retriever="untuned")
    _json(data / "bm25" / "runs" / "scifact" / "test.per_query.json", per_query({"RR@10": BM25[0], "Hit@50": BM25[1]}))
    _record(data / "bm25", "baseline/bm25")
    for variant, values in LOSSES.items():
        folder = data / "pretrain" / variant
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "losses.tsv").write_text("step\tloss\tmlm\n" + "".join(
            f"{step}\t{value!r}\t{value / 2!r}\n" for step, value in enumerate(values, start=1)), encoding="utf-8")
        _record(folder, f"pretrain/{variant}", variant=variant)
    _record(data / "pretrain" / "none", "pretrain/none", variant="none")
    annotation = data / "annotation"
    labels = "item,doc_id,kind,pid,context_id,score,judge_label,human_label,votes,label,label_source\n" + "".join(
        f"A{i}{k},d{i},{kind},d{i}#0,x,0.5,{label},,,{label},judge\n"
        for i, pair in enumerate(ANNOTATION)
        for k, (kind, label) in enumerate(zip(("passage-passage", "passage-query"), pair)))
    annotation.mkdir(parents=True, exist_ok=True)
    (annotation / "labels.csv").write_text(labels, encoding="utf-8")
    _json(annotation / "summary.json", {
        "labels": "automatic judge: test labels", "label_source": "judge", "documents": 4,
        "shares": {"passage-passage": {"pairs": 4, "high": 1, "share": 0.25},
                   "passage-query": {"pairs": 4, "high": 3, "share": 0.75}},
        "judge": {"model": "tiny:minilm", "pooling": "mean", "similarity": "cosine", "max_length": 256,
                  "threshold": 0.968, "accuracy": 0.59, "f1": 0.41, "positives": 50, "negatives": 50,
                  "source": "scifact train qrels"}})
    _record(annotation, "annotation/table5")
    _json(data / "metrics" / "query_generator.json", GENERATOR_METRICS)
    _json(data / "metrics" / "queries.json", QUERIES_METRICS)
    _record(data / "generator", "query_generator", model="tiny:minilm", mode="train")
    _record(data / "queries.arrow", "generate_queries")
    return data
