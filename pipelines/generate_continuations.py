"""DVC stage generate_continuations: one causal-LM continuation per passage -> data/<profile>/continuations.arrow.

The texts MASTER's GOR decoder recovers (qac.querygen.continuation). Sharded,
resumable and merged exactly as generate_queries:

Single process:       python pipelines/generate_continuations.py
One machine, N GPUs:  torchrun --nproc_per_node N pipelines/generate_continuations.py
Separate machines:    python pipelines/generate_continuations.py --shard i/n   (each i, shared disk)
                      python pipelines/generate_continuations.py --merge-only  (once all shards finished)

A rerun after an interruption continues from the committed chunks
(``data/<profile>/.continuations.work/``). Quality figures (length,
distinct-1/2, empty and duplicate shares) go to metrics/continuations.json.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict

import argparse

from qac.config import load_params, profile_dir
from qac.console import StageClock, add_verbose_flag, print_summary, setup_console


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", help="i/n: generate only shard i of n (0-based); no merge unless --merge")
    parser.add_argument("--merge", action="store_true", help="with --shard: merge afterwards (all shards must be done)")
    parser.add_argument("--merge-only", action="store_true", help="only merge the committed chunks of all shards")
    return add_verbose_flag(parser).parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_console(args.verbose)
    clock = StageClock()

    import contextlib

    import torch

    from qac.console import progress
    from qac.data.arrowstore import QUERIES_SCHEMA, iter_records
    from qac.distributed import autocast_dtype, barrier, cleanup, init_distributed, sum_over_ranks
    from qac.querygen.continuation import (ContinuationGenerator, ContinuationSettings, continuation_quality,
                                           load_causal_lm)
    from qac.querygen.shards import (ChunkStore, ShardSpec, build_manifest, generate_chunks, passages_tokenizer,
                                     pending_passages, work_dir_for)
    from qac.reporting.dvc_metrics import write_stage_metrics
    from qac.tracking import log_metrics, stage_run
    from qac.tracking.record import log_file_input

    params = load_params()
    section = params["continuation"]
    settings = ContinuationSettings.from_params(params)     # bad values fail here, before any slow work
    data = profile_dir(params)
    passages_path, output = data / "passages.arrow", data / "continuations.arrow"
    if not passages_path.exists():
        raise FileNotFoundError(f"{passages_path} not found: run the split_passages stage first")

    ctx = init_distributed()
    dtype = autocast_dtype(str(section.get("dtype", "auto")), ctx.device)
    # Decoding runs in batches: keep their composition fixed so that a resumed run decodes alike.
    compute = {"dtype": str(dtype or "float32"), "batch_size": int(section["batch_size"])}
    manifest = build_manifest(passages_path, settings.model, settings, int(section["chunk_size"]), compute,
                              section.get("max_passages"))
    store = ChunkStore(work_dir_for(output), manifest)
    if ctx.is_main:
        store.prepare()
    barrier()
    if not ctx.is_main:
        store.prepare()

    shard = (ShardSpec.parse(args.shard) if args.shard else ShardSpec()).within(ctx.rank, ctx.world_size)
    merging = not (args.shard and not (args.merge or args.merge_only))
    tracked = contextlib.ExitStack()
    if ctx.is_main and merging:
        tracked.enter_context(stage_run(
            params, "generate_continuations", "generate_continuations", kind="continuation",
            stage_params={**asdict(settings), "batch_size": section["batch_size"],
                          "chunk_size": section["chunk_size"], **compute},
            inputs={"passages": passages_path}, tags={"qac.world_size": ctx.world_size}))
        log_file_input(passages_path, "passages", "generation")
    with tracked:
        started = time.perf_counter()
        generated_here = 0
        if not args.merge_only:
            model, tokenizer = load_causal_lm(settings.model, ctx.device, seed=settings.seed)
            generator = ContinuationGenerator(model, tokenizer, settings, autocast_dtype=dtype)
            bar = progress(total=pending_passages(store, shard), unit="passage", main_only=False,
                           desc=f"continuations shard {shard.index}/{shard.count}", position=ctx.rank)
            with torch.inference_mode():
                stats = generate_chunks(store, generator, passages_path, shard, int(section["batch_size"]), bar.update)
            bar.close()
            generated_here = stats.passages
        generated_all = sum_over_ranks(generated_here, ctx.device)   # also a barrier
        if not merging:
            if ctx.is_main:
                print(f"shard {args.shard} done; merge with --merge-only once every shard has finished",
                      file=sys.stderr)
            cleanup()
            return 0
        if not ctx.is_main:
            cleanup()
            return 0

        wall = time.perf_counter() - started
        # The continuation's token ids beside its text, by the tokenizer of the passages' ids (the encoder's):
        # the GOR decoder reads them as queries.arrow's, stamp checked.
        totals = store.merge(output, *passages_tokenizer(passages_path))
        texts = [(record["queries"] or [""])[0] for record in iter_records(output, QUERIES_SCHEMA, ["queries"])]
        summary = continuation_quality(texts, totals)
        if totals.seconds:
            summary["passages_per_second_per_process"] = totals.passages / totals.seconds
        if generated_all:
            summary["passages_per_second"] = generated_all / wall
        log_metrics(summary)
        write_stage_metrics(data / "metrics", "continuations", summary)
    store.remove()
    cleanup()
    rate = f"{summary['passages_per_second']:.1f} passages/s" if generated_all else "nothing left to generate"
    print_summary("generate_continuations", f"{summary['passages']} passages",
                  f"mean {summary['mean_words']:.1f} words", f"distinct-2 {summary['distinct_2']:.3f}", rate,
                  seconds=clock.seconds)
    return 0



if __name__ == "__main__":
    sys.exit(main())
