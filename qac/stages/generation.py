"""The sharded generation stage: what ``generate_queries`` and ``generate_continuations`` run alike.

Both write one record per row of ``passages.arrow`` through the chunk store of
:mod:`qac.querygen.shards`, and differ only in the generator and in the figures
they report. :func:`run_sharded_generation` holds the rest: rank 0 prepares the
store before the other ranks, each process takes its shard (``--shard i/n``
further split among torchrun ranks) with its own progress bar, the generated
count is summed over the ranks, and the merging process opens the stage's
MLflow run before generation and merges, logs and writes the metrics in it.

The work folder names the run generating into it (``mlflow_run.json``): a
rerun after a kill says that it resumes, tags its run with the chunks it kept
and ends the killed run as resumed by this one (:mod:`qac.tracking.interrupted`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Mapping

from qac.querygen.generate import GenerationStats
from qac.querygen.shards import (ChunkStore, ShardSpec, build_manifest, generate_chunks, passages_tokenizer,
                                 pending_passages, work_dir_for)
from qac.console import progress
from qac.distributed import barrier, cleanup, sum_over_ranks
from qac.io import write_json
from qac.reporting.dvc_metrics import write_stage_metrics

if TYPE_CHECKING:
    from qac.params.sections import ContinuationSection, QuerygenSection

RUN_FILE = "mlflow_run.json"   # in the work folder: the run whose chunks it holds


def run_sharded_generation(ctx, *, shard: str | None, merge: bool, merge_only: bool, stage: str,
                           passages_path: str | os.PathLike, output: str | os.PathLike, source: str, settings: Any,
                           section: QuerygenSection | ContinuationSection, compute: Mapping[str, Any],
                           open_run: Callable[[], ContextManager[Any]],
                           make_generator: Callable[[], Any],
                           summarize: Callable[[GenerationStats], dict[str, float]]) -> tuple[dict, Any] | None:
    """Generate ``output`` from ``passages_path`` in resumable chunks; ``(summary, run)`` in the merging process.

    ``shard`` (``i/n``, None: all) is the part this launch generates, further split among torchrun ranks;
    a shard alone merges nothing unless ``merge``; ``merge_only`` merges the committed chunks of all shards.
    ``source``, ``settings`` and ``compute`` fingerprint the chunks (:func:`build_manifest`); ``section`` is the
    stage's params section (``batch_size``, ``chunk_size``, ``max_passages``). ``open_run()`` opens the stage's
    MLflow run, ``make_generator()`` loads the generator (not called by ``--merge-only``) and ``summarize(totals)``
    gives the figures of the merged output, to which the throughput is added; they go to MLflow and to
    ``metrics/<output stem>.json``. Every other process, and a shard-only run, gets None.
    """
    output = Path(output)
    store = _prepared_store(ctx, output, build_manifest(passages_path, source, settings, section.chunk_size, compute,
                                                        section.max_passages))

    spec = (ShardSpec.parse(shard) if shard else ShardSpec()).within(ctx.rank, ctx.world_size)
    # The run is open from before generation to after the merge, so its
    # duration is the stage's; a shard-only process (merged later) records none.
    merging = not (shard and not (merge or merge_only))
    tracked = contextlib.ExitStack()
    tracking = None
    if ctx.is_main and merging:
        tracking = tracked.enter_context(open_run())
        tracking.log_file_inputs({"passages": passages_path}, "generation")
        _resume_killed_run(stage, store, tracking)
    with tracked:
        started = time.perf_counter()
        generated_here = 0
        if not merge_only:
            generated_here = _generate_shard(ctx, store, make_generator(), passages_path, spec, section.batch_size,
                                             output.stem)
        generated_all = sum_over_ranks(generated_here, ctx.device)   # also a barrier
        if not merging and ctx.is_main:
            print(f"shard {shard} done; merge with --merge-only once every shard has finished",
                  file=sys.stderr)
        if not (merging and ctx.is_main):
            cleanup()
            return None

        wall = time.perf_counter() - started   # every rank has finished: this covers the whole run
        # Token ids beside each text, by the tokenizer of the passages' ids, so pairs are of one vocabulary.
        totals = store.merge(output, *passages_tokenizer(passages_path))
        summary = summarize(totals)
        summary["passages_per_second_per_process"] = totals.passages / totals.seconds if totals.seconds else 0.0
        if generated_all:
            summary["passages_per_second"] = generated_all / wall
        tracking.log_metrics(summary)
        write_stage_metrics(output.parent / "metrics", output.stem, summary)
    store.remove()
    cleanup()
    return summary, tracking


def _prepared_store(ctx, output: Path, manifest) -> ChunkStore:
    """The chunk store of ``output``'s work folder, prepared by the main process first (it clears chunks of
    another manifest), then by the others."""
    store = ChunkStore(work_dir_for(output), manifest)
    if ctx.is_main:
        store.prepare()
    barrier()
    if not ctx.is_main:
        store.prepare()
    return store


def _generate_shard(ctx, store: ChunkStore, generator, passages_path, spec, batch_size: int, name: str) -> int:
    """Generate this process's pending chunks of ``spec``; how many passages it generated. One bar per
    process (each generates its own shard), each on its own line."""
    import torch

    bar = progress(total=pending_passages(store, spec), unit="passage", main_only=False,
                   desc=f"{name} shard {spec.index}/{spec.count}", position=ctx.local_rank)
    with torch.inference_mode():
        stats = generate_chunks(store, generator, passages_path, spec, batch_size, bar.update)
    bar.close()
    return stats.passages


def _resume_killed_run(stage: str, store: ChunkStore, tracking) -> None:
    """Name the stage's run in the work folder; when a killed run left committed chunks there, say so and
    link the two."""
    run_file = store.root / RUN_FILE
    committed = len(store.committed())
    if committed and run_file.is_file():
        killed = json.loads(run_file.read_text(encoding="utf-8")).get("run_id")
        print(f"{stage}: resuming: {committed} chunk(s) committed by run {killed} kept", file=sys.stderr)
        tracking.resumes(killed, resumed=True, committed_chunks=committed)
    write_json(run_file, {"run_id": tracking.run_id})


def rate(summary: Mapping[str, Any]) -> str:
    """The summary line's rate: passages per second, or that nothing was left to generate."""
    if "passages_per_second" in summary:
        return f"{summary['passages_per_second']:.1f} passages/s"
    return "nothing left to generate"
