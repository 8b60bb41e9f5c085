"""DVC stage generate_queries: C sampled queries per passage -> data/<profile>/queries.arrow.

Single process:       python pipelines/generate_queries.py
One machine, N GPUs:  torchrun --nproc_per_node N pipelines/generate_queries.py
Separate machines:    python pipelines/generate_queries.py --shard i/n   (each i, shared disk)
                      python pipelines/generate_queries.py --merge-only  (once all shards finished)

A rerun after an interruption continues from the committed chunks (``data/<profile>/.queries.work/``,
``qac.stages.generation``), says so, and its MLflow run resumes the killed one (``qac.resumes_run``).
"""

from __future__ import annotations

from dataclasses import asdict

from qac.config import profile_dir
from qac.params import load_params
from qac.console import StageClock, print_summary
from qac.distributed import init_distributed
from qac.stages.arguments import sharded_stage_arguments
from qac.tracking.lifecycle import Upstream, tracked_stage


def main(argv=None) -> int:
    args = sharded_stage_arguments(__doc__.splitlines()[0], argv)
    clock = StageClock()

    # here, not at the top: it loads torch
    from qac.querygen.generate import DecodingPlan, SamplingSettings, generator_from_settings
    # here, not at the top: it loads numpy, pyarrow, torch
    from qac.stages.generation import rate, run_sharded_generation

    params = load_params()
    section = params.querygen
    data = profile_dir(params)
    passages_path, generator_dir, output = data / "passages.arrow", data / "generator", data / "queries.arrow"
    for needed in (passages_path, generator_dir):
        if not needed.exists():
            raise SystemExit(f"{needed} not found: run the upstream stage first")

    ctx = init_distributed()
    settings = SamplingSettings.from_params(params)
    plan = DecodingPlan.for_stage(section, ctx.device, generator_dir)
    compute = plan.compute

    def open_run():
        generator = Upstream(data, generator_dir, "query_generator")
        sampling = {"model": (generator.record() or {}).get("model", str(generator_dir)), **asdict(settings),
                    "batch_size": section.batch_size, "chunk_size": section.chunk_size, **compute}
        return tracked_stage(params, "generate_queries", "generate_queries", kind="querygen", stage_params=sampling,
                             inputs={"passages": passages_path, "generator": generator_dir},
                             tags={"qac.world_size": ctx.world_size}, parent=generator, output=output, root=data)

    def make_generator():
        return generator_from_settings(str(generator_dir), settings, ctx.device, section.dtype,
                                       plan.batch_invariant, section.sync_every, plan.decode)

    merged = run_sharded_generation(ctx, shard=args.shard, merge=args.merge, merge_only=args.merge_only,
                                    stage="generate_queries", passages_path=passages_path, output=output,
                                    source=str(generator_dir), settings=settings, section=section, compute=compute,
                                    open_run=open_run, make_generator=make_generator,
                                    summarize=lambda totals: totals.summary())
    if merged is not None:     # the merging process (every other one, and a shard-only run, gets None)
        summary, _ = merged
        print_summary("generate_queries", f"{summary['passages']} passages", f"{summary['queries']} queries",
                      rate(summary), seconds=clock.seconds)
    return 0

