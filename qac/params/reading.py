"""A params file read: its text (UTF-8, or its first bad byte named) and its values (YAML as DVC reads it).

Apart from :mod:`qac.params.yaml_io` because an error here is a
:class:`~qac.params.errors.ParamsError` (pydantic's side of the package),
while the YAML reader must also work where pydantic is not installed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from qac.io import NotUtf8, decode_utf8
from qac.params.errors import ParamsError, Problem
from qac.params.yaml_io import key_lines, read_yaml


# Beyond this a file is not a profile's parameters: reading and checking it would take minutes and gigabytes.
MAX_PARAMS_BYTES = 5_000_000


def read_params_file(path: str | os.PathLike) -> tuple[str, Any]:
    """The text of the YAML file at ``path`` and its values; a :class:`ParamsError` naming the file, line and
    column when it is not UTF-8 or not YAML (as DVC reads it: a key written twice is an error)."""
    import yaml

    path = Path(path)
    try:
        entry = path.stat()
    except FileNotFoundError:
        raise ParamsError(path, [Problem("", "not found (the profiles' files are profiles/base.yaml and "
                                             "profiles/<name>.yaml; git restores one deleted by mistake)")]) from None
    if not stat.S_ISREG(entry.st_mode):     # a FIFO would block the read; a device never ends
        raise ParamsError(path, [Problem("", "not a regular file (a params file is a YAML file)")])
    if entry.st_size > MAX_PARAMS_BYTES:
        raise ParamsError(path, [Problem("", f"{entry.st_size:,} bytes: a params file holds a few thousand "
                                         f"values in some tens of kilobytes (the limit is {MAX_PARAMS_BYTES:,})")])
    try:
        text = decode_utf8(path.read_bytes())
    except NotUtf8 as error:
        raise ParamsError(path, [Problem("", f"{error}; save the file as UTF-8")]) from None
    try:
        return text, read_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        key = _key_at_line(text, mark.line + 1) if mark else None
        where = f" (key {key})" if key else ""
        raise ParamsError(path, [Problem("", f"not valid YAML{line}{where}: "
                                             f"{getattr(error, 'problem', None) or error}")]) from None


def _key_at_line(text: str, line: int) -> str | None:
    """The deepest dotted key written on ``line``, when the text composes (a value that fails to construct)."""
    keys = [key for key, number in key_lines(text).items() if number == line]
    return max(keys, key=lambda key: key.count("."), default=None)
