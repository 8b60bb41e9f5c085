"""Passage splitting speed: batched tokenization against sentence-by-sentence tokenization.

    python benchmarks/bench_split.py [--documents N] [--workers 2] [--max-len 128] [--repeats 1]

Splits SciFact (from the data mirror) with our splitter, which sends each
chunk's sentences, passages and overlap texts to the tokenizer in one call
each, and with the same splitter calling the tokenizer once per text, as the
reference release does for every sentence. Both run in ``--workers`` processes
and must produce identical passages (checked). The Punkt model is trained on
the corpus once, before timing. Reports documents per second (worker start-up
included) and documents per CPU second in the section ``split`` of
reports/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from qac.benchmarking import (machine_summary, markdown_table, positive_int,  # noqa: E402
                              report_destination, write_section)

CHUNK_SIZE = 64


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the worker processes)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_split(documents, punkt_dir, settings, *, workers: int, batched: bool, tokenizer: str):
    """Wall seconds, steady-state documents/s, CPU seconds (all processes) and the splits of one run.

    Steady state starts when the first chunk comes back: worker start-up (imports,
    tokenizer loading) is then over, and it varies a lot on a loaded machine.
    """
    from qac.data.splitting import iter_split_corpus

    wall, cpu = time.perf_counter(), cpu_seconds()
    splits, first = [], None
    for split in iter_split_corpus(documents, tokenizer_spec=tokenizer, punkt_dir=punkt_dir, settings=settings,
                                   workers=workers, batched=batched, chunk_size=CHUNK_SIZE):
        if first is None:
            first = time.perf_counter()
        splits.append(split)
    end = time.perf_counter()
    steady = (len(documents) - CHUNK_SIZE) / (end - first) if len(documents) > CHUNK_SIZE else float("nan")
    return end - wall, steady, cpu_seconds() - cpu, splits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=positive_int, default=None, help="first N SciFact documents (default: all)")
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument("--max-len", type=positive_int, default=128)
    parser.add_argument("--tokenizer", default="minilm")
    parser.add_argument("--punkt", choices=("trained", "pretrained"), default="trained",
                        help="Punkt trained on the documents (the profiles' setting) or NLTK's English model")
    parser.add_argument("--repeats", type=positive_int, default=1, help="report the best of this many runs per method")
    parser.add_argument("--report", default=None, help="default: reports/benchmarks.md; with --small, a file in the system's temporary folder")
    parser.add_argument("--small", action="store_true",
                        help="100 documents, 1 worker: every path once (a check, not a measurement)")
    args = parser.parse_args(argv)
    args.report = report_destination(args.report, args.small)
    if args.small:
        args.documents, args.workers = args.documents or 100, 1

    # After the command line: NLTK alone takes seconds to import, and a bad argument is refused at once.
    from qac.config import data_mirror
    from qac.data.beir import iter_corpus_jsonl
    from qac.data.punkt import prepare_punkt
    from qac.data.splitting import SplitSettings
    from qac.params import base_settings

    corpus = data_mirror() / "scifact" / "corpus.jsonl"
    documents = [(d.doc_id, d.full_text) for d in itertools.islice(iter_corpus_jsonl(corpus), args.documents)]
    settings = base_settings(SplitSettings.from_params, max_len=args.max_len, seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        punkt_dir = os.path.join(tmp, "punkt")
        punkt_model = prepare_punkt(args.punkt, punkt_dir, lambda: (text for _, text in documents), "bench")
        # Starting the workers (imports, tokenizer loading) costs the same for both
        # methods: measured on one document and subtracted.
        startup, _, startup_cpu, _ = time_split(documents[:1], punkt_dir, settings, workers=args.workers,
                                             batched=True, tokenizer=args.tokenizer)
        methods = {"batched (ours)": True, "sentence by sentence (release)": False}
        runs = {name: [] for name in methods}
        for _ in range(args.repeats):  # alternate, so both see the same machine load
            for name, batched in methods.items():
                runs[name].append(time_split(documents, punkt_dir, settings, workers=args.workers,
                                             batched=batched, tokenizer=args.tokenizer))
    outputs = [name_runs[0][3] for name_runs in runs.values()]
    if outputs[0] != outputs[1]:
        raise SystemExit("the two methods produced different passages")
    passages = sum(len(split.passages) for split in outputs[0])
    best = {name: (min(r[0] for r in name_runs), max(r[1] for r in name_runs),
                   min(r[2] for r in name_runs) - startup_cpu)
            for name, name_runs in runs.items()}
    base_wall, base_steady, base_cpu = best["sentence by sentence (release)"]
    rows = [{"method": name, "workers": args.workers, "documents": len(documents), "passages": passages,
             "wall s": round(wall, 1), "documents/s (wall)": round(len(documents) / wall, 1),
             "documents/s (steady)": round(steady, 1), "speed-up (steady)": round(steady / base_steady, 2),
             "CPU s": round(cpu, 1), "documents per CPU s": round(len(documents) / cpu, 1),
             "speed-up (CPU)": round(base_cpu / cpu, 2)}
            for name, (wall, steady, cpu) in best.items()]
    body = "\n".join([
        "## Passage splitting (SciFact)", "",
        f"Measured on {machine_summary()}.",
        f"`python benchmarks/bench_split.py{' --documents ' + str(args.documents) if args.documents else ''} "
        f"--workers {args.workers} --max-len {args.max_len}`: tokenizer `{args.tokenizer}`, Punkt {punkt_model}, "
        f"short spans 0.15, best of {args.repeats} alternating runs. Wall seconds include starting the "
        f"worker processes (alone, on one document: {startup:.1f} s wall, {startup_cpu:.1f} CPU s); "
        "steady documents/s count from the first finished chunk on, so they exclude it. CPU s sums all "
        "processes, start-up subtracted. Both methods produce identical passages (checked). The "
        f"2 cores were shared with other work while measuring (load average {os.getloadavg()[0]:.1f}): "
        "wall figures are noisy, CPU seconds less so.", "",
        markdown_table(rows),
    ])
    write_section("split", body, args.report)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
