"""Reading a params file: parsed as DVC writes it, checked against the schema before anything else runs."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from qac.params.errors import ParamsError, Problem
from qac.params.locations import PROFILE_NAMES, params_path
from qac.params.sections import Params
from qac.params.validation import validate_params
from qac.params.reading import read_params_file

T = TypeVar("T")


def load_params(path: str | os.PathLike | None = None) -> Params:
    """Read a profile's parameters: ``path`` if given, else :func:`params_path`.

    The whole file is checked against the schema (:mod:`qac.params.sections`) first, so a
    misspelt key or a value out of range stops the caller before any slow work, with a
    :class:`~qac.params.errors.ParamsError` naming the key and its line. What comes back is the
    checked file itself, typed and frozen (:class:`~qac.params.sections.Params`): a key it leaves
    out reads as the schema's default, and a partial file (a small study naming some sections)
    reads as ``profiles/base.yaml`` with its keys over it. Floats written ``5e-05`` (as
    ``dvc exp run -S`` writes them) read as numbers.
    """
    path = Path(path) if path else params_path()
    if not path.exists():
        raise ParamsError(path, [Problem("", f"no such params file (profiles: {', '.join(PROFILE_NAMES)}; set "
                                             "QAC_PARAMS to a file or QAC_PROFILE to a profile name)")])
    if path.is_dir():
        raise ParamsError(path, [Problem("", "is a folder, not a params file (a profile's file is "
                                             "profiles/<name>/params.yaml)")])
    text, params = read_params_file(path)
    if not isinstance(params, dict) or "profile" not in params:
        raise ParamsError(path, [Problem("", "not a qac params file (no 'profile' key)")])
    return validate_params(params, path, text)


def base_params() -> Params:
    """``profiles/base.yaml`` typed: the method's settings as the paper defines them, every key the schema
    knows. What a library function or a test starts from when it has no profile: take a section's
    settings from it and change the keys that matter (``dataclasses.replace``). The rules across keys
    are left out: the base names no datasets or variants of its own."""
    from qac.params.locations import profiles_root

    path = profiles_root() / "base.yaml"
    # Read and checked once per version of the file (tests and benchmarks build many settings from it).
    return _checked_base(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _checked_base(path: str, mtime_ns: int) -> Params:
    text, params = read_params_file(path)
    return validate_params(params, path, text, complete=False)


def base_settings(build: Callable[[Params], T], **changes: Any) -> T:
    """A settings dataclass as ``profiles/base.yaml`` sets it, with ``changes``: for tests, benchmarks and
    notebooks that need a few keys other than the method's (``build`` reads the checked parameters, e.g.
    ``SamplingSettings.from_params``)."""
    return dataclasses.replace(build(base_params()), **changes)
