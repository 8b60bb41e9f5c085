"""A broken params file as one paragraph: every problem with its dotted key, its line and what was expected.

Pydantic's validation errors are folded into :class:`Problem` rows (one per
key, a union's branches in one message, a misspelt key with the declared key
it most likely means) and :class:`ParamsError` formats them.
"""

from __future__ import annotations

import difflib
import re
import typing
from typing import Annotated, Any, Mapping, Union

from pydantic import BaseModel, ValidationError

from qac.errors import UserError
from qac.params.sections import Params
from qac.params.yaml_io import yaml11_reading


class Problem(typing.NamedTuple):
    key: str          # dotted key ('' for the whole file)
    message: str


class ParamsError(ValueError, UserError):
    """A params file that breaks the schema: every problem with its dotted key and line."""

    def __init__(self, path: str | None, problems: list[Problem], lines: Mapping[str, Any] | None = None):
        # lines: dotted key -> its line in ``path``, or (another file, line) for a key written elsewhere
        self.path = str(path) if path else "params"
        self.problems = list(problems)
        self.lines = dict(lines or {})
        super().__init__(self.describe())

    def describe(self) -> str:
        def place(problem: Problem) -> str:
            line = line_of(self.lines, problem.key)
            if isinstance(line, tuple):          # a key written in another file than the error's (path, line)
                return f"{line[0]}:{line[1]}"
            return f"{self.path}:{line}" if line else self.path

        if all(not problem.key for problem in self.problems):
            return "; ".join(f"{place(problem)}: {problem.message}" for problem in self.problems)
        footer = ("Change it in that file (a profile's params.yaml is rendered from profiles/base.yaml and "
                  "profiles/<name>.yaml: change those, then run `qac profile render`); docs/parameters.md lists "
                  "every key with its type and range.")
        if len(self.problems) == 1:
            problem = self.problems[0]
            stop = "" if problem.message.endswith((".", "?", ")")) else "."
            return f"{place(problem)}: parameter {problem.key}: {problem.message}{stop} {footer}"
        shown = self.problems[:12]
        rows = [f"  {place(problem)}: " + (f"parameter {problem.key}: " if problem.key else "") + problem.message
                for problem in shown]
        if len(self.problems) > len(shown):
            rows.append(f"  ... and {len(self.problems) - len(shown)} more")
        return (f"{self.path}: {len(self.problems)} problems in the parameters:\n" + "\n".join(rows) + "\n"
                + footer)

    def __reduce__(self):
        return type(self), (self.path, self.problems, self.lines)


def line_of(lines: Mapping[str, Any], key: str) -> Any:
    """The line of ``key`` in ``lines``, else of its nearest enclosing key written there; None if neither is."""
    while key:
        if key in lines:
            return lines[key]
        key = key.rpartition(".")[0]
    return None


def unwrap(annotation: Any) -> Any:
    """The model or container type inside Optional / Annotated / unions."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, getattr(__import__("types"), "UnionType", Union)):
            args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            models = [arg for arg in args if isinstance(arg, type) and issubclass(arg, BaseModel)]
            containers = [arg for arg in args if typing.get_origin(arg) in (dict, list)]
            annotation = (models or containers or args)[0]
        else:
            return annotation


def known_keys_at(parts: tuple) -> list[str]:
    """The keys the schema declares inside the mapping at ``parts`` (a pydantic error location)."""
    annotation: Any = Params
    for part in parts:
        annotation = unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if part not in annotation.model_fields:
                return []
            annotation = annotation.model_fields[part].annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        else:
            return []
    annotation = unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _dotted(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def _shown(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(item, (int, float, str, bool)) for item in value) \
            and len(repr(value)) <= 60:
        return repr(value)              # a short list of plain values reads best as itself
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return repr(value)


def _expectation(error: dict) -> str:
    """What the schema wanted, in words (``an integer``, ``>= 1``, ``one of 'cls', 'mean'``)."""
    kind, context = error["type"], error.get("ctx") or {}
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "an integer"
    if kind in ("float_type", "float_parsing"):
        return "a number"
    if kind == "bool_type":
        return "true or false"
    if kind == "string_type":
        return "a string"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "a mapping of keys"
    if kind == "list_type":
        return "a list"
    if kind == "none_required":
        return "null"
    if kind == "literal_error":
        return f"one of {context.get('expected')}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        limit = next(iter(context.values()))
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return f"{bound} {limit}"
    if kind == "finite_number":
        return "a finite number"
    if kind == "string_pattern_mismatch":
        return f"a string of the form {context.get('pattern')}"
    if kind == "too_short":
        return "not empty"
    if kind == "value_error":
        return str(context.get("error") or error["msg"])
    return error["msg"]


def _type_problem(items: list[dict]) -> str:
    """One message for a key's errors (several when its type is a union: one per branch)."""
    given = items[0].get("input")
    expectations = list(dict.fromkeys(_expectation(item) for item in items))
    ranged = all(item["type"] in ("greater_than_equal", "greater_than", "less_than_equal", "less_than",
                                  "finite_number", "too_short") for item in items)
    hint = ""
    if isinstance(given, str) and re.fullmatch(r"\s*[-+]?(?=[._]*[0-9])[0-9._]+([eE][-+]?[0-9]+)?\s*", given):
        hint = " (a number written as a string: drop the quotes)"
    elif isinstance(given, str) and (older := yaml11_reading(given)) is not None:
        # `yes`, `off`, `1:30`: YAML 1.1 tools read them as booleans or numbers, DVC's YAML 1.2 as strings.
        hint = (f" (YAML 1.2, by which DVC and qac read params, reads {given} as a string where YAML 1.1 "
                f"read {older!r}: write {_yaml12_spelling(older)} if that is meant)")
    verb = "must be" if ranged else "expected"
    return f"{verb} {' or '.join(expectations)}, found {_shown(given)}{hint}"


def _yaml12_spelling(value: Any) -> str:
    """``value`` as a params file writes it for DVC's YAML 1.2 reader: ``true``, ``90``, ``0o10``."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


# Names other tools give a setting, and the key qac uses for it (suggested when that key exists there).
_ALIASES = {"learning_rate": "lr", "num_epochs": "epochs", "n_epochs": "epochs", "num_train_epochs": "epochs",
            "train_batch_size": "batch_size", "per_device_train_batch_size": "batch_size", "num_steps": "steps",
            "max_steps": "steps", "max_length": "max_len", "max_seq_length": "max_len", "seed_value": "seed"}


def _suggestion(name: str, known: list[str], missing: list[str], unknown_here: int) -> str | None:
    """The declared key a misspelt ``name`` most likely means."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    if _ALIASES.get(name) in known:
        return _ALIASES[name]
    if len(missing) == 1 and unknown_here == 1:
        return missing[0]    # one key renamed: the unknown one stands for the missing one
    return None


def schema_problems(error: ValidationError) -> list[Problem]:
    """Pydantic's errors as problems, one per key (a union's branches folded into one message)."""
    by_key: dict[tuple, list[dict]] = {}
    for item in error.errors():
        loc = _clean_location(tuple(item["loc"]))
        by_key.setdefault(loc, []).append(item)
    kinds_of = {loc: {item["type"] for item in items} for loc, items in by_key.items()}
    missing: dict[tuple, list[str]] = {}
    unknown: dict[tuple, list[str]] = {}
    for loc, kinds in kinds_of.items():
        if "missing" in kinds:
            missing.setdefault(loc[:-1], []).append(str(loc[-1]))
        if "extra_forbidden" in kinds:
            unknown.setdefault(loc[:-1], []).append(str(loc[-1]))
    explained: set[tuple] = set()      # missing keys that a misspelling accounts for
    problems = []
    for loc, items in by_key.items():
        kinds, key, parent = kinds_of[loc], _dotted(loc), loc[:-1]
        if "extra_forbidden" in kinds:
            known = known_keys_at(parent)
            close = _suggestion(str(loc[-1]), known, missing.get(parent, []), len(unknown.get(parent, [])))
            if close is not None:
                explained.add(parent + (close,))
            prefix = _dotted(parent) + "." if parent else ""
            hint = f"; did you mean {prefix}{close}?" if close else ""
            scope = f"{_dotted(parent)} has" if parent else "the file has"
            listing = f" ({scope}: {', '.join(known)})" if known and not close and len(known) <= 40 else ""
            problems.append(Problem(key, f"unknown key{hint}{listing}"))
        elif loc and loc[-1] == "[key]":
            # A mapping's key is a name (a dataset, a variant): the problem is the mapping's, naming the key.
            problems.append(Problem(_dotted(loc[:-2]), f"key {items[0].get('input')!r}: "
                                    f"{_type_problem(items)}"))
        elif "missing" not in kinds:
            problems.append(Problem(key, _type_problem(items)))
    for loc, kinds in kinds_of.items():
        if "missing" in kinds and loc not in explained:
            problems.append(Problem(_dotted(loc), "missing: this key is required (docs/parameters.md lists every "
                                                  "key; profiles/base.yaml has its usual value)"))
    return problems


def _clean_location(loc: tuple) -> tuple:
    """A pydantic error location without the union branch tags (``'int'``, ``'literal[...]'``,
    ``'PretrainVariant'``) that pydantic inserts after a field whose type is a union of several types."""
    annotation: Any = Params
    clean: list = []
    parts = list(loc)
    while parts:
        annotation = _strip(annotation)
        members = _union_members(annotation)
        if len(members) > 1 and isinstance(parts[0], str):
            tag = parts.pop(0)
            chosen = next((m for m in members if isinstance(m, type) and getattr(m, "__name__", None) == tag),
                          None)
            if chosen is None and tag.startswith("dict["):
                chosen = next((m for m in members if typing.get_origin(m) is dict), None)
            if chosen is None and tag.startswith("list["):
                chosen = next((m for m in members if typing.get_origin(m) is list), None)
            annotation = chosen
            continue
        part = parts.pop(0)
        clean.append(part)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = annotation.model_fields.get(part)
            annotation = info.annotation if info is not None else None
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        else:
            annotation = None
    return tuple(clean)


def _strip(annotation: Any) -> Any:
    """``annotation`` without Annotated wrappers and without None in a union."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    members = _union_members(annotation)
    if len(members) == 1 and members[0] is not annotation:
        return _strip(members[0])
    return annotation


def _union_members(annotation: Any) -> list:
    import types

    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return [annotation]
