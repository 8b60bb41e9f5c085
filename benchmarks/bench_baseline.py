"""Start-encoder baseline at its published strength: writes the "baseline" section of reports/benchmarks.md.

all-MiniLM-L6-v2, the default profile's start encoder, is evaluated on the
SciFact test split of the data mirror with our own encoding, search and
metrics, once the way its model card runs it (the profile's ``encoders.minilm``
settings: mean pooling, normalised vectors, 256 tokens) and once the way the
fine-tuned rows are encoded ([CLS], not normalised, the profile's finetune
lengths), beside the published nDCG@10 (MTEB SciFact). The first must
reproduce the published figure to its printed digits; the gap between the two
is what evaluating a baseline the wrong way costs.

    python benchmarks/bench_baseline.py     # a few minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def evaluate_way(model, tokenizer, dataset, *, pooling: str, normalize: bool, query_max_len: int,
                 passage_max_len: int, limit: int | None = None) -> tuple[float, float]:
    """nDCG@10 on SciFact test and the seconds it took (encoding both sides, search, metrics)."""
    from qac.evaluation.metrics import evaluate
    from qac.retrieval import document_text
    from qac.retrieval.encode import encode_texts
    from qac.retrieval.search import dense_search

    started = time.perf_counter()
    doc_ids = list(dataset.corpus)[:limit]
    texts = [document_text(dataset.corpus[d].title, dataset.corpus[d].text) for d in doc_ids]
    options = dict(pooling=pooling, normalize=normalize, batch_size=64)
    docs = encode_texts(model, tokenizer, texts, max_length=passage_max_len, desc="encode scifact corpus", **options)
    qrels = dataset.qrels["test"]
    query_ids = [q for q in dataset.queries if q in qrels][:limit]
    queries = encode_texts(model, tokenizer, [dataset.queries[q] for q in query_ids], max_length=query_max_len,
                           desc="encode scifact test queries", **options)
    run = dense_search(query_ids, queries, doc_ids, docs, k=1000)
    result = evaluate(qrels, run, ["nDCG@10"])
    return result.aggregate["nDCG@10"], time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    from qac.benchmarking import report_destination

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=None, help="the data mirror (default: QAC_DATA_MIRROR, else ../shared/data)")
    parser.add_argument("--report", default=None, help="default: reports/benchmarks.md; with --small, a file in the system's temporary folder")
    parser.add_argument("--small", action="store_true",
                        help="the first 24 documents and queries: every path once (a check, not a measurement)")
    args = parser.parse_args(argv)
    args.report = report_destination(args.report, args.small)

    import torch

    from qac.benchmarking import machine_summary, markdown_table, write_section
    from qac.config import render_profile
    from qac.params import validate_params
    from qac.data.beir import read_beir
    from qac.models.loading import load_model, load_tokenizer
    from qac.retrieval.dense import baseline_settings, start_encoder

    torch.set_num_threads(os.cpu_count() or 1)
    params = validate_params(render_profile("default"))
    spec = start_encoder(params)
    trained = baseline_settings(params, spec)
    published = next(f for f in trained["published"] if (f["dataset"], f["split"], f["measure"])
                     == ("scifact", "test", "nDCG@10"))
    from qac.config import data_mirror

    dataset = read_beir(Path(args.mirror or data_mirror()) / "scifact", ["test"], name="scifact")
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    finetune = params.finetune
    ways = [("as its model was trained (encoders.minilm)", trained["pooling"], trained["normalize"],
             trained["query_max_len"], trained["passage_max_len"]),
            ("as the fine-tuned rows are encoded", finetune.pooling, False, finetune.query_max_len,
             finetune.passage_max_len)]
    rows = []
    load_before = os.getloadavg()[0]
    for label, pooling, normalize, query_len, passage_len in ways:
        value, seconds = evaluate_way(model, tokenizer, dataset, pooling=pooling, normalize=normalize,
                                      query_max_len=query_len, passage_max_len=passage_len,
                                      limit=24 if args.small else None)
        rows.append({"evaluated": label, "pooling": pooling, "normalised": "yes" if normalize else "no",
                     "tokens (query/passage)": f"{query_len}/{passage_len}", "nDCG@10": f"{value:.4f}",
                     "published": f"{published['value']:.4f}", "seconds": f"{seconds:.0f}"})
        print(f"{label}: nDCG@10 {value:.4f} (published {published['value']:.4f}), {seconds:.0f} s", flush=True)
    body = (f"## Start-encoder baseline ({spec}, SciFact test)\n\n"
            f"`python benchmarks/bench_baseline.py`; {machine_summary()}. Published: {published['source']}. "
            "Our encoding, search and trec_eval-exact metrics on the whole corpus (5,183 abstracts; the default "
            "profile cuts it); the first row is how the default profile's untuned baseline row is evaluated. "
            f"Load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end: on a shared "
            "machine the seconds are the wall time of a process competing for the cores, not a speed figure.\n\n"
            + markdown_table(rows))
    write_section("baseline", body, args.report)


if __name__ == "__main__":
    main()
