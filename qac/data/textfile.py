"""Line-by-line reading of JSONL and TSV files that reports where a problem is.

Lines are read as bytes and decoded one at a time, so an undecodable byte is
reported with its line number rather than as a bare ``UnicodeDecodeError``.
Files ending in ``.gz`` are decompressed on the fly (MS MARCO ships them so).
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from qac.data.errors import DataFormatError


def open_binary(path: str | os.PathLike):
    """Open a file for reading bytes; ``.gz`` files are decompressed on the fly."""
    path = Path(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def iter_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` of a UTF-8 text file, without the line ending.

    A line that is not valid UTF-8 raises :class:`DataFormatError` naming the
    line and the column of the first bad byte. A leading byte order mark is dropped.
    """
    if not Path(path).is_file():
        raise DataFormatError(path, None, None, "file not found")
    with open_binary(path) as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFormatError(
                    path, line_number, None,
                    f"not valid UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})",
                ) from None
            if line_number == 1:
                line = line.removeprefix("\ufeff")
            yield line_number, line.rstrip("\r\n")


def iter_json_objects(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file."""
    for line_number, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, line_number, None,
                                  f"malformed JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(record, dict):
            raise DataFormatError(path, line_number, None,
                                  f"expected a JSON object, found {type(record).__name__}")
        yield line_number, record


def iter_rows(path: str | os.PathLike, fields: tuple[str, ...], *,
              whitespace: bool = False) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line_number, values)`` for each non-blank line with exactly ``len(fields)`` columns.

    Columns are tab separated, or separated by any run of whitespace with
    ``whitespace=True`` (TREC qrels). ``fields`` names the columns for messages.
    """
    for line_number, line in iter_lines(path):
        if not line.strip():
            continue
        values = line.split() if whitespace else line.split("\t")
        if len(values) != len(fields):
            separator = "whitespace" if whitespace else "tab"
            raise DataFormatError(
                path, line_number, None,
                f"expected {len(fields)} {separator}-separated fields ({', '.join(fields)}), "
                f"found {len(values)}",
            )
        yield line_number, values


def required_id(record: dict[str, Any], field: str, path, line: int) -> str:
    """An identifier field: a non-empty string (integers are accepted and converted)."""
    if field not in record:
        raise DataFormatError(path, line, field, "missing")
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(path, line, field, f"expected a string id, found {type(value).__name__}")
    value = str(value).strip()
    if not value:
        raise DataFormatError(path, line, field, "empty id")
    return value


def required_text(record: dict[str, Any], field: str, path, line: int, *, default: str | None = None) -> str:
    """A text field (``default`` when it may be missing); ``null`` counts as missing."""
    value = record.get(field)
    if value is None:
        if default is None:
            raise DataFormatError(path, line, field, "missing")
        return default
    if not isinstance(value, str):
        raise DataFormatError(path, line, field, f"expected text, found {type(value).__name__}")
    return value


def parse_int(value: str, field: str, path, line: int) -> int:
    """An integer column (a relevance grade)."""
    try:
        return int(value)
    except ValueError:
        raise DataFormatError(path, line, field, f"expected an integer, found {value!r}") from None


def check_new_id(seen: dict[str, int], key: str, field: str, path, line: int) -> None:
    """Raise on an id seen before in the same file, naming the line where it first appeared."""
    first = seen.setdefault(key, line)
    if first != line:
        raise DataFormatError(path, line, field, f"duplicate id {key!r} (first on line {first})")


class QrelsCollector:
    """Collects judgements row by row, checking repeated pairs.

    A pair judged twice with the same grade is counted (``qrels_duplicate``)
    and kept once; with different grades it is an error, since either could
    be meant.
    """

    def __init__(self, path, grade_field: str, skipped: Counter | None = None):
        self.path = path
        self.grade_field = grade_field
        self.skipped = skipped
        self.qrels: dict[str, dict[str, int]] = {}
        self._first_line: dict[tuple[str, str], int] = {}

    def add(self, qid: str, doc_id: str, grade: int, line: int) -> None:
        judged = self.qrels.setdefault(qid, {})
        if doc_id not in judged:
            judged[doc_id] = grade
            self._first_line[qid, doc_id] = line
        elif judged[doc_id] != grade:
            raise DataFormatError(
                self.path, line, self.grade_field,
                f"pair ({qid}, {doc_id}) judged {judged[doc_id]} on line "
                f"{self._first_line[qid, doc_id]} and {grade} here",
            )
        elif self.skipped is not None:
            self.skipped["qrels_duplicate"] += 1
