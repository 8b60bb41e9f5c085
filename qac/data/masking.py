"""Whole-word masking for masked language modelling (BERT's 80/10/10 recipe).

A word is a word-piece that does not start with ``##`` plus the ``##``
continuations that follow it; a word is masked as a whole or not at all, as in
coCondenser and CoT-MAE. Special tokens ([CLS], [SEP], padding) are never
chosen.

Masking works on one sequence at a time with a NumPy generator that the caller
seeds, so a sequence's mask depends only on (seed, step, its index in the
global batch): a run split over several processes, or padded differently,
masks exactly the same tokens as a single process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100  # label of a position that carries no MLM loss (PyTorch's CrossEntropyLoss default)


@dataclass(frozen=True)
class MaskingVocab:
    """What whole-word masking needs to know about a tokenizer."""

    mask_id: int
    vocab_size: int
    special_ids: frozenset[int]
    is_continuation: np.ndarray   # bool per vocabulary id: the word-piece starts with "##"

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "MaskingVocab":
        vocab = tokenizer.get_vocab()
        continuation = np.zeros(max(len(tokenizer), max(vocab.values()) + 1), dtype=bool)
        for piece, index in vocab.items():
            continuation[index] = piece.startswith("##")
        if tokenizer.mask_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no [MASK] token")
        return cls(mask_id=tokenizer.mask_token_id, vocab_size=len(tokenizer),
                   special_ids=frozenset(tokenizer.all_special_ids), is_continuation=continuation)


def word_spans(token_ids: list[int], vocab: MaskingVocab) -> list[tuple[int, int]]:
    """``(start, end)`` positions of each whole word; special tokens belong to no word."""
    spans: list[tuple[int, int]] = []
    for position, token in enumerate(token_ids):
        if token in vocab.special_ids:
            continue
        if spans and vocab.is_continuation[token] and spans[-1][1] == position:
            spans[-1] = (spans[-1][0], position + 1)
        else:
            spans.append((position, position + 1))
    return spans


def whole_word_mask(token_ids: list[int], vocab: MaskingVocab, probability: float,
                    rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Mask whole words covering about ``probability`` of the maskable tokens.

    Returns ``(inputs, labels)``: ``labels`` holds the original id at chosen
    positions and ``IGNORE_INDEX`` elsewhere. Of the chosen tokens 80% become
    [MASK], 10% a random token and 10% stay as they are. Words are visited in a
    random order and taken while the budget ``round(probability * maskable)``
    (at least one token) is not exceeded, as in BERT's whole-word masking.
    """
    if probability <= 0:
        return list(token_ids), [IGNORE_INDEX] * len(token_ids)
    spans = word_spans(token_ids, vocab)
    maskable = sum(end - start for start, end in spans)
    if maskable == 0:
        return list(token_ids), [IGNORE_INDEX] * len(token_ids)
    budget = max(1, int(round(probability * maskable)))
    chosen: list[int] = []
    for word in rng.permutation(len(spans)):
        start, end = spans[word]
        if len(chosen) + (end - start) > budget:
            continue
        chosen.extend(range(start, end))
        if len(chosen) == budget:
            break
    return mask_positions(token_ids, chosen, vocab, rng)


def mask_positions(token_ids: list[int], chosen: list[int], vocab: MaskingVocab,
                   rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """``(inputs, labels)`` with the ``chosen`` positions masked by BERT's 80/10/10 recipe.

    ``labels`` holds the original id at each chosen position and ``IGNORE_INDEX``
    elsewhere; of the chosen tokens 80% become [MASK], 10% a random token and
    10% stay as they are (draws in the order of ``chosen``).
    """
    inputs = list(token_ids)
    labels = [IGNORE_INDEX] * len(token_ids)
    replacement = rng.random(len(chosen))
    random_tokens = rng.integers(0, vocab.vocab_size, size=len(chosen))
    for position, draw, random_token in zip(chosen, replacement, random_tokens):
        labels[position] = token_ids[position]
        if draw < 0.8:
            inputs[position] = vocab.mask_id
        elif draw < 0.9:
            inputs[position] = int(random_token)
    return inputs, labels


def word_strings(pieces: list[str], spans: list[tuple[int, int]]) -> list[str]:
    """The word each span of word-pieces spells (``##`` continuations joined), as word frequencies key it.

    ``pieces`` are the sequence's word-pieces (``tokenizer.convert_ids_to_tokens``).
    """
    return [pieces[start] + "".join(piece[2:] for piece in pieces[start + 1:end]) for start, end in spans]


def weighted_word_mask(token_ids: list[int], vocab: MaskingVocab, probability: float, weights: list[float],
                       rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Whole-word masking where word ``i`` of :func:`word_spans` is drawn with weight ``weights[i]``.

    Words are drawn without replacement with probability proportional to
    their weight (Efraimidis-Spirakis: each word gets the key
    ``u ** (1 / weight)``, ``u`` uniform, and words are visited by decreasing
    key), then taken while the budget ``round(probability * maskable)`` (at
    least one token) is not exceeded, as in :func:`whole_word_mask`; the
    chosen tokens are masked 80/10/10. Equal weights give uniform whole-word
    masking. MASTER's MKP decoder weights a word by its TF-IDF, so rare
    keywords are masked more often.
    """
    spans = word_spans(token_ids, vocab)
    if len(weights) != len(spans):
        raise ValueError(f"{len(weights)} weights for {len(spans)} words")
    maskable = sum(end - start for start, end in spans)
    if probability <= 0 or maskable == 0:
        return list(token_ids), [IGNORE_INDEX] * len(token_ids)
    budget = max(1, int(round(probability * maskable)))
    weight = np.asarray(weights, dtype=np.float64)
    if (weight <= 0).any() or not np.isfinite(weight).all():
        raise ValueError("word weights must be positive and finite")
    # log of u ** (1 / w), which orders the words as the keys themselves do
    keys = np.log(rng.random(len(spans))) / weight
    chosen: list[int] = []
    for word in np.argsort(-keys, kind="stable"):
        start, end = spans[word]
        if len(chosen) + (end - start) > budget:
            continue
        chosen.extend(range(start, end))
        if len(chosen) == budget:
            break
    return mask_positions(token_ids, sorted(chosen), vocab, rng)
