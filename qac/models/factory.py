"""Build the pre-training model a run's settings name (``method`` and its options)."""

from __future__ import annotations

from typing import Any, Mapping

METHODS = ("none", "cocondenser", "cotmae")


def build_pretraining_model(settings: Mapping[str, Any], seed: int, full_vocab_logits: bool = False):
    """coCondenser or CoT-MAE initialised from ``settings["init"]`` (a model spec)."""
    from qac.models.cocondenser import CoCondenser
    from qac.models.cotmae import CoTMAE

    method = settings["method"]
    if method == "cocondenser":
        return CoCondenser.from_spec(
            settings["init"], seed=seed, dropout=settings.get("dropout"), n_head_layers=int(settings["n_head_layers"]),
            skip_from=int(settings["skip_from"]), temperature=float(settings["temperature"]),
            mlm_probability=float(settings["mlm_probability"]), full_vocab_logits=full_vocab_logits,
            loss_weights=settings.get("cocondenser_loss_weights", "paper"))
    if method == "cotmae":
        return CoTMAE.from_spec(
            settings["init"], seed=seed, dropout=settings.get("dropout"), decoder=settings["cotmae_decoder"],
            decoder_layers=int(settings["cotmae_decoder_layers"]),
            decoder_weight=float(settings["cotmae_decoder_weight"]),
            attention_window=int(settings["cotmae_attention_window"]),
            mask_ratio=float(settings["cotmae_mask_ratio"]),
            decoder_mask_ratio=float(settings["cotmae_decoder_mask_ratio"]),
            full_vocab_logits=full_vocab_logits)
    raise ValueError(f"method must be one of {METHODS} (none exports the init encoder), got {method!r}")
