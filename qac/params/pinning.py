"""Pinning a profile's hub models to commits: ``qac profile pin NAME``.

A hub name without a revision loads whatever the model's owners pushed last, so two runs of one profile
can train from different weights and say the same thing in their lineage. A profile that sets
``pinned_models`` (the paper's) refuses to run until every hub model it loads is written
``name@<commit>`` (:func:`qac.params.model_sources.pin_problems`). This module asks the hub which commit
each unpinned name is at now and writes that commit where the profile's own file names the model, leaving
the rest of the file (comments, order) as it was. The hub is whatever ``huggingface_hub`` is pointed at
(``HF_ENDPOINT``, ``HF_TOKEN``), so a mirror or a private hub works the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from qac.errors import UserError
from qac.model_specs import REVISION_MARK, is_commit, split_revision
from qac.io import atomic_path
from qac.redaction import redact_text


@dataclass(frozen=True)
class Pin:
    """One hub model pinned: the keys that name it, its commit, how many places of the file were written."""

    name: str
    commit: str
    keys: tuple[str, ...]
    places: int


def hub_commit(name: str, endpoint: str | None = None) -> str:
    """The commit the hub's main branch of model ``name`` is at now (40 hex digits); ``endpoint`` None: the
    hub ``huggingface_hub`` is set to (``HF_ENDPOINT``, else huggingface.co)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    try:
        commit = HfApi(endpoint=endpoint).model_info(name).sha
    except OfflineModeIsEnabled:
        raise UserError(f"{name}: the hub is switched off here (HF_HUB_OFFLINE is set); pin it by hand as "
                        f"{name}@<commit>") from None
    except RepositoryNotFoundError:
        raise UserError(f"{name}: no such model on the hub (or it is private: set HF_TOKEN)") from None
    except HfHubHTTPError as error:
        raise UserError(f"{name}: the hub answered {error.response.status_code if error.response is not None else '?'} "
                        f"when asked for its commit") from None
    except Exception as error:      # no network, no such host, refused: the HTTP client's own error classes
        raise UserError(f"{name}: the hub cannot be reached ({type(error).__name__}: {redact_text(str(error), endpoint or '')}); pin "
                        f"it by hand as {name}@<commit>, or run this where the hub is reachable") from None
    if not is_commit(commit):
        raise UserError(f"{name}: the hub gave {commit!r} as its commit, not 40 hex digits")
    return commit


def unpinned_models(params) -> dict[str, list[str]]:
    """``hub name -> keys`` for every hub model the checked ``params`` load without any revision (one written
    with a branch or tag is the user's to change: a commit appended to it would not parse)."""
    # here, not at the top: it loads pydantic
    from qac.params.model_sources import unpinned_keys

    return {spec: keys for spec, keys in unpinned_keys(params).items() if split_revision(spec)[1] is None}


def _value_pattern(name: str) -> re.Pattern[str]:
    # The name as a YAML value: after "key: ", "- ", "[" or "," (a flow list or mapping), quoted or not; not a
    # mapping key (encoders names a model as published) and not already followed by a revision.
    return re.compile(rf"(?P<before>(?:^|[:\[,])\s*|^\s*-\s+)(?P<quote>['\"]?)(?P<name>{re.escape(name)})"
                      rf"(?![\w./@-])(?!['\"]?\s*:(?:\s|$))")


_COMMENT = re.compile(r"(?:^|\s)#")


def _code_and_comment(line: str) -> tuple[str, str]:
    # A comment can name a model ("bert-base-uncased / Luyu/condenser"); only the YAML before it is pinned.
    found = _COMMENT.search(line)
    return (line, "") if found is None else (line[:found.start()], line[found.start():])


def _names_value(text: str, name: str) -> bool:
    pattern = _value_pattern(name)
    return any(pattern.search(_code_and_comment(line)[0]) for line in text.splitlines())


def pinned_text(text: str, commits: dict[str, str]) -> tuple[str, dict[str, int]]:
    """``text`` with each name of ``commits`` written ``name@<commit>`` where it is a value (comments left as
    they are); the count of places per name."""
    counts = dict.fromkeys(commits, 0)
    lines = []
    for line in text.splitlines(keepends=True):
        code, comment = _code_and_comment(line)
        for name, commit in commits.items():
            code, count = _value_pattern(name).subn(rf"\g<before>\g<quote>\g<name>{REVISION_MARK}{commit}", code)
            counts[name] += count
        lines.append(code + comment)
    return "".join(lines), counts


def pin_profile(source: str | Path, params, resolve: Callable[[str], str] = hub_commit,
                write: bool = True) -> list[Pin]:
    """Pin every unpinned hub model of ``params`` (a profile's checked, rendered parameters) in ``source``,
    the profile's own file (``profiles/<name>.yaml``); return what was pinned.

    Every name is resolved before the file is touched, and the file is replaced whole (temp file, then
    rename), so a hub that fails half-way leaves it as it was. A model that the profile only inherits
    (from its parent or ``profiles/base.yaml``) cannot be pinned in another file's place: that is an error
    naming the key to add to the profile's own file.
    """
    source = Path(source)
    wanted = unpinned_models(params)
    if not wanted:
        return []
    text = source.read_text(encoding="utf-8")
    inherited = {spec: keys for spec, keys in wanted.items() if not _names_value(text, spec)}
    if inherited:
        listed = "; ".join(f"{', '.join(keys)} ({spec})" for spec, keys in inherited.items())
        raise UserError(f"{source}: {listed} come from a file this profile inherits; write each key in {source} "
                        "(the same value) and pin again, so that the pin is this profile's own")
    commits = {spec: resolve(spec) for spec in wanted}
    new_text, counts = pinned_text(text, commits)
    if write:
        with atomic_path(source) as staging:
            staging.write_text(new_text, encoding="utf-8")
    return [Pin(spec, commits[spec], tuple(keys), counts[spec]) for spec, keys in wanted.items()]
