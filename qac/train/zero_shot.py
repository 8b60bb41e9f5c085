"""The zero-shot (BEIR) retriever of Table 2, trained as the paper's footnote 2 says.

The paper trains its BEIR retriever with sentence-transformers' MS MARCO hard
negatives; the release points to BEIR's ``train_msmarco_v3.py``: mean pooling,
MultipleNegativesRankingLoss over cosine similarities scaled by 20, batches of
75 (query, positive, hard negative) triples, 350 tokens. The recipe here runs
that through the project's own fine-tuning loop (:func:`qac.train.finetune.train_biencoder`):
MNRL with scale ``s`` over unit-length vectors is InfoNCE with temperature
``1 / s`` over the positive, the query's hard negative and every other passage
of the batch, which is what :class:`qac.models.biencoder.BiEncoder` computes.
The settings come from ``beir_retriever`` in params.yaml (qac.params.sections).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qac.train.finetune import FinetuneSettings

if TYPE_CHECKING:
    from qac.params.sections import Params


#: The value of ``tables.zero_shot_retriever`` that trains and scores this retriever.
RETRIEVER = "beir"


def recipe_settings(params: Params) -> FinetuneSettings:
    """:class:`FinetuneSettings` of the zero-shot recipe from the ``beir_retriever`` section; how many
    loader processes prepare its batches (speed, not results) as fine-tuning's."""
    section = params.beir_retriever
    return FinetuneSettings(
        query_max_len=section.query_max_len, passage_max_len=section.passage_max_len, corpus_max_len=None,
        pad_to_multiple_of=section.pad_to_multiple_of, unpadded=params.finetune.unpadded,
        train_n_passages=section.train_n_passages,
        batch_size=section.batch_size, lr=section.lr, epochs=section.epochs, warmup_ratio=section.warmup_ratio,
        weight_decay=section.weight_decay, max_grad_norm=section.max_grad_norm, temperature=1.0 / section.scale,
        pooling=section.pooling, similarity="cosine" if section.loss == "cosine_mnrl" else "dot",
        dtype=section.dtype, seed=params.seed, log_every=section.log_every,
        incomplete_batch=section.incomplete_batch, loader_workers=params.finetune.loader_workers,
        prefetch_batches=params.finetune.prefetch_batches)


def trained_variants(params: Params) -> list[str]:
    """The variants whose zero-shot retriever is trained: none unless ``tables.zero_shot_retriever`` is
    ``beir``; then those of ``evaluate.zero_shot_variants`` (null: every variant), the ones Table 2 reports."""
    if params.tables.zero_shot_retriever != RETRIEVER:
        return []
    declared = list(params.pretrain.variants)
    chosen = params.evaluate.zero_shot_variants
    return declared if chosen is None else [name for name in declared if name in chosen]
