"""The deviation ledger: write docs/deviations.md, check it, show which recipe a profile runs.

  qac deviations render        # write docs/deviations.md from qac/deviations.yaml and the profiles
  qac deviations check         # exit 1 if docs/deviations.md is stale or a ledger key is not a params key
  qac deviations recipe NAME   # each switch of profile NAME: its value and the recipe (paper, release)

The ledger lists every known difference between the paper's text, the
authors' release and our profiles; each difference that can run both ways is
a switch, a params key with a value for each recipe.
"""

from __future__ import annotations

import argparse
import sys

from qac.params import PROFILE_NAMES
from qac.deviations import DOC, missing_keys, recipe_of, render_markdown, rendered_profiles
from qac.io import atomic_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("render", help="write docs/deviations.md")
    actions.add_parser("check", help="docs/deviations.md current and every ledger key a params key")
    recipe = actions.add_parser("recipe", help="which recipe each switch of a profile runs")
    recipe.add_argument("name", choices=PROFILE_NAMES)


def run(args: argparse.Namespace) -> int:
    try:
        profiles = rendered_profiles()
    except (OSError, ValueError) as error:
        print(f"qac deviations: {error}", file=sys.stderr)
        return 2
    if args.action == "recipe":
        for deviation, entry in recipe_of(profiles[args.name]).items():
            print(f"{deviation:28} {entry['switch']:45} {entry['value']!s:8} {entry['recipe'] or 'neither'}")
        return 0
    text = render_markdown(profiles)
    if args.action == "render":
        with atomic_path(DOC) as staging:
            staging.write_text(text, encoding="utf-8")
        print(f"{DOC} written")
        return 0
    status = 0
    for name, params in profiles.items():
        for missing in missing_keys(params):
            print(f"qac deviations: qac/deviations.yaml: {missing} is not a key of profile {name}", file=sys.stderr)
            status = 1
    if not DOC.exists() or DOC.read_text(encoding="utf-8") != text:
        print(f"qac deviations: {DOC} is stale; run `qac deviations render`", file=sys.stderr)
        status = 1
    if status == 0:
        print("deviation ledger: docs current, every key a params key")
    return status
