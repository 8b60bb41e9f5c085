"""The deviation ledger (``qac/deviations.yaml``): paper text vs the authors' release vs our profiles.

Each entry says what the paper states, what the release did and what qac
does; where the two recipes differ and both can run, ``switch`` names the
params key that chooses and ``values`` its value for each recipe. The ledger
is data: :func:`render_markdown` writes ``docs/deviations.md`` from it,
:func:`recipe_of` tells which recipe a set of parameters runs (the tables
print it), and the tests check every key it names against the profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

from qac.params.vocabulary import RECIPES
from qac.config import render_profile
from qac.params import PROFILE_NAMES

LEDGER = Path(__file__).with_name("deviations.yaml")
DOC = Path(__file__).resolve().parent.parent / "docs" / "deviations.md"
STAGES = ("pretrain", "finetune", "evaluate", "split", "querygen", "prepare", "bm25", "beir", "tables", "none")
_MISSING = object()


@dataclass(frozen=True)
class Deviation:
    id: str
    title: str
    stage: str
    paper: str
    release: str
    ours: str
    switch: str | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    recipe: str | None = None
    variant: str | None = None
    keys: tuple[str, ...] = ()
    effect: str | None = None
    sources: tuple[str, ...] = ()

    @property
    def all_keys(self) -> tuple[str, ...]:
        return ((self.switch,) if self.switch else ()) + self.keys

    def recipe_of_value(self, value: Any) -> str | None:
        """``paper`` or ``release`` when ``value`` is that recipe's value (both when they are equal), else None."""
        matches = [name for name in RECIPES if self.values.get(name, _MISSING) == value]
        return "/".join(matches) or None


def _error(path: Path, index: int, message: str) -> ValueError:
    return ValueError(f"{path}: entries[{index}]: {message}")


def parse_ledger(text: str, path: Path = LEDGER) -> list[Deviation]:
    """The ledger's entries, checked: unique ids, known stages, both recipes' values for every switch."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f":{mark.line + 1}" if mark else ""
        raise ValueError(f"{path}{at}: not valid YAML: {getattr(error, 'problem', None) or error}") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: needs a list under 'entries'")
    known = set(Deviation.__dataclass_fields__)
    deviations, seen = [], set()
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _error(path, index, "not a mapping")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise _error(path, index, f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for name in ("id", "title", "stage", "paper", "release", "ours"):
            if not isinstance(entry.get(name), str) or not entry[name].strip():
                raise _error(path, index, f"field {name!r} must be a non-empty string")
        if entry["id"] in seen:
            raise _error(path, index, f"id {entry['id']!r} appears twice")
        seen.add(entry["id"])
        if entry["stage"] not in STAGES:
            raise _error(path, index, f"stage {entry['stage']!r} is not one of {', '.join(STAGES)}")
        for name in ("keys", "sources"):
            listed = entry.get(name)
            if listed is not None and not (isinstance(listed, list)
                                           and all(isinstance(item, str) and item.strip() for item in listed)):
                raise _error(path, index, f"field {name!r} must be a list of non-empty strings")
        switch = entry.get("switch")
        if switch is not None and not (isinstance(switch, str) and switch.strip()):
            raise _error(path, index, f"field 'switch' must be a dotted params key, found {switch!r}")
        if switch is not None:
            values = entry.get("values") or {}
            if sorted(values) != sorted(RECIPES):
                raise _error(path, index, f"switch {switch}: 'values' must give exactly {' and '.join(RECIPES)}")
            if entry.get("recipe") not in RECIPES:
                raise _error(path, index, f"switch {switch}: 'recipe' (the paper profile's) must be one of "
                                          f"{', '.join(RECIPES)}")
            if entry["stage"] == "none":
                raise _error(path, index, f"switch {switch}: name the stage it changes")
        elif entry.get("values") or entry.get("recipe"):
            raise _error(path, index, "'values' and 'recipe' need a 'switch'")
        deviations.append(Deviation(**{**entry, "keys": tuple(entry.get("keys") or ()),
                                       "sources": tuple(entry.get("sources") or ()),
                                       "values": dict(entry.get("values") or {})}))
    return deviations


@lru_cache(maxsize=1)
def load_ledger() -> tuple[Deviation, ...]:
    return tuple(parse_ledger(LEDGER.read_text(encoding="utf-8")))


def switches() -> list[Deviation]:
    return [entry for entry in load_ledger() if entry.switch]


def lookup(params: Mapping[str, Any], dotted: str) -> Any:
    """The value of ``a.b.c`` in ``params``; raises KeyError naming the first missing part."""
    node: Any = params
    for depth, part in enumerate(dotted.split(".")):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(".".join(dotted.split(".")[:depth + 1]))
        node = node[part]
    return node


def missing_keys(params: Mapping[str, Any]) -> list[str]:
    """Keys the ledger names (switches and related keys) that ``params`` lacks."""
    missing = []
    for entry in load_ledger():
        for key in entry.all_keys:
            try:
                lookup(params, key)
            except KeyError:
                missing.append(f"{entry.id}: {key}")
    return missing


def recipe_of(params: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """For each switch: the value ``params`` holds and the recipe it is (``paper``, ``release``, or None).

    ``overrides`` are a pre-training variant's own settings, which replace
    ``pretrain.common.<key>`` for that variant.
    """
    result = {}
    for entry in switches():
        try:
            value = lookup(params, entry.switch)
        except KeyError:
            continue
        if overrides and entry.switch.startswith("pretrain.common."):
            value = overrides.get(entry.switch.rsplit(".", 1)[1], value)
        result[entry.id] = {"switch": entry.switch, "value": value, "recipe": entry.recipe_of_value(value)}
    return result


def recipe_summary(params: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> str:
    """One line: ``release`` / ``paper`` when every switch runs that recipe, else each switch's recipe."""
    recipes = recipe_of(params, overrides)
    # A switch whose two recipes agree (paper/release) sides with either.
    for name in ("release", "paper"):
        if recipes and all(name in (entry["recipe"] or "").split("/") for entry in recipes.values()):
            return f"{name} recipe ({len(recipes)} switches, qac/deviations.yaml)"
    parts = [f"{key} {entry['recipe'] or 'neither'}" for key, entry in recipes.items()]
    return "mixed recipe: " + ", ".join(parts)


def _value_text(value: Any) -> str:
    return "`null`" if value is None else f"`{value}`"


def render_markdown(profiles: Mapping[str, Mapping[str, Any]]) -> str:
    """``docs/deviations.md``: every entry, with each profile's value of each switch."""
    ledger = load_ledger()
    lines = ["# Deviations: paper text, authors' release, our profiles", "",
             "Generated from `qac/deviations.yaml` by `qac deviations render`; edit that file, not this one.",
             "",
             "The paper is arXiv 2212.09598 (EMNLP 2023); the release is the `cotmae-qc` folder of the",
             "authors' IR repository with the Tevatron v1 and BEIR scripts it calls. Where the two differ, or",
             "the paper is silent, a switch (a params key) chooses; the paper profile runs what the authors",
             "ran. The tables' header names the recipe of the profile that built them.", "",
             "## Switches", "",
             "| deviation | switch | paper | release | " + " | ".join(f"{name} profile" for name in profiles) + " |",
             "|---|---|---|---|" + "---|" * len(profiles)]
    for entry in ledger:
        if not entry.switch:
            continue
        cells = []
        for params in profiles.values():
            try:
                value = lookup(params, entry.switch)
                cells.append(f"{_value_text(value)} ({entry.recipe_of_value(value) or 'neither'})")
            except KeyError:
                cells.append("not set")
        lines.append(f"| [{entry.title}](#{entry.id}) | `{entry.switch}` | {_value_text(entry.values['paper'])} | "
                     f"{_value_text(entry.values['release'])} | " + " | ".join(cells) + " |")
    lines += ["", "## Entries", ""]
    for entry in ledger:
        lines += [f"### {entry.title}", f'<a id="{entry.id}"></a>', "",
                  f"- **Paper:** {entry.paper}", f"- **Release:** {entry.release}", f"- **qac:** {entry.ours}"]
        if entry.switch:
            lines.append(f"- **Switch:** `{entry.switch}`: paper {_value_text(entry.values['paper'])}, release "
                         f"{_value_text(entry.values['release'])}; the paper profile runs the {entry.recipe} recipe.")
        if entry.keys:
            lines.append("- **Keys:** " + ", ".join(f"`{key}`" for key in entry.keys))
        if entry.effect:
            lines.append(f"- **Effect:** {entry.effect}")
        if entry.sources:
            lines.append("- **Sources:** " + "; ".join(entry.sources))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def rendered_profiles() -> dict[str, dict[str, Any]]:
    """Each profile's parameters as ``qac profile render`` merges them (no rendered file needed)."""
    return {name: render_profile(name) for name in PROFILE_NAMES}
