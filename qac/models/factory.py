"""Build the pre-training model a run's settings name (``method`` and its options), and its batches."""

from __future__ import annotations

from typing import Any, Mapping

from qac.params.vocabulary import METHODS


def build_pretraining_model(settings, seed: int, full_vocab_logits: bool = False):
    """coCondenser, CoT-MAE or MASTER initialised from ``settings.init`` (a model spec), with the options of a
    run's :class:`qac.train.pretrain.PretrainSettings`."""
    # here, not at the top: it loads numpy, torch
    from qac.models.cocondenser import CoCondenser
    # here, not at the top: it loads numpy, torch
    from qac.models.cotmae import CoTMAE
    # here, not at the top: it loads numpy, torch
    from qac.models.master import Master

    method = settings.method
    if method == "cocondenser":
        return CoCondenser.from_spec(
            settings.init, seed=seed, dropout=settings.dropout, n_head_layers=int(settings.n_head_layers),
            skip_from=int(settings.skip_from), temperature=float(settings.temperature),
            mlm_probability=float(settings.mlm_probability), full_vocab_logits=full_vocab_logits,
            loss_weights=settings.cocondenser_loss_weights)
    if method == "cotmae":
        return CoTMAE.from_spec(
            settings.init, seed=seed, dropout=settings.dropout, decoder=settings.cotmae_decoder,
            decoder_layers=int(settings.cotmae_decoder_layers),
            decoder_weight=float(settings.cotmae_decoder_weight),
            attention_window=int(settings.cotmae_attention_window),
            mask_ratio=float(settings.cotmae_mask_ratio),
            decoder_mask_ratio=float(settings.cotmae_decoder_mask_ratio),
            full_vocab_logits=full_vocab_logits)
    if method == "master":
        return Master.from_spec(
            settings.init, seed=seed, dropout=settings.dropout, decoders=tuple(settings.master_decoders),
            decoder_layers=int(settings.master_decoder_layers), weights=dict(settings.master_weights),
            mask_ratio=float(settings.master_mask_ratio),
            decoder_mask_ratio=float(settings.master_decoder_mask_ratio), full_vocab_logits=full_vocab_logits,
            decoder_init=settings.master_decoder_init)
    raise ValueError(f"method must be one of {METHODS} (none exports the init encoder), got {method!r}")


def required_inputs(settings) -> list[str]:
    """Files besides ``passages.arrow`` a run of ``settings`` reads: ``queries`` (query or mixed
    context, MASTER's DOR decoder), ``continuations`` (MASTER's GOR), ``word_frequencies`` (MASTER's MKP)."""
    if settings.method == "master":
        # here, not at the top: it loads numpy, pyarrow, torch
        from qac.data.master import required_inputs as master_inputs

        return master_inputs(settings)
    return ["queries"] if settings.method != "none" and settings.context_type in ("query", "mixed") else []


# The stage that writes each file a pre-training run may read (data/<profile>/<file>).
INPUT_FILES = {"passages": ("passages.arrow", "split_passages"), "queries": ("queries.arrow", "generate_queries"),
               "continuations": ("continuations.arrow", "generate_continuations"),
               "word_frequencies": ("word_frequencies.json", "word_frequencies")}


def input_files(root, settings) -> dict[str, Any]:
    """``{name: path under root}`` of every file a run of ``settings`` reads: the passages (unless it
    pre-trains nothing, method none) and :func:`required_inputs`. The pre-training stage and a
    hyperparameter trial read their inputs from here, so both check and read the same files."""
    from pathlib import Path

    names = ([] if settings.method == "none" else ["passages"]) + required_inputs(settings)
    return {name: Path(root) / INPUT_FILES[name][0] for name in names}


def build_batches(settings, model, tokenizer, corpus, inputs: Mapping[str, Any]):
    """``(sampler, collator)`` of a run: ``sampler.batch(step, size)`` gives the global batch's
    examples, ``collator(examples, step)`` this process's tensors. ``inputs`` maps the names of
    :func:`required_inputs` to their paths."""
    # here, not at the top: it loads numpy, pyarrow, torch
    from qac.data.context_pairs import PairCollator, PairSampler

    sampler = PairSampler(corpus, settings.context_type, settings.seed, settings.mixed_query_prob,
                          passage_draw=settings.passage_context_draw)
    if settings.method == "master":
        # here, not at the top: it loads numpy, pyarrow, torch
        from qac.data.master import master_batches

        sampler, collator = master_batches(settings, model.mask_ratios, tokenizer, sampler, dict(inputs))
    else:
        collator = PairCollator(tokenizer, settings.max_len, settings.query_max_len, *model.mask_ratios,
                                seed=settings.seed, pad_to=settings.pad_to,
                                pad_to_multiple_of=settings.pad_to_multiple_of, crop=settings.spans == "overflow")
    if settings.unpadded:
        # here, not at the top: it loads numpy, torch
        from qac.data.streams import UnpaddedCollator

        collator = UnpaddedCollator(collator, settings.pad_to_multiple_of)
    return sampler, collator
