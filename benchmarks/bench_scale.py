"""Paper-scale simulation: prepare -> split -> pair-corpus load on a synthetic MS MARCO documents TSV.

    python benchmarks/bench_scale.py --documents 20000 [--work DIR] [--keep]
    python benchmarks/bench_scale.py --report        # table of every recorded N -> reports/benchmarks.md
    python benchmarks/bench_scale.py --small --work DIR   # 50 documents, 1 split worker, result in DIR only

Writes N synthetic documents in the ``msmarco-docs.tsv`` format (docid, url,
title, body) with MS MARCO's length distribution, then runs the real stage
scripts, each as its own process: ``pipelines/prepare.py`` (the TSV streamed
into a prepared dataset), ``pipelines/split_passages.py`` (2 worker processes,
``passages.arrow``), and a pair-corpus load in 2 ``torchrun`` processes (gloo)
that map ``passages.arrow`` and a ``queries.arrow`` of 3 synthetic queries per
passage and draw batches from them. Peak resident memory is read from
``wait4`` for each stage (the largest of the stage's process and the
processes it waited for, its workers), so the figure is that of the largest
single process. The result goes to ``reports/bench_scale/<N>.json``; the last
line printed is ``documents=N peak_rss_mb=M docs_per_s=D`` (documents per
second through prepare and split).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "reports" / "bench_scale"
PAPER_DOCUMENTS = 3_213_835   # MS MARCO documents (TREC DL 2019 overview, Craswell et al., arXiv:2003.07820)

# Document length in words: log-normal with mean 1,100 words. The mean follows
# from the collection's published size: msmarco-docs.tsv is 22 GB for 3.2M
# documents (TREC DL 2019 overview, arXiv:2003.07820; microsoft.github.io/msmarco),
# about 6,900 bytes per document, and English web text averages about 6 bytes
# per word with its separator, so ~1,100 words. The spread (sigma 1.0: median
# ~670 words, 1% of documents over ~6,900 words) gives the long tail of web
# pages; what the benchmark must show is that memory does not follow it.
MEAN_WORDS, SIGMA = 1100.0, 1.0
MAX_WORDS = 60_000
TITLE_WORDS = (3, 12)
VOCABULARY = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
              "they you were her she there been one all we their has would when what so if more about no can said "
              "who will time up other into than its some only could new people after first two may any these also "
              "water system health market city study power energy state school world report food music history "
              "law police science river price data family house market plant weather result cell patient children "
              "company service program policy figure answer question season account county museum species region "
              "protein treatment computer network insurance mortgage recipe symptoms vitamin engine battery").split()


def document_lengths(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0])
    mu = math.log(MEAN_WORDS) - SIGMA ** 2 / 2          # so that the mean is MEAN_WORDS
    return np.clip(rng.lognormal(mu, SIGMA, count), 5, MAX_WORDS).astype(np.int64)


def write_documents_tsv(path: Path, count: int, seed: int = 0) -> dict:
    """N documents in the msmarco-docs.tsv format, written a document at a time; their word counts."""
    words = np.array(VOCABULARY)
    lengths = document_lengths(count, seed)
    rng = np.random.default_rng([seed, 1])
    with open(path, "w", encoding="utf-8") as handle:
        for index, length in enumerate(lengths.tolist()):
            ids = rng.integers(len(words), size=length)
            sentence_ends = set(np.cumsum(rng.integers(6, 30, size=length // 6 + 1)).tolist())
            body = " ".join(word + ("." if position in sentence_ends else "")
                            for position, word in enumerate(words[ids].tolist(), start=1))
            title = " ".join(words[rng.integers(len(words), size=int(rng.integers(*TITLE_WORDS)))].tolist())
            handle.write(f"D{index}\thttp://example.org/{index}\t{title.capitalize()}\t{body.capitalize()}.\n")
    return {"words_mean": float(lengths.mean()), "words_median": float(np.median(lengths)),
            "words_p99": float(np.percentile(lengths, 99)), "words_max": int(lengths.max())}


def write_queries_arrow(passages: Path, queries: Path) -> int:
    """3 queries per passage (words of the passage), streamed: a queries.arrow in the stage's format."""
    from qac.data.arrowstore import PASSAGES_SCHEMA, iter_records, write_queries

    def records():
        for record in iter_records(passages, PASSAGES_SCHEMA, columns=["pid", "text"]):
            words = record["text"].split()
            yield {"pid": record["pid"], "queries": [" ".join(words[k:k + 6]) for k in (0, 6, 12)]}

    return write_queries(queries, records())


def run_measured(command: list[str], env: dict, log: Path) -> tuple[float, float]:
    """Run ``command``; (wall seconds, peak RSS in MB of it or any process it waited for)."""
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({process.returncode}); see {log}:\n"
                 + log.read_text(encoding="utf-8")[-3000:])
    return seconds, usage.ru_maxrss / 1024   # Linux reports kilobytes


def bench_params(work: Path, workers: int) -> dict:
    """The smoke profile with the benchmark's changes merged in and checked against the schema, so a
    parameter the schema comes to require reaches the benchmark with the profile (and a change it no
    longer accepts stops it here, naming the key)."""
    from qac.config import deep_merge, render_profile
    from qac.params import validate_params

    overrides = {
        "data_dir": str(work / "data"), "pretrain_corpus": "synthetic",
        "datasets": {"synthetic": {"format": "msmarco-docs", "mirror": "synthetic", "splits": []}},
        "mlflow": {"experiment": "qac-bench-scale", "system_metrics": False},
        "prepare": {"max_documents": None, "keep_judged_documents": True, "min_text_chars": 1},
        "split": {"workers": workers, "max_documents": None, "punkt": "trained", "punkt_train_documents": 2000,
                  "max_len": 144, "chunk_size": 64},
    }
    params = deep_merge(render_profile("smoke"), overrides)
    validate_params(params, work / "params.yaml", complete=True)
    return params


def pair_load(data: Path, batches: int, batch_size: int) -> None:
    """One torchrun process: map the Arrow files, index the anchors, draw this rank's share of batches."""
    import resource

    import torch.distributed as dist

    from qac.data.context_pairs import PairSampler, load_pair_corpus, shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    started = time.perf_counter()
    corpus = load_pair_corpus(data / "passages.arrow", data / "queries.arrow", "mixed", query_count=3)
    loaded = time.perf_counter() - started
    sampler = PairSampler(corpus, "mixed", seed=0)
    characters = 0
    for step in range(batches):
        for pair in shard(sampler.batch(step, batch_size), rank, world):
            characters += len(pair.anchor) + len(pair.context)
    dist.barrier()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    # One file per rank: the ranks share stdout, where their lines can interleave.
    (data / f"pair_load.rank{rank}.json").write_text(json.dumps({
        "rank": rank, "anchors": len(corpus), "load_s": loaded, "characters": characters,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_anon_mb": int(status["RssAnon"].split()[0]) / 1024,
        "rss_file_mb": int(status["RssFile"].split()[0]) / 1024}), encoding="utf-8")
    dist.destroy_process_group()


def disk_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2 ** 20
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2 ** 20


def run(documents: int, work: Path, workers: int, keep: bool, batches: int = 50) -> dict:
    import yaml

    shutil.rmtree(work, ignore_errors=True)
    (work / "mirror" / "synthetic").mkdir(parents=True)
    load_before = os.getloadavg()[0]
    tsv = work / "mirror" / "synthetic" / "msmarco-docs.tsv"
    started = time.perf_counter()
    lengths = write_documents_tsv(tsv, documents)
    write_s = time.perf_counter() - started
    (work / "params.yaml").write_text(yaml.safe_dump(bench_params(work, workers)), encoding="utf-8")
    env = dict(os.environ, QAC_PARAMS=str(work / "params.yaml"), QAC_DATA_MIRROR=str(work / "mirror"),
               MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}", PYTHONPATH=str(REPO),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    data = work / "data" / "smoke"
    stages = {}
    stages["prepare"] = run_measured([sys.executable, "pipelines/prepare.py", "--dataset", "synthetic"], env,
                                     work / "prepare.log")
    stages["split"] = run_measured([sys.executable, "pipelines/split_passages.py"], env, work / "split.log")
    started = time.perf_counter()
    write_queries_arrow(data / "passages.arrow", data / "queries.arrow")
    queries_s = time.perf_counter() - started
    stages["pair_load"] = run_measured([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                        "--nproc_per_node", "2", __file__, "--pair-load", str(data),
                                        "--batches", str(batches)],
                                       env, work / "pair_load.log")
    ranks = [json.loads((data / f"pair_load.rank{rank}.json").read_text(encoding="utf-8")) for rank in range(2)]
    split_metrics = json.loads((data / "metrics" / "split.json").read_text())
    import resource

    result = {
        "documents": documents, **lengths, "passages": int(split_metrics["passages"]),
        "seconds": {"write_tsv": write_s, **{name: wall for name, (wall, _) in stages.items()},
                    "write_queries": queries_s},
        "peak_rss_mb": {**{name: rss for name, (_, rss) in stages.items()},
                        "driver": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024},
        "pair_ranks": ranks,
        "disk_mb": {"msmarco-docs.tsv": disk_mb(tsv), "prepared dataset": disk_mb(data / "datasets" / "synthetic"),
                    "passages.arrow": disk_mb(data / "passages.arrow"),
                    "queries.arrow (3 per passage)": disk_mb(data / "queries.arrow")},
        "workers": workers, "cpu_count": os.cpu_count(),
        # the cores may be shared: the 1-minute load average as the run started and ended
        "load_average": [load_before, os.getloadavg()[0]],
    }
    result["peak_rss_largest_mb"] = max(result["peak_rss_mb"].values())
    result["docs_per_s"] = documents / (result["seconds"]["prepare"] + result["seconds"]["split"])
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def projection(rows: list[dict]) -> dict:
    """3.2M documents, scaled linearly from the largest measured N (time and disk grow with the corpus)."""
    largest = max(rows, key=lambda row: row["documents"])
    factor = PAPER_DOCUMENTS / largest["documents"]
    seconds = largest["seconds"]
    split_cpu_bound = seconds["split"] * factor
    return {
        "disk_gb": sum(largest["disk_mb"].values()) * factor / 1024,
        "prepare_h": seconds["prepare"] * factor / 3600,
        # split scales with worker processes (the stage's output does not depend on their number);
        # measured with `workers` processes on cpu_count shared cores.
        "split_h_2_cores": split_cpu_bound / 3600,
        "split_h_16_cores": split_cpu_bound * largest["workers"] / 16 / 3600,
        # the index pass of load_pair_corpus (inside each rank), not torchrun's start-up
        "pair_load_s": max(rank["load_s"] for rank in largest["pair_ranks"]) * factor,
    }


def report() -> None:
    from qac.benchmarking import machine_summary, markdown_table, write_section

    rows = sorted((json.loads(path.read_text()) for path in RESULTS.glob("*.json")), key=lambda r: r["documents"])
    if not rows:
        sys.exit(f"no results in {RESULTS}: run with --documents N first")
    table = []
    for row in rows:
        rank_rss = max(rank["peak_rss_mb"] for rank in row["pair_ranks"])
        table.append({"documents": row["documents"], "passages": row["passages"],
                      "mean words": row["words_mean"], "prepare s": row["seconds"]["prepare"],
                      "split s": row["seconds"]["split"], "pair load s": row["seconds"]["pair_load"],
                      "docs/s (prepare+split)": row["docs_per_s"],
                      "peak RSS MB prepare": row["peak_rss_mb"]["prepare"],
                      "split": row["peak_rss_mb"]["split"], "pair load (largest rank)": rank_rss,
                      "largest process MB": row["peak_rss_largest_mb"],
                      "pair rank anon / file MB": "{:.0f} / {:.0f}".format(
                          max(r["rss_anon_mb"] for r in row["pair_ranks"]),
                          max(r["rss_file_mb"] for r in row["pair_ranks"])),
                      "disk MB (tsv, prepared, passages, queries)": ", ".join(
                          f"{value:.0f}" for value in row["disk_mb"].values()),
                      "load start / end": "{:.1f} / {:.1f}".format(*row["load_average"])
                      if "load_average" in row else "not recorded"})
    smallest, largest = rows[0]["peak_rss_largest_mb"], max(row["peak_rss_largest_mb"] for row in rows)
    anon = [max(rank["rss_anon_mb"] for rank in row["pair_ranks"]) for row in rows]
    file_backed = [max(rank["rss_file_mb"] for rank in row["pair_ranks"]) for row in rows]
    over_goal = [f"{row['documents']:,}" for row in rows if row["peak_rss_largest_mb"] > 1.5 * smallest]
    verdict = f"missed at {', '.join(over_goal)} documents" if over_goal else "met at every N"
    stages = [max(row["peak_rss_mb"], key=lambda stage: row["peak_rss_mb"][stage]) for row in rows]
    largest_stage = " / ".join(dict.fromkeys(stages)) + (" at every N" if len(set(stages)) == 1 else ", by N")
    largest_run = rows[-1]
    paper = projection(rows)
    body = f"""## Scale: prepare -> split -> pair corpus, bounded memory

`python benchmarks/bench_scale.py --documents N` (then `--report`): a synthetic MS MARCO documents TSV
(log-normal lengths, mean {MEAN_WORDS:.0f} words), the real `prepare` and `split_passages` stage scripts
(split with {rows[-1]['workers']} worker processes), then a pair-corpus load in 2 `torchrun` processes (gloo)
drawing 50 global batches of 256 mixed pairs. Peak RSS is per process (`wait4`), the largest process of the
stage; the pair-load ranks also give their anonymous and file-backed (memory-mapped Arrow) resident memory.
Machine: {machine_summary()}. The cores may have been shared with other work while measuring (the load
column), so seconds are upper bounds and noisy between rows.

{markdown_table(table)}

Peak memory of the largest process ({largest_stage}): {smallest:.0f} MB at {rows[0]['documents']:,} documents,
{largest:.0f} MB at most over all N (ratio {largest / smallest:.2f}; the goal is at most 1.5: {verdict}).
The pair-load ranks' anonymous (private) memory: {anon[0]:.0f} MB at {rows[0]['documents']:,} documents,
{max(anon):.0f} MB at most (ratio {max(anon) / anon[0]:.2f}); their file-backed resident memory (shared libraries
and touched pages of the memory-mapped Arrow files): {file_backed[0]:.0f} MB, {max(file_backed):.0f} MB at most,
while `passages.arrow` grows to {largest_run['disk_mb']['passages.arrow']:.0f} MB at {largest_run['documents']:,} documents.
The mapping is advised random-access (no read-around of `read_ahead_kb` at each page fault) and the readers
release the pages they have decoded (docs/architecture.md, "Files between stages"), so a process's resident
set holds the rows in hand, not the file; the page cache still shares what was read between processes.

Projection to the {PAPER_DOCUMENTS:,} MS MARCO documents (time and disk linear in N from the largest
run): disk {paper['disk_gb']:.0f} GB (TSV, prepared copy, passages, 3 queries per passage; 20 queries per
passage would add about 6x the queries figure), prepare {paper['prepare_h']:.1f} h (one process, reading
the TSV twice), split {paper['split_h_2_cores']:.1f} h on 2 cores and {paper['split_h_16_cores']:.1f} h on a
16-core node (16 worker processes; splitting is CPU-bound and its chunks independent), pair-corpus
load (the index pass) {paper['pair_load_s']:.0f} s per process. Memory: prepare and split processes about
{max(max(row["peak_rss_mb"]["prepare"], row["peak_rss_mb"]["split"]) for row in rows):.0f} MB at most (flat in N above);
a pair-load rank about {max(anon):.0f} MB of private memory plus 16 bytes per anchor (row index and epoch
permutation: about 0.5 GB for ~35M passages), with the page cache holding what it maps of `passages.arrow`.
The split figures include training Punkt on 2,000 documents and were measured on shared cores, so the
hours are an upper bound.
"""
    write_section("scale", body)
    print("wrote the scale section of reports/benchmarks.md")


def main(argv=None) -> int:
    from qac.benchmarking import positive_int

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=positive_int, help="synthetic documents to write and process")
    parser.add_argument("--work", type=Path, help="working folder (default: /tmp/qac-bench-scale-N)")
    parser.add_argument("--workers", type=positive_int, default=2, help="split worker processes")
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    parser.add_argument("--report", action="store_true", help="write the scale section of reports/benchmarks.md from the results")
    parser.add_argument("--small", action="store_true",
                        help="50 documents, 1 split worker, 4 batches per pair-load rank; the result stays in the "
                             "working folder (a check that every path runs, not a measurement)")
    parser.add_argument("--pair-load", type=Path, help=argparse.SUPPRESS)   # one torchrun process
    parser.add_argument("--batches", type=positive_int, default=50, help=argparse.SUPPRESS)   # its batches of 256 pairs
    args = parser.parse_args(argv)
    if args.small:
        args.documents, args.workers, args.keep, args.batches = args.documents or 50, 1, True, 4
    if args.pair_load:
        pair_load(args.pair_load, batches=args.batches, batch_size=256)
        return 0
    if args.report:
        report()
        return 0
    if not args.documents:
        parser.error("--documents N (or --report)")
    result = run(args.documents, args.work or Path(f"/tmp/qac-bench-scale-{args.documents}"), args.workers,
                 args.keep, args.batches)
    results = (args.work or Path(f"/tmp/qac-bench-scale-{args.documents}")) if args.small else RESULTS
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{args.documents}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    print(f"documents={args.documents} peak_rss_mb={result['peak_rss_largest_mb']:.0f} "
          f"docs_per_s={result['docs_per_s']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
