"""DVC stage filter_llm_queries@<generator>: keep the generated queries the filters accept.

Writes data/<profile>/llm_queries/<generator>/filtered.arrow and metrics/filter.json (kept shares, Table 5's
judge before and after; qac.llm_queries.filtering).
"""

from __future__ import annotations

import _environment  # noqa: F401,I001  (first: a Python without qac says which one to use)

import argparse

from qac.console import StageClock, print_summary


def main(argv=None) -> int:
    from qac.stages.arguments import _parsed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generator", required=True, help="a key of llm_queries.generators")
    args = _parsed(parser, argv)
    clock = StageClock()

    from qac.params import load_params
    from qac.stages.filter_llm_queries import filter_llm_queries

    figures = filter_llm_queries(load_params(), args.generator)
    facts = [f"{figures['queries_after']} of {figures['queries_before']} queries kept ({figures['kept_share']:.1%})"]
    if "judge/difference" in figures:
        facts.append(f"Table 5 judge high share {figures['judge/high_share/before']:.1%} -> "
                     f"{figures['judge/high_share/after']:.1%}")
    print_summary(f"filter_llm_queries@{args.generator}", *facts, seconds=clock.seconds)
    return 0


if __name__ == "__main__":
    from qac.console import run_main

    run_main(main)
