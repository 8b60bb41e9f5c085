"""DVC stage generate_continuations: one causal-LM continuation per passage -> data/<profile>/continuations.arrow.

MASTER's GOR texts (qac.querygen.continuation), sharded, resumable and merged as generate_queries.
Single process:       python pipelines/generate_continuations.py
One machine, N GPUs:  torchrun --nproc_per_node N pipelines/generate_continuations.py
Separate machines:    python pipelines/generate_continuations.py --shard i/n   (each i, shared disk)
                      python pipelines/generate_continuations.py --merge-only  (once all shards finished)
A rerun continues from the committed chunks (``data/<profile>/.continuations.work/``).
"""

from __future__ import annotations

from dataclasses import asdict

from qac.config import profile_dir
from qac.params import load_params
from qac.console import StageClock, print_summary
from qac.distributed import autocast_dtype, init_distributed
from qac.stages.arguments import sharded_stage_arguments
from qac.tracking.lifecycle import tracked_stage


def main(argv=None) -> int:
    args = sharded_stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import QUERIES_SCHEMA, iter_records
    # here, not at the top: it loads torch
    from qac.querygen.continuation import (ContinuationGenerator, ContinuationSettings, continuation_quality,
                                           load_causal_lm)
    # here, not at the top: it loads numpy, pyarrow, torch
    from qac.stages.generation import rate, run_sharded_generation

    params = load_params()
    section = params.continuation
    settings = ContinuationSettings.from_params(params)     # bad values fail here, before any slow work
    data = profile_dir(params)
    passages_path, output = data / "passages.arrow", data / "continuations.arrow"
    if not passages_path.exists():
        raise SystemExit(f"{passages_path} not found: run the split_passages stage first")

    ctx = init_distributed()
    dtype = autocast_dtype(section.dtype, ctx.device)
    # Decoding runs in batches: keep their composition fixed so that a resumed run decodes alike.
    compute = {"dtype": str(dtype or "float32"), "batch_size": section.batch_size}

    def open_run():
        return tracked_stage(params, "generate_continuations", "generate_continuations", kind="continuation",
                             stage_params={**asdict(settings), "batch_size": section.batch_size,
                                           "chunk_size": section.chunk_size, **compute},
                             inputs={"passages": passages_path}, tags={"qac.world_size": ctx.world_size},
                             root=data)

    def make_generator():
        model, tokenizer = load_causal_lm(settings.model, ctx.device, seed=settings.seed)
        return ContinuationGenerator(model, tokenizer, settings, autocast_dtype=dtype)

    def summarize(totals):
        # The merged texts: one continuation per record, empty when the LM wrote nothing.
        return continuation_quality([(record["queries"] or [""])[0]
                                     for record in iter_records(output, QUERIES_SCHEMA, ["queries"])], totals)

    merged = run_sharded_generation(ctx, shard=args.shard, merge=args.merge, merge_only=args.merge_only,
                                    stage="generate_continuations", passages_path=passages_path,
                                    output=output, source=settings.model, settings=settings, section=section,
                                    compute=compute, open_run=open_run, make_generator=make_generator,
                                    summarize=summarize)
    if merged is not None:     # the merging process (every other one, and a shard-only run, gets None)
        summary, _ = merged
        print_summary("generate_continuations", f"{summary['passages']} passages",
                      f"mean {summary['mean_words']:.1f} words", f"distinct-2 {summary['distinct_2']:.3f}",
                      rate(summary), seconds=clock.seconds)
    return 0

