"""Export the Table 5 annotation sheet for people, or import their filled sheets.

  qac annotate export [--out DIR]
      samples the pairs exactly as the `annotation` stage does (same seed and
      data) and writes DIR/sheet.csv (pairs shuffled, kind hidden) and
      DIR/key.csv (which pair is which; do not show it to annotators).
      Annotators fill the `label` column of their own copy with high or low.

  qac annotate import --key DIR/key.csv [--sheet DIR/sheet.csv] FILLED.csv FILLED.csv ...
      takes the majority label of each pair, prints the share of highly
      correlated pairs per kind and the agreement (mean pairwise agreement,
      Fleiss' kappa), and writes human_labels.csv and agreement.json beside
      the key (or into --out). To put human labels into Table 5, list the
      filled sheets under annotation.human_sheets in params.yaml and rerun
      the `annotation` and `tables` stages.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = commands.add_parser("export", help="write sheet.csv and key.csv for annotators")
    export.add_argument("--params", default=None, help="params file (default: $QAC_PARAMS, else "
                        "profiles/$QAC_PROFILE/params.yaml, else the default profile)")
    export.add_argument("--out", default=None, help="folder (default: data/<profile>/annotation)")
    imported = commands.add_parser("import", help="majority labels and agreement of filled sheets")
    imported.add_argument("sheets", nargs="+", help="filled sheets, one per annotator")
    imported.add_argument("--key", required=True, help="key.csv written by export")
    imported.add_argument("--sheet", default=None, help="the exported sheet.csv, to check the texts match")
    imported.add_argument("--out", default=None, help="folder for human_labels.csv and agreement.json "
                                                      "(default: beside the key)")


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from qac.config import profile_dir
    from qac.params import load_params
    from qac.evaluation import annotation

    params = load_params(args.params)
    data = profile_dir(params)
    out = Path(args.out) if args.out else data / "annotation"
    pairs = annotation.sample_items(annotation.read_passages(data / "passages.arrow"),
                                    annotation.read_queries(data / "queries.arrow"),
                                    int(params["annotation"]["documents"]), int(params["seed"]))
    count = annotation.export_sheet(pairs, out / "sheet.csv", out / "key.csv", int(params["seed"]))
    print(f"wrote {count} pairs from {count // 2} documents to {out / 'sheet.csv'} (key: {out / 'key.csv'})")
    return 0


def _import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from qac.io import write_json
    from qac.evaluation import annotation

    human = annotation.import_sheets(args.sheets, args.key, args.sheet)
    key = annotation.read_key(args.key)
    rows = [{"item": item, "doc_id": entry["doc_id"], "kind": entry["kind"], "pid": entry["pid"],
             "context_id": entry["context_id"], "votes": " ".join(human.votes[item]),
             "label": human.labels[item] or ""} for item, entry in key.items()]
    out = Path(args.out) if args.out else Path(args.key).parent
    annotation.write_csv(out / "human_labels.csv", ["item", "doc_id", "kind", "pid", "context_id", "votes", "label"],
                         rows)
    shares = annotation.label_shares(rows)
    write_json(out / "agreement.json", {**human.summary(), "shares": shares})
    print(human.description())
    for kind, share in shares.items():
        print(f"{kind}: {share['high']}/{share['pairs']} highly correlated ({share['share']:.1%})")
    print(f"wrote {out / 'human_labels.csv'} and {out / 'agreement.json'}")
    return 0


def run(args: argparse.Namespace) -> int:
    return _export(args) if args.action == "export" else _import(args)
