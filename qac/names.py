"""Names that become folder names: profiles, datasets, variants, studies.

A profile, dataset or variant name is one path component under
``data/<profile>/`` (``data/smoke/eval/<variant>/``, ``datasets/<name>/``), so
it must be a plain name, never a path: letters, digits, ``_``, ``-`` and ``.``,
starting with a letter, digit or ``_`` (no ``/``, no ``..``, no hidden or
option-like name). Paths a profile names inside a folder (a mirror sub-folder,
a dataset's files) may have several components but stay inside: relative,
no ``..`` component.
"""

from __future__ import annotations

import re

from qac.errors import UserError

PLAIN_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"
PLAIN_NAME_RULE = ("a plain name (letters, digits, '_', '-' and '.', starting with a letter, digit or '_'; "
                   "no '/' or '..'), since it becomes a folder name")

INSIDE_PATH_RULE = ("a relative path inside its folder ('/'-separated names, none of them empty, '.' or '..'; "
                    "not starting with '/')")

_PLAIN = re.compile(PLAIN_NAME_PATTERN)


def is_plain_name(name: object) -> bool:
    return isinstance(name, str) and bool(_PLAIN.match(name))


def checked_plain_name(name: str, what: str) -> str:
    """``name`` if it is a plain name; else a :class:`UserError` saying what it names and the rule."""
    if not is_plain_name(name):
        raise UserError(f"{what} {name!r} is not {PLAIN_NAME_RULE}")
    return name


OUTPUT_FOLDER_RULE = (f"{INSIDE_PATH_RULE}, or an absolute path without '.' or '..' components (a folder on "
                      "another disk)")


def is_output_folder(path: object) -> bool:
    """A folder to write into: relative and inside the working folder ('../x' would write beside the
    checkout), or absolute, a deliberate choice of another disk."""
    return is_inside_path(path) or (isinstance(path, str) and path.startswith("/")
                                    and is_inside_path(path.lstrip("/")))


def output_option_problem(value: str) -> str | None:
    """Why a folder given on the command line cannot be written into (the rule of :func:`is_output_folder`,
    a trailing '/' allowed), or None."""
    return None if is_output_folder(value.rstrip("/") or "/") else f"expected {OUTPUT_FOLDER_RULE}"


def is_inside_path(path: object) -> bool:
    """A relative path whose every component is a name: it cannot leave the folder it is joined to."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
