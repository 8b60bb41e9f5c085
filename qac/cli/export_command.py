"""Bundle a profile's retrievers, runs, results, tables and lineage into one folder fit for an archive.

Reads data/<profile>/ and writes <out> (default exports/<profile>): each
fine-tuned retriever as a sentence-transformers folder with its model card,
TREC runs headed by ir_metadata, MTEB result files with model_meta.json,
ranx-readable qrels and runs with a comparison report, the committed tables,
the params, pipeline, lock and run records, and MANIFEST.json (size and MD5
of every file). See docs/interoperability.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qac.cli.tables_command import check_out_option, folder_problem
from qac.errors import UserError
from qac.reporting.export import export_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", nargs="?", default=None,
                        help="the profile (default: $QAC_PROFILE's params, as every command reads them)")
    parser.add_argument("--params", default=None, help="params file (default: profiles/<profile>/params.yaml)")
    parser.add_argument("--out", default=None, help="export folder (default: exports/<profile>)")
    parser.add_argument("--data", default=None, help="the profile's DVC outputs (default: data/<profile>)")


def run(args: argparse.Namespace) -> int:
    import time

    # here, not at the top: it loads pydantic
    from qac.params import load_params

    check_out_option(args.out)
    params = load_params(args.params or (f"profiles/{args.profile}/params.yaml" if args.profile else None),
                         running=False)
    out = Path(args.out or f"exports/{params.profile}")
    problem = folder_problem(out)
    if problem:
        raise UserError(f"--out {out}: {problem}")
    started = time.perf_counter()
    export_profile(params, out, args.data)
    files = sum(1 for path in out.rglob("*") if path.is_file())
    print(f"wrote {out}: {files} files in {time.perf_counter() - started:.1f} s (MANIFEST.json lists them)")
    return 0
