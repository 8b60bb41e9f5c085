"""GPU benchmark: writes the "gpu" section of reports/benchmarks.md.

Measures, on the device it finds (named in the report):

- pre-training steps of coCondenser and CoT-MAE, BERT-base built from its
  configuration, at 144 tokens: our recipe (bf16 autocast, SDPA, MLM logits
  at masked positions only, dynamic padding) against the release's (fp16
  autocast, full-vocabulary logits, static padding to 144); pairs/s, tokens/s, MFU;
- the stage loop (``qac.train.pretrain.pretrain``: sampling, DataLoader
  collation of stored token ids, logging) against the isolated step on the
  same batches, with the loop's data-wait share;
- GradCache: the cached step against the full-batch step at the same batch;
- encoding passages from stored ids (bf16 on a GPU), and exact search with
  ``qac.retrieval.search.torch_search`` (and FAISS on the GPU when installed);
- a projection of the paper profile's GPU-hours per pre-training variant and
  for encoding its corpus, from the measured rates.

- query generation with a T5-base-sized model built from its configuration
  (C = 20, 64 new tokens, as the paper's release): our loop in bf16 with
  sampling on the device (host reads every 8 steps, the paper profile's
  ``querygen.sync_every``, and every step), our batch-invariant fp32 mode,
  and Hugging Face ``generate`` with bf16 weights and at the release's fp32,
  all at batch 64;

Needs only torch, transformers, numpy, pyarrow and pandas besides the project;
runs in well under 10 minutes on one H100. ``--dry-run`` runs every path once
with a tiny model on the CPU (the test suite does), writing to ``--report``.

    python benchmarks/bench_gpu.py                       # on a GPU machine
    python benchmarks/bench_gpu.py --dry-run --report /tmp/gpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_pretrain import scifact_pairs  # noqa: E402
from qac.benchmarking import machine_summary, markdown_table, write_section  # noqa: E402

PAPER_CORPUS_PASSAGES = 8_841_823          # MS MARCO passages, encoded once per retriever


def write_pair_files(directory: Path, triples, tokenizer, name: str) -> tuple[Path, Path]:
    """passages.arrow and queries.arrow with token ids from ``(anchor, passage, query)`` triples."""
    from qac.data.arrowstore import write_passages, write_queries

    passages, queries = [], []
    for number, (anchor, passage, query) in enumerate(triples):
        pids = [f"d{number}#0", f"d{number}#1"]
        for k, text in enumerate((anchor, passage)):
            passages.append({"pid": pids[k], "doc_id": f"d{number}", "position": k, "text": text, "n_tokens": 0,
                             "contexts": {"nearby": [pids[1 - k]], "random_sampled": [pids[1 - k]], "overlap": ""}})
            queries.append({"pid": pids[k], "queries": [query]})
    write_passages(directory / "passages.arrow", passages, tokenizer=tokenizer, tokenizer_name=name)
    write_queries(directory / "queries.arrow", queries, tokenizer=tokenizer, tokenizer_name=name)
    return directory / "passages.arrow", directory / "queries.arrow"


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, optimizer, batches, device, warmup: int = 1) -> float:
    """Median seconds of optimizer steps over ``batches`` (after ``warmup`` untimed ones)."""
    times = []
    for index, batch in enumerate(batches):
        batch = {side: {k: v.to(device, non_blocking=True) for k, v in t.items()} for side, t in batch.items()}
        synchronize(device)
        start = time.perf_counter()
        step.forward_backward(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def build_model(method: str, spec: str, device, full_vocab: bool):
    from qac.models.factory import build_pretraining_model
    from qac.train.pretrain import PretrainSettings

    settings = PretrainSettings.from_mapping({"method": method, "init": spec, "skip_from": 6 if "tiny" not in spec
                                              else 1, "n_head_layers": 2, "dropout": 0.0,
                                              "cotmae_decoder": "release"})
    return build_pretraining_model(settings.to_dict(), seed=0, full_vocab_logits=full_vocab).to(device)


def pretraining_rows(args, device, tokenizer, corpus, peak) -> tuple[list[dict], dict]:
    from qac.data.context_pairs import PairCollator, PairSampler
    from qac.models.grad_cache import FullBatchStep, GradCachedStep
    from qac.train.throughput import trainable_parameters

    rows, rates = [], {}
    sampler = PairSampler(corpus, "query", seed=0)
    recipes = [("ours", torch.bfloat16 if device.type == "cuda" else None, False, None),
               ("release", torch.float16 if device.type == "cuda" else None, True, args.max_len)]
    for method in ("cocondenser", "cotmae"):
        for recipe, dtype, full_vocab, pad_to in recipes:
            model = build_model(method, args.model, device, full_vocab)
            collator = PairCollator(tokenizer, args.max_len, 32, *model.mask_ratios, seed=0, pad_to=pad_to)
            batches = [collator(sampler.batch(step, args.batch_size), step) for step in range(args.steps + 1)]
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                                          fused=device.type == "cuda")
            seconds = time_steps(FullBatchStep(model, device, dtype), optimizer, batches, device)
            padded = statistics.mean(sum(s["attention_mask"].numel() for s in b.values()) for b in batches)
            real = statistics.mean(sum(int(s["attention_mask"].sum()) for s in b.values()) for b in batches)
            mfu = 6 * trainable_parameters(model) * padded / seconds / peak if peak else None
            rows.append({"method": method, "recipe": recipe, "pairs/s": args.batch_size / seconds,
                         "tokens/s": real / seconds, "MFU": f"{100 * mfu:.1f}%" if mfu else "n/a (no peak)"})
            rates[(method, recipe)] = args.batch_size / seconds
            if method == "cocondenser" and recipe == "ours":
                chunk = max(1, args.batch_size // 4)
                cached = time_steps(GradCachedStep(model, chunk, device, dtype), optimizer, batches, device)
                rates["grad_cache"] = (cached / seconds, chunk)
            del model, optimizer
    return rows, rates


def loop_rows(args, device, corpus_files, tokenizer) -> dict:
    """The stage loop's pairs/s and data wait, beside the isolated step on the same batches."""
    from qac.data.context_pairs import PairCollator, PairSampler, load_pair_corpus
    from qac.distributed import autocast_dtype
    from qac.models.grad_cache import FullBatchStep
    from qac.train.pretrain import PretrainSettings, pretrain

    passages, queries = corpus_files
    steps = args.steps + 2
    settings = PretrainSettings.from_mapping(dict(
        method="cocondenser", init=args.model, context_type="query", steps=steps, batch_size=args.batch_size,
        max_len=args.max_len, query_max_len=32, log_every=steps, checkpoint_every=steps, dropout=0.0,
        skip_from=6 if "tiny" not in args.model else 1, loader_workers=args.workers, compile=args.compile))
    logged = {}
    with tempfile.TemporaryDirectory() as work:
        pretrain(settings, passages=passages, queries=queries, work_dir=Path(work) / "w", out_dir=Path(work) / "o",
                 log=lambda step, metrics: logged.update(metrics))
    model = build_model("cocondenser", args.model, device, False)
    corpus = load_pair_corpus(passages, queries, "query", tokenizer=tokenizer)
    sampler = PairSampler(corpus, "query", seed=settings.seed)
    collator = PairCollator(tokenizer, args.max_len, 32, *model.mask_ratios, seed=settings.seed)
    batches = [collator(sampler.batch(step, args.batch_size), step) for step in range(steps)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                                  fused=device.type == "cuda")
    seconds = time_steps(FullBatchStep(model, device, autocast_dtype("auto", device)), optimizer, batches, device)
    return {"loop pairs/s": logged["samples_per_second"], "isolated pairs/s": args.batch_size / seconds,
            "loop / isolated": logged["samples_per_second"] * seconds / args.batch_size,
            "data wait": f"{100 * logged['data_wait_share']:.1f}%",
            "padding efficiency": logged["padding_efficiency"],
            "MFU (loop)": f"{100 * logged['mfu']:.1f}%" if "mfu" in logged else "n/a (no peak)"}


def encoding_and_search(args, device, tokenizer, texts) -> dict:
    from qac.data.tokens import TextEncoder
    from qac.models.loading import load_model
    from qac.retrieval.encode import encode_texts
    from qac.retrieval.search import search_reference, torch_search

    encoder = load_model(args.model).to(device)
    ids = TextEncoder(tokenizer)(texts)
    encode_texts(encoder, tokenizer, texts[:64], token_ids=ids[:64], max_length=args.max_len, batch_size=256)
    synchronize(device)
    start = time.perf_counter()
    vectors = encode_texts(encoder, tokenizer, texts, token_ids=ids, max_length=args.max_len, batch_size=256)
    synchronize(device)
    encode_rate = len(texts) / (time.perf_counter() - start)

    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(args.search_passages, vectors.shape[1])).astype(np.float32)
    queries = rng.normal(size=(args.search_queries, vectors.shape[1])).astype(np.float32)
    torch_search(queries[:16], corpus, k=100, device=device)
    synchronize(device)
    start = time.perf_counter()
    scores, indices = torch_search(queries, corpus, k=100, device=device)
    synchronize(device)
    search_rate = len(queries) / (time.perf_counter() - start)
    _, expected = search_reference(queries[:8], corpus, k=100)
    figures = {"encoding passages/s": encode_rate, "search queries/s (torch, fp32)": search_rate,
               "search equals reference": bool(np.array_equal(indices[:8], expected)),
               "search corpus": f"{args.search_passages:,} x {vectors.shape[1]}"}
    try:
        import faiss  # noqa: F401

        from qac.retrieval.search import search

        if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
            start = time.perf_counter()
            search(queries, corpus, k=100, use_gpu=True)
            figures["search queries/s (faiss-gpu)"] = len(queries) / (time.perf_counter() - start)
    except ImportError:
        pass
    return figures


def generation_rows(args, device, tokenizer, texts) -> tuple[list[dict], float]:
    """Passages/s of query generation: ours (device-side sampling, bf16) against Hugging Face ``generate``.

    Returns the rows and the ratio of our bf16 loop to ``generate`` with bf16 weights at the same batch.
    """
    import copy

    from transformers import T5Config, T5ForConditionalGeneration

    from bench_querygen import time_hf_generate, time_ours
    from qac.querygen.generate import QueryGenerator, SamplingSettings

    dry = args.dry_run
    sizes = dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4) if dry else {}
    config = T5Config(vocab_size=max(len(tokenizer), 32128), pad_token_id=0, eos_token_id=tokenizer.sep_token_id,
                      decoder_start_token_id=0, **sizes)                  # t5-base sizes unless a dry run
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).to(device).eval()
    settings = SamplingSettings(queries_per_passage=4 if dry else 20, max_new_tokens=8 if dry else 64,
                                max_source_len=512, drop_duplicates=False)
    passages = [(f"p{i}", text) for i, text in enumerate(texts[:args.generation_passages])]
    batch = args.generation_batch
    half = torch.bfloat16 if device.type == "cuda" else None      # the CPU of a dry run stays in fp32
    label = "bf16" if half else "fp32"
    rows = []

    def ours(name, subset, **kwargs):
        generator = QueryGenerator(model, tokenizer, settings, **kwargs)
        with torch.inference_mode():
            generator.generate_candidates(subset[:batch], batch)             # warm-up
            synchronize(device)
            rows.append({"setting": name, **time_ours(generator, subset, batch)})

    ours(f"ours, {label}, sampling on the device, host reads every 8 steps", passages, autocast_dtype=half,
         batch_invariant=False, sync_every=8)
    ours(f"ours, {label}, sampling on the device, host reads every step", passages, autocast_dtype=half,
         batch_invariant=False, sync_every=1)
    ours("ours, fp32, batch-invariant", passages[:max(batch, len(passages) // 8)])
    weights = copy.deepcopy(model).to(torch.bfloat16) if half else model
    torch.manual_seed(0)
    reference = {"setting": f"HF generate, {label} weights",
                 **time_hf_generate(weights, tokenizer, passages, settings, batch, device)}
    rows.append(reference)
    rows.append({"setting": "HF generate, fp32 (the release's settings)",
                 **time_hf_generate(model, tokenizer, passages, settings, batch, device)})
    for row in rows:
        row["batch"] = batch
    return rows, rows[0]["passages/s"] / reference["passages/s"]    # the first row: ours, host reads every 8 steps


def projection(rates: dict, encode_rate: float, generation_rate: float, dry_run: bool) -> list[dict]:
    """GPU-hours of the paper profile's pre-training variants, of one corpus encoding and of query generation
    per million passages (the split corpus's size is known only once split), at the measured rates."""
    import yaml

    params = yaml.safe_load(open(Path(__file__).resolve().parent.parent / "profiles" / "paper" / "params.yaml"))
    common = params["pretrain"]["common"]
    rows = []
    for name, variant in params["pretrain"]["variants"].items():
        merged = {**common, **variant}
        if merged["method"] not in ("cocondenser", "cotmae"):
            continue
        rate = rates[(merged["method"], "ours")]
        pairs = merged["steps"] * merged["batch_size"]
        rows.append({"stage": f"pretrain {name}", "pairs": f"{pairs:,}", "pairs/s (one device)": rate,
                     "GPU-hours": pairs / rate / 3600})
    rows.append({"stage": "encode MS MARCO passages (once per retriever)", "pairs": f"{PAPER_CORPUS_PASSAGES:,}",
                 "pairs/s (one device)": encode_rate, "GPU-hours": PAPER_CORPUS_PASSAGES / encode_rate / 3600})
    rows.append({"stage": "generate 20 queries per passage, per million split passages", "pairs": "1,000,000",
                 "pairs/s (one device)": generation_rate, "GPU-hours": 1e6 / generation_rate / 3600})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model on the CPU: every path once")
    parser.add_argument("--model", default=None, help="model spec (default: scratch:bert-base-uncased; dry run: "
                                                      "tiny:minilm)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--max-len", type=int, default=144)
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers of the stage loop")
    parser.add_argument("--compile", action="store_true", help="torch.compile the stage loop's model")
    parser.add_argument("--report", default="reports/benchmarks.md")
    args = parser.parse_args(argv)
    dry = args.dry_run
    args.model = args.model or ("tiny:minilm" if dry else "scratch:bert-base-uncased")
    args.batch_size = args.batch_size or (8 if dry else 128)
    args.steps = args.steps or (2 if dry else 10)
    args.workers = args.workers if args.workers is not None else (2 if dry else 4)
    args.search_passages, args.search_queries = (2_000, 64) if dry else (1_000_000, 8_192)
    args.generation_passages, args.generation_batch = (8, 4) if dry else (512, 64)
    device = torch.device("cpu" if dry or not torch.cuda.is_available() else "cuda")

    from qac.models.loading import load_tokenizer
    from qac.data.context_pairs import load_pair_corpus
    from qac.train.throughput import peak_flops

    started = time.perf_counter()
    device_name, peak = peak_flops(device)
    tokenizer = load_tokenizer(args.model)
    triples = scifact_pairs(256 if dry else 2048)
    with tempfile.TemporaryDirectory() as work:
        files = write_pair_files(Path(work), triples, tokenizer, args.model)
        corpus = load_pair_corpus(*files, "query", tokenizer=tokenizer)
        step_rows, rates = pretraining_rows(args, device, tokenizer, corpus, peak)
        loop = loop_rows(args, device, files, tokenizer)
    texts = [anchor for anchor, _, _ in triples] * (1 if dry else 4)
    retrieval = encoding_and_search(args, device, tokenizer, texts)
    generation, generation_ratio = generation_rows(args, device, tokenizer, texts)
    cache_ratio, chunk = rates["grad_cache"]
    body = [
        "## GPU benchmark (`benchmarks/bench_gpu.py`)" + (" — dry run, tiny model on the CPU" if dry else ""),
        "",
        f"Device: {device_name}; assumed peak {peak / 1e12:.0f} TFLOP/s bf16" if peak else
        f"Device: {device_name}; no peak FLOP/s assumed (MFU not given)",
        f"Machine: {machine_summary()}; model {args.model}, {args.batch_size} pairs per step, "
        f"{args.max_len} tokens; MFU = 6 x parameters x padded tokens / time / peak.",
        "", "### Pre-training step (isolated)", "", markdown_table(step_rows),
        "", f"GradCache (chunk {chunk}) step / full-batch step: {cache_ratio:.2f}x",
        "", "### Stage loop vs isolated step (coCondenser, ours)", "", markdown_table([loop]),
        "", "### Encoding and exact search", "", markdown_table([retrieval]),
        "", f"### Query generation ({'tiny T5' if dry else 'T5-base sizes'}, random weights)", "",
        markdown_table(generation, ["setting", "batch", "passages", "seconds", "passages/s", "mean tokens/query",
                                    "recomputed decisions"]),
        "", f"Ours with sampling on the device / Hugging Face generate with the same weights' precision, same batch: "
            f"{generation_ratio:.2f}x",
        "", "### Projection: the paper profile on one such device", "",
        markdown_table(projection(rates, retrieval["encoding passages/s"], generation[0]["passages/s"], dry)),
        "", f"Whole benchmark: {time.perf_counter() - started:.0f} s.",
    ]
    write_section("gpu", "\n".join(body), args.report)
    print("\n".join(body))


if __name__ == "__main__":
    main()
