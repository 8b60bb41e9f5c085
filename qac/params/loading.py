"""Reading a params file: parsed as DVC writes it, checked against the schema before anything else runs."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from qac.params.errors import ParamsError, Problem
from qac.params.locations import PROFILE_NAMES, params_path, profiles_root
from qac.params.sections import Params
from qac.params.validation import validate_params
from qac.params.model_sources import pin_problems
from qac.params.reading import read_params_file
from qac.params.yaml_io import key_lines

T = TypeVar("T")


def load_params(path: str | os.PathLike | None = None, *, running: bool = True) -> Params:
    """Read a profile's parameters: ``path`` if given, else :func:`params_path`.

    The whole file is checked against the schema (:mod:`qac.params.sections`) first, so a
    misspelt key or a value out of range stops the caller before any slow work, with a
    :class:`~qac.params.errors.ParamsError` naming the key and its line. What comes back is the
    checked file itself, typed and frozen (:class:`~qac.params.sections.Params`): a key it leaves
    out reads as the schema's default, and a partial file (a small study naming some sections)
    reads as ``profiles/base.yaml`` with its keys over it. Floats written ``5e-05`` (as
    ``dvc exp run -S`` writes them) read as numbers. ``running`` (a stage, ``qac repro``, a search): a
    profile that sets ``pinned_models`` must name every hub model at a commit; a caller that only reads
    the file (tables, the check, a plan) passes False.
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
    problem = profile_folder_problem(path, params["profile"])
    if problem is not None:
        raise ParamsError(path, [problem], key_lines(text))
    _check_stage_profile(path)
    checked = validate_params(params, path, text)
    problems = pin_problems(checked) if running else []
    if problems:
        raise ParamsError(path, problems, key_lines(text))
    return checked


def _check_stage_profile(path: Path) -> None:
    """Under ``dvc repro``, refuse to run a stage whose own profile folder's params name another profile.

    The stage's command reads ``profiles/${profile}/params.yaml``: with ``profile: default`` written in
    ``profiles/smoke/params.yaml`` a smoke stage would read and write the default profile's files, and the
    file it reads is valid. DVC names the stage's dvc.yaml in ``DVC_STAGE`` (relative to where DVC was
    started; the repository root is the usual place, and the one checked here).
    """
    stage, root = os.environ.get("DVC_STAGE", ""), os.environ.get("DVC_ROOT")
    if ":" not in stage or not root:
        return
    own = (Path(root) / stage.rpartition(":")[0]).parent / "params.yaml"
    if not own.is_file() or own.resolve() == path.resolve():
        return
    text, params = read_params_file(own)
    profile = params.get("profile") if isinstance(params, dict) else None
    problem = profile_folder_problem(own, profile)
    if problem is not None:
        raise ParamsError(own, [problem], key_lines(text))


def profile_folder_problem(path: str | os.PathLike, profile: Any) -> Problem | None:
    """Why the ``profile`` written in a profile's own file (``profiles/<name>/params.yaml``) is not its folder's.

    The folder's dvc.yaml and lock belong to that profile, while the stages write under
    ``data/<profile>/``: another name would put one profile's outputs in another's lock. A file
    elsewhere (a small study's, a test's) names whatever profile it likes.
    """
    path = Path(path).absolute()
    folder = path.parent
    in_profiles = folder.parent.name == "profiles" or (folder.parent / "base.yaml").is_file()
    if path.name != "params.yaml" or not in_profiles or profile == folder.name:
        return None
    return Problem("profile", f"is {profile!r} in the folder of profile {folder.name!r} ({folder}): a profile's "
                              f"params file names its own folder's profile, as its dvc.yaml and dvc.lock are that "
                              f"profile's and the stages write under data/<profile>/; write profile: {folder.name}, "
                              f"or copy the file outside profiles/ to run it as another profile")


def base_params() -> Params:
    """``profiles/base.yaml`` typed: the method's settings as the paper defines them, every key the schema
    knows. What a library function or a test starts from when it has no profile: take a section's
    settings from it and change the keys that matter (``dataclasses.replace``). The rules across keys
    are left out: the base names no datasets or variants of its own."""
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
