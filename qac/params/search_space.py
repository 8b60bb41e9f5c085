"""The search space of a study, declared in ``params.yaml`` under ``hpo.space``.

Each entry maps a parameter key to its range::

    hpo:
      space:
        pretrain.lr:            {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
        pretrain.query_count:   {type: int, low: 1, high: 20}
        pretrain.cotmae_decoder: {type: categorical, choices: [paper, release]}
        finetune.lr:            null        # null: not searched (lets a profile drop a base entry)

A ``pretrain.<field>`` key is a pre-training setting of the variant the study
searches (``hpo.variant``): the trial's value is written into that variant, so
it wins over ``pretrain.common`` exactly as a variant's own settings do. Any
other key is a dotted path into the parameters (``finetune.lr``) and must name
an existing setting. Values are checked when the study starts, so a typo fails
before any trial runs, with an error that names the key.

The grammar sits with the parameters, whose rules check ``hpo.space`` while reading the file
(:func:`qac.params.rules.search_space`); :mod:`qac.hpo.space` draws and applies a trial's values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from qac.params.vocabulary import SPACE_KINDS

_FIELDS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}
# Variant keys that are not in pretrain.common but that a variant may set.
_VARIANT_ONLY_KEYS = ("method", "context_type", "query_count", "init")


class SpaceError(ValueError):
    """A search-space entry that cannot be used; the message names the key."""


@dataclass(frozen=True)
class Dimension:
    """One searched parameter: its key, its type and its bounds or choices."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        """Draw this dimension's value for an Optuna trial."""
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.key, self.low, self.high, log=self.log, step=self.step or 1)
        return trial.suggest_categorical(self.key, list(self.choices))


def parse_space(space: Mapping[str, Any] | None, where: str = "hpo.space") -> list[Dimension]:
    """Check the ``hpo.space`` mapping and turn it into dimensions (null entries are skipped)."""
    if not space:
        raise SpaceError(f"{where}: the search space is empty; declare at least one parameter")
    if not isinstance(space, Mapping):
        raise SpaceError(f"{where}: expected a mapping of parameter key -> range, got {type(space).__name__}")
    dimensions = [_parse_entry(str(key), entry, f"{where}.{key}")
                  for key, entry in space.items() if entry is not None]
    if not dimensions:
        raise SpaceError(f"{where}: every entry is null; declare at least one parameter")
    return dimensions


def _parse_entry(key: str, entry: Any, where: str) -> Dimension:
    if not isinstance(entry, Mapping):
        raise SpaceError(f"{where}: expected a mapping like {{type: float, low: .., high: ..}}, got {entry!r}")
    kind = entry.get("type")
    if kind not in SPACE_KINDS:
        raise SpaceError(f"{where}: 'type' must be one of {', '.join(SPACE_KINDS)}, got {kind!r}")
    unknown = set(entry) - _FIELDS[kind]
    if unknown:
        raise SpaceError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))} for type {kind} "
                         f"(allowed: {', '.join(sorted(_FIELDS[kind]))})")
    if kind == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{where}: 'choices' must be a non-empty list")
        for choice in choices:
            if choice is not None and not isinstance(choice, (str, int, float, bool)):
                raise SpaceError(f"{where}: choice {choice!r} is not a string, number, boolean or null")
        if len(set(map(repr, choices))) != len(choices):
            raise SpaceError(f"{where}: 'choices' lists a value twice")
        return Dimension(key=key, kind=kind, choices=tuple(choices))

    for bound in ("low", "high"):
        if bound not in entry:
            raise SpaceError(f"{where}: '{bound}' is required for type {kind}")
    low, high = entry["low"], entry["high"]
    log = entry.get("log", False)
    step = entry.get("step")
    number = int if kind == "int" else (int, float)
    for name, value in (("low", low), ("high", high)) + ((("step", step),) if step is not None else ()):
        if isinstance(value, bool) or not isinstance(value, number):
            raise SpaceError(f"{where}: '{name}' must be {'an integer' if kind == 'int' else 'a number'}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SpaceError(f"{where}: '{name}' must be finite, got {value!r}")
    if not isinstance(log, bool):
        raise SpaceError(f"{where}: 'log' must be true or false, got {log!r}")
    if low > high:
        raise SpaceError(f"{where}: 'low' ({low}) is above 'high' ({high})")
    if log and low <= 0:
        raise SpaceError(f"{where}: a log-scaled range needs 'low' > 0, got {low}")
    if step is not None:
        if step <= 0:
            raise SpaceError(f"{where}: 'step' must be positive, got {step}")
        if log:
            raise SpaceError(f"{where}: 'step' and 'log' cannot be combined (Optuna samples one or the other)")
    if kind == "float":
        low, high = float(low), float(high)
    return Dimension(key=key, kind=kind, low=low, high=high, log=log, step=step)


def check_space_against_params(dimensions: list[Dimension], params: Mapping[str, Any], variant: str,
                               where: str = "hpo.space") -> None:
    """Every key must name a setting that exists; ``pretrain.query_count`` must fit the generated queries."""
    variants = params.get("pretrain", {}).get("variants", {})
    if variant not in variants:
        raise SpaceError(f"hpo.variant: {variant!r} is not a pre-training variant "
                         f"(pretrain.variants has {', '.join(variants) or 'none'})")
    common = params["pretrain"].get("common", {})
    for dim in dimensions:
        section, _, field = dim.key.partition(".")
        if section == "hpo":
            # A trial's copy of the params cannot change the study that runs it (its budget, storage, space).
            raise SpaceError(f"{where}.{dim.key}: the study's own settings (hpo.*) cannot be searched; "
                             "search pre-training (pretrain.<field>) or other settings")
        if section == "pretrain":
            if not field or "." in field or (field not in common and field not in _VARIANT_ONLY_KEYS):
                raise SpaceError(f"{where}.{dim.key}: not a pre-training setting (pretrain.<field> with a "
                                 f"field of pretrain.common or one of {', '.join(_VARIANT_ONLY_KEYS)})")
        else:
            node: Any = params
            for part in dim.key.split("."):
                if not isinstance(node, Mapping) or part not in node:
                    raise SpaceError(f"{where}.{dim.key}: no such parameter in params.yaml")
                node = node[part]
            if isinstance(node, Mapping):
                raise SpaceError(f"{where}.{dim.key}: names a section, not a single setting")
        if dim.key == "pretrain.query_count":
            available = params.get("querygen", {}).get("queries_per_passage")
            if available is not None and dim.high > available:
                raise SpaceError(f"{where}.{dim.key}: 'high' ({dim.high}) exceeds querygen.queries_per_passage "
                                 f"({available}), the number of generated queries per passage")
            if dim.low < 1:
                raise SpaceError(f"{where}.{dim.key}: 'low' must be at least 1, got {dim.low}")
