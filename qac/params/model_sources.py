"""Model specs that name nothing loadable, found before any model loads.

``pretrain.common.init: /data/models/bert`` with a typo in the folder, or a
name no hub can hold (``my model``), would stop a stage seconds in, inside
transformers, with a chain of tracebacks about repository ids. Each key that
names a model is checked here: a spec that is written as a path must be a
folder, and any other must be a valid hub name. Whether a valid hub name can
be fetched (network, cache) is only known when it loads; the stage then names
it in one paragraph (:func:`qac.model_specs.unloadable_model_message`).
"""

from __future__ import annotations

from qac.model_specs import spec_problem
from qac.params.errors import Problem
from qac.params.sections import Params


def model_keys(params: Params) -> list[tuple[str, str]]:
    """``(dotted key, spec)`` of every key that names a model or tokenizer to load."""
    keys = [("pretrain.common.init", params.pretrain.common.init), ("split.tokenizer", params.split.tokenizer),
            ("query_generator.model", params.query_generator.model), ("continuation.model", params.continuation.model),
            ("annotation.judge_model", params.annotation.judge_model)]
    for name, variant in params.pretrain.variants.items():
        if "init" in variant.model_fields_set and variant.init is not None:
            keys.append((f"pretrain.variants.{name}.init", variant.init))
    keys += [(f"llm_queries.generators.{name}.model", entry.model)
             for name, entry in params.llm_queries.generators.items()]
    keys += [(f"reference_retrievers.{index}", spec) for index, spec in enumerate(params.reference_retrievers)]
    return keys


def model_source_problems(params: Params) -> list[Problem]:
    """A problem for each model key whose spec is a missing folder or no possible hub name."""
    problems = []
    for key, spec in model_keys(params):
        problem = spec_problem(spec)
        if problem:
            problems.append(Problem(key, problem))
    return problems
