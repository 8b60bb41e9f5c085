"""A trial's values in the search space of ``hpo.space``: drawn (:func:`suggest_values`), applied to the
params (:func:`apply_values`) and checked before the study starts (:func:`check_values_are_taken`).

The space's grammar (its entries, :class:`Dimension`, :func:`parse_space`) is :mod:`qac.params.search_space`,
where the params file's own checks read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from qac.params.search_space import Dimension, SpaceError, check_space_against_params, parse_space

if TYPE_CHECKING:
    from qac.params.sections import Params

__all__ = ["Dimension", "SpaceError", "apply_values", "check_space_against_params", "check_values_are_taken",
           "parse_space", "suggest_values"]


def check_values_are_taken(params: Params, dimensions: list[Dimension], variant: str,
                            where: str = "hpo.space") -> None:
    """Each choice of a categorical entry and both ends of a range, set as a trial sets them, must pass
    the checks of the params themselves; the first value the searched key does not take raises.

    Without this a value the key refuses (``finetune.lr: abc``, a dropout above 1) would surface in
    every trial that draws it, as a failed trial, after the study and its workers had started.
    """
    # here, not at the top: it loads pydantic
    from qac.params import ParamsError

    for dim in dimensions:
        for label, value in _values_to_try(dim):
            try:
                apply_values(params, {dim.key: value}, variant)
            except ParamsError as error:
                raise SpaceError(f"{where}.{dim.key}: {label} is not a value {dim.key} takes "
                                 f"({_first_reason(error, dim.key)})") from None


def _values_to_try(dim: Dimension) -> list[tuple[str, Any]]:
    """(how the value is written in the entry, the value): every choice, or the two ends of a range."""
    if dim.kind == "categorical":
        return [(f"choice {choice!r}", choice) for choice in dim.choices]
    return [(f"'low' ({dim.low!r})", dim.low), (f"'high' ({dim.high!r})", dim.high)]


def _first_reason(error, key: str) -> str:
    """The first problem of a params check; another key's name is kept, as the value broke a rule there."""
    problem = error.problems[0]
    field = key.partition(".")[2]
    own = problem.key == key or (key.startswith("pretrain.") and problem.key.endswith(f".{field}"))
    return problem.message if own else f"{problem.key}: {problem.message}"


def suggest_values(trial, dimensions: list[Dimension]) -> dict[str, Any]:
    """The trial's value of every dimension, keyed like ``hpo.space``."""
    return {dim.key: dim.suggest(trial) for dim in dimensions}


def apply_values(params: Params, values: Mapping[str, Any], variant: str) -> Params:
    """``params`` with a trial's values set (``pretrain.*`` in the variant and its seed copies, which must
    equal it but for their seed), checked again as a whole."""
    # here, not at the top: it loads pydantic
    from qac.params import with_values

    copies = [name for name, spec in params.pretrain.variants.items() if name == variant or spec.seed_of == variant]
    changes: dict[str, Any] = {}
    for key, value in values.items():
        section, _, field = key.partition(".")
        if section == "pretrain":
            changes.update({f"pretrain.variants.{name}.{field}": value for name in copies})
        else:
            changes[key] = value
    return with_values(params, changes)
