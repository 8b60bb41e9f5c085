"""Profiles and the data mirror.

Each profile (smoke, default, paper) is a folder ``profiles/<name>/`` holding
the three files DVC reads for it: ``params.yaml`` (its parameters),
``dvc.yaml`` (the study's stages: ``profiles/pipeline.yaml`` with each stage's code
dependencies generated from its imports) and
``dvc.lock`` (what last ran). ``params.yaml`` is rendered from
``profiles/base.yaml`` (the method as the paper defines it) deep-merged with
``profiles/<name>.yaml`` (the profile's sizes, data and models) by
``qac profile render``, so the three scales share one definition of the
method. Running one profile never touches another's files, and nothing
re-renders a profile behind the user's back: a params file edited by hand is
only replaced with ``--force``.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from qac.errors import UserError
from qac.import_graph import with_code_deps
from qac.params import PROFILE_NAMES, profiles_root, read_yaml, yaml_dumper
from qac.params.locations import PROFILE_PARENTS, REPO_ROOT
from qac.io import atomic_path
from qac.params.yaml_io import key_lines

PIPELINE_TEMPLATE = "pipeline.yaml"
_DIGEST_PREFIX = "# render-sha256: "       # of the file's whole text but this line: comments count as edits
_VALUES_DIGEST_PREFIX = "# render-digest: "  # earlier renders: of the values alone



def deep_merge(base: dict, override: dict) -> dict:
    """Return ``base`` with ``override`` merged in; mappings merge, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def profile_files(name: str, profiles_dir: Path) -> list[Path]:
    """The files profile ``name`` is rendered from, its own first: ``<name>.yaml``, its parent's (and so on,
    :data:`PROFILE_PARENTS`), then ``base.yaml``."""
    files, current = [], name
    while current is not None:
        files.append(profiles_dir / f"{current}.yaml")
        current = PROFILE_PARENTS.get(current)
    return files + [profiles_dir / "base.yaml"]


def render_profile(name: str, profiles_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The full parameter set of profile ``name``: base merged with the profile's overrides, checked.

    A problem is named at the file and line that wrote the key: ``profiles/<name>.yaml`` where the
    profile sets it, else ``profiles/base.yaml``; nothing is rendered from a profile that breaks the schema.
    """
    # here, not at the top: it loads pydantic
    from qac.params.errors import ParamsError, Problem
    # here, not at the top: it loads pydantic
    from qac.params.reading import read_params_file
    # here, not at the top: it loads pydantic
    from qac.params.validation import validate_params

    if name not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}")
    profiles_dir = Path(profiles_dir or profiles_root())
    sources = []           # (file, its keys' lines), the profile's first: where a problem is named
    values = []
    for path in profile_files(name, profiles_dir):
        text, read = read_params_file(path)
        if read is not None and not isinstance(read, dict):
            raise ParamsError(path, [Problem("", f"expected a mapping of parameters, found a "
                                                 f"{type(read).__name__}")])
        sources.append((path, key_lines(text)))
        values.append(read or {})
    (source, source_lines), override = sources[0], values[0]
    merged = values[-1]
    for layer in reversed(values[:-1]):       # base first, then each parent, the profile's own file last
        merged = deep_merge(merged, {key: value for key, value in layer.items() if key != "profile"}
                            if layer is not override else layer)
    try:
        params = expand_seeds(merged)
    except ParamsError as error:        # named at the profile's own file, where a profile's seeds are written
        raise ParamsError(source, error.problems, source_lines) from None
    written = override.get("profile", name) if isinstance(override, dict) else name
    if written != name:     # the file is the profile: a different name inside it is a mistake, not an override
        raise ParamsError(source, [Problem("profile", f"is {written!r} in the file of profile {name!r}: leave "
                                                      f"the key out (the file's name is the profile) or write "
                                                      f"profile: {name}")], source_lines)
    params["profile"] = name
    try:
        validate_params(params)
    except ParamsError as error:
        raise _at_sources(error.problems, sources) from None
    return params


def _at_sources(problems, sources) -> Exception:
    """``problems`` of a rendered profile as a ParamsError naming, for each key, the first of ``sources``
    (file, its keys' lines) that writes it (a key neither writes, such as a missing one, is the profile's)."""
    # here, not at the top: it loads pydantic
    from qac.params.errors import ParamsError, line_of

    places = {}
    for problem in problems:
        # The file that writes the key itself, before one that only opens its section (the profile's
        # `continuation:` when base.yaml holds the faulty continuation.temperature).
        places[problem.key] = next(((path, lines[problem.key]) for path, lines in sources if problem.key in lines),
                                   None) or next(((path, line) for path, lines in sources
                                                  if (line := line_of(lines, problem.key))), (sources[0][0], None))
    paths = {path for path, _ in places.values()}
    return ParamsError(paths.pop() if len(paths) == 1 else sources[0][0], problems,
                       {key: place for key, place in places.items() if place[1]})


SEED_SUFFIX = "-seed"


def seed_variant_name(variant: str, seed: int) -> str:
    """The name of ``variant`` run again with another ``seed``: ``<variant>-seed<seed>``."""
    return f"{variant}{SEED_SUFFIX}{seed}"


def expand_seeds(params: dict[str, Any]) -> dict[str, Any]:
    """One variant per seed: a variant's ``seeds: [s0, s1, ...]`` (or the profile's ``seeds``) becomes itself
    with seed ``s0`` and a copy ``<variant>-seed<s>`` per further seed (``seed: s``, ``seed_of: <variant>``).

    Each copy is a variant of its own, so DVC runs its pre-training, fine-tuning and evaluation as
    stages of their own; the tables read a variant and its copies as one row (mean and spread across
    seeds). The first seed keeps the variant's name, and where it is the top-level ``seed`` the
    variant's entry is left as it was, so its stages and outputs do not change.
    """
    variants = (params.get("pretrain") or {}).get("variants")
    if not variants:
        return params
    # here, not at the top: it loads pydantic
    from qac.params.errors import ParamsError, Problem

    profile_seeds = _checked_seeds(params.get("seeds"), "seeds")
    expanded = {}
    for name, spec in variants.items():
        spec = dict(spec or {})
        seeds = _checked_seeds(spec.pop("seeds", None), f"pretrain.variants.{name}.seeds")
        if seeds is None and spec.get("method") != "none":
            seeds = profile_seeds
        if not seeds or "seed_of" in spec:
            expanded[name] = spec
            continue
        first, *others = seeds
        if first != params.get("seed"):
            spec["seed"] = first
        expanded[name] = spec
        for seed in others:
            copy_name = seed_variant_name(name, seed)
            if copy_name in variants:       # a variant of that name is declared: never replace it silently
                raise ParamsError(None, [Problem(f"pretrain.variants.{name}.seeds",
                                                 f"the run with seed {seed} would be named {copy_name!r}, a variant "
                                                 "declared already: rename that variant or drop the seed")])
            expanded[copy_name] = {**spec, "seed": seed, "seed_of": name}
    params["pretrain"]["variants"] = expanded
    return params


def _checked_seeds(seeds: Any, key: str) -> list[int] | None:
    """A list of seeds as the schema allows it (integers, at least one, each once), else a ParamsError naming
    ``key``: checked while rendering, before the list is spread into variants where the schema no longer
    sees it."""
    if seeds is None:
        return None
    # here, not at the top: it loads pydantic
    from qac.params.errors import ParamsError, Problem
    # here, not at the top: it loads pydantic
    from qac.params.fields import SEEDS_RULE, seeds_distinct

    if not isinstance(seeds, list) or not all(isinstance(seed, int) and not isinstance(seed, bool) for seed in seeds):
        raise ParamsError(None, [Problem(key, f"expected a list of integer seeds, found {seeds!r}")])
    if not seeds_distinct(seeds):
        raise ParamsError(None, [Problem(key, f"expected {SEEDS_RULE}, found {seeds!r}")])
    return seeds


def variant_seed(params: Mapping[str, Any], variant: str) -> int:
    """The seed variant ``variant`` trains with: its own ``seed``, else the top-level one."""
    spec = ((params.get("pretrain") or {}).get("variants") or {}).get(variant) or {}
    return int(spec["seed"] if spec.get("seed") is not None else params["seed"])


def _leading_comment(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def _params_body(params: dict[str, Any], colons_in_flow: bool = False) -> str:
    return yaml.dump(params, Dumper=yaml_dumper(colons_in_flow), sort_keys=False, default_flow_style=None,
                     width=100, allow_unicode=False)


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def rendered_params_text(params: dict[str, Any], profiles_dir: str | os.PathLike | None = None) -> str:
    """The text of a rendered params file: a provenance header, then ``params`` as YAML.

    The header repeats the profile file's leading comment (what the profile
    scales down from the paper) and records a digest of the rendered body, so
    a later render can tell a hand-edited file from its own output.
    """
    name = params["profile"]
    profile_file = Path(profiles_dir or profiles_root()) / f"{name}.yaml"
    introduction = (
        f"# Parameters of profile '{name}', rendered by `qac profile render {name}`\n"
        f"# from {' + '.join(f'profiles/{path.name}' for path in reversed(profile_files(name, Path('.'))))}. "
        "Change the profile there and\n"
        "# re-render; edit this file (or `dvc exp run -S`) for a one-off experiment:\n"
        "# a render never replaces a hand-edited file without --force.\n"
    )
    rest = "#\n" + (_leading_comment(profile_file) if profile_file.exists() else "") + _params_body(params)
    return f"{introduction}{_DIGEST_PREFIX}{_digest(introduction + rest)}\n{rest}"


def write_params(params: dict[str, Any], path: str | os.PathLike, profiles_dir: str | os.PathLike | None = None) -> None:
    """Write ``params`` (a mapping, or checked parameters) to ``path``, atomically, as
    :func:`rendered_params_text` renders it."""
    plain = params.to_dict() if hasattr(params, "to_dict") else params
    _write_text(path, rendered_params_text(plain, profiles_dir))


def _write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)


def params_current(path: str | os.PathLike, params: dict[str, Any],
                   profiles_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``path`` holds the render of ``params`` byte for byte (the header's description included)."""
    path = Path(path)
    return path.exists() and path.read_text(encoding="utf-8") == rendered_params_text(params, profiles_dir)


def params_hand_edited(path: str | os.PathLike) -> bool:
    """Whether the params file at ``path`` differs from what its last render wrote.

    A file without a render digest (written by hand, or by a tool that dropped
    the header) counts as hand-edited: its content is the user's.
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    recorded = next((line[len(_DIGEST_PREFIX):].strip() for line in lines if line.startswith(_DIGEST_PREFIX)), None)
    if recorded is not None:     # any change to the text, a comment's included, is the user's
        return _digest("".join(line for line in lines if not line.startswith(_DIGEST_PREFIX))) != recorded
    values = next((line[len(_VALUES_DIGEST_PREFIX):].strip() for line in lines
                   if line.startswith(_VALUES_DIGEST_PREFIX)), None)
    if values is None:
        return True
    return _digest(_params_body(read_yaml(text), colons_in_flow=True)) != values   # as those renders wrote it


def rendered_pipeline_text(profiles_dir: str | os.PathLike | None = None) -> str:
    """The text of a profile's ``dvc.yaml``: the pipeline template with each stage's code dependencies
    generated from the imports of the script it runs (:func:`qac.import_graph.with_code_deps`)."""
    return with_code_deps((Path(profiles_dir or profiles_root()) / PIPELINE_TEMPLATE).read_text(encoding="utf-8"))


class HandEditedParams(RuntimeError):
    """Rendering would overwrite a params file that someone edited."""


def render_profile_files(name: str, force: bool = False, profiles_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write ``profiles/<name>/params.yaml`` and ``dvc.yaml``; return the files that changed.

    ``params.yaml`` is left alone when it already holds the render, byte for byte; a file that
    was edited by hand is only replaced with ``force`` (else
    :class:`HandEditedParams`), so an experiment's edits are never thrown away
    silently. ``dvc.yaml`` is the pipeline template with its stages' code dependencies
    (:func:`rendered_pipeline_text`).
    """
    profiles_dir = Path(profiles_dir or profiles_root())
    params = render_profile(name, profiles_dir)
    folder = profiles_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    changed = []
    params_file = folder / "params.yaml"
    if not params_current(params_file, params, profiles_dir):
        if params_file.exists() and params_hand_edited(params_file) and not force:
            raise HandEditedParams(
                f"{params_file} was edited by hand (it differs from its last render); move the change into "
                f"profiles/{name}.yaml or profiles/base.yaml, or pass --force to discard it")
        write_params(params, params_file, profiles_dir)
        changed.append(params_file)
    pipeline = rendered_pipeline_text(profiles_dir)
    dvc_file = folder / "dvc.yaml"
    if not dvc_file.exists() or dvc_file.read_text(encoding="utf-8") != pipeline:
        _write_text(dvc_file, pipeline)
        changed.append(dvc_file)
    return changed


def data_mirror() -> Path:
    """The local data mirror searched before any download (``QAC_DATA_MIRROR``)."""
    default = REPO_ROOT.parent / "shared" / "data"
    value = os.environ.get("QAC_DATA_MIRROR")
    if value is None:
        return default
    if not value.strip():
        raise UserError(f"QAC_DATA_MIRROR is set but empty: unset it to use the default mirror ({default}), or "
                        "set it to the folder of a data mirror")
    mirror = Path(value)
    if os.path.lexists(mirror) and not mirror.is_dir():
        raise UserError(f"QAC_DATA_MIRROR={value}: not a folder (a data mirror is a folder of datasets, such as "
                        f"{default})")
    return mirror


def profile_dir(params: dict[str, Any]) -> Path:
    """``data/<profile>``: where every stage of the active profile writes."""
    return Path(params.get("data_dir", "data")) / params["profile"]


class UnknownVariant(ValueError, UserError):
    """A variant named on a command line or in a call that the params file does not declare."""


def checked_variant(params: Mapping[str, Any], variant: str) -> str:
    """``variant`` if it is a key of ``pretrain.variants``; else an :class:`UnknownVariant` naming the close
    spelling or the variants there are."""
    variants = list(params["pretrain"].get("variants") or {})
    if variant not in variants:
        close = difflib.get_close_matches(variant, variants, n=1, cutoff=0.6)
        raise UnknownVariant(f"unknown variant {variant!r}: not a key of pretrain.variants in the params file"
                             + (f"; did you mean {close[0]}?" if close else f" (declared: {', '.join(variants)})"))
    return variant
