"""GPU benchmark: the figures of one device, written section by section to ``--out``.

Runs on a machine that holds only the checkout and PyTorch, transformers,
numpy, pyarrow and pandas (no model hub, no data mirror, no MLflow, DVC or
FAISS): its models are built from ``benchmarks/bert-base-uncased`` (BERT-base's
configuration and the uncased vocabulary, random weights) and its text comes
from ``benchmarks/sample_text.py`` (SciFact when the data mirror holds it,
generated text otherwise). Sections, each written to ``<out>/bench_gpu.json``
and ``<out>/bench_gpu.md`` as soon as it finishes (a later failure keeps the
earlier figures; a failed section records its error and the next one runs):

- ``pretrain``: one optimizer step of coCondenser, CoT-MAE and MASTER (five
  decoders) at 144 tokens, bf16, for query and passage contexts, and the
  release's recipe for coCondenser (fp16, full-vocabulary logits, static
  padding); FLOPs counted with ``torch.utils.flop_counter`` on one batch:
  hardware FLOP utilisation on padded tokens, MFU on real ones;
- ``paper_lengths``: the same steps on passages and queries of MS MARCO's
  token lengths (``benchmarks/msmarco_lengths.json``: mean 80.6 passage
  tokens, 4.5% over 144; queries mean 9.0) at the recipe's dropout 0.1, each
  padded (``pretrain.common.unpadded: false``) and unpadded (token streams,
  ``true``); CoT-MAE with both decoders. MFU counts the unpadded step's
  FLOPs (what the real tokens need) for both layouts; HFU the FLOPs the
  layout computed;
- ``grad_cache``: the gradient-cached step at the paper profile's chunk
  against the full-batch step, same batch;
- ``stage_loop``: ``qac.train.pretrain.pretrain`` (sampling, DataLoader
  collation of stored ids, logging) in its steady window (the first logging
  window, with start-up, reported apart) against the isolated step;
- ``encoding``: passages/s from stored ids;
- ``search``: exact top 1,000 with ``qac.retrieval.search.torch_search`` over
  a corpus of MS MARCO's size when the device holds it (FAISS's GPU index too,
  when installed);
- ``generation``: query generation with a T5-base-sized model (20 candidates,
  64 new tokens) against Hugging Face ``generate`` in bf16 at the same batch;
- ``compile``: ``torch.compile`` of the coCondenser and CoT-MAE steps at
  static per-side lengths, compile time apart from the steady step, MFU.

Every section stops timing once its ``--budget-s`` is spent (it always times
a few steps), so the whole run fits about seven minutes on an H100.
``--publish`` copies a results file into ``reports/bench_gpu.json`` (what
``qac profile plan --cost`` reads) and its section into
``reports/benchmarks.md``.

    python benchmarks/bench_gpu.py --out /tmp/gpu            # on a GPU machine
    python benchmarks/bench_gpu.py --dry-run --out /tmp/gpu   # every path once, tiny model on the CPU
    python benchmarks/bench_gpu.py --publish /tmp/gpu/bench_gpu.json
    python benchmarks/bench_gpu.py --publish first/bench_gpu.json rerun/bench_gpu.json   # some sections rerun
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCHMARKS))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from sample_text import MODEL_DIR, msmarco_length_triples, text_triples  # noqa: E402

from qac.params import read_yaml  # noqa: E402
from qac.params.vocabulary import PRETRAINING_METHODS as METHODS  # noqa: E402

SECTIONS = ("pretrain", "paper_lengths", "grad_cache", "stage_loop", "encoding", "search", "compile", "generation")
# Wall-clock caps per section on a GPU (a hung kernel or a slow path stops its section, not the run);
# each is also held to what is left of --deadline-s.
SECTION_CAP_S = {"pretrain": 180, "paper_lengths": 150, "grad_cache": 60, "stage_loop": 90, "encoding": 60, "search": 90,
                 "compile": 240, "generation": 150}
RESULTS = "bench_gpu.json"
PUBLISHED = REPO / "reports" / "bench_gpu.json"
PAPER_CORPUS_PASSAGES = 8_841_823          # MS MARCO passages
QUERY_MAX_LEN = 32                         # the collators' query limit (bench_pretrain.make_batches)


# ---------------------------------------------------------------------------------------------------------
# results: one JSON file, its Markdown rendering beside it, both replaced after every section


class Results:
    def __init__(self, out: Path, header: dict):
        self.out = out
        self.data = {**header, "sections": {}}
        out.mkdir(parents=True, exist_ok=True)

    def record(self, name: str, figures: dict) -> None:
        self.data["sections"][name] = figures
        self.save()

    def save(self) -> None:
        from qac.io import atomic_path

        for path, text in ((self.out / RESULTS, json.dumps(self.data, indent=1, default=float) + "\n"),
                           (self.out / "bench_gpu.md", render_markdown(self.data) + "\n")):
            with atomic_path(path) as tmp:
                Path(tmp).write_text(text, encoding="utf-8")


class SectionStopped(BaseException):
    """A section ran past its wall-clock cap (a hung kernel or a slow path must not take the run). Not an
    ``Exception``: the handlers that keep a section's other rows going past a failed one let it through."""


@contextlib.contextmanager
def wall_cap(seconds: float | None):
    """Raise :class:`SectionStopped` in this (main) thread after ``seconds``; no cap where signals are absent."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def stop(signum, frame):
        raise SectionStopped(f"stopped at its cap of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_section(results: Results, name: str, function, budget_s: float, cap_s: float | None = None) -> dict | None:
    """Run one section, record its figures (or its error) and how long it took. A section stopped at
    ``cap_s`` seconds, or failing midway, keeps the rows it recorded as it went (status "running")."""
    print(f"[bench_gpu] {name} ...", flush=True)
    started = time.perf_counter()
    try:
        with wall_cap(cap_s):
            figures = {"status": "done", **function(budget_s)}
    except (Exception, SectionStopped) as error:     # noqa: BLE001 - a failed section must not lose the others
        partial = results.data["sections"].get(name) or {}
        figures = {**{k: v for k, v in partial.items() if k != "status"}, "status": "failed",
                   "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
        print(figures["traceback"], file=sys.stderr, flush=True)
    figures["seconds"] = time.perf_counter() - started
    results.record(name, figures)
    print(f"[bench_gpu] {name}: {figures['status']} in {figures['seconds']:.0f} s", flush=True)
    release_memory()
    return figures if figures["status"] == "done" else None


def release_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------
# timing helpers


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def to_device(batch: dict, device) -> dict:
    from qac.data.streams import to_device as side_to_device

    return {side: side_to_device(tensors, device) for side, tensors in batch.items()}


WARMUP, MIN_STEPS = 2, 3           # a dry run sets both to 1


def timed(run, items, device, budget_s: float, warmup: int | None = None, max_steps: int = 30,
          min_steps: int | None = None) -> dict:
    """Call ``run(item)`` over ``items`` (cycled): ``warmup`` untimed calls, then timed ones until
    ``max_steps`` or, once ``min_steps`` are timed, until ``budget_s`` is spent. Median and the first call.

    The warm-up sees every distinct item at least once: each new shape costs its first call kernel
    selection (cuBLAS heuristics, cuDNN attention plans), which a training run pays once per length
    and then amortises over its steps; timing it here would charge it to every step."""
    warmup = max(WARMUP if warmup is None else warmup, len(items))
    min_steps = MIN_STEPS if min_steps is None else min_steps
    times, started, index = [], time.perf_counter(), 0
    first = None
    while True:
        synchronize(device)
        start = time.perf_counter()
        run(items[index % len(items)])
        synchronize(device)
        elapsed = time.perf_counter() - start
        first = elapsed if first is None else first
        if index >= warmup:
            times.append(elapsed)
        index += 1
        if len(times) >= max_steps or (len(times) >= min_steps and time.perf_counter() - started > budget_s):
            break
    return {"median_s": statistics.median(times), "first_s": first, "timed": len(times)}


def counted_flops(step, batch) -> int:
    """FLOPs of ``step.forward_backward(batch)`` counted as a training run counts them (``qac.train.flops``):
    on a copy of the model on the meta device. A token stream's attention there runs the varlen kernel the
    counter has a formula for; the jagged tensors of the CPU's kernel and of attention dropout it cannot count."""
    from qac.train.flops import META, counted_flops as count_on_meta

    return int(count_on_meta(step.model, batch, lambda replica, meta_batch: step.on(replica, META).forward_backward(meta_batch)))


def token_counts(batches) -> tuple[float, float]:
    """Mean real and padded (computed) tokens per batch (all sides); a token stream computes its real tokens."""
    def real(side):
        return int(side["attention_mask"].sum()) if "attention_mask" in side else side["input_ids"].numel()

    def computed(side):
        return side["attention_mask"].numel() if "attention_mask" in side else side["input_ids"].numel()

    return (statistics.mean(sum(real(s) for s in b.values()) for b in batches),
            statistics.mean(sum(computed(s) for s in b.values()) for b in batches))


def peak_of(device) -> tuple[str, float | None]:
    """The device's name and its dense bf16 peak FLOP/s (None where the table has none: the CPU)."""
    from qac.train.throughput import peak_flops

    return peak_flops(device)


# ---------------------------------------------------------------------------------------------------------
# models and batches


@functools.cache
def base_values() -> dict:
    """``profiles/base.yaml`` read as it is (the method's settings): this machine may lack the schema's pydantic."""
    return read_yaml((REPO / "profiles" / "base.yaml").read_text(encoding="utf-8"))


def pretraining_settings(method: str, spec: str, **overrides) -> dict:
    from bench_pretrain import skip_from
    from qac.train.pretrain import PretrainSettings

    base = base_values()
    values = {**base["pretrain"]["common"], "context_type": "passage", "query_count": 1,
              "spans": base["split"]["spans"], "method": method, "seed": 42, "init": spec,
              "skip_from": skip_from(spec, 6), "n_head_layers": 2, "dropout": 0.0,
              "cotmae_decoder": "release", **overrides}
    return PretrainSettings.from_mapping(values)


def build_model(method: str, spec: str, device, full_vocab: bool = False):
    from qac.models.factory import build_pretraining_model

    return build_pretraining_model(pretraining_settings(method, spec), seed=0,
                                   full_vocab_logits=full_vocab).to(device)


def method_batches(tokenizer, triples, method: str, model, context: str, batch_size: int, count: int,
                   max_len: int, pad_to=None) -> list[dict]:
    """Collated batches of ``method``, passages cut at ``max_len`` tokens; lengths rounded up as the pipeline
    rounds them (``pretrain.common.pad_to_multiple_of``) unless padded to a fixed ``pad_to``."""
    from bench_pretrain import make_batches

    return make_batches(tokenizer, triples, context, batch_size, count, model.mask_ratios, pad_to,
                        master=method == "master", pad_to_multiple_of=paper_setting("pad_to_multiple_of"),
                        max_len=max_len)


def optimizer_for(model, device):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                             fused=device.type == "cuda")


def step_runner(step, optimizer):
    def run(batch):
        step.forward_backward(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return run


def step_figures(step, optimizer, batches, device, budget_s: float, peak, batch_size: int) -> dict:
    """Time the step over ``batches`` and count its FLOPs on the first one."""
    batches = [to_device(b, device) for b in batches]
    run = step_runner(step, optimizer)
    timing = timed(run, batches, device, budget_s)
    flops_first = counted_flops(step, batches[0])
    optimizer.zero_grad(set_to_none=True)
    real, padded = token_counts(batches)
    _, padded_first = token_counts(batches[:1])       # a token stream's computed tokens are its real ones
    flops = flops_first * padded / padded_first       # the counted FLOPs per computed token, at the mean padding
    seconds = timing["median_s"]
    figures = {"pairs/s": batch_size / seconds, "tokens/s": real / seconds, "s/step": seconds,
               "real tokens/step": real, "padded tokens/step": padded, "counted GFLOP/step": flops / 1e9,
               "steps timed": timing["timed"]}
    if peak:
        figures["HFU (counted, padded)"] = flops / seconds / peak
        figures["MFU (counted, real tokens)"] = flops * real / padded / seconds / peak
    return figures


# ---------------------------------------------------------------------------------------------------------
# sections


def pretrain_section(args, device, tokenizer, triples, peak, progress):
    """Each configuration on its own: one that fails (out of memory, say) records its error and the
    next one runs; the rows so far are saved after each (``progress``)."""
    def section(budget_s):
        batch = args.batch_size
        configs = [(method, "ours", context, batch) for method in METHODS for context in ("query", "passage")]
        configs.append(("cocondenser", "release", "passage", batch))
        # twice the batch: how far the utilisation is held back by launches rather than arithmetic
        configs += [(method, "ours", "passage", 2 * batch) for method in ("cocondenser", "cotmae")]
        share = budget_s / len(configs)
        dtype_ours = torch.bfloat16 if device.type == "cuda" else None
        dtype_release = torch.float16 if device.type == "cuda" else None
        rows = []
        from qac.models.grad_cache import FullBatchStep

        recipes = {"ours": f"bf16 autocast, MLM logits at masked positions only, dynamic padding rounded up to a "
                           f"multiple of {paper_setting('pad_to_multiple_of')}",
                   "release": "fp16 autocast, full-vocabulary logits, static padding to max_len"}
        for method in METHODS:
            model = build_model(method, args.model, device)
            optimizer = optimizer_for(model, device)
            for name, recipe, context, pairs in (c for c in configs if c[0] == method):
                release = recipe == "release"
                row = {"method": method, "recipe": recipe, "context": context, "pairs/step": pairs}
                try:
                    model.full_vocab_logits = release
                    batches = method_batches(tokenizer, triples, method, model, context, pairs,
                                             args.distinct_batches, args.max_len,
                                             pad_to=args.max_len if release else None)
                    step = FullBatchStep(model, device, dtype_release if release else dtype_ours)
                    row.update(step_figures(step, optimizer, batches, device, share, peak, pairs))
                except Exception as error:      # noqa: BLE001 - the other configurations still run
                    row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                    optimizer.zero_grad(set_to_none=True)
                    release_memory()
                rows.append(row)
                print(f"  {row}", flush=True)
                progress({"batch_size": args.batch_size, "max_len": args.max_len, "rows": rows, "recipes": recipes})
            del model, optimizer
            release_memory()
        if all("error" in row for row in rows):
            raise RuntimeError(f"every configuration failed; the first: {rows[0]['error']}")
        return {"batch_size": args.batch_size, "max_len": args.max_len, "rows": rows, "recipes": recipes}
    return section


PAPER_DROPOUT = 0.1          # the recipe's (BERT's own); the pretrain section trains at 0


def paper_lengths_section(args, device, tokenizer, peak, progress):
    """Each method (CoT-MAE with both decoders) and context on MS MARCO's lengths, padded and unpadded,
    at the recipe's dropout. Per configuration the two layouts run on the same pairs and masks; the
    FLOPs of the unpadded step on a batch are the model FLOPs of its real tokens (MFU for both), each
    layout's own count its hardware FLOPs (HFU)."""
    def section(budget_s):
        from qac.data.streams import token_stream
        from qac.models.factory import build_pretraining_model
        from qac.models.grad_cache import FullBatchStep

        triples = msmarco_length_triples(256 if args.dry_run else 4096)
        configs = [(method, decoder, context) for method, decoder in
                   (("cocondenser", None), ("cotmae", "paper"), ("cotmae", "release"), ("master", None))
                   for context in ("query", "passage")]
        if args.dry_run:        # every method, decoder and context once
            configs = [configs[0], configs[3], configs[4], configs[7]]
        share = budget_s / (2 * len(configs))
        dtype = torch.bfloat16 if device.type == "cuda" else None
        multiple = paper_setting("pad_to_multiple_of")
        rows = []
        for method, decoder, context in configs:
            base = {"method": method + (f" ({decoder} decoder)" if decoder else ""), "context": context,
                    "pairs/step": args.batch_size}
            try:
                settings = pretraining_settings(method, args.model, dropout=PAPER_DROPOUT,
                                                **({"cotmae_decoder": decoder} if decoder else {}))
                model = build_pretraining_model(settings, seed=0).to(device)
                optimizer = optimizer_for(model, device)
                padded = method_batches(tokenizer, triples, method, model, context, args.batch_size,
                                        args.distinct_batches, args.max_len)
                layouts = {"padded": padded,
                           "unpadded": [{name: token_stream(side, multiple) for name, side in batch.items()}
                                        for batch in padded]}
                step = FullBatchStep(model, device, dtype)
                measured = {}
                for layout, batches in layouts.items():
                    batches = [to_device(b, device) for b in batches]
                    timing = timed(step_runner(step, optimizer), batches, device, share)
                    flops = counted_flops(step, batches[0])
                    optimizer.zero_grad(set_to_none=True)
                    real, computed = token_counts(batches)
                    first_real, first_computed = token_counts(batches[:1])
                    measured[layout] = {"s/step": timing["median_s"], "real tokens/step": real,
                                        "computed tokens/step": computed, "flops": flops * computed / first_computed,
                                        "model flops": flops * real / first_real, "steps timed": timing["timed"]}
                model_flops = measured["unpadded"]["model flops"]       # what the real tokens need
                for layout, figures in measured.items():
                    seconds = figures["s/step"]
                    row = {**base, "layout": layout, "pairs/s": args.batch_size / seconds,
                           "real tokens/s": figures["real tokens/step"] / seconds, "s/step": seconds,
                           "real tokens/step": figures["real tokens/step"],
                           "computed tokens/step": figures["computed tokens/step"],
                           "model GFLOP/step": model_flops / 1e9, "computed GFLOP/step": figures["flops"] / 1e9,
                           "speed vs padded": measured["padded"]["s/step"] / seconds,
                           "steps timed": figures["steps timed"]}
                    if peak:
                        row["MFU (real tokens)"] = model_flops / seconds / peak
                        row["HFU (computed tokens)"] = figures["flops"] / seconds / peak
                    rows.append(row)
                del model, optimizer, step
            except Exception as error:      # noqa: BLE001 - the other configurations still run
                rows.append({**base, "error": f"{type(error).__name__}: {str(error)[:300]}"})
            release_memory()
            print(f"  {rows[-1]}", flush=True)
            progress({"batch_size": args.batch_size, "max_len": args.max_len, "dropout": PAPER_DROPOUT,
                      "rows": rows})
        if all("error" in row for row in rows):
            raise RuntimeError(f"every configuration failed; the first: {rows[0]['error']}")
        return {"batch_size": args.batch_size, "max_len": args.max_len, "dropout": PAPER_DROPOUT, "rows": rows,
                "lengths": "benchmarks/msmarco_lengths.json (passages mean 80.6 tokens, median 71, p95 142, 4.5% "
                           "over 144; queries mean 9.0, max 44)"}
    return section


def paper_setting(key: str) -> int:
    """``pretrain.common.<key>`` of the paper profile (the GradCache chunk, the length multiple)."""
    import yaml

    params = yaml.safe_load((REPO / "profiles" / "paper" / "params.yaml").read_text(encoding="utf-8"))
    return int(params["pretrain"]["common"][key])


def grad_cache_section(args, device, tokenizer, triples, peak):
    def section(budget_s):
        from qac.models.grad_cache import FullBatchStep, GradCachedStep

        chunk = args.chunk or paper_setting("grad_cache_chunk")
        dtype = torch.bfloat16 if device.type == "cuda" else None
        model = build_model("cocondenser", args.model, device)
        optimizer = optimizer_for(model, device)
        batch_size = args.grad_cache_batch
        while True:
            batches = method_batches(tokenizer, triples, "cocondenser", model, "query", batch_size,
                                     args.distinct_batches, args.max_len)
            try:
                full = step_figures(FullBatchStep(model, device, dtype), optimizer, batches, device,
                                    budget_s / 2, peak, batch_size)
                break
            except torch.cuda.OutOfMemoryError:
                if batch_size <= 2 * chunk:
                    raise
                optimizer.zero_grad(set_to_none=True)
                release_memory()
                batch_size //= 2            # the full batch must fit for the comparison
        cached_step = GradCachedStep(model, chunk, device, dtype)
        cached = step_figures(cached_step, optimizer, batches, device, budget_s / 2, peak, batch_size)
        gpu_batch = to_device(batches[0], device)
        profile = host_profile(lambda: cached_step.forward_backward(gpu_batch), device)
        optimizer.zero_grad(set_to_none=True)
        # Larger chunks (where memory allows: the chunk changes how the batch is computed, not what): how much
        # of the overhead is the chunk loop's per-chunk cost
        by_chunk = {}
        for larger in (2 * chunk, 4 * chunk):
            if larger >= batch_size:
                break
            timing = step_figures(GradCachedStep(model, larger, device, dtype), optimizer, batches, device,
                                  budget_s / 4, peak, batch_size)
            by_chunk[str(larger)] = timing["s/step"] / full["s/step"]
        return {"batch_size": batch_size, "chunk": chunk, "context": "query", "full": full, "cached": cached,
                "time ratio": cached["s/step"] / full["s/step"],
                "counted FLOP ratio": cached["counted GFLOP/step"] / full["counted GFLOP/step"],
                "time ratio at larger chunks": by_chunk, PROFILE: profile}
    return section


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


def stage_loop_section(args, device, tokenizer, triples, peak):
    """The loop's steady rate: logging windows after the first (which carries the start-up: worker
    processes, first allocations, kernel selection) against the isolated step on the same batches."""
    def section(budget_s):
        from qac.data.context_pairs import load_pair_corpus
        from qac.distributed import autocast_dtype
        from qac.models.factory import build_batches
        from qac.models.grad_cache import FullBatchStep
        from qac.train.pretrain import pretrain

        window, windows = args.loop_window, args.loop_windows
        steps = window * windows
        settings = pretraining_settings("cocondenser", args.model, context_type="query", steps=steps,
                                        batch_size=args.batch_size, max_len=args.max_len, query_max_len=32,
                                        log_every=window, checkpoint_every=steps, loader_workers=args.workers)
        logged = []
        with tempfile.TemporaryDirectory() as work:
            work = Path(work)
            passages, queries = write_pair_files(work, triples, tokenizer, args.model)
            started = time.perf_counter()
            pretrain(settings, passages=passages, queries=queries, work_dir=work / "w", out_dir=work / "o",
                     log=lambda step, metrics: logged.append(dict(metrics, step=step)))
            loop_seconds = time.perf_counter() - started
            corpus = load_pair_corpus(passages, queries, "query", tokenizer=tokenizer)
        model = build_model("cocondenser", args.model, device)
        sampler, collator = build_batches(settings, model, tokenizer, corpus, {})    # the loop's own batches
        batches = [collator(sampler.batch(step, args.batch_size), step) for step in range(steps)]
        step = FullBatchStep(model, device, autocast_dtype("auto", device))
        isolated = step_figures(step, optimizer_for(model, device), batches, device, budget_s, peak,
                                args.batch_size)
        steady = logged[1:] or logged
        loop_rate = statistics.median(m["samples_per_second"] for m in steady)
        return {"batch_size": args.batch_size, "steps": steps, "log window": window, "workers": args.workers,
                "loop pairs/s (steady windows)": loop_rate,
                "loop pairs/s (first window, with start-up)": logged[0]["samples_per_second"],
                "isolated pairs/s": isolated["pairs/s"], "loop / isolated": loop_rate / isolated["pairs/s"],
                "data wait (steady)": statistics.median(m["data_wait_share"] for m in steady),
                "padding efficiency": logged[-1]["padding_efficiency"],
                "loop wall seconds (start-up and checkpoint included)": loop_seconds}
    return section


def encoding_section(args, device, tokenizer, triples):
    def section(budget_s):
        from qac.data.tokens import TextEncoder
        from qac.models.loading import load_model
        from qac.retrieval.encode import encode_texts

        encoder = load_model(args.model).to(device)
        anchors = [anchor for anchor, _, _ in triples]
        ids = TextEncoder(tokenizer)(anchors)

        def rate(count, workers=0):
            texts = [anchors[i % len(anchors)] for i in range(count)]
            token_ids = [ids[i % len(ids)] for i in range(count)]
            synchronize(device)
            start = time.perf_counter()
            encode_texts(encoder, tokenizer, texts, token_ids=token_ids, max_length=args.max_len,
                         batch_size=args.encode_batch, loader_workers=workers)
            synchronize(device)
            return count / (time.perf_counter() - start)

        first = rate(min(len(anchors), 2 * args.encode_batch))            # warm-up and a first estimate
        count = max(args.encode_batch, min(args.encode_passages, int(first * budget_s * 0.3)))
        rate(count)                 # every batch length seen once (kernel selection per shape, paid once in a run)
        figures = {"passages/s": rate(count), "passages": count, "batch_size": args.encode_batch,
                   "max_len": args.max_len, "dtype": "bf16" if device.type == "cuda" else "fp32"}
        figures["passages/s (2 loader workers)"] = rate(count, workers=2)
        figures["rows where the batch's own forward puts them"] = rows_in_place(encoder, tokenizer, anchors, ids,
                                                                                args, device)
        # The model alone on one full batch (no padding work, no copies back): what the loop could reach
        from qac.distributed import autocast_context, autocast_dtype

        input_ids = torch.full((args.encode_batch, args.max_len), 1000, dtype=torch.long, device=device)
        mask = torch.ones_like(input_ids)
        encoder.eval()

        def forward(_):
            with torch.inference_mode(), autocast_context(device, autocast_dtype("auto", device)):
                encoder(input_ids=input_ids, attention_mask=mask)

        alone = timed(forward, [None], device, budget_s * 0.3)
        figures["model alone passages/s (full batches)"] = args.encode_batch / alone["median_s"]
        figures[PROFILE] = host_profile(
            lambda: encode_texts(encoder, tokenizer, anchors[:2 * args.encode_batch],
                                 token_ids=ids[:2 * args.encode_batch], max_length=args.max_len,
                                 batch_size=args.encode_batch), device)
        return figures
    return section


def rows_in_place(encoder, tokenizer, anchors, ids, args, device) -> bool:
    """The vectors of one batch of ``encode_texts`` (copied back while later batches run) equal, in the
    rows of their texts, the same batch's forward pass run alone."""
    from qac.data.tokens import SpecialTokens, with_special_tokens
    from qac.distributed import autocast_context, autocast_dtype
    from qac.models.biencoder import pool
    from qac.retrieval.encode import EncodeBatches, encode_texts

    count = 3 * args.encode_batch
    vectors = encode_texts(encoder, tokenizer, anchors[:count], token_ids=ids[:count], max_length=args.max_len,
                           batch_size=args.encode_batch)
    special = SpecialTokens.of(tokenizer)
    token_ids = [with_special_tokens(i, args.max_len, special) for i in ids[:count]]
    order = np.argsort([-len(i) for i in token_ids], kind="stable")
    batch = order[args.encode_batch:2 * args.encode_batch]           # the middle batch
    rows, input_ids, mask = EncodeBatches(token_ids, [batch], tokenizer.pad_token_id or 0)[0]
    encoder.eval()                  # as encode_texts runs it (and leaves it as it found it)
    with torch.inference_mode(), autocast_context(device, autocast_dtype("auto", device)):
        output = encoder(input_ids=input_ids.to(device), attention_mask=mask.to(device))
        alone = pool(output.last_hidden_state, mask.to(device), "cls").float().cpu().numpy()
    return bool(np.array_equal(vectors[rows.numpy()], alone))


def host_profile(run, device, rows: int = 12) -> str:
    """The ops that took the most time in ``run()`` (``torch.profiler``; device time on a GPU): a diagnosis
    kept beside the rate."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        run()
        synchronize(device)
    # the device column is "device" in recent releases, "cuda" in older ones
    keys = ("self_device_time_total", "self_cuda_time_total") if device.type == "cuda" else ()
    for key in (*keys, "self_cpu_time_total"):
        try:
            return profiler.key_averages().table(sort_by=key, row_limit=rows)
        except Exception:           # noqa: BLE001 - a name this release does not know
            continue
    return ""


def search_section(args, device):
    def section(budget_s):
        from qac.retrieval.search import search_reference, torch_search

        dim, k = args.search_dim, args.search_k
        passages = args.search_passages
        if device.type == "cuda":           # the corpus must leave room for the score blocks
            free = torch.cuda.mem_get_info(device)[0]
            passages = min(passages, int(0.6 * free / (4 * dim)))
        generator = torch.Generator(device=device).manual_seed(0)
        corpus = torch.randn(passages, dim, generator=generator, device=device)
        queries = torch.randn(args.search_queries, dim, generator=generator, device=device)
        torch_search(queries[:64], corpus, k=k, device=device)            # warm-up
        synchronize(device)
        start = time.perf_counter()
        scores, indices = torch_search(queries, corpus, k=k, device=device)
        synchronize(device)
        seconds = time.perf_counter() - start
        figures = {"corpus": f"{passages:,} x {dim}", "queries": len(queries), "k": k, "dtype": "fp32",
                   "queries/s (torch)": len(queries) / seconds, "seconds (torch)": seconds}
        # the blocked search against one unblocked product for a few queries
        check = 8
        if passages * dim * 4 * check < 2e9 or device.type == "cuda":
            reference = one_block_top(queries[:check], corpus, k)
            figures["equals one-block search"] = bool((torch.as_tensor(indices[:check]) == reference).all())
            figures["same top-k sets as one-block search"] = all(
                set(a.tolist()) == set(b.tolist()) for a, b in zip(torch.as_tensor(indices[:check]), reference))
        if device.type == "cpu":
            _, expected = search_reference(queries[:check].numpy(), corpus.numpy(), k)
            figures["equals NumPy reference"] = bool((indices[:check] == expected).all())
        try:
            import faiss

            if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
                from qac.retrieval.search import search

                host_corpus, host_queries = corpus.cpu().numpy(), queries.cpu().numpy()
                del corpus
                release_memory()
                start = time.perf_counter()
                search(host_queries, host_corpus, k=k, use_gpu=True, backend="faiss")
                figures["queries/s (faiss-gpu)"] = len(host_queries) / (time.perf_counter() - start)
        except ImportError:
            figures["faiss-gpu"] = "not installed"
        return figures
    return section


def one_block_top(queries, corpus, k):
    """Top-k indices from one float32 product (no ties in random data; a score within rounding of
    the k-th can still swap places with it, as another kernel sums in another order)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return (queries @ corpus.T).topk(k, dim=1).indices.cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def generation_section(args, device, tokenizer, triples, progress):
    """Passages/s of query generation: ours (device-side sampling) against Hugging Face ``generate``."""
    def section(budget_s):
        import copy

        from transformers import T5Config, T5ForConditionalGeneration

        from bench_querygen import T5_BASE
        from qac.querygen.generate import QueryGenerator, SamplingSettings

        dry = args.dry_run
        sizes = dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4) if dry else T5_BASE
        config = T5Config(vocab_size=max(len(tokenizer), 32128), pad_token_id=0,
                          eos_token_id=tokenizer.sep_token_id, decoder_start_token_id=0, **sizes)
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(config).to(device).eval()
        querygen = base_values()["querygen"]
        settings = SamplingSettings(**{**{field.name: querygen[field.name] for field in dataclasses.fields(SamplingSettings)
                                          if field.name != "seed"},
                                       "queries_per_passage": 4 if dry else 20, "max_new_tokens": 8 if dry else 64,
                                       "max_source_len": 512, "drop_duplicates": False}, seed=42)
        passages = [(f"p{i}", anchor) for i, (anchor, _, _) in enumerate(triples)]
        batch = args.generation_batch
        half = torch.bfloat16 if device.type == "cuda" else None         # a dry run's CPU stays in fp32
        label = "bf16" if half else "fp32"
        weights = copy.deepcopy(model).to(torch.bfloat16) if half else model
        graph = "a CUDA graph per batch" if device.type == "cuda" else "no CUDA graph (CPU)"
        sampled = dict(autocast_dtype=half, batch_invariant=False, sync_every=8)
        settings_rows = [       # (setting, QueryGenerator options, or the model Hugging Face's generate runs)
            (f"ours, {label}, static decode ({graph}), host reads every 8 steps", {**sampled, "decode": "static"}),
            (f"ours, {label}, static decode without CUDA graph, host reads every 8 steps",
             {**sampled, "decode": "static", "cuda_graphs": False}),
            (f"ours, {label}, cache loop, sampling on the device, host reads every 8 steps", sampled),
            (f"ours, {label}, cache loop, sampling on the device, host reads every step", {**sampled, "sync_every": 1}),
            (f"HF generate, {label} weights", weights),
            ("HF generate, fp32 (the release's settings)", model),
        ]
        if device.type == "cpu":
            # batch invariance is the CPU's default (off on a GPU: batch_invariant auto), and about 28x slower
            # than sampling on an H200: not worth the device's time
            settings_rows.insert(3, ("ours, fp32, batch-invariant", {}))
        first_batch, warned = {}, {}     # per row: the first batch's candidates, and any warning it raised

        def run(index, chunk):
            how = settings_rows[index][1]
            return ours(index, how, chunk) if isinstance(how, dict) else hf(how, chunk)

        def ours(index, options, chunk):
            import warnings

            generator = QueryGenerator(model, tokenizer, settings, **options)
            with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                candidates, stats = generator.generate_candidates(chunk, batch)
            first_batch.setdefault(index, candidates)
            graph_warnings = {str(w.message)[:200] for w in caught if "CUDA graph" in str(w.message)}
            if graph_warnings:      # the static loop ran without its CUDA graph: say why
                warned[index] = "; ".join(sorted(graph_warnings))
            return stats.tokens

        def hf(net, chunk):
            inputs = tokenizer([settings.prefix + text for _, text in chunk], truncation=True,
                               max_length=settings.max_source_len, padding=True, return_tensors="pt",
                               return_token_type_ids=False).to(device)
            with torch.inference_mode():
                out = net.generate(**inputs, do_sample=True, top_k=settings.top_k, top_p=settings.top_p,
                                   max_new_tokens=settings.max_new_tokens,
                                   num_return_sequences=settings.queries_per_passage)
            return int((out != tokenizer.pad_token_id).sum()) - len(out)

        rows, share = [], budget_s / len(settings_rows)
        for index, (name, _) in enumerate(settings_rows):
            row = {"setting": name, "batch": batch}
            try:
                run(index, passages[:batch])                 # warm-up at the timed batch's shapes
                done, tokens, seconds = 0, 0, 0.0
                while done < args.generation_passages and (done < batch or seconds < share):
                    chunk = [passages[(done + i) % len(passages)] for i in range(batch)]
                    synchronize(device)
                    start = time.perf_counter()
                    tokens += run(index, chunk)
                    synchronize(device)
                    seconds += time.perf_counter() - start
                    done += batch
                row.update({"passages": done, "seconds": seconds, "passages/s": done / seconds,
                            "mean tokens/query": tokens / (done * settings.queries_per_passage)})
            except Exception as error:          # noqa: BLE001 - the other settings still run
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                release_memory()
            if index in warned:
                row["warnings"] = warned[index]
            rows.append(row)
            print(f"  {row}", flush=True)
            progress({"rows": rows})
        reference = next(r for r in rows if r["setting"] == f"HF generate, {label} weights")
        # How often the static loop samples the cache loop's candidate on the same batch (bf16: rare tokens differ)
        static, cache = first_batch.get(0), first_batch.get(2)
        agreement = share_equal(static, cache) if static and cache else None
        # The same comparison in fp32 on this device: float noise of 1e-6, so nearly every candidate should agree
        fp32_agreement = None
        try:
            few = passages[:min(16, batch)]
            exact = [QueryGenerator(model, tokenizer, settings, batch_invariant=False, sync_every=8, decode=decode)
                     .generate_candidates(few, batch)[0] for decode in ("static", "cache")]
            fp32_agreement = share_equal(*exact)
        except Exception as error:          # noqa: BLE001 - the timed rows stand without it
            print(f"  fp32 agreement check failed: {type(error).__name__}: {error}", flush=True)
        # the first of ours that ran: the loop a stage on this device uses by default (querygen.decode: auto)
        ours_index = next((i for i, r in enumerate(rows) if r["setting"].startswith("ours") and "passages/s" in r),
                          None)
        if ours_index is None:
            raise RuntimeError(f"our generation loop failed: {rows[0]['error']}")
        profile = host_profile(lambda: run(ours_index, passages[:batch]), device)
        ours_row = rows[ours_index]
        ratio = ours_row["passages/s"] / reference["passages/s"] if "passages/s" in reference else None
        return {"model": "tiny T5" if dry else "T5-base sizes, random weights",
                "queries per passage": settings.queries_per_passage, "new tokens": settings.max_new_tokens,
                "rows": rows, "ours": ours_row["setting"],
                "candidates equal between the static and the cache loop (first batch)": agreement,
                "candidates equal between the static and the cache loop in fp32": fp32_agreement,
                "ours / HF generate (same precision, same batch)": ratio, PROFILE: profile}
    return section


def share_equal(first: list[list[str]], second: list[list[str]]) -> float:
    """The share of candidates (passage by passage, in order) that two generation loops sampled alike."""
    return sum(a == b for x, y in zip(first, second) for a, b in zip(x, y)) / sum(len(x) for x in first)


def compile_section(args, device, tokenizer, triples, peak, progress):
    """``torch.compile`` of the coCondenser and CoT-MAE steps on batches padded to ``max_len`` (passages) and
    the query limit (queries): one shape, one compilation. The first step (compilation) apart from the
    steady step, against eager, with the counted FLOPs' utilisation of both. Rows are recorded as each
    method finishes."""
    def section(budget_s):
        from qac.models.grad_cache import FullBatchStep

        dtype = torch.bfloat16 if device.type == "cuda" else None
        rows = []
        for method in ("cocondenser", "cotmae"):
            row = {"method": method, "context": "query"}
            try:
                model = build_model(method, args.model, device)
                optimizer = optimizer_for(model, device)
                batches = [to_device(b, device) for b in method_batches(
                    tokenizer, triples, method, model, "query", args.compile_batch, args.distinct_batches,
                    args.max_len, pad_to=(args.max_len, QUERY_MAX_LEN))]
                eager_step = FullBatchStep(model, device, dtype)
                eager = step_figures(eager_step, optimizer, batches, device, budget_s / 4, peak, args.compile_batch)
                # a dry run checks that the step captures (no code generation: inductor's C++ build takes minutes)
                module = torch.compile(model, backend="eager") if args.dry_run else torch.compile(model)
                compiled = timed(step_runner(FullBatchStep(module, device, dtype), optimizer), batches, device,
                                 budget_s / 4, warmup=WARMUP + 1)
                flops = eager["counted GFLOP/step"] * 1e9
                real_share = eager["real tokens/step"] / eager["padded tokens/step"]
                row.update({"batch_size": args.compile_batch,
                            "padding": f"static, {args.max_len} (passages) and {QUERY_MAX_LEN} (queries)",
                            "backend": "eager (dry run: capture only)" if args.dry_run else "inductor",
                            "eager s/step": eager["s/step"],
                            "compiled s/step": compiled["median_s"],
                            "compiled / eager speed": eager["s/step"] / compiled["median_s"],
                            "first compiled step s (compilation)": compiled["first_s"],
                            "compile seconds (first step less a steady one)": compiled["first_s"] - compiled["median_s"]})
                if peak:
                    row.update({"eager MFU": eager["MFU (counted, real tokens)"],
                                "compiled HFU": flops / compiled["median_s"] / peak,
                                "compiled MFU": flops * real_share / compiled["median_s"] / peak})
                del model, optimizer, module, batches
            except Exception as error:          # noqa: BLE001 - the other method still runs
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
            rows.append(row)
            print(f"  {row}", flush=True)
            progress({"rows": rows})
            release_memory()
            torch._dynamo.reset()
        if all("error" in row for row in rows):
            raise RuntimeError(f"every method failed; the first: {rows[0]['error']}")
        return {"rows": rows}
    return section


# ---------------------------------------------------------------------------------------------------------
# rendering


def render_markdown(data: dict) -> str:
    from qac.benchmarking import markdown_table

    sections = data["sections"]
    peak = data.get("peak_flops")
    lines = ["## GPU benchmark (`benchmarks/bench_gpu.py`)" + (" — dry run, tiny model on the CPU"
                                                               if data.get("dry_run") else ""), "",
             f"Device: {data['device']}; " + (f"assumed dense bf16 peak {peak / 1e12:.0f} TFLOP/s" if peak
                                               else "no peak FLOP/s known (no MFU)") + f"; {data['date']}.",
             f"Machine: {data['machine']}; model {data['model']}; text: {data['text']}.",
             "FLOPs counted with `torch.utils.flop_counter` on one batch of each configuration, scaled to "
             "the mean padded tokens; HFU = counted FLOPs / time / peak, MFU = the same on real tokens only."]

    def profile_block(figures, what):
        if figures.get(PROFILE):
            lines.extend(["", f"Where {what}'s time went (`torch.profiler`, top operators):", "", "```",
                          figures[PROFILE].rstrip(), "```"])

    def failed(name, title):
        figures = sections.get(name)
        if figures is None:
            lines.extend(["", f"### {title}", "", "not run"])
            return True
        if figures["status"] == "failed":
            lines.extend(["", f"### {title}", "", f"failed after {figures['seconds']:.0f} s: {figures['error']}"])
            if figures.get("rows"):         # what it measured before it stopped
                lines.extend(["", "Rows measured before it stopped:", "",
                              markdown_table([percent(plain(r)) for r in figures["rows"]])])
            return True
        if figures["status"] == "running":
            lines.extend(["", f"### {title}", "", "(running, or stopped: the rows so far)", ""])
            if figures.get("rows"):
                lines.append(markdown_table([percent(plain(r)) for r in figures["rows"]]))
            return True
        lines.extend(["", f"### {title}", ""] + ([f"Measured {figures['measured']}.", ""] if "measured" in figures
                                                  else []))
        return False

    columns = ["method", "recipe", "context", "pairs/step", "pairs/s", "tokens/s", "s/step", "padded tokens/step",
               "counted GFLOP/step", "HFU (counted, padded)", "MFU (counted, real tokens)", "steps timed"]
    if not failed("pretrain", "Pre-training step (isolated)"):
        p = sections["pretrain"]
        lines.append(f"{p['batch_size']} pairs per step unless said, {p['max_len']} tokens. Recipes: "
                     + "; ".join(f"{k}: {v}" for k, v in p["recipes"].items()) + ".")
        lines.extend(["", markdown_table([percent(r) for r in p["rows"]],
                                         columns + (["error"] if any("error" in r for r in p["rows"]) else []))])
    if not failed("paper_lengths", "Pre-training step on MS MARCO's lengths, padded and unpadded"):
        p = sections["paper_lengths"]
        lines.append(f"{p['batch_size']} pairs per step, passages cut at {p['max_len']} tokens, dropout "
                     f"{p['dropout']}; lengths from {p['lengths']}. MFU: the unpadded step's counted FLOPs (the real "
                     "tokens' work) over time and peak, for both layouts; HFU: the layout's own counted FLOPs.")
        columns = ["method", "context", "layout", "pairs/s", "real tokens/s", "s/step", "real tokens/step",
                   "computed tokens/step", "model GFLOP/step", "computed GFLOP/step", "MFU (real tokens)",
                   "HFU (computed tokens)", "speed vs padded", "steps timed"]
        lines.extend(["", markdown_table([percent(r) for r in p["rows"]],
                                         columns + (["error"] if any("error" in r for r in p["rows"]) else []))])
    if not failed("grad_cache", "GradCache"):
        g = sections["grad_cache"]
        whose = "" if data.get("dry_run") else " (the paper profile's)"
        lines.append(f"coCondenser, query context, {g['batch_size']} pairs, chunk {g['chunk']}{whose}: cached step / full-batch step = {g['time ratio']:.2f}x by time, "
                     f"{g['counted FLOP ratio']:.2f}x by counted FLOPs "
                     f"({g['full']['s/step']:.4g} s vs {g['cached']['s/step']:.4g} s)."
                     + "".join(f" Chunk {c}: {ratio:.2f}x." for c, ratio in g.get("time ratio at larger chunks",
                                                                                  {}).items()))
        profile_block(g, "one cached step")
    if not failed("stage_loop", "Stage loop vs isolated step (coCondenser, query context)"):
        lines.append(markdown_table([percent(plain(sections["stage_loop"]))]))
    if not failed("encoding", "Encoding"):
        lines.append(markdown_table([plain(sections["encoding"])]))
        profile_block(sections["encoding"], "one call")
    if not failed("search", "Exact search"):
        lines.append(markdown_table([plain(sections["search"])]))
    if not failed("generation", "Query generation"):
        g = sections["generation"]
        lines.append(f"{g['model']}, {g['queries per passage']} queries per passage, {g['new tokens']} new tokens.")
        ratio = g["ours / HF generate (same precision, same batch)"]
        columns = ["setting", "batch", "passages", "seconds", "passages/s", "mean tokens/query"]
        columns += [extra for extra in ("warnings", "error") if any(extra in r for r in g["rows"])]
        agreement = g.get("candidates equal between the static and the cache loop (first batch)")
        exact = g.get("candidates equal between the static and the cache loop in fp32")
        lines.extend(["", markdown_table(g["rows"], columns), "",
                      *([f"Candidates the static loop samples equal to the cache loop's (first batch, same uniforms): "
                         f"{agreement:.1%}" + (f"; in fp32 on the same device: {exact:.1%}" if exact is not None
                                               else "") + ".", ""] if agreement is not None else []),
                      f"Ours ({g.get('ours', 'host reads every 8 steps')}) / Hugging Face generate, same precision, "
                      "same batch: " + (f"{ratio:.2f}x" if ratio else "n/a (the reference failed)")])
        profile_block(g, "one batch of ours")
    if not failed("compile", "torch.compile (coCondenser and CoT-MAE steps, query context)"):
        lines.append(markdown_table([percent(r) for r in sections["compile"].get("rows", [])]))
    total = sum(s.get("seconds", 0) for s in sections.values())
    lines.extend(["", f"Sections took {total:.0f} s in all."])
    return "\n".join(lines)


PROFILE = "host profile (one call)"


def plain(figures: dict) -> dict:
    return {k: v for k, v in figures.items()
            if k not in ("status", "seconds", "measured", PROFILE) and not isinstance(v, (dict, list))}


def percent(row: dict) -> dict:
    return {k: (f"{100 * v:.1f}%" if isinstance(v, float) and ("FU" in k or "wait" in k) else v)
            for k, v in row.items()}


def read_results(path: Path) -> dict:
    """One results file as this script writes it, or a one-paragraph stop naming the file and what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise SystemExit(f"bench_gpu --publish: {path} cannot be read ({error.strerror or error})") from None
    except ValueError as error:
        raise SystemExit(f"bench_gpu --publish: {path} is not JSON ({error}); give the bench_gpu.json a run "
                         "wrote") from None
    missing = [key for key in ("device", "date", "sections") if not isinstance(data, dict) or key not in data]
    if missing or not isinstance(data["sections"], dict):
        raise SystemExit(f"bench_gpu --publish: {path} is not a bench_gpu results file (no "
                         f"{', '.join(missing) or 'sections object'}); give the bench_gpu.json a run wrote")
    return data


def merge_results(files: list[Path]) -> dict:
    """Results files of one device merged, later sections replacing earlier ones (a rerun of some
    sections); each section keeps the date of the run that measured it."""
    runs = [read_results(path) for path in files]
    devices = {run["device"] for run in runs}
    if len(devices) > 1:
        raise SystemExit(f"bench_gpu --publish: the files were measured on different devices "
                         f"({', '.join(sorted(devices))}); publish one device's figures")
    merged = {**runs[-1], "sections": {}}
    for run in runs:
        for name, figures in run["sections"].items():
            merged["sections"][name] = {**figures, "measured": run["date"]} if len(runs) > 1 else figures
    if len(runs) > 1:
        merged["command"] = " ; ".join(run["command"] for run in runs)
        merged["date"] = " and ".join(dict.fromkeys(run["date"] for run in runs))
    return merged


def publish(results_files: list[Path], report: Path) -> None:
    """The results file(s) as ``reports/bench_gpu.json`` and its section of the benchmark report."""
    from qac.benchmarking import write_section
    from qac.io import atomic_path

    data = merge_results(results_files)
    with atomic_path(PUBLISHED) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    write_section("gpu", render_markdown(data), report)


# ---------------------------------------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for bench_gpu.json and bench_gpu.md")
    parser.add_argument("--dry-run", action="store_true", help="tiny model on the CPU: every path once")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds of timing per section (default 40; dry run 0: one timed call)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="wall seconds for all sections: each is stopped where it would run past (and a "
                             "section left without time is recorded as not started)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--model", default=None, help="model spec (default: scratch:benchmarks/bert-base-uncased; "
                                                      "dry run: tiny: of the same)")
    parser.add_argument("--text", choices=("auto", "scifact", "synthetic"), default="auto",
                        help="auto: SciFact when the data mirror holds it, generated text otherwise")
    parser.add_argument("--batch-size", type=int, default=None, help="pairs per step (default 128)")
    parser.add_argument("--max-len", type=int, default=None, help="passage tokens (default 144, the paper's; "
                                                                   "dry run 48)")
    parser.add_argument("--chunk", type=int, default=None, help="GradCache chunk (default: the paper profile's)")
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers of the stage loop")
    parser.add_argument("--report", type=Path, default=None, help="also write the section into this report")
    parser.add_argument("--publish", type=Path, nargs="+", default=None, metavar="RESULTS_JSON",
                        help="copy a results file to reports/bench_gpu.json and its section into reports/"
                             "benchmarks.md (or --report), then stop; several files of one device are "
                             "merged, a later file's sections replacing an earlier one's")
    args = parser.parse_args(argv)
    if args.publish is None and args.out is None:
        parser.error("--out is required (the folder the figures are written to)")
    dry = args.dry_run
    args.model = args.model or f"{'tiny' if dry else 'scratch'}:{MODEL_DIR}"
    # A dry run times each path once (after its warm-up): it checks that the path runs, it measures nothing.
    args.budget_s = args.budget_s if args.budget_s is not None else (0.0 if dry else 40.0)
    # A dry run is a check that every path runs, not a measurement: the smallest sizes that still exercise it
    # (a gradient cache of two chunks, batches that differ, passages cut at their maximum length).
    args.max_len = args.max_len or (48 if dry else 144)
    args.batch_size = args.batch_size or (4 if dry else 128)
    args.workers = args.workers if args.workers is not None else (1 if dry else 4)
    args.grad_cache_batch = 2 * args.batch_size if not dry else 6
    # torch.compile at the larger of the two batches the pre-training rows time: where its MFU is highest
    args.compile_batch = 2 * args.batch_size if not dry else args.batch_size
    args.chunk = args.chunk or (2 if dry else None)
    args.distinct_batches = 2 if dry else 8
    args.loop_window, args.loop_windows = (2, 3) if dry else (10, 6)
    args.encode_batch, args.encode_passages = (32, 64) if dry else (512, 200_000)
    args.search_passages, args.search_queries, args.search_dim = ((2_000, 16, 32) if dry else
                                                                  (PAPER_CORPUS_PASSAGES, 8_192, 768))
    args.search_k = 100 if dry else 1000
    args.generation_passages, args.generation_batch = (8, 4) if dry else (512, 64)
    if dry:
        global WARMUP, MIN_STEPS
        WARMUP, MIN_STEPS = 1, 1
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.publish is not None:
        publish(args.publish, args.report or REPO / "reports" / "benchmarks.md")
        return
    from qac.benchmarking import machine_summary
    from qac.models.loading import load_tokenizer

    import transformers

    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    device_name, peak = peak_of(device)
    tokenizer = load_tokenizer(args.model)
    triples, text_source = text_triples(256 if args.dry_run else 2048, args.text)
    results = Results(args.out, {
        "schema": 1, "device": device_name, "peak_flops": peak,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_summary(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "model": args.model.replace(str(REPO) + os.sep, ""),
        "text": text_source, "dry_run": args.dry_run, "budget_s_per_section": args.budget_s,
        "command": " ".join(["python benchmarks/bench_gpu.py", *(sys.argv[1:] if argv is None else argv)])})
    results.save()

    def running(name):
        """Record a section's figures so far (a later stop or failure keeps them)."""
        return lambda figures: results.record(name, {"status": "running", **figures})

    builders = {
        "pretrain": lambda: pretrain_section(args, device, tokenizer, triples, peak, running("pretrain")),
        "paper_lengths": lambda: paper_lengths_section(args, device, tokenizer, peak, running("paper_lengths")),
        "grad_cache": lambda: grad_cache_section(args, device, tokenizer, triples, peak),
        "stage_loop": lambda: stage_loop_section(args, device, tokenizer, triples, peak),
        "encoding": lambda: encoding_section(args, device, tokenizer, triples),
        "search": lambda: search_section(args, device),
        "generation": lambda: generation_section(args, device, tokenizer, triples, running("generation")),
        "compile": lambda: compile_section(args, device, tokenizer, triples, peak, running("compile")),
    }
    started = time.perf_counter()
    for name in args.sections:
        left = args.deadline_s - (time.perf_counter() - started) if args.deadline_s else None
        if left is not None and left < 5:
            results.record(name, {"status": "failed", "error": f"not started: --deadline-s {args.deadline_s:.0f} "
                                                               "spent", "seconds": 0.0})
            continue
        caps = [c for c in (None if args.dry_run else SECTION_CAP_S[name], left) if c is not None]
        run_section(results, name, builders[name](), args.budget_s, min(caps) if caps else None)
    if args.report:
        from qac.benchmarking import write_section

        write_section("gpu", render_markdown(results.data), args.report)
    print(render_markdown(results.data))
    failed = [name for name, s in results.data["sections"].items() if s["status"] != "done"]
    if failed:
        raise SystemExit(f"bench_gpu: section(s) failed: {', '.join(failed)} (their errors are in "
                         f"{args.out / RESULTS})")


if __name__ == "__main__":
    main()
