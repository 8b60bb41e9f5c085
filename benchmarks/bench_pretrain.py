"""Pre-training throughput: writes the "pretrain" section of reports/benchmarks.md.

What one optimizer step (forward, backward, AdamW) costs, in pairs and tokens
per second, for coCondenser, CoT-MAE and MASTER on the default profile's encoder
(all-MiniLM-L6-v2) on CPU, and the ratios that the implementation choices buy:

- MLM logits at masked positions only vs over every position (full vocabulary);
- dynamic padding (each batch side padded to its longest sequence) vs static
  padding to 144 tokens (the paper's max length);
- query contexts vs passage contexts (the paper says query pairs are cheaper).

Pairs come from ``data/<profile>/passages.arrow`` and ``queries.arrow`` when
they exist, otherwise from the SciFact mirror: a passage is ~110 words of an
abstract (about 144 word-pieces), its passage context the next ~110 words of
the same abstract, its query context a SciFact claim (real queries of typical
length). Collation (tokenising, masking) is outside the timed region. MASTER
runs its five decoders: MKP and CMP on the anchor, NPR on the context, DOR on
the query, GOR on the passage context standing in for a continuation of the
same length (its TF-IDF weights are counted over the benchmark's anchors).

``--gpu`` times BERT-base (built from its configuration, random weights) with
bf16 autocast and reports MFU = 6 * parameters * tokens / time / peak, for our
recipe and for the release's (fp16 autocast, full-vocabulary logits, static
padding to 144).

    python benchmarks/bench_pretrain.py            # CPU, a few minutes on 2 cores
    python benchmarks/bench_pretrain.py --gpu      # adds the GPU table
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Idle OpenMP threads sleep instead of spinning, so process CPU time measures work, not waiting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from qac.benchmarking import (machine_summary, markdown_table, positive_int,  # noqa: E402
                              report_destination, write_section)
from qac.data.context_pairs import Pair, PairCollator  # noqa: E402

GPU_PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}   # dense tensor-core FLOP/s


def scifact_pairs(count: int, words: int = 110) -> list[tuple[str, str, str]]:
    """``(passage, next passage, query)`` triples: SciFact from the data mirror, generated text without it."""
    from sample_text import text_triples

    return text_triples(count)[0]


def corpus_pairs(passages: Path, queries: Path, count: int) -> list[tuple[str, str, str]]:
    """The same triples from the pipeline's own files (anchor, its first random_sampled passage, its first query)."""
    from qac.data.context_pairs import load_pair_corpus

    corpus = load_pair_corpus(passages, queries, "mixed", passage_context="random_sampled")
    triples = []
    for index in range(min(count, len(corpus))):
        triples.append((corpus.text(index), corpus.passage_contexts(index)[0], corpus.queries_of(index)[0]))
    return triples


def make_batches(tokenizer, triples, context: str, batch_size: int, steps: int, mask_ratios, pad_to,
                 master: bool = False, pad_to_multiple_of: int = 1, max_len: int = 144):
    """``steps`` collated batches of ``batch_size`` pairs; passages cut at ``max_len`` tokens, queries at 32.

    ``pad_to``: one length for both sides (the release's static padding), or ``(anchor, context)`` lengths
    (static shapes at each side's own limit, as a compiled step wants them; not for MASTER)."""
    if isinstance(pad_to, tuple):
        if master:
            raise ValueError("per-side static lengths are for coCondenser and CoT-MAE batches")
        # the sides of two collators: masks are drawn per (step, pair, side), so they are the same either way
        anchor_side = make_batches(tokenizer, triples, context, batch_size, steps, mask_ratios, pad_to[0],
                                   pad_to_multiple_of=pad_to_multiple_of, max_len=max_len)
        context_side = make_batches(tokenizer, triples, context, batch_size, steps, mask_ratios, pad_to[1],
                                    pad_to_multiple_of=pad_to_multiple_of, max_len=min(max_len, pad_to[1]))
        return [{"anchor": a["anchor"], "context": c["context"]} for a, c in zip(anchor_side, context_side)]
    collator = (master_collator(tokenizer, triples, mask_ratios, pad_to, pad_to_multiple_of, max_len) if master
                else PairCollator(tokenizer, max_len, 32, *mask_ratios, seed=0, pad_to=pad_to,
                                  pad_to_multiple_of=pad_to_multiple_of))
    batches = []
    for step in range(steps):
        chosen = [triples[(step * batch_size + i) % len(triples)] for i in range(batch_size)]
        if master:
            from qac.data.master import MasterPair

            pairs = [MasterPair(i, anchor, query if context == "query" else passage, context, row=i,
                                queries=(query,), continuation=passage)
                     for i, (anchor, passage, query) in enumerate(chosen)]
        else:
            pairs = [Pair(i, anchor, query if context == "query" else passage, context)
                     for i, (anchor, passage, query) in enumerate(chosen)]
        batches.append(collator(pairs, step))
    return batches


def master_collator(tokenizer, triples, mask_ratios, pad_to, pad_to_multiple_of: int = 1, max_len: int = 144):
    """MASTER's collator with inverse document frequencies counted over the triples' anchors."""
    from collections import Counter

    from qac.data.masking import MaskingVocab
    from qac.data.master import MasterCollator, WordWeights, passage_words

    anchors = [anchor for anchor, _, _ in triples]
    frequency = Counter()
    for words in passage_words(tokenizer, anchors, MaskingVocab.from_tokenizer(tokenizer)):
        frequency.update(set(words))
    weights = WordWeights(passages=len(anchors), document_frequency=dict(frequency))
    return MasterCollator(tokenizer, max_len, 32, *mask_ratios, seed=0, word_weights=weights, pad_to=pad_to,
                          pad_to_multiple_of=pad_to_multiple_of)


class StepTimer:
    """Times optimizer steps (forward, backward, AdamW) of one model."""

    def __init__(self, model, device, autocast_dtype=None):
        from qac.models.grad_cache import FullBatchStep

        self.model, self.device = model, device
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                                           fused=device.type == "cuda")
        self.step = FullBatchStep(model, device, autocast_dtype)

    def seconds(self, batch, full_vocab_logits: bool) -> tuple[float, float]:
        """Wall-clock and process CPU seconds of one step."""
        self.model.full_vocab_logits = full_vocab_logits
        batch = {side: {k: v.to(self.device) for k, v in tensors.items()} for side, tensors in batch.items()}
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        self.step.forward_backward(batch)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, time.process_time() - cpu_start


def run_interleaved(configs: list[dict], rounds: int, warmup: int) -> None:
    """Time every configuration once per round, round after round, and keep each one's median.

    Interleaving spreads the load of a shared machine evenly over the
    configurations; the process CPU time of a step is kept beside its wall
    time because it hardly moves when other processes compete for the cores.
    """
    for config in configs:
        config["times"], config["cpu_times"] = [], []
    for round_index in range(warmup + rounds):
        for config in configs:
            wall, cpu = config["timer"].seconds(config["batches"][round_index], config["full_vocab"])
            if round_index >= warmup:
                config["times"].append(wall)
                config["cpu_times"].append(cpu)
    for config in configs:
        batches = config["batches"]
        config["seconds"] = statistics.median(config["times"])
        config["cpu_seconds"] = statistics.median(config["cpu_times"])
        config["tokens"] = statistics.mean(sum(int(s["attention_mask"].sum()) for s in b.values()) for b in batches)
        config["padded_tokens"] = statistics.mean(sum(s["attention_mask"].numel() for s in b.values())
                                                  for b in batches)


def skip_from(spec: str, layer: int) -> int:
    """coCondenser's skip layer for ``spec``: ``layer``, or the last but one of a 2-layer ``tiny:`` model."""
    return 1 if spec.startswith("tiny:") else layer


def cpu_table(args) -> str:
    from qac.models.cocondenser import CoCondenser
    from qac.models.cotmae import CoTMAE
    from qac.models.loading import load_tokenizer
    from qac.models.master import Master

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    tokenizer = load_tokenizer(args.model)
    if args.passages and args.queries:
        triples, source = corpus_pairs(Path(args.passages), Path(args.queries), 256), str(args.passages)
    else:
        triples, source = scifact_pairs(32 if args.small else 256), "SciFact mirror (abstract spans + claims)"
    models = {
        "cocondenser": CoCondenser.from_spec(args.model, seed=0, n_head_layers=2, skip_from=skip_from(args.model, 3)),
        "cotmae (paper decoder)": CoTMAE.from_spec(args.model, seed=0, decoder="paper"),
        "cotmae (release decoder)": CoTMAE.from_spec(args.model, seed=0, decoder="release"),
        "master (5 decoders)": Master.from_spec(args.model, seed=0),
    }
    variants = [("cocondenser", "masked-only logits, dynamic padding", False, None),
                ("cocondenser", "full-vocabulary logits, dynamic padding", True, None),
                ("cocondenser", "masked-only logits, static padding 144", False, 144),
                ("cotmae (paper decoder)", "masked-only logits, dynamic padding", False, None),
                ("cotmae (release decoder)", "masked-only logits, dynamic padding", False, None),
                ("master (5 decoders)", "masked-only logits, dynamic padding", False, None)]
    timers = {name: StepTimer(model.train(), device) for name, model in models.items()}
    configs = []
    for method, recipe, full_vocab, pad_to in variants:
        for context in ("passage", "query"):
            configs.append({"method": method, "recipe": recipe, "context": context, "full_vocab": full_vocab,
                            "timer": timers[method],
                            "batches": make_batches(tokenizer, triples, context, args.batch_size, args.steps + 1,
                                                    models[method].mask_ratios, pad_to,
                                                    master=method.startswith("master"))})
    run_interleaved(configs, rounds=args.steps, warmup=1)
    rows, measured = [], {}
    for config in configs:
        measured[(config["method"], config["recipe"], config["context"])] = config
        rows.append({"method": config["method"], "recipe": config["recipe"], "context": config["context"],
                     "pairs/s": args.batch_size / config["seconds"],
                     "tokens/s": config["tokens"] / config["seconds"],
                     "pairs/CPU-s": args.batch_size / config["cpu_seconds"],
                     "tokens/CPU-s": config["tokens"] / config["cpu_seconds"],
                     "wall s/step": config["seconds"], "CPU s/step": config["cpu_seconds"],
                     "tokens/step": config["tokens"], "padded tokens/step": config["padded_tokens"]})
        print(rows[-1], flush=True)

    def speed(method, recipe, context):   # pairs per CPU-second: robust to the shared machine's load
        return args.batch_size / measured[(method, recipe, context)]["cpu_seconds"]

    base = "masked-only logits, dynamic padding"
    ratios = []
    for context in ("passage", "query"):
        ratios.append({"ratio": f"masked-only / full-vocabulary logits ({context})",
                       "speed-up (CPU time)": speed("cocondenser", base, context)
                       / speed("cocondenser", "full-vocabulary logits, dynamic padding", context)})
        static = measured[("cocondenser", "masked-only logits, static padding 144", context)]
        ratios.append({"ratio": f"dynamic / static-144 padding ({context})",
                       "speed-up (CPU time)": speed("cocondenser", base, context)
                       / speed("cocondenser", "masked-only logits, static padding 144", context),
                       "padded tokens, static / dynamic": static["padded_tokens"]
                       / measured[("cocondenser", base, context)]["padded_tokens"]})
    for method in ("cocondenser", "cotmae (paper decoder)", "cotmae (release decoder)", "master (5 decoders)"):
        ratios.append({"ratio": f"query / passage context pairs per second ({method})",
                       "speed-up (CPU time)": speed(method, base, "query") / speed(method, base, "passage")})
    columns = ["ratio", "speed-up (CPU time)", "padded tokens, static / dynamic"]
    config = models["cocondenser"].bert.config
    return (f"CPU: `{args.model}` ({config.num_hidden_layers} layers, {config.hidden_size} wide), "
            f"{args.batch_size} pairs per step, "
            f"{args.threads} threads, fp32; each configuration's median over {args.steps} steps, the "
            f"configurations interleaved round by round after one warm-up round (the 2 cores are shared, "
            f"so wall times drift with the other users' load: pairs per CPU-second and the ratios, "
            f"computed from process CPU time, are the figures to compare). "
            f"Pairs from: {source}. Passages are cut at 144 tokens, queries at 32.\n\n"
            + markdown_table(rows) + "\n\n" + markdown_table(ratios, columns)
            + "\n\nWhere static and dynamic padding process the same padded tokens (a batch side already "
              "holds a 144-token sequence), their ratio shows only the measurement noise.")


def gpu_table(args) -> str:
    """BERT-base on the GPU: our recipe vs the release's, with MFU."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    from qac.models.cocondenser import CoCondenser
    from qac.models.loading import load_tokenizer
    from qac.models.master import Master
    from qac.params.vocabulary import MASTER_TASKS

    device = torch.device("cuda")
    tokenizer = load_tokenizer("minilm")            # bert-base-uncased's vocabulary
    config = BertConfig()                           # BERT-base: 12 layers, 768 wide
    bert = BertModel(config)
    head = BertForMaskedLM(config).cls
    head.predictions.decoder.weight = bert.embeddings.word_embeddings.weight
    model = CoCondenser(bert, head, n_head_layers=2, skip_from=6).to(device)
    parameters = sum(p.numel() for p in model.bert.parameters())
    name = torch.cuda.get_device_name(0)
    peak = next((value for key, value in GPU_PEAK_BF16.items() if key in name), None)
    triples = scifact_pairs(1024)
    recipes = [("ours: bf16, masked-only logits, dynamic padding", torch.bfloat16, False, None),
               ("release: fp16, full-vocabulary logits, static 144", torch.float16, True, 144)]
    configs = []
    for recipe, dtype, full_vocab, pad_to in recipes:
        for context in ("passage", "query"):
            configs.append({"recipe": recipe, "context": context, "full_vocab": full_vocab,
                            "timer": StepTimer(model, device, dtype),
                            "batches": make_batches(tokenizer, triples, context, args.gpu_batch_size,
                                                    args.steps + 2, model.mask_ratios, pad_to)})
    # MASTER: the encoder reads the anchor, each 2-layer decoder its own text (embeddings and LM head shared).
    master = Master(bert, head, decoders=MASTER_TASKS).to(device)
    decoder_parameters = sum(p.numel() for p in master.decoders["mkp"].parameters())
    for context in ("passage", "query"):
        configs.append({"recipe": "MASTER, ours: bf16, masked-only logits, dynamic padding", "context": context,
                        "full_vocab": False, "timer": StepTimer(master, device, torch.bfloat16), "master": True,
                        "batches": make_batches(tokenizer, triples, context, args.gpu_batch_size, args.steps + 2,
                                                master.mask_ratios, None, master=True)})
    run_interleaved(configs, rounds=args.steps, warmup=2)
    rows = []
    for config in configs:
        if config.get("master"):
            # 6 x parameters x tokens for the encoder over the anchors and each decoder over its own text
            anchor = statistics.mean(int(b["anchor"]["attention_mask"].sum()) for b in config["batches"])
            flops = 6 * (parameters * anchor + decoder_parameters * (config["tokens"] - anchor)) / config["seconds"]
        else:
            flops = 6 * parameters * config["tokens"] / config["seconds"]
        rows.append({"recipe": config["recipe"], "context": config["context"],
                     "pairs/s": args.gpu_batch_size / config["seconds"],
                     "tokens/s": config["tokens"] / config["seconds"],
                     "MFU (real tokens)": flops / peak if peak else "n/a"})
        print(rows[-1], flush=True)
    return (f"GPU: {name}, BERT-base encoder ({parameters / 1e6:.0f}M parameters) + 2-layer head, "
            f"{args.gpu_batch_size} pairs per step, peak {peak / 1e12 if peak else 'unknown'} TFLOP/s bf16. "
            f"MFU counts 6 x parameters x non-padding tokens (MASTER: the encoder's over the anchors, a "
            f"decoder's over its own text).\n\n" + markdown_table(rows))


def cpu_ratios(args) -> list[str]:
    """The CPU ratios of tokenising once (issue targets: collation >= 10x cheaper per pair with identical
    input_ids; the stage loop within 10% of the isolated step, data wait < 10%; encoding >= 1.5x)."""
    import tempfile

    import numpy as np

    from qac.data.arrowstore import write_passages, write_queries
    from qac.data.context_pairs import PairSampler, TextPairCollator, load_pair_corpus
    from qac.data.tokens import TextEncoder
    from qac.models.cocondenser import CoCondenser
    from qac.models.loading import load_model, load_tokenizer
    from qac.retrieval.encode import encode_texts
    from qac.params import base_params
    from qac.train.pretrain import PretrainSettings, pretrain

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    triples = scifact_pairs(64 if args.small else 512)
    pairs_per_batch, rounds_of_collation = (16, 2) if args.small else (128, 9)
    lines = []

    # 1. Collation of the same pairs: tokenising texts vs slicing stored ids.
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        passages, queries = [], []
        for number, (anchor, passage, query) in enumerate(triples):
            pids = [f"d{number}#0", f"d{number}#1"]
            for k, text in enumerate((anchor, passage)):
                passages.append({"pid": pids[k], "doc_id": f"d{number}", "position": k, "text": text, "n_tokens": 0,
                                 "contexts": {"nearby": [pids[1 - k]], "random_sampled": [pids[1 - k]],
                                              "overlap": ""}})
                queries.append({"pid": pids[k], "queries": [query]})
        write_passages(work / "passages.arrow", passages, tokenizer=tokenizer, tokenizer_name=args.model)
        write_queries(work / "queries.arrow", queries, tokenizer=tokenizer, tokenizer_name=args.model)
        corpus = load_pair_corpus(work / "passages.arrow", work / "queries.arrow", "mixed", tokenizer=tokenizer)
        sampler = PairSampler(corpus, "mixed", seed=0)
        batches = [sampler.batch(step, pairs_per_batch) for step in range(4)]
        old, new = TextPairCollator(tokenizer, 144, 32, 0.15, 0.15, seed=0), PairCollator(tokenizer, 144, 32, 0.15,
                                                                                        0.15, seed=0)
        for step, pairs in enumerate(batches):      # identical batches, and warm-up
            a, b = old(pairs, step), new(pairs, step)
            assert all(torch.equal(a[side][name], b[side][name]) for side in a for name in a[side])
        # The two collators interleaved round by round, the fastest round of each: the least disturbed
        # by other work on the shared cores (wall time, as process CPU time would also count torch's idle
        # threads spinning after the old path's tensor operations)
        rounds = {"old": [], "new": []}
        for _ in range(rounds_of_collation):
            for label, collator in (("old", old), ("new", new)):
                start = time.perf_counter()
                for step, pairs in enumerate(batches):
                    collator(pairs, step)
                rounds[label].append((time.perf_counter() - start) / (len(batches) * 128))
        times = {label: min(values) for label, values in rounds.items()}
        lines.append(f"collation per pair: tokenising {times['old'] * 1e6:.0f} us, stored ids "
                     f"{times['new'] * 1e6:.0f} us: {times['old'] / times['new']:.1f}x cheaper "
                     f"(identical input_ids, masks and labels on {4 * pairs_per_batch} pairs)")

        # 2. The stage loop (qac.train.pretrain.pretrain, DataLoader with 2 workers) vs the isolated step,
        # both as the median over steps 2..N: the first step of each carries one-off costs (the loader's
        # worker processes starting, first-call allocations) that a long run does not see.
        steps, batch_size = (3 if args.small else 9), args.batch_size
        base = base_params()
        settings = PretrainSettings.from_mapping(dict(
            base.pretrain.common.to_dict(), spans=base.split.spans, query_count=1,
            method="cocondenser", seed=42, init=args.model, context_type="mixed", steps=steps, batch_size=batch_size,
            max_len=144, query_max_len=32, log_every=1, checkpoint_every=steps, dropout=0.0, dtype="fp32",
            loader_workers=2, skip_from=skip_from(args.model, base.pretrain.common.skip_from)))
        logged = []
        pretrain(settings, passages=work / "passages.arrow", queries=work / "queries.arrow", work_dir=work / "w",
                 out_dir=work / "o", log=lambda step, metrics: logged.append(metrics))
        model = CoCondenser.from_spec(args.model, seed=settings.seed, dropout=0.0, skip_from=settings.skip_from,
                                      n_head_layers=settings.n_head_layers)
        timer = StepTimer(model, torch.device("cpu"))
        isolated = [timer.seconds(new(sampler.batch(step, batch_size), step), False)[0] for step in range(steps)]
        isolated_rate = batch_size / statistics.median(isolated[1:])
        loop_rate = statistics.median(metrics["samples_per_second"] for metrics in logged[1:])
        wait = statistics.median(metrics["data_wait_share"] for metrics in logged[1:])
        lines.append(f"stage loop vs isolated step (CPU, {args.model}, {batch_size} pairs, median of steps 2-{steps}):"
                     f" {loop_rate:.2f} vs {isolated_rate:.2f} pairs/s = {loop_rate / isolated_rate:.2f}; data wait "
                     f"{100 * wait:.1f}% of the loop; padding efficiency {logged[-1]['padding_efficiency']:.2f}")

    # 3. Encoding: tokenise-then-pad vs stored ids padded as arrays.
    encoder = load_model(args.model)
    texts = [anchor for anchor, _, _ in triples[:32 if args.small else 256]]
    ids = TextEncoder(tokenizer)(texts)
    encode_texts(encoder, tokenizer, texts[:32], max_length=144, batch_size=64)      # warm-up
    rates = {}
    for label, kwargs in (("old", {}), ("new", {"token_ids": ids})):
        start = time.perf_counter()
        vectors = encode_texts(encoder, tokenizer, texts, max_length=144, batch_size=64, **kwargs)
        rates[label] = len(texts) / (time.perf_counter() - start)
        rates[label + "_vectors"] = vectors
    assert np.array_equal(rates["old_vectors"], rates["new_vectors"])
    # What tokenising once can save at most here: the share of the tokenising path spent in the tokenizer.
    start = time.perf_counter()
    tokenizer(texts, truncation=True, max_length=144, add_special_tokens=True)
    share = (time.perf_counter() - start) * rates["old"] / len(texts)
    lines.append(f"CPU encoding: {rates['old']:.1f} passages/s tokenising, {rates['new']:.1f} from stored ids: "
                 f"{rates['new'] / rates['old']:.2f}x (identical vectors); the tokenizer takes "
                 f"{100 * share:.1f}% of the tokenising path here, so skipping it can give at most "
                 f"{1 / (1 - share):.2f}x on this CPU (the forward pass is the rest)")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="the encoder (default minilm; --small: tiny:minilm, "
                                                       "a 2-layer random BERT with its vocabulary)")
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--steps", type=positive_int, default=3, help="timed steps per configuration (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passages", help="passages.arrow to draw pairs from (default: SciFact mirror)")
    parser.add_argument("--queries", help="queries.arrow beside --passages")
    parser.add_argument("--gpu", action="store_true", help="also time BERT-base on the GPU")
    parser.add_argument("--gpu-batch-size", type=int, default=128)
    parser.add_argument("--report", default=None, help="default: reports/benchmarks.md; with --small, a file in the system's temporary folder")
    parser.add_argument("--small", action="store_true",
                        help="2 pairs per step, 1 timed step, a few dozen pairs: every path once (a check, not a "
                             "measurement)")
    parser.add_argument("--ratios-only", action="store_true", help="only the tokenise-once ratios (no step table)")
    args = parser.parse_args(argv)
    args.report = report_destination(args.report, args.small)
    if args.small:
        args.batch_size, args.steps = 2, 1
    args.model = args.model or ("tiny:minilm" if args.small else "minilm")

    if not args.ratios_only:
        body = ["## Pre-training throughput (`benchmarks/bench_pretrain.py`)", "", f"Machine: {machine_summary()}", "",
                cpu_table(args)]
        if args.gpu:
            body += ["", gpu_table(args)]
        write_section("pretrain", "\n".join(body), args.report)
    # Their own section, so that `--ratios-only` refreshes them without the step table's ten minutes.
    ratios = cpu_ratios(args)
    body = ["### Tokenising once (`benchmarks/bench_pretrain.py`, last lines; `--ratios-only` alone)", "",
            f"Measured in one run on: {machine_summary()}", ""] + [f"- {line}" for line in ratios]
    write_section("pretrain-ratios", "\n".join(body), args.report)
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
