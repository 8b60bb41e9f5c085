"""Reading a params file: parsed as DVC writes it, checked against the schema before anything else runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from qac.params.errors import ParamsError, Problem
from qac.params.locations import PROFILE_NAMES, params_path
from qac.params.validation import validate_params
from qac.params.yaml_io import read_yaml


def load_params(path: str | os.PathLike | None = None, validate: bool = True) -> dict[str, Any]:
    """Read a profile's parameters: ``path`` if given, else :func:`params_path`.

    The whole file is checked against the schema (:mod:`qac.params.sections`) first, so a
    misspelt key or a value out of range stops the caller before any slow work, with a
    :class:`~qac.params.errors.ParamsError` naming the key and its line. Floats written
    ``5e-05`` (as ``dvc exp run -S`` writes them) read as numbers.
    """
    path = Path(path) if path else params_path()
    if not path.exists():
        raise ParamsError(path, [Problem("", f"no such params file (profiles: {', '.join(PROFILE_NAMES)}; set "
                                             "QAC_PARAMS to a file or QAC_PROFILE to a profile name)")])
    if path.is_dir():
        raise ParamsError(path, [Problem("", "is a folder, not a params file (a profile's file is "
                                             "profiles/<name>/params.yaml)")])
    text = path.read_text(encoding="utf-8")
    try:
        params = read_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ParamsError(path, [Problem("", f"not valid YAML{line}: {getattr(error, 'problem', None) or error}")]) \
            from None
    if not isinstance(params, dict) or "profile" not in params:
        raise ParamsError(path, [Problem("", "not a qac params file (no 'profile' key)")])
    if validate:
        validate_params(params, path, text)
    return params
