"""Benchmark retrieval and evaluation; writes the "retrieval" section of reports/benchmarks.md.

Measures, on this machine:
1. dense encoding throughput (passages/s) of the default encoder (all-MiniLM-L6-v2,
   [CLS] pooling, length-sorted batches) on SciFact abstracts at 128 and 256 tokens;
2. exact FAISS inner-product search (IndexFlatIP) throughput (queries/s) on a
   SciFact-sized index and on 100k random 384-d vectors;
3. evaluation of a 7,000 x 1,000 run (MS MARCO dev size at depth 1000):
   `qac.evaluation.metrics.evaluate` against `pytrec_eval`, both in memory on the
   same dicts, and the `qac eval` command end to end (reading the run file).

Usage: python benchmarks/bench_retrieval.py [--threads 2] [--docs 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MEASURES = ["RR@10", "R@50", "R@1000", "Hit@50", "Hit@1000", "nDCG@10", "AP"]
PYTREC_MEASURES = {"recip_rank", "recall.50", "recall.1000", "success.50", "success.1000", "ndcg_cut.10", "map"}


def timed(fn, repeats: int = 1):
    """Best wall time of ``repeats`` calls and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_encoding(n_docs: int) -> list[dict]:
    from qac.config import data_mirror
    from qac.data.beir import iter_corpus_jsonl
    from qac.models.loading import load_model, load_tokenizer
    from qac.retrieval.encode import encode_texts

    texts = []
    for document in iter_corpus_jsonl(data_mirror() / "scifact" / "corpus.jsonl"):
        texts.append(document.full_text)
        if len(texts) == n_docs:
            break
    model, tokenizer = load_model("minilm").eval(), load_tokenizer("minilm")
    encode_texts(model, tokenizer, texts[:32], max_length=128, batch_size=32)   # warm-up
    rows = []
    for max_length in (128, 256):
        token_ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        lengths = [len(ids) for ids in token_ids]
        seconds, _ = timed(lambda: encode_texts(model, tokenizer, texts, max_length=max_length, batch_size=64))
        rows.append({"task": f"encode SciFact abstracts, max {max_length} tokens",
                     "size": f"{len(texts)} passages, mean {np.mean(lengths):.0f} tokens",
                     "seconds": seconds, "throughput": f"{len(texts) / seconds:.1f} passages/s"})
    return rows


def bench_search() -> list[dict]:
    from qac.retrieval.search import search

    rng = np.random.default_rng(0)
    rows = []
    for label, n_passages, n_queries, k in [("SciFact-sized", 5_183, 1_109, 1000), ("random", 100_000, 1_000, 1000)]:
        passages = rng.normal(size=(n_passages, 384)).astype(np.float32)
        queries = rng.normal(size=(n_queries, 384)).astype(np.float32)
        seconds, _ = timed(lambda: search(queries, passages, k=k), repeats=2)
        rows.append({"task": f"FAISS IndexFlatIP top-{k}, {label}",
                     "size": f"{n_passages:,} x 384 passages, {n_queries:,} queries",
                     "seconds": seconds, "throughput": f"{n_queries / seconds:,.0f} queries/s"})
    return rows


def synthetic_run(n_queries: int = 7_000, depth: int = 1_000, seed: int = 0):
    """A run shaped like MS MARCO dev at depth 1000 (8.8M document ids), ~1.06 relevant per query."""
    rng = np.random.default_rng(seed)
    run, qrels = {}, {}
    for q in range(n_queries):
        docs = rng.choice(8_841_823, size=depth, replace=False)
        scores = np.sort(rng.random(depth).astype(np.float32))[::-1]
        qid = str(q)
        run[qid] = dict(zip(map(str, docs.tolist()), scores.tolist()))
        relevant = [docs[rng.integers(0, depth)]] if rng.random() < 0.8 else []
        relevant.append(rng.integers(0, 8_841_823))
        qrels[qid] = {str(doc): 1 for doc in relevant}
    return qrels, run


def bench_evaluation() -> list[dict]:
    import pytrec_eval

    from qac.evaluation.metrics import evaluate
    from qac.evaluation.trec_io import write_run

    qrels, run = synthetic_run()
    size = "7,000 queries x 1,000 documents"
    rows = []
    ours, result = timed(lambda: evaluate(qrels, run, MEASURES), repeats=2)
    rows.append({"task": f"qac evaluate() in memory, {len(MEASURES)} measures", "size": size, "seconds": ours,
                 "throughput": f"{len(run) / ours:,.0f} queries/s"})

    def reference():
        return pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES).evaluate(run)

    theirs, reference_result = timed(reference, repeats=2)
    rows.append({"task": f"pytrec_eval in memory, {len(PYTREC_MEASURES)} measures", "size": size,
                 "seconds": theirs, "throughput": f"{len(run) / theirs:,.0f} queries/s"})
    ap = np.mean([values["map"] for values in reference_result.values()])
    assert abs(ap * len(reference_result) / len(qrels) - result.aggregate["AP"]) < 1e-9, "AP disagrees"

    with tempfile.TemporaryDirectory() as tmp:
        run_path, qrels_path = Path(tmp) / "run.trec", Path(tmp) / "qrels.txt"
        write_run(run_path, run)
        qrels_path.write_text("".join(f"{q} 0 {d} {r}\n" for q, docs in qrels.items() for d, r in docs.items()))
        command = [str(Path(sys.executable).parent / "qac"), "eval", "--qrels", str(qrels_path),
                   "--run", str(run_path), "--metrics", *MEASURES]
        seconds, _ = timed(lambda: subprocess.run(command, check=True, capture_output=True))
        rows.append({"task": "`qac eval` command end to end (read 7M-line run file, evaluate)", "size": size,
                     "seconds": seconds, "throughput": f"{len(run) / seconds:,.0f} queries/s"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch and FAISS")
    parser.add_argument("--docs", type=int, default=300, help="SciFact abstracts to encode")
    parser.add_argument("--report", default="reports/benchmarks.md")
    args = parser.parse_args()

    import faiss
    import torch

    from qac.benchmarking import machine_summary, markdown_table, write_section

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    rows = bench_encoding(args.docs) + bench_search() + bench_evaluation()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    body = "\n".join([
        "## Retrieval and evaluation",
        "",
        f"Measured by `benchmarks/bench_retrieval.py` on {machine_summary()}; "
        f"{args.threads} threads for torch and FAISS; load average at the end {load} (the machine "
        "is shared, so figures are upper bounds on time). Encoding: all-MiniLM-L6-v2, [CLS] pooling, "
        "length-sorted batches of 64, fp32 on CPU. Search: exact inner product, best of 2. "
        "Evaluation: a synthetic MS MARCO dev-sized run; `qac eval` and pytrec_eval agree on the values "
        "(checked on AP here and on every measure in tests/test_metrics.py).",
        "",
        markdown_table(rows, ["task", "size", "seconds", "throughput"]),
    ])
    write_section("retrieval", body, args.report)
    print(body)


if __name__ == "__main__":
    main()
