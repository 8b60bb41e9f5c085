"""Query generation speed: passages per second, batched vs one passage at a time.

CPU part (always): the default profile's generator (data/default/generator, or
else bert2bert warm-started from MiniLM without training) on 2 CPU threads,
C = 5 candidates, fp32, on SciFact passages (data/default/passages.arrow if
the split stage has run, else the mirror's SciFact documents). Rows: our
batched loop with batch-size invariance on (the default in fp32) and off, the
same loop one passage at a time, and Hugging Face ``generate`` on the same
batch for reference (global RNG: not batch-invariant) where the generator is
a Hugging Face seq2seq model (the prefix-LM is not).

GPU part (``--gpu``, needs CUDA): a T5-base-sized model built from its
configuration (random weights), C = 20 as the paper's release, bf16 autocast
(with the decoder's key/value cache) over a batch-size sweep against fp32 at
batch 64, and Hugging Face ``generate`` at the release's settings (fp32,
batch 64).

Stage path (``--tiny``, CPU or GPU): the code the generate_queries stage runs
(chunks of a ``passages.arrow``, the resumable shard store, the merge into
``queries.arrow``) with a tiny T5 built from a config, fp32 and, on a GPU,
bf16.

Untrained generators rarely emit the end token, so every candidate runs to
``max_new_tokens``: the figures are for the longest possible queries. The
report gives the mean generated length beside each row.

    python benchmarks/bench_querygen.py [--passages 32] [--gpu]
    python benchmarks/bench_querygen.py --tiny [--tiny-passages 64] [--max-new-tokens 16]
    python benchmarks/bench_querygen.py --small --report /tmp/q.md   # both CPU paths, a few passages
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from qac.benchmarking import machine_summary, markdown_table, positive_int, report_destination, write_section
from qac.config import data_mirror
from qac.querygen.generate import QueryGenerator, SamplingSettings


# t5-base's sizes (the paper's generator, doc2query/all-with_prefix-t5-base-v1); T5Config() alone is t5-small's.
T5_BASE = dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12)


def load_passages(count: int) -> list[tuple[str, str]]:
    split = Path("data/default/passages.arrow")
    passages = []
    if split.exists():
        from qac.data.arrowstore import PASSAGES_SCHEMA, iter_records

        records = iter_records(split, PASSAGES_SCHEMA, columns=["pid", "text"], stop=count)
        passages = [(record["pid"], record["text"]) for record in records]
        if len(passages) == count:
            return passages
        passages = []
    with open(data_mirror() / "scifact" / "corpus.jsonl", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            passages.append((f"{record['_id']}#0", f"{record.get('title', '')} {record['text']}".strip()))
            if len(passages) == count:
                break
    return passages


def default_generator():
    """The trained default generator if the stage has run, else an untrained bert2bert from MiniLM."""
    folder = Path("data/default/generator")
    if folder.exists():
        from qac.querygen.generate import load_generator

        model, tokenizer = load_generator(str(folder))
        return model, tokenizer, "data/default/generator (trained)"
    from qac.querygen.train_generator import build_bert2bert

    model, tokenizer = build_bert2bert("minilm", seed=0)
    return model.eval(), tokenizer, "bert2bert warm-started from minilm (untrained)"


def time_ours(generator: QueryGenerator, passages, batch_size: int) -> dict:
    started = time.perf_counter()
    candidates, stats = generator.generate_candidates(passages, batch_size)
    seconds = time.perf_counter() - started
    return {"passages": len(passages), "seconds": seconds, "passages/s": len(passages) / seconds,
            "mean tokens/query": stats.tokens / (len(passages) * generator.settings.queries_per_passage),
            "recomputed decisions": stats.recomputed / stats.decisions if stats.decisions else 0.0}


def time_hf_generate(model, tokenizer, passages, settings: SamplingSettings, batch_size: int, device,
                     dtype=None) -> dict:
    import contextlib

    started = time.perf_counter()
    lengths = []
    autocast = torch.autocast(device_type=device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    for start in range(0, len(passages), batch_size):
        inputs = tokenizer([settings.prefix + text for _, text in passages[start:start + batch_size]],
                           truncation=True, max_length=settings.max_source_len, padding=True, return_tensors="pt",
                           return_token_type_ids=False).to(device)
        with torch.inference_mode(), autocast:
            out = model.generate(**inputs, do_sample=True, top_k=settings.top_k, top_p=settings.top_p,
                                 max_new_tokens=settings.max_new_tokens,
                                 num_return_sequences=settings.queries_per_passage)
        lengths += ((out != tokenizer.pad_token_id).sum(-1) - 1).tolist()   # one read per batch
    seconds = time.perf_counter() - started
    return {"passages": len(passages), "seconds": seconds, "passages/s": len(passages) / seconds,
            "mean tokens/query": sum(lengths) / len(lengths)}


def sampling_settings(**changes) -> SamplingSettings:
    """profiles/base.yaml's sampling with ``changes`` (the schema, hence pydantic, only where it runs: not
    on the bare GPU machine that imports this module for its model sizes)."""
    from qac.params import base_settings

    return base_settings(SamplingSettings.from_params, **changes)


def cpu_part(args) -> str:
    torch.set_num_threads(2)
    model, tokenizer, name = default_generator()
    settings = sampling_settings(seed=42, queries_per_passage=5, max_new_tokens=args.max_new_tokens, max_source_len=144)
    passages = load_passages(args.passages)
    rows = []
    for label, invariant, batch_size, subset in [
        (f"ours, batch {args.batch_size}, batch-invariant", True, args.batch_size, passages),
        (f"ours, batch {args.batch_size}, invariance off", False, args.batch_size, passages),
        ("ours, one passage at a time, batch-invariant", True, 1, passages[:args.single_passages]),
    ]:
        generator = QueryGenerator(model, tokenizer, settings, batch_invariant=invariant)
        with torch.inference_mode():
            rows.append({"setting": label, **time_ours(generator, subset, batch_size)})
        print(rows[-1], flush=True)
    if hasattr(model, "generate"):     # the prefix-LM generator has only our loop
        torch.manual_seed(0)
        rows.append({"setting": f"HF generate, batch {args.batch_size} (reference)",
                     **time_hf_generate(model, tokenizer, passages, settings, args.batch_size, torch.device("cpu"))})
        print(rows[-1], flush=True)
    columns = ["setting", "passages", "seconds", "passages/s", "mean tokens/query", "recomputed decisions"]
    note = ("" if args.max_new_tokens == 64 else
            f"\n\nmax_new_tokens {args.max_new_tokens} instead of the paper's 64 to keep the run short; an untrained "
            "generator runs every candidate to the cap, so the cost per passage grows about in proportion.")
    return (f"### CPU: {name}, C = 5, max_new_tokens = {args.max_new_tokens}, fp32, 2 threads\n\n"
            + markdown_table(rows, columns) + note)


def gpu_part(args) -> str:
    from transformers import T5Config, T5ForConditionalGeneration

    from qac.models.loading import load_tokenizer

    device = torch.device("cuda")
    tokenizer = load_tokenizer("minilm")
    config = T5Config(pad_token_id=0, eos_token_id=tokenizer.sep_token_id, decoder_start_token_id=0, **T5_BASE)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).to(device).eval()
    settings = sampling_settings(seed=42, queries_per_passage=args.gpu_candidates, max_new_tokens=args.max_new_tokens,
                                max_source_len=144)
    passages = load_passages(args.gpu_passages)
    rows = []
    runs = [("fp32", None, 64)] + [("bf16", torch.bfloat16, b) for b in args.gpu_batch_sizes]
    for label, dtype, batch_size in runs:
        generator = QueryGenerator(model, tokenizer, settings, autocast_dtype=dtype, batch_invariant=dtype is None)
        with torch.inference_mode():
            generator.generate_candidates(passages[:batch_size], batch_size)    # warm-up
            torch.cuda.synchronize()
            row = time_ours(generator, passages, batch_size)
        rows.append({"setting": f"ours, {label}, batch {batch_size}", **row})
        print(rows[-1], flush=True)
    rows.append({"setting": "HF generate, fp32, batch 64 (the release's settings)",
                 **time_hf_generate(model, tokenizer, passages, settings, 64, device)})
    columns = ["setting", "passages", "seconds", "passages/s", "mean tokens/query", "recomputed decisions"]
    return (f"### GPU: T5-base-sized (random weights), C = {args.gpu_candidates}, "
            f"max_new_tokens = {args.max_new_tokens}\n\n" + markdown_table(rows, columns))


def tiny_part(args) -> str:
    """The stage's own path (chunks of passages.arrow, shard store, merge) with a tiny T5 built from a config."""
    import tempfile

    from transformers import T5Config, T5ForConditionalGeneration

    from qac.data.arrowstore import write_passages
    from qac.models.loading import load_tokenizer
    from qac.querygen.shards import ChunkStore, ShardSpec, build_manifest, generate_chunks

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer("minilm")
    config = T5Config(vocab_size=tokenizer.vocab_size, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                      num_decoder_layers=2, num_heads=4, pad_token_id=0, eos_token_id=tokenizer.sep_token_id,
                      decoder_start_token_id=0)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).to(device).eval()
    settings = sampling_settings(seed=42, queries_per_passage=args.tiny_candidates, max_new_tokens=args.max_new_tokens,
                                max_source_len=144)
    passages = load_passages(args.tiny_passages)
    runs = [("fp32", None)] + ([("bf16", torch.bfloat16)] if device.type == "cuda" else [])
    rows = []
    with tempfile.TemporaryDirectory() as work:
        passages_path = Path(work) / "passages.arrow"
        write_passages(passages_path, ({"pid": pid, "doc_id": pid.rpartition("#")[0], "position": 0, "text": text,
                                        "n_tokens": 0, "contexts": {"nearby": [], "random_sampled": [], "overlap": ""}}
                                       for pid, text in passages))
        for label, dtype in runs:
            generator = QueryGenerator(model, tokenizer, settings, autocast_dtype=dtype, batch_invariant=dtype is None)
            manifest = build_manifest(passages_path, "tiny-t5", settings, args.tiny_chunk_size,
                                      {"dtype": label, "batch_size": args.batch_size})
            store = ChunkStore(Path(work) / f".queries-{label}.work", manifest)
            store.prepare()
            started = time.perf_counter()
            with torch.inference_mode():
                stats = generate_chunks(store, generator, passages_path, ShardSpec(), args.batch_size)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            store.merge(Path(work) / f"queries-{label}.arrow")
            rows.append({"setting": f"stage path, {label}, batch {args.batch_size}, chunks of {args.tiny_chunk_size}",
                         "passages": stats.passages, "seconds": seconds, "passages/s": stats.passages / seconds,
                         "mean tokens/query": stats.tokens / stats.candidates if stats.candidates else 0.0,
                         "recomputed decisions": stats.recomputed / stats.decisions if stats.decisions else 0.0})
            print(rows[-1], flush=True)
    columns = ["setting", "passages", "seconds", "passages/s", "mean tokens/query", "recomputed decisions"]
    return (f"### Stage path on {device.type}: tiny T5 from a config (2+2 layers, width 64, random weights), "
            f"C = {args.tiny_candidates}, max_new_tokens = {args.max_new_tokens}\n\n" + markdown_table(rows, columns))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=positive_int, default=32)
    parser.add_argument("--single-passages", type=int, default=8, help="passages for the one-at-a-time row")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gpu", action="store_true", help="also run the GPU part (needs CUDA)")
    parser.add_argument("--gpu-passages", type=int, default=1024)
    parser.add_argument("--gpu-candidates", type=int, default=20)
    parser.add_argument("--gpu-batch-sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--tiny", action="store_true",
                        help="only the stage path (passages.arrow chunks, shard store, merge) with a tiny T5")
    parser.add_argument("--tiny-passages", type=int, default=64)
    parser.add_argument("--tiny-candidates", type=int, default=20)
    parser.add_argument("--tiny-chunk-size", type=int, default=32)
    parser.add_argument("--report", default=None, help="default: reports/benchmarks.md; with --small, a file in the system's temporary folder")
    parser.add_argument("--small", action="store_true",
                        help="the CPU part and the stage path at a few passages and tokens (a check, not a "
                             "measurement)")
    args = parser.parse_args(argv)
    args.report = report_destination(args.report, args.small)
    if args.small:
        args.passages, args.single_passages, args.batch_size, args.max_new_tokens = 4, 2, 4, 4
        args.tiny_passages, args.tiny_candidates, args.tiny_chunk_size = 8, 2, 4
        write_section("querygen-tiny", tiny_part(args), args.report)

    load_before = os.getloadavg()[0]
    if args.tiny:
        body = tiny_part(args)
        write_section("querygen-tiny", body, args.report)
        print(body)
        return 0
    parts = [cpu_part(args)]
    if args.gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--gpu: CUDA is not available")
        parts.append(gpu_part(args))
    body = "\n\n".join([
        "## Query generation (`benchmarks/bench_querygen.py`)",
        f"Measured on: {machine_summary()}; load average {load_before:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (the cores are shared). Passages per second of the generation loop (model loaded, "
        "tokenisation included). Batched rows sort passages by length; 'recomputed decisions' is the share of "
        "sampling decisions re-taken from canonical logits to make the output independent of the batch.",
        *parts,
    ])
    write_section("querygen", body, args.report)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
