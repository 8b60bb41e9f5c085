"""Switch the active profile: render params.yaml from profiles/base.yaml + profiles/NAME.yaml.

  qac profile use smoke     # a few hundred documents, tiny models (tests, CI)
  qac profile use default   # SciFact + all-MiniLM-L6-v2 on a laptop
  qac profile use paper     # MS MARCO, bert-base, doc2query: the paper's scale
  qac profile show          # which profile params.yaml holds

DVC records the rendered parameters, so `dvc repro` after a switch reruns
exactly the stages whose parameters changed.
"""

from __future__ import annotations

import argparse

from qac.config import PROFILE_NAMES, load_params, render_profile, write_params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    use = actions.add_parser("use", help="render params.yaml for a profile")
    use.add_argument("name", choices=PROFILE_NAMES)
    use.add_argument("--params", default="params.yaml", help="file to write (default: params.yaml)")
    show = actions.add_parser("show", help="print the active profile")
    show.add_argument("--params", default="params.yaml")


def run(args: argparse.Namespace) -> int:
    if args.action == "use":
        write_params(render_profile(args.name), args.params)
        print(f"{args.params}: profile {args.name}")
    else:
        print(load_params(args.params)["profile"])
    return 0
