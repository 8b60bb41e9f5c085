"""DVC stage generate_queries: C sampled queries per passage -> data/<profile>/queries.arrow.

Single process:       python pipelines/generate_queries.py
One machine, N GPUs:  torchrun --nproc_per_node N pipelines/generate_queries.py
Separate machines:    python pipelines/generate_queries.py --shard i/n   (each i, shared disk)
                      python pipelines/generate_queries.py --merge-only  (once all shards finished)

A rerun after an interruption continues from the committed chunks
(``data/<profile>/.queries.work/``); see ``qac.querygen.shards``. It says so,
and its MLflow run resumes the killed one (``qac.resumes_run``, whose id the
work folder keeps). The run is recorded in ``data/<profile>/.runs/queries.arrow/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from qac.config import load_params, profile_dir
from qac.console import StageClock, add_verbose_flag, print_summary, setup_console

RUN_FILE = "mlflow_run.json"   # in the work folder: the run whose chunks it holds


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
    from qac.distributed import autocast_dtype, barrier, cleanup, init_distributed, sum_over_ranks
    from qac.reporting.dvc_metrics import write_stage_metrics
    from qac.querygen.generate import SamplingSettings, generator_from_settings, resolve_batch_invariant
    from qac.querygen.shards import (ChunkStore, ShardSpec, build_manifest, generate_chunks, passages_tokenizer,
                                     pending_passages, work_dir_for)
    from qac.io import write_json
    from qac.tracking import linked_run_id, log_metrics, read_run_record, stage_run, write_run_record
    from qac.tracking.interrupted import end_interrupted_run
    from qac.tracking.record import log_file_input

    params = load_params()
    section = params["querygen"]
    data = profile_dir(params)
    passages_path, generator_dir, output = data / "passages.arrow", data / "generator", data / "queries.arrow"
    for needed in (passages_path, generator_dir):
        if not needed.exists():
            raise FileNotFoundError(f"{needed} not found: run the upstream stage first")

    ctx = init_distributed()
    settings = SamplingSettings.from_params(params)
    dtype = autocast_dtype(str(section.get("dtype", "auto")), ctx.device)
    invariant = resolve_batch_invariant(section.get("batch_invariant", "auto"), dtype)
    compute = {"dtype": str(dtype or "float32"), "batch_invariant": invariant}
    if not invariant:  # then the batch composition can change rare tokens: keep it fixed for resumption
        compute["batch_size"] = int(section["batch_size"])
    manifest = build_manifest(passages_path, str(generator_dir), settings, int(section["chunk_size"]), compute,
                              section.get("max_passages"))
    store = ChunkStore(work_dir_for(output), manifest)
    if ctx.is_main:
        store.prepare()
    barrier()
    if not ctx.is_main:
        store.prepare()

    shard = (ShardSpec.parse(args.shard) if args.shard else ShardSpec()).within(ctx.rank, ctx.world_size)
    # The run is open from before generation to after the merge, so its
    # duration is the stage's; a shard-only process (merged later) records none.
    merging = not (args.shard and not (args.merge or args.merge_only))
    tracked = contextlib.ExitStack()
    if ctx.is_main and merging:
        generator_run = read_run_record(data, generator_dir)
        sampling = {"model": (generator_run or {}).get("model", str(generator_dir)), **asdict(settings),
                    "batch_size": section["batch_size"], "chunk_size": section["chunk_size"], **compute}
        parent = linked_run_id(generator_run, "query_generator")
        run = tracked.enter_context(stage_run(
            params, "generate_queries", "generate_queries", kind="querygen", stage_params=sampling,
            inputs={"passages": passages_path, "generator": generator_dir},
            tags={"qac.world_size": ctx.world_size}, parent_run_id=parent))
        log_file_input(passages_path, "passages", "generation")
        # The work folder names the run generating into it: a rerun after a kill resumes that run's work.
        run_file = store.root / RUN_FILE
        committed = len(store.committed())
        if committed and run_file.is_file():
            killed = json.loads(run_file.read_text(encoding="utf-8")).get("run_id")
            print(f"generate_queries: resuming: {committed} chunk(s) committed by run {killed} kept",
                  file=sys.stderr)
            import mlflow

            mlflow.set_tag("qac.resume.committed_chunks", committed)
            end_interrupted_run(killed, run.info.run_id, resumed=True)
        write_json(run_file, {"run_id": run.info.run_id})
    with tracked:
        started = time.perf_counter()
        generated_here = 0
        if not args.merge_only:
            generator = generator_from_settings(str(generator_dir), settings, ctx.device,
                                                str(section.get("dtype", "auto")), invariant)
            # One bar per process (each generates its own shard), each on its own line.
            bar = progress(total=pending_passages(store, shard), unit="passage", main_only=False,
                           desc=f"queries shard {shard.index}/{shard.count}", position=ctx.local_rank)
            with torch.inference_mode():
                stats = generate_chunks(store, generator, passages_path, shard, int(section["batch_size"]),
                                        bar.update)
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

        wall = time.perf_counter() - started   # every rank has finished: this covers the whole run
        totals = store.merge(output, *passages_tokenizer(passages_path))
        summary = totals.summary()
        summary["passages_per_second_per_process"] = totals.passages / totals.seconds if totals.seconds else 0.0
        if generated_all:
            summary["passages_per_second"] = generated_all / wall
        log_metrics(summary)
        write_stage_metrics(data / "metrics", "queries", summary)
        write_run_record(data, output, run.info.run_id)
    store.remove()
    cleanup()
    rate = f"{summary['passages_per_second']:.1f} passages/s" if generated_all else "nothing left to generate"
    print_summary("generate_queries", f"{totals.passages} passages", f"{totals.queries} queries", rate,
                  seconds=clock.seconds)
    return 0



if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
