"""The errors of the data layer: bad input data, and a dataset that cannot be had.

Every reader reports a problem as :class:`DataFormatError`, whose message names
the file, the line (1-based) and the field, so a person can open the file at
the right place.
"""

from __future__ import annotations

import os

from qac.errors import UserError


class DataFormatError(ValueError, UserError):
    """Bad input data: ``path``, ``line`` (1-based, or None) and ``field`` (or None)."""

    def __init__(self, path: str | os.PathLike, line: int | None, field: str | None, problem: str):
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{problem}")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return type(self), (self.path, self.line, self.field, self.problem)


class DatasetUnavailableError(RuntimeError, UserError):
    """A declared dataset that is neither in the mirror nor downloadable."""
