"""What a run is, for people and for queries: run names and variant parameters.

A run name leads with what differs between runs, so the part that tells two
runs apart survives a narrow column in the MLflow runs table: the query count
and context type before the method (``C=5 · query · cocondenser``), and the
retriever before the variant (``r1 · C=5 · query · cocondenser``; a
pre-training run ends in ``pretrain``, as its retrievers nest under it). The
DVC stage that made the run stays in the tag ``qac.stage``. Every run of a
variant (pre-training, fine-tuning, evaluation) and every baseline carries the
variant parameters that mean something for it (``variant``, ``method``,
``context_type``; ``query_count`` only for query or mixed context,
``cotmae_decoder`` only for CoT-MAE,
``master_decoders`` only for MASTER; ``retriever``), so MLflow's compare view
and ``mlflow.search_runs`` can pivot on them without a ``C=4`` on a run that
never read a generated query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from qac.config import checked_variant
from qac.params.variants import variant_settings

if TYPE_CHECKING:
    from qac.params.sections import Params

SEPARATOR = " · "


def run_name(*parts: Any) -> str:
    """``run_name("cotmae", "passage", "pretrain") == "cotmae · passage · pretrain"`` (empty parts dropped)."""
    return SEPARATOR.join(str(part) for part in parts if part not in (None, ""))


def variant_description(params: Params, variant: str) -> dict[str, Any]:
    """The variant's identity as flat parameters: what a pivot table needs to tell variants apart.

    ``context_type`` is ``none`` for method ``none`` (nothing is pre-trained);
    ``query_count`` appears only where queries are read (query or mixed
    context), ``cotmae_decoder`` only for CoT-MAE. The values equal the
    ``qac.*`` tags, so parameters and tags never disagree.
    """
    settings = variant_settings(params, checked_variant(params, variant))
    trained = settings["method"] != "none"
    context = settings["context_type"] if trained else "none"
    description = {"variant": variant, "method": settings["method"], "context_type": context}
    if context in ("query", "mixed"):
        description["query_count"] = settings["query_count"]
    if settings["method"] == "cotmae":
        description["cotmae_decoder"] = settings["cotmae_decoder"]
    if settings["method"] == "master":
        description["master_decoders"] = ",".join(settings["master_decoders"])
    description["seed"] = settings["seed"]
    seed_of = params.pretrain.variants[variant].seed_of
    if seed_of:   # a seed copy: the variant it repeats with another seed
        description["seed_of"] = seed_of
    description["init"] = settings["init"]
    return description


def baseline_description(retriever: str) -> dict[str, Any]:
    """Variant parameters of a baseline that is no pre-training variant (BM25)."""
    return {"variant": retriever, "method": retriever, "context_type": "none", "retriever": retriever}


def variant_label(description: Mapping[str, Any]) -> str:
    """``C=5 · query · cocondenser``; ``passage · cocondenser`` (C plays no part); ``none`` untrained.

    Most specific first: variants of one study mostly share their method.
    """
    if description["method"] == "none" or description["context_type"] == "none":
        return str(description["method"])
    parts = []
    if description["method"] == "cotmae" and description.get("cotmae_decoder") not in (None, "none", "paper"):
        parts.append(f"decoder={description['cotmae_decoder']}")
    decoders = description.get("master_decoders")
    if description["method"] == "master" and decoders not in (None, "none", "mkp,cmp,npr,dor,gor"):
        parts.append(f"decoders={decoders.replace(',', '+')}")
    if description["context_type"] in ("query", "mixed"):
        parts.append(f"C={description['query_count']}")
    parts += [description["context_type"], description["method"]]
    if description.get("seed_of"):
        parts.insert(0, f"seed={description['seed']}")
    return run_name(*parts)


def variant_run_name(description: Mapping[str, Any], role: str) -> str:
    """The run name of one role of a variant: ``C=5 · query · cocondenser · pretrain``, ``r1 · C=5 · query · cocondenser``.

    A pre-training run leads with its variant (its siblings are other variants);
    a retriever's run leads with its role (its siblings are the other retriever).
    """
    if role == "pretrain":
        return run_name(variant_label(description), role)
    return run_name(role, variant_label(description))

