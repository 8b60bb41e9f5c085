"""Lengths in tokens against the positions of the model that reads them, before any model loads.

``finetune.passage_max_len: 100000`` passes every range check, and fails
minutes later inside the first forward pass with a tensor-size error. Each
length key is weighed here against the models it feeds, their positions read
from their ``config.json`` (:func:`qac.model_specs.max_positions`): the
encoders of the pre-training variants (pre-training, fine-tuning, the zero-shot
retriever, the passage split), a published encoder's own lengths, the query
generator, the continuation LM and the annotation judge. A model whose
configuration is not at hand (a hub name not in the local cache) is not
checked.
"""

from __future__ import annotations

from typing import Iterable

from qac.params.errors import Problem
from qac.params.rules import merged_variant, variant_key
from qac.params.sections import Params
from qac.model_specs import max_positions


def _encoder_specs(params: Params) -> list[tuple[str, str]]:
    """``(spec, key that names it)`` of each encoder the variants start from, once per spec."""
    found: dict[str, str] = {}
    for name in params.pretrain.variants:
        found.setdefault(merged_variant(params, name)["init"], variant_key(params, name, "init"))
    return [(spec, key) for spec, key in found.items()]


def _pretrain_lengths(params: Params) -> Iterable[tuple[str, int, str]]:
    for name in params.pretrain.variants:
        merged = merged_variant(params, name)
        for length in ("max_len", "query_max_len", "pad_to"):
            if merged[length] is not None:          # pad_to null: each batch padded to its longest sequence
                yield variant_key(params, name, length), int(merged[length]), merged["init"]


def length_problems(params: Params) -> list[Problem]:
    """Each length key over the positions of a model it feeds, named with the model and its limit."""
    problems: dict[str, Problem] = {}

    def check(key: str, tokens: int, spec: str, spec_key: str, what: str = "", extra: int = 0,
              extra_key: str | None = None) -> None:
        positions = max_positions(spec)
        if positions is None or tokens + extra <= positions or key in problems:
            return
        if extra_key is not None and positions - extra < 1:
            # The tokens added leave no room for any source: theirs is the key to lower.
            if extra_key not in problems:
                problems[extra_key] = Problem(extra_key, f"{extra} tokens plus {tokens} source tokens ({key}) are "
                                                         f"more than the model {spec!r} ({spec_key}) can read: "
                                                         f"{positions} positions (its configuration), so at most "
                                                         f"{max(positions - tokens, 0)}")
            return
        limit = positions - extra
        problems[key] = Problem(key, f"{tokens}{what} is more than the model {spec!r} ({spec_key}) can read: "
                                     f"{positions} positions (its configuration), so at most {limit}")

    encoders = _encoder_specs(params)
    spec_keys = dict(encoders)
    for key, tokens, spec in _pretrain_lengths(params):
        check(key, tokens, spec, spec_keys.get(spec, "pretrain.common.init"))
    for spec, spec_key in encoders:
        check("split.max_len", params.split.max_len, spec, spec_key, " tokens plus [CLS] and [SEP]", extra=2)
        for length in ("query_max_len", "passage_max_len", "corpus_max_len"):
            tokens = getattr(params.finetune, length)
            if tokens is not None:
                check(f"finetune.{length}", tokens, spec, spec_key)
        for length in ("query_max_len", "passage_max_len"):
            check(f"beir_retriever.{length}", getattr(params.beir_retriever, length), spec, spec_key)
    for spec, entry in params.encoders.items():
        for length in ("query_max_len", "passage_max_len"):
            check(f"encoders.{spec}.{length}", getattr(entry, length), spec, "its key in encoders")
    check("annotation.judge_max_len", params.annotation.judge_max_len, params.annotation.judge_model,
          "annotation.judge_model")
    generator = params.query_generator
    # A prefix LM reads the passage and writes the query in one sequence; an encoder-decoder in two.
    together = generator.architecture == "prefix_lm"
    for key, tokens in (("query_generator.max_source_len", generator.max_source_len),
                        ("querygen.max_source_len", params.querygen.max_source_len)):
        written = generator.max_target_len if key.startswith("query_generator") else params.querygen.max_new_tokens
        written_key = ("query_generator.max_target_len" if key.startswith("query_generator")
                       else "querygen.max_new_tokens")
        if together:
            check(key, tokens, generator.model, "query_generator.model",
                  f" source tokens plus {written} written ({written_key})", extra=written, extra_key=written_key)
        else:
            check(key, tokens, generator.model, "query_generator.model")
            check(written_key, written, generator.model, "query_generator.model")
    continuation = params.continuation
    check("continuation.max_source_len", continuation.max_source_len, continuation.model, "continuation.model",
          f" tokens plus {continuation.max_new_tokens} sampled (continuation.max_new_tokens)",
          extra=continuation.max_new_tokens, extra_key="continuation.max_new_tokens")
    return list(problems.values())
