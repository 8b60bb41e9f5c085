"""A pre-training variant's identity, computed once from the checked params: its settings and its seed.

Training (:class:`qac.train.pretrain.PretrainSettings`), run names and variant parameters
(:mod:`qac.tracking.naming`) read a variant through :func:`variant_settings`, so what a run is called
and what it trains with are one computation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qac.params.sections import Params

# Keys of a variant's entry that say which runs it stands for, not how one trains.
_RUN_KEYS = ("seeds", "seed", "seed_of")


def variant_settings(params: Params, variant: str) -> dict[str, Any]:
    """Every setting variant ``variant`` pre-trains with: ``pretrain.common`` with the keys the variant sets
    over it (a seed copy trains as its variant does), its context type and query count, its seed (a seed
    copy's own, else the global one) and how the split stage cut the passages (``split.spans``)."""
    section = params.pretrain
    spec = section.variants[variant]
    overrides = {key: value for key, value in spec.to_dict().items() if key not in _RUN_KEYS}
    return {**section.common.to_dict(), **overrides, "context_type": spec.context_type,
            "query_count": spec.query_count, "seed": params.seed if spec.seed is None else spec.seed,
            "spans": params.split.spans}
