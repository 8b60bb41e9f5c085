"""Settings as ``profiles/base.yaml`` and the schema set them, with a test's own keys over them.

The settings classes hold no defaults (the schema and the base file do), so a test that needs a
small model or a short run names what it changes and takes the method's settings for the rest.
"""

from __future__ import annotations

from typing import Any

from qac.params import base_params, base_settings
from qac.params.sections import PretrainVariant


def pretrain_settings(**values: Any):
    """A pre-training variant: ``pretrain.common`` of the base, a variant's schema defaults (passage
    context, one query), the base's ``split.spans`` and seed, then ``values``."""
    from qac.train.pretrain import PretrainSettings

    return PretrainSettings.from_mapping(pretrain_values(**values))


def pretrain_values(**values: Any) -> dict[str, Any]:
    """The mapping :func:`pretrain_settings` builds from (for tests that pass settings to a subprocess)."""
    base = base_params()
    variant = PretrainVariant.model_fields
    return {**base.pretrain.common.to_dict(), "context_type": variant["context_type"].default,
            "query_count": variant["query_count"].default, "spans": base.split.spans, "seed": base.seed, **values}


def finetune_settings(**changes: Any):
    from qac.train.finetune import FinetuneSettings

    return base_settings(lambda params: FinetuneSettings.from_params(params.finetune, params.seed), **changes)


def sampling_settings(**changes: Any):
    from qac.querygen.generate import SamplingSettings

    return base_settings(SamplingSettings.from_params, **changes)


def split_settings(**changes: Any):
    from qac.data.splitting import SplitSettings

    return base_settings(SplitSettings.from_params, **changes)


def bm25_settings(**changes: Any):
    from qac.retrieval.bm25 import BM25Settings

    return base_settings(lambda params: BM25Settings.from_params(params.bm25), **changes)


def generator_training_settings(**changes: Any):
    from qac.querygen.train_generator import TrainSettings

    return base_settings(TrainSettings.from_params, **changes)


def continuation_settings(**changes: Any):
    from qac.querygen.continuation import ContinuationSettings

    return base_settings(ContinuationSettings.from_params, **changes)
