"""The untuned start encoder: which model the no-pre-training variant starts from, and how it encodes.

Read from the params alone, so the tables describe the row without loading a model or the encoding code
(:mod:`qac.retrieval.dense` evaluates it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qac.params.sections import Params


def start_encoder(params: Params) -> str | None:
    """The model spec the no-pre-training variant ``none`` starts from (its ``init``, else the common one)."""
    none = params.pretrain.variants.get("none")
    if none is None:
        return None
    return none.init or params.pretrain.common.init


def baseline_settings(params: Params, spec: str | None) -> dict:
    """How to encode with the untuned model ``spec``: as it was trained (``encoders.<spec>``), else as fine-tuned.

    Returns ``pooling``, ``normalize``, ``query_max_len``, ``passage_max_len`` and the
    ``published`` figures (empty for a model the params do not describe).
    """
    finetune = params.finetune
    entry = params.encoder(spec)
    if entry is None:
        return {"pooling": finetune.pooling, "normalize": False, "query_max_len": finetune.query_max_len,
                "passage_max_len": finetune.corpus_max_len or finetune.passage_max_len, "published": []}
    return {key: getattr(entry, key)
            for key in ("pooling", "normalize", "query_max_len", "passage_max_len", "published")}
