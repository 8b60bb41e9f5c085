"""Checking a whole params mapping: keys and types by the sections, then the rules across keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from qac.params.errors import ParamsError, Problem, schema_problems
from qac.params.locations import profiles_root
from qac.params.model_lengths import length_problems
from qac.params.model_sources import model_source_problems
from qac.params.rules import cross_field_problems
from qac.params.sections import Params
from qac.params.reading import read_params_file
from qac.params.yaml_io import key_lines

def validate_params(params: Any, path: str | Path | None = None, text: str | None = None,
                    complete: bool | None = None) -> Params:
    """Check a whole params mapping; raise :class:`ParamsError` naming every broken key (and its line).

    A complete file (a rendered profile: every key of ``profiles/base.yaml``) is checked as it is,
    the rules across keys included. A partial one (a hand-written file naming only some sections, as
    small studies and tests write) is checked key by key, merged onto ``profiles/base.yaml``: every
    key it has is known, typed and in range; the rules across keys are left out, since they would
    weigh its values against base values it never chose. ``complete`` None: complete when ``text``
    carries a render digest (``qac profile render`` wrote it), when it sets every section, or when no
    base file is found.
    """
    lines = key_lines(text) if text is not None else {}
    if not isinstance(params, Mapping):
        raise ParamsError(path, [Problem("", f"expected a mapping of parameters, found "
                                             f"{type(params).__name__}")], lines)
    base = None if complete else _base_params()
    if complete is None:
        complete = (base is None or (text is not None and "# render-digest: " in text)
                    or all(name in params for name in Params.model_fields))
    checked = dict(params) if complete or base is None else _merged(base, params)
    try:
        model = Params.model_validate(checked)
    except ValidationError as error:
        raise ParamsError(path, schema_problems(error), lines) from None
    problems = cross_field_problems(model) if complete else []
    # Lengths against the models' positions hold whatever the rest of the file says: partial files too.
    problems += length_problems(model) + model_source_problems(model)
    if problems:
        raise ParamsError(path, problems, lines)
    return model


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and key not in _KEYED_SECTIONS:
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


# Mappings whose keys are names (datasets, variants, search-space entries): a file's own replace base's.
_KEYED_SECTIONS = ("datasets", "variants", "space", "stages")


def _base_params() -> dict[str, Any] | None:
    path = profiles_root() / "base.yaml"
    if not path.exists():
        return None
    return read_params_file(path)[1]
