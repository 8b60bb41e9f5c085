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
from pathlib import Path

from qac.cli.tables_command import check_out_option, folder_problem
from qac.config import profile_dir
from qac.data.errors import DataFormatError
from qac.errors import UserError
from qac.evaluation import annotation
from qac.io import NotUtf8, decode_utf8, write_json


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
    # here, not at the top: it loads pydantic
    from qac.params import load_params

    check_out_option(args.out)
    params = load_params(args.params)
    data = profile_dir(params)
    out = Path(args.out) if args.out else data / "annotation"
    _check_out_folder(out, args.out)
    pairs = annotation.sample_items(annotation.read_passages(data / "passages.arrow"),
                                    annotation.read_queries(data / "queries.arrow"),
                                    int(params["annotation"]["documents"]), int(params["seed"]))
    count = annotation.export_sheet(pairs, out / "sheet.csv", out / "key.csv", int(params["seed"]))
    print(f"wrote {count} pairs from {count // 2} documents to {out / 'sheet.csv'} (key: {out / 'key.csv'})")
    return 0


def _check_out_folder(out: Path, given: str | None) -> None:
    """Before any work: the files go into ``out``, which must be a folder or one that can be made."""
    problem = folder_problem(out)
    if problem:
        raise UserError(f"{'--out ' if given else ''}{out}: {problem}")


def read_text_file(path: str, what: str) -> tuple[bytes, str]:
    """The bytes of ``path`` and their text; an error names the file (and the line of a byte that is not
    UTF-8) where the CSV reader would name neither."""
    file = Path(path)
    if file.is_dir():
        raise DataFormatError(path, None, None, f"a folder, not a file (expected {what})")
    if not file.is_file():
        raise DataFormatError(path, None, None, f"file not found (expected {what})")

    data = file.read_bytes()
    try:
        text = decode_utf8(data)
    except NotUtf8 as error:
        raise DataFormatError(path, error.line, None, f"not UTF-8 text (byte 0x{error.byte:02x}); save it "
                                                      "as CSV in UTF-8") from None
    return data, text.removeprefix("\ufeff")    # a spreadsheet's byte order mark, as the CSV reader drops it


def check_unique_items(path: str, text: str) -> None:
    """Each item once in a filled sheet: a repeated item is named with both its lines, before the texts of
    its rows are compared with the exported sheet (which would report the repeat as a text that differs)."""
    import csv
    import io

    reader = csv.DictReader(io.StringIO(text, newline=""))
    if "item" not in (reader.fieldnames or []):
        return      # the library names the missing column
    first_line: dict[str, int] = {}
    for row in reader:
        item = (row["item"] or "").strip()
        if item in first_line:
            raise DataFormatError(path, reader.line_num, "item", f"item {item!r} appears twice (lines "
                                  f"{first_line[item]} and {reader.line_num}): each item is labelled once")
        first_line[item] = reader.line_num


def check_filled_sheets(paths: list[str]) -> None:
    """At least two sheets, each a UTF-8 file of its own (not the same file or the same bytes given twice,
    which would count one annotator twice and agree with itself), each item once."""
    import hashlib

    if len(paths) < 2:
        raise UserError(f"{paths[0]}: need the filled sheets of at least two annotators, got 1; agreement and "
                        "the majority label compare annotators, so give every annotator's sheet")
    seen_paths: dict[Path, str] = {}
    seen_bytes: dict[str, str] = {}
    for path in paths:
        data, text = read_text_file(path, "a filled sheet")
        place = Path(path).resolve()
        if place in seen_paths:
            raise UserError(f"{path}: given twice (as {seen_paths[place]} too); give each annotator's sheet once")
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen_bytes:
            raise UserError(f"{path}: byte for byte the same as {seen_bytes[digest]}: a copy of one annotator's "
                            "sheet, not a second annotator's; give each annotator's own filled sheet")
        seen_paths[place], seen_bytes[digest] = path, path
        check_unique_items(path, text)


def _import(args: argparse.Namespace) -> int:
    # Checked here, before the library reads anything, so each problem is named with its file.
    check_out_option(args.out)
    check_filled_sheets(args.sheets)
    read_text_file(args.key, "the key.csv written by export")
    if args.sheet is not None:
        read_text_file(args.sheet, "the sheet.csv written by export")
    out = Path(args.out) if args.out else Path(args.key).parent
    _check_out_folder(out, args.out)
    human = annotation.import_sheets(args.sheets, args.key, args.sheet)
    key = annotation.read_key(args.key)
    rows = [{"item": item, "doc_id": entry["doc_id"], "kind": entry["kind"], "pid": entry["pid"],
             "context_id": entry["context_id"], "votes": " ".join(human.votes[item]),
             "label": human.labels[item] or ""} for item, entry in key.items()]
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
