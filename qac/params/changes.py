"""Changing parameters: a new checked set from an old one and some keys set by their dotted names.

The parameters are frozen, so a change makes a new set, checked again as a whole: a trial's
values (``qac hpo``), a command line's overrides, a test's smaller study. A value out of range
or a key that does not exist stops the change with the same :class:`ParamsError` a file gets.
"""

from __future__ import annotations

from typing import Any, Mapping

from qac.params.errors import ParamsError, Problem
from qac.params.sections import Params
from qac.params.validation import validate_params


def with_values(params: Params, values: Mapping[str, Any]) -> Params:
    """``params`` with each dotted key of ``values`` (``finetune.lr``, ``pretrain.variants.x.lr``) set.

    The section holding a key must exist (a new variant or dataset is a whole entry set at its
    parent's key); the result is checked as a whole, the rules across keys included."""
    data = params.to_dict()
    for dotted, value in values.items():
        assign(data, dotted, value)
    return validate_params(data, complete=True)


def assign(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in plain parameters ``data`` (which must already hold the section ``a.b``)."""
    *parents, last = dotted.split(".")
    node: Any = data
    for depth, part in enumerate(parents):
        if not isinstance(node, dict) or part not in node or not isinstance(node[part], dict):
            raise ParamsError(None, [Problem(".".join(parents[:depth + 1]), f"no such section to set {dotted} in")])
        node = node[part]
    node[last] = value
