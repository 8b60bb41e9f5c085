"""Benchmark retrieval and evaluation; writes the "retrieval" section of reports/benchmarks.md.

Measures, on this machine:
1. dense encoding throughput (passages/s) of the default encoder (all-MiniLM-L6-v2,
   [CLS] pooling, length-sorted batches) on SciFact abstracts at 128 and 256 tokens;
2. exact FAISS inner-product search (IndexFlatIP) throughput (queries/s) on a
   SciFact-sized index and on 100k random 384-d vectors; and the blocked PyTorch
   search (the GPU path, here on the CPU) against FAISS on 100k x 384 vectors of
   small integers, where scores are exact and tie often: the same runs (scores,
   passages above the k-th score), the k-th place kept as trec_eval ranks ties;
3. evaluation of a 7,000 x 1,000 run (MS MARCO dev size at depth 1000):
   `qac.evaluation.metrics.evaluate` against `pytrec_eval`, both in memory on the
   same dicts, and the `qac eval` command end to end (reading the run file).

Usage: python benchmarks/bench_retrieval.py [--threads 2] [--docs 300]
       python benchmarks/bench_retrieval.py --small --report /tmp/r.md   # every path, small sizes
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


def bench_search(small: bool = False) -> list[dict]:
    from qac.retrieval.search import search

    rng = np.random.default_rng(0)
    rows = []
    sizes = [("SciFact-sized", 5_183, 1_109, 1000), ("random", 100_000, 1_000, 1000)]
    for label, n_passages, n_queries, k in ([("small", 2_000, 20, 100)] if small else sizes):
        passages = rng.normal(size=(n_passages, 384)).astype(np.float32)
        queries = rng.normal(size=(n_queries, 384)).astype(np.float32)
        seconds, _ = timed(lambda: search(queries, passages, k=k), repeats=2)
        rows.append({"task": f"FAISS IndexFlatIP top-{k}, {label}",
                     "size": f"{n_passages:,} x 384 passages, {n_queries:,} queries",
                     "seconds": seconds, "throughput": f"{n_queries / seconds:,.0f} queries/s"})
    return rows


def same_runs_with_ties(ours, theirs, exact) -> tuple[bool, int]:
    """Whether two top-k results are the same run as trec_eval reads them: per query the same scores,
    the same passages above the k-th score, and at the k-th place ``ours`` holding the tied passages
    of the highest ids (``exact``: every passage's score). Also the rows with ties across the k-th place."""
    (our_scores, our_indices), (their_scores, their_indices) = ours, theirs
    across = 0
    for row in range(len(exact)):
        if not np.array_equal(np.sort(our_scores[row]), np.sort(their_scores[row])):
            return False, across
        kth = our_scores[row].min()
        if set(our_indices[row][our_scores[row] > kth]) != set(their_indices[row][their_scores[row] > kth]):
            return False, across
        tied = np.flatnonzero(exact[row] == kth)[::-1]          # row numbers are the document ids here
        kept = np.sort(our_indices[row][our_scores[row] == kth])[::-1]
        if not np.array_equal(kept, tied[:len(kept)]):
            return False, across
        across += len(tied) > len(kept)
    return True, across


def bench_torch_search_with_ties(small: bool = False) -> list[dict]:
    """The blocked PyTorch search on the CPU against FAISS, on vectors whose scores tie."""
    import torch

    from qac.retrieval.search import search, torch_search

    n_passages, n_queries, k = (5_000, 20, 100) if small else (100_000, 200, 1000)
    rng = np.random.default_rng(1)
    passages = rng.integers(-3, 4, size=(n_passages, 384)).astype(np.float32)   # integer scores: exact, tied
    passages[n_passages // 2:n_passages // 2 + 50] = passages[7]                 # and duplicated passages
    queries = rng.integers(-3, 4, size=(n_queries, 384)).astype(np.float32)
    faiss_seconds, faiss_result = timed(lambda: search(queries, passages, k=k, backend="faiss"))
    torch_seconds, torch_result = timed(lambda: torch_search(queries, passages, k=k, device="cpu"))
    with torch.inference_mode():
        exact = (torch.from_numpy(queries) @ torch.from_numpy(passages).T).numpy()
    same, across = same_runs_with_ties(torch_result, faiss_result, exact)
    if not same:
        raise SystemExit("the PyTorch search and FAISS gave different runs")
    size = f"{n_passages:,} x 384 integer vectors, {n_queries} queries"
    return [{"task": f"PyTorch blocked search top-{k} on the CPU (the GPU path), ties: same runs as FAISS "
                     f"({across} of {n_queries} queries tie across the k-th place)",
             "size": size, "seconds": torch_seconds, "throughput": f"{n_queries / torch_seconds:,.0f} queries/s"},
            {"task": f"FAISS IndexFlatIP top-{k} on the same vectors", "size": size, "seconds": faiss_seconds,
             "throughput": f"{n_queries / faiss_seconds:,.0f} queries/s"}]


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


def bench_evaluation(small: bool = False) -> list[dict]:
    import pytrec_eval

    from qac.evaluation.metrics import evaluate
    from qac.evaluation.trec_io import write_run

    qrels, run = synthetic_run(*((200, 100) if small else (7_000, 1_000)))
    size = f"{len(run):,} queries x {len(next(iter(run.values()))):,} documents"
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
        if not Path(command[0]).exists():                 # not installed as a command: run the module
            command[:1] = [sys.executable, "-m", "qac.cli"]
        seconds, _ = timed(lambda: subprocess.run(command, check=True, capture_output=True))
        rows.append({"task": "`qac eval` command end to end (read the run file, evaluate)", "size": size,
                     "seconds": seconds, "throughput": f"{len(run) / seconds:,.0f} queries/s"})
    return rows


def main(argv=None) -> None:
    from qac.benchmarking import positive_int, report_destination

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch and FAISS")
    parser.add_argument("--docs", type=positive_int, default=300, help="SciFact abstracts to encode")
    parser.add_argument("--report", default=None, help="default: reports/benchmarks.md; with --small, a file in the system's temporary folder")
    parser.add_argument("--small", action="store_true", help="every path at small sizes (a check, not a measurement)")
    args = parser.parse_args(argv)
    args.report = report_destination(args.report, args.small)

    import faiss
    import torch

    from qac.benchmarking import machine_summary, markdown_table, write_section

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    small = args.small
    rows = (bench_encoding(16 if small else args.docs) + bench_search(small) + bench_torch_search_with_ties(small)
            + bench_evaluation(small))
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
