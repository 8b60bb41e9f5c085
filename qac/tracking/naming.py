"""What a run is, for people and for queries: run names and variant parameters.

A run name leads with what differs between runs of one kind, so the runs
table reads as a list of variants (``cocondenser · query · C=5 · r1``); the
DVC stage that made the run stays in the tag ``qac.stage``. Every run of a
variant (pre-training, fine-tuning, evaluation) and every baseline carries the
same variant parameters (``method``, ``context_type``, ``query_count``,
``cotmae_decoder``, ``master_decoders``, ``variant``, ``retriever``), so MLflow's compare view and
``mlflow.search_runs`` can pivot on them.
"""

from __future__ import annotations

from typing import Any, Mapping

SEPARATOR = " · "


def run_name(*parts: Any) -> str:
    """``run_name("cotmae", "passage", "pretrain") == "cotmae · passage · pretrain"`` (empty parts dropped)."""
    return SEPARATOR.join(str(part) for part in parts if part not in (None, ""))


def variant_description(params: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """The variant's identity as flat parameters: what a pivot table needs to tell variants apart.

    ``context_type`` is ``none`` and ``query_count`` 0 for method ``none`` (nothing
    is pre-trained); otherwise the values equal the ``qac.*`` tags the reports
    read, so parameters and tags never disagree.
    """
    from qac.train.pretrain import PretrainSettings

    settings = PretrainSettings.from_params(params, variant)
    trained = settings.method != "none"
    context = settings.context_type if trained else "none"
    return {
        "variant": variant,
        "method": settings.method,
        "context_type": context,
        "query_count": settings.query_count if trained else 0,
        "cotmae_decoder": settings.cotmae_decoder if settings.method == "cotmae" else "none",
        "master_decoders": ",".join(settings.master_decoders) if settings.method == "master" else "none",
        "init": settings.init,
    }


def baseline_description(retriever: str) -> dict[str, Any]:
    """Variant parameters of a baseline that is no pre-training variant (BM25)."""
    return {"variant": retriever, "method": retriever, "context_type": "none", "query_count": 0,
            "cotmae_decoder": "none", "master_decoders": "none", "retriever": retriever}


def variant_label(description: Mapping[str, Any]) -> str:
    """``cocondenser · query · C=5``; ``cocondenser · passage`` (C plays no part); ``none`` untrained."""
    if description["method"] == "none" or description["context_type"] == "none":
        return str(description["method"])
    parts = [description["method"], description["context_type"]]
    if description["context_type"] in ("query", "mixed"):
        parts.append(f"C={description['query_count']}")
    if description["method"] == "cotmae" and description.get("cotmae_decoder") not in (None, "none", "paper"):
        parts.append(f"decoder={description['cotmae_decoder']}")
    decoders = description.get("master_decoders")
    if description["method"] == "master" and decoders not in (None, "none", "mkp,cmp,npr,dor,gor"):
        parts.append(f"decoders={decoders.replace(',', '+')}")
    return run_name(*parts)


def variant_run_name(description: Mapping[str, Any], role: str) -> str:
    """The run name of one role (``pretrain``, ``r1``, ``r2``, ``untuned``) of a variant."""
    return run_name(variant_label(description), role)

