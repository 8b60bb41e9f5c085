"""DVC stage generate_llm_queries@<generator>: C prompted queries per passage from a causal LM.

Writes data/<profile>/llm_queries/<generator>/queries.arrow and prompts.json (qac.stages.llm_queries).
Sharding and resumption as generate_queries: --shard i/n, --merge, --merge-only; torchrun splits a shard.
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

import argparse

from qac.console import StageClock, print_summary


def main(argv=None) -> int:
    from qac.stages.arguments import _parsed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generator", required=True, help="a key of llm_queries.generators")
    parser.add_argument("--shard", help="i/n: generate only shard i of n (0-based); no merge unless --merge")
    parser.add_argument("--merge", action="store_true", help="with --shard: merge afterwards (all shards must be done)")
    parser.add_argument("--merge-only", action="store_true", help="only merge the committed chunks of all shards")
    args = _parsed(parser, argv)
    clock = StageClock()

    from qac.params import load_params
    from qac.stages.generation import rate
    from qac.stages.llm_queries import generate_llm_queries

    summary = generate_llm_queries(load_params(), args.generator, shard=args.shard, merge=args.merge,
                                   merge_only=args.merge_only)
    if summary is not None:
        print_summary(f"generate_llm_queries@{args.generator}", f"{summary['passages']} passages",
                      f"{summary['queries']} queries", rate(summary), seconds=clock.seconds)
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
