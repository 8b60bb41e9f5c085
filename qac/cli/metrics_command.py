"""Show a profile's DVC metrics, one value per line (a view that fits a terminal).

`dvc metrics show` prints every metrics file of every profile as one table
row per file, thousands of characters wide. This lists the results files
that the profile's dvc.yaml declares as metrics (data/<profile>/metrics/*.json,
metrics/eval/<variant>.json, bm25/metrics.json) one value per line:
`file  key  value`, nested keys joined with `/`. `--timing` adds the
wall-clock files of data/<profile>/metrics/timing/ (not results, declared
nowhere); a PATTERN keeps the lines that contain it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Iterator

from qac.config import profile_dir
from qac.io import NotUtf8, decode_utf8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default=None, help="keep lines containing this text (e.g. nDCG@10)")
    parser.add_argument("--params", default=None, help="params file (default: $QAC_PARAMS, else "
                        "profiles/$QAC_PROFILE/params.yaml, else the default profile)")
    parser.add_argument("--timing", action="store_true", help="also the wall-clock figures of metrics/timing/")


def metrics_files(root: Path, timing: bool = False) -> list[Path]:
    """The profile's declared metrics files under ``root`` (``data/<profile>``) that exist, in a stable order."""
    files = sorted((root / "metrics").glob("*.json")) + sorted((root / "metrics" / "eval").glob("*.json"))
    files += [path for path in [root / "bm25" / "metrics.json"] if path.is_file()]
    if timing:
        files += sorted((root / "metrics" / "timing").glob("*.json"))
    return files


def flat_values(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(a/b/c, leaf)`` of a nested JSON object."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from flat_values(child, f"{prefix}/{key}" if prefix else str(key))
    else:
        yield prefix, value


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer()):
        return str(int(value))
    return f"{value:.4f}"


class UnreadableMetrics(Exception):
    """A metrics file that is no JSON text: shown as one ``(unreadable)`` line, the others still listed."""


def read_metrics_file(path: Path) -> Any:
    """The JSON value of ``path``; :class:`UnreadableMetrics` says where and why it cannot be read."""
    if path.is_dir():
        raise UnreadableMetrics("a folder, not a file")

    try:
        text = decode_utf8(path.read_bytes())
    except NotUtf8 as error:
        raise UnreadableMetrics(f"line {error.line}: not UTF-8 text (byte 0x{error.byte:02x})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UnreadableMetrics(f"line {error.lineno}: {error.msg}") from None


def metric_lines(root: Path, timing: bool = False, pattern: str | None = None) -> list[str]:
    rows = []
    for path in metrics_files(root, timing):
        try:
            values = read_metrics_file(path)
        except UnreadableMetrics as problem:
            rows.append((path.relative_to(root).as_posix(), "(unreadable)", str(problem)))
            continue
        for key, value in flat_values(values):
            rows.append((path.relative_to(root).as_posix(), key, _text(value)))
    if pattern:
        rows = [row for row in rows if any(pattern in cell for cell in row)]
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return [f"{file:<{widths[0]}}  {key:<{widths[1]}}  {value}" for file, key, value in rows]


def run(args: argparse.Namespace) -> int:
    import sys

    # here, not at the top: it loads pydantic
    from qac.params import load_params

    params = load_params(args.params, running=False)
    root = profile_dir(params)
    lines = metric_lines(root, args.timing, args.pattern)
    if not lines:
        if args.pattern and metric_lines(root, args.timing, None):
            print(f"qac metrics: no metric of {root.as_posix()} contains {args.pattern!r} (the text is matched "
                  "as written, case included; without a pattern every metric is listed)", file=sys.stderr)
        else:
            print(f"qac metrics: no metrics under {root.as_posix()} (run the profile first, from the checkout's "
                  "root)", file=sys.stderr)
        return 1
    print(f"metrics of profile {params['profile']} ({root.as_posix()}/)")
    print("\n".join(lines))
    return 0
