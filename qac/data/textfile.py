"""Line-by-line reading of JSONL and TSV files that reports where a problem is.

This is the one decoding path of every input reader (``prepare``'s readers,
``qac eval``'s run and qrels files), in-memory or streaming:

- lines are read as bytes and decoded one at a time, so an undecodable byte is
  reported with its line number rather than as a bare ``UnicodeDecodeError``;
- a leading byte order mark is dropped (editors on Windows write one);
- files ending in ``.gz`` are decompressed on the fly (MS MARCO ships them so);
  a truncated or non-gzip ``.gz`` is reported with the line it was reached at;
- JSON text with a lone surrogate (``"\\ud800"``, which no UTF-8 file can hold)
  is reported with its line;
- :func:`check_id` rejects ids that a TREC run or qrels file cannot carry
  (whitespace splits them; invisible characters make them unmatchable);
- :func:`require_rows` turns an empty file (0 bytes, a header only, or nothing
  left once unusable rows are skipped) into an error naming it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
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
    line and the column of the first bad byte; so does a ``.gz`` file that is
    truncated or not gzip at all. A leading byte order mark is dropped.
    """
    check_file(path)
    line_number = 0
    try:
        with open_binary(path) as handle:
            for line_number, raw in enumerate(handle, start=1):
                yield line_number, _decode(raw, path, line_number)
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        # Raised while reading the line after the last one yielded.
        problem = ("not a gzip file" if line_number == 0 and isinstance(error, gzip.BadGzipFile)
                   else f"truncated or corrupt gzip data after line {line_number}")
        raise DataFormatError(path, line_number + 1, None, f"{problem} ({error})") from None


def check_file(path: str | os.PathLike) -> None:
    """Raise naming ``path`` unless it is a readable file: missing, a folder and other kinds each say so."""
    path = Path(path)
    if path.is_file():
        return
    if path.is_dir():
        raise DataFormatError(path, None, None, "is a folder, not a file (name the file inside it)")
    if path.exists():
        raise DataFormatError(path, None, None, "is not a regular file")
    raise DataFormatError(path, None, None, "file not found")


def _decode(raw: bytes, path, line_number: int) -> str:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        problem = f"not valid UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})"
        if line_number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            problem += "; the file is UTF-16 (it starts with a UTF-16 byte order mark): convert it to UTF-8"
        elif line_number == 1 and raw.startswith(b"\x1f\x8b"):
            problem += "; the file is gzip-compressed: name it *.gz or decompress it"
        raise DataFormatError(path, line_number, None, problem) from None
    if line_number == 1:
        line = line.removeprefix("\ufeff")
    return line.rstrip("\r\n")


# A \u escape of a surrogate in JSON text (D800-DFFF); pairs are fine, lone ones are not.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_no_lone_surrogate(record: Any, path, line: int) -> None:
    """Raise if a string of ``record`` holds a lone surrogate (it could never be written as UTF-8)."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        bad = error.object[error.start:error.end]
        raise DataFormatError(path, line, None,
                              f"JSON text holds a lone surrogate \\u{ord(bad[0]):04x}, which is not a character") from None


def iter_json_objects(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file."""
    for line_number, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            # Some of json's messages end in "at" ("Invalid control character at") for its own "line L column C".
            reason = error.msg.removesuffix(" at")
            raise DataFormatError(path, line_number, None, f"malformed JSON ({reason} at column {error.colno})") from None
        if not isinstance(record, dict):
            raise DataFormatError(path, line_number, None,
                                  f"expected a JSON object, found {type(record).__name__}")
        if _SURROGATE_ESCAPE.search(line):   # the cheap test first: this runs for every line
            _check_no_lone_surrogate(record, path, line_number)
        yield line_number, record


def iter_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Yield the records (JSON objects) of a JSONL file; a bad line raises with file and line number."""
    for _, record in iter_json_objects(path):
        yield record


def iter_rows(path: str | os.PathLike, fields: tuple[str, ...], *,
              whitespace: bool = False) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line_number, values)`` for each non-blank line with exactly ``len(fields)`` columns.

    Columns are tab separated, or separated by any run of ASCII whitespace with
    ``whitespace=True`` (as trec_eval splits its files: a no-break space inside
    an id is part of the id, reported by name, never a separator). ``fields``
    names the columns for messages.
    """
    for line_number, line in iter_lines(path):
        if not line.strip():
            continue
        values = split_fields(line, fields, path, line_number) if whitespace else line.split("\t")
        if len(values) != len(fields):
            raise DataFormatError(path, line_number, None, _count_problem(line, fields, values, whitespace))
        yield line_number, values


# C's isspace in the "C" locale, trec_eval's separator (Python's str.split also splits on \x1c-\x1f and Unicode).
_ASCII_WHITESPACE = re.compile(r"[ \t\n\r\f\v]+")


def split_fields(line: str, fields: tuple[str, ...], path, line_number: int) -> list[str]:
    """``line`` split on ASCII whitespace; a field holding other whitespace or an invisible character
    (a no-break space pasted from a web page) is an error naming the field and the character."""
    if line.isascii():
        return line.split()
    values = _ASCII_WHITESPACE.split(line.strip(" \t\n\r\f\v"))
    for index, value in enumerate(values):
        if not value.isprintable():
            bad = next(ch for ch in value if not ch.isprintable())
            name = fields[index] if index < len(fields) else f"field {index + 1}"
            raise DataFormatError(path, line_number, name,
                                  f"{value!r} contains {_describe(bad)}; fields of a TREC file are separated by "
                                  "spaces or tabs, and an id must be one printable word")
    return values


def _count_problem(line: str, fields: tuple[str, ...], values: list[str], whitespace: bool) -> str:
    separator = "whitespace" if whitespace else "tab"
    problem = f"expected {len(fields)} {separator}-separated fields ({', '.join(fields)}), found {len(values)}"
    if not whitespace and len(values) == 1 and len(line.split()) == len(fields):
        problem += " (the line is separated by spaces: this file must be tab-separated)"
    elif not whitespace and len(values) < len(fields) and " " in line.strip():
        problem += " (no tab after a field: is the line separated by spaces? this file must be tab-separated)"
    elif whitespace and len(fields) == 4 and len(values) == 3:
        problem += (" (three columns are BEIR qrels, read as such only under their header line "
                    "'query-id<TAB>corpus-id<TAB>score')")
    return problem


def iter_trec_rows(path: str | os.PathLike, fields: tuple[str, ...], *, comments: str,
                   extra_fields: bool) -> Iterator[tuple[int, list[str]]]:
    """Rows of a whitespace-separated TREC file as trec_eval reads them.

    ``comments``: ``line-start`` skips lines whose first character is ``#`` (trec_eval's
    qrels), ``first-word`` also after leading blanks (trec_eval's runs). ``extra_fields``:
    fields after the last named one are ignored (a run's), else a wrong count is an error
    that says what trec_eval accepts. Blank lines are skipped.
    """
    for line_number, line in iter_lines(path):
        stripped = line.lstrip(" \t\r\f\v")
        if not stripped or (line.startswith("#") or (comments == "first-word" and stripped.startswith("#"))):
            continue
        values = split_fields(line, fields, path, line_number)
        if len(values) == len(fields) or (extra_fields and len(values) > len(fields)):
            yield line_number, values[:len(fields)]
            continue
        problem = _count_problem(line, fields, values, True)
        if not extra_fields and len(values) > len(fields):
            problem += " (trec_eval refuses extra fields here too)"
        elif extra_fields:
            problem += f" (trec_eval, too, needs at least these {len(fields)})"
        raise DataFormatError(path, line_number, None, problem)


def required_id(record: dict[str, Any], field: str, path, line: int) -> str:
    """An identifier field: a non-empty string (integers are accepted and converted)."""
    if field not in record:
        raise DataFormatError(path, line, field, "missing")
    value = record[field]
    if value is None:
        raise DataFormatError(path, line, field, "null, expected a string id")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(path, line, field, f"expected a string id, found {type(value).__name__}")
    return check_id(str(value), field, path, line)


def check_id(value: str, field: str, path, line: int | None) -> str:
    """An id stripped of surrounding whitespace; raise if empty or not writable to a TREC file.

    TREC runs and qrels are whitespace separated, so an id with a space (or a
    tab, a no-break space, ...) would be split into two fields by trec_eval and
    by our readers; invisible characters (a byte order mark in the middle of a
    concatenated file, control characters) make ids that look equal and are not.
    """
    value = value.strip()
    if not value:
        raise DataFormatError(path, line, field, "empty id")
    # isprintable() is False for every whitespace but the ASCII space and for
    # control and format characters: two C-level tests, cheap on millions of ids.
    if " " in value or not value.isprintable():
        bad = next(ch for ch in value if ch == " " or not ch.isprintable())
        raise DataFormatError(path, line, field,
                              f"id {value!r} contains {_describe(bad)}; ids are written to "
                              "whitespace-separated TREC files and must be one printable word")
    return value


def _describe(ch: str) -> str:
    import unicodedata

    if ch in " \t":
        return "whitespace"
    name = f"{unicodedata.name(ch, 'an unnamed character')} (U+{ord(ch):04X})"
    return f"the whitespace {name}" if ch.isspace() else f"the invisible character {name}"


def require_rows(count: int, path, what: str, *, skipped: int = 0) -> None:
    """Raise naming ``path`` when a reader found no ``what`` (an empty file gives an empty dataset otherwise)."""
    if count:
        return
    detail = (f"all {skipped} were skipped as unusable" if skipped
              else "the file is empty or holds only a header")
    raise DataFormatError(path, None, None, f"no {what}: {detail}")


def required_text(record: dict[str, Any], field: str, path, line: int, *, default: str | None = None) -> str:
    """A text field (``default`` when it may be missing or ``null``)."""
    value = record.get(field)
    if value is None:
        if default is None:
            raise DataFormatError(path, line, field, "missing" if field not in record else "null, expected text")
        return default
    if not isinstance(value, str):
        raise DataFormatError(path, line, field, f"expected text, found {type(value).__name__}")
    return value


# Numbers as trec_eval (C's atol / atof) reads them: ASCII digits, no digit-group underscores (Python's int()
# and float() take "1_000" and Arabic-Indic digits; atol reads "1_000" as 1).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?i:inf|infinity|nan)")


def parse_int(value: str, field: str, path, line: int) -> int:
    """An integer column (a relevance grade): ASCII digits with an optional sign."""
    if _INTEGER.fullmatch(value):
        return int(value)
    hint = ""
    if _NUMBER.fullmatch(value):
        hint = " (trec_eval would silently cut it to its integer part)"
    elif "_" in value or not value.isascii():
        hint = " (ASCII digits only, no digit-group underscores: trec_eval reads only the leading ASCII digits)"
    raise DataFormatError(path, line, field, f"expected an integer, found {value!r}{hint}")


def parse_number(value: str, field: str, path, line: int) -> float:
    """A decimal number column (a run's score): ASCII digits, optional fraction and exponent."""
    if _NUMBER.fullmatch(value):
        return float(value)
    hint = (" (ASCII digits only, no digit-group underscores)" if "_" in value or not value.isascii() else "")
    raise DataFormatError(path, line, field, f"must be a number, got {value!r}{hint}")


def is_number(value: str) -> bool:
    """Whether ``value`` reads as a number (:func:`parse_number` would accept it)."""
    return _NUMBER.fullmatch(value) is not None


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
