"""The parameters of a study: one typed schema, checked before any work.

A params file (``profiles/base.yaml`` merged with a profile, rendered to
``profiles/<name>/params.yaml``) is read by :func:`load_params` and checked in
two ways (:func:`validate_params`):

- per key: type and range, by the pydantic sections (:mod:`qac.params.sections`;
  strict: ``"8"`` is not a number, ``true`` is not 1);
- across keys (:mod:`qac.params.rules`): a variant's ``query_count`` within
  ``querygen.queries_per_passage``, batch sizes that divide, datasets and
  variants that are declared, depths within the corpus a profile keeps, ...

A broken file stops the caller with one :class:`ParamsError` paragraph naming
every key and its line (:mod:`qac.params.errors`). The modules:

- ``fields``: constrained types and keys shared by several sections;
- ``sections``: one model per section, :class:`Params` the whole file;
- ``rules``: the rules across keys, one function per rule or section;
- ``errors``: pydantic's errors as problems with key and line;
- ``yaml_io``: YAML as DVC reads and writes it, the line of every key;
- ``reading``: a params file's text and values, a bad byte or bad YAML named with its line;
- ``model_lengths``, ``model_sources``: lengths against the models' positions, model specs that name nothing;
- ``locations``: which params file a stage reads;
- ``validation``, ``loading``: checking a mapping, reading a file (typed and frozen);
- ``changes``: a new checked set with some keys set (a trial's values, overrides);
- ``documentation``: ``docs/parameters.md`` (``qac profile docs``).

A new parameter is declared in ``sections`` (a field with its type, range and
description) in the same commit that adds it to ``profiles/base.yaml``;
``tests/test_params_schema.py`` fails on a key of a profile the schema does not
know, and on a stale ``docs/parameters.md``.
"""

from qac.params.locations import DEFAULT_PROFILE, PROFILE_NAMES, params_path, profile_params_path, profiles_root
from qac.params.yaml_io import read_yaml, yaml_dumper, yaml_loader

# Names that need pydantic are imported when first used: reading a profile's YAML or locating
# its file must work where pydantic is not installed (the GPU benchmark's bare machine).
_LAZY = {"ParamsError": "errors", "Problem": "errors", "known_keys_at": "errors", "load_params": "loading",
         "base_params": "loading", "base_settings": "loading", "Params": "sections", "validate_params": "validation",
         "with_values": "changes"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"qac.params.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'qac.params' has no attribute {name!r}")


__all__ = ["DEFAULT_PROFILE", "PROFILE_NAMES", "Params", "ParamsError", "Problem", "base_params", "base_settings",
           "known_keys_at",
           "load_params", "params_path", "profile_params_path", "profiles_root", "read_yaml", "validate_params",
           "with_values", "yaml_dumper", "yaml_loader"]
