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
from typing import Iterator

import numpy as np

IGNORE_INDEX = -100  # label of a position that carries no MLM loss (PyTorch's CrossEntropyLoss default)


@dataclass(frozen=True)
class MaskingVocab:
    """What whole-word masking needs to know about a tokenizer."""

    mask_id: int
    vocab_size: int
    special_ids: frozenset[int]
    is_continuation: np.ndarray   # bool per vocabulary id: the word-piece starts with "##"

    @property
    def is_special(self) -> np.ndarray:
        """Bool per vocabulary id: a special token (never masked, belongs to no word)."""
        table = self.__dict__.get("_is_special")
        if table is None:
            table = np.zeros(len(self.is_continuation), dtype=bool)
            table[[i for i in self.special_ids if 0 <= i < len(table)]] = True
            object.__setattr__(self, "_is_special", table)
        return table

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
    return mask_positions(token_ids, take_words(spans, rng.permutation(len(spans)), budget), vocab, rng)


def take_words(spans: list[tuple[int, int]], order, budget: int) -> list[int]:
    """The token positions of the words visited in ``order`` (indices into ``spans``), each word taken
    whole while it fits in the ``budget`` of tokens, until the budget is met."""
    chosen: list[int] = []
    for word in order:
        start, end = spans[word]
        if len(chosen) + (end - start) > budget:
            continue
        chosen.extend(range(start, end))
        if len(chosen) == budget:
            break
    return chosen


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
    chosen = take_words(spans, np.argsort(-keys, kind="stable"), budget)
    return mask_positions(token_ids, sorted(chosen), vocab, rng)


def whole_word_mask_batch(flat_ids: np.ndarray, lengths: np.ndarray, keys, vocab: MaskingVocab,
                          probability: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`whole_word_mask` of many sequences at once, with the same result for each.

    ``flat_ids`` holds the sequences one after another (int64), ``lengths``
    their lengths; sequence i is masked with the draws of
    ``np.random.default_rng(keys[i])``, exactly as :func:`whole_word_mask`
    would use them. Returns flat ``(inputs, labels)``. Words, budgets and the
    80/10/10 replacement are array operations over the whole batch; per
    sequence remain only the generator's draws and the greedy walk over the
    permuted words up to the budget.
    """
    flat_ids = np.asarray(flat_ids, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    inputs = flat_ids.copy()
    labels = np.full(len(flat_ids), IGNORE_INDEX, dtype=np.int64)
    if probability <= 0 or not len(flat_ids):
        return inputs, labels
    sequence_start = np.cumsum(lengths) - lengths
    row = np.repeat(np.arange(len(lengths)), lengths)
    inside = ~vocab.is_special[flat_ids]
    follows_word = np.zeros(len(flat_ids), dtype=bool)          # previous position of the same sequence is in a word
    follows_word[1:] = inside[:-1]
    follows_word[sequence_start[lengths > 0]] = False
    starts_word = inside & ~(vocab.is_continuation[flat_ids] & follows_word)
    word_start = np.flatnonzero(starts_word)
    word_length = np.bincount((np.cumsum(starts_word) - 1)[inside], minlength=len(word_start))
    word_row = row[word_start]
    words = np.bincount(word_row, minlength=len(lengths))
    first_word = np.cumsum(words) - words
    maskable = np.bincount(word_row, weights=word_length, minlength=len(lengths))
    budgets = np.maximum(1, np.round(probability * maskable)).astype(np.int64).tolist()
    words, first_word = words.tolist(), first_word.tolist()     # read one sequence at a time below

    # Per sequence only the generator's draws and the greedy walk; the positions of the taken
    # words are laid out for the whole batch afterwards.
    taken_words, draws, random_tokens = [], [], []
    for index, rng in enumerate(seeded_generators(keys)):
        count = words[index]
        if count == 0:
            continue
        first = first_word[index]
        lengths_of = word_length[first:first + count]
        budget = budgets[index]
        order = rng.permutation(count)
        ordered = lengths_of[order]
        cumulative = ordered.cumsum()
        # Words up to the first that passes the budget are all taken; after it,
        # each word only if it still fits, until the budget is met.
        fits = int(cumulative.searchsorted(budget, side="right"))
        taken = order[:fits]
        used = int(cumulative[fits - 1]) if fits else 0
        if used < budget and fits < count:
            extra = []
            for word, length in zip(order[fits:].tolist(), ordered[fits:].tolist()):
                if used + length <= budget:
                    extra.append(word)
                    used += length
                    if used == budget:
                        break
            taken = np.concatenate([taken, np.asarray(extra, dtype=taken.dtype)])
        taken_words.append(taken + first)
        draws.append(rng.random(used))
        random_tokens.append(rng.integers(0, vocab.vocab_size, size=used))
    if not taken_words:
        return inputs, labels
    taken_words = np.concatenate(taken_words)
    counts = word_length[taken_words]
    # positions word by word, in the order the words were taken
    chosen = (np.repeat(word_start[taken_words] - np.cumsum(counts) + counts, counts)
              + np.arange(int(counts.sum())))
    draws, random_tokens = np.concatenate(draws), np.concatenate(random_tokens)
    labels[chosen] = flat_ids[chosen]
    inputs[chosen[draws < 0.8]] = vocab.mask_id
    replace = (draws >= 0.8) & (draws < 0.9)
    inputs[chosen[replace]] = random_tokens[replace]
    return inputs, labels


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple`` (``multiple`` 1 or less leaves it as it is)."""
    if multiple <= 1:
        return value
    return -(-value // multiple) * multiple


def masked_targets(labels, multiple: int = 1) -> dict:
    """The labelled positions of a side, row by row: ``mlm_positions`` and ``mlm_labels``, both ``[rows, P]``.

    Row r lists the columns of its labelled tokens (``labels != IGNORE_INDEX``)
    in increasing order, then columns whose label is ``IGNORE_INDEX``, so that
    ``mlm_labels`` is ``labels`` gathered at ``mlm_positions``: the labelled
    tokens, then ignored slots. ``P`` is the largest labelled count of a row,
    rounded up to ``multiple``. The loss gathers the rows the MLM head reads
    with these indices (qac.models.losses.masked_lm_sum): selecting them with a
    boolean mask on the device would make the device tell the host how many
    there are (an ``aten.nonzero`` per selection, a host-device sync, and a
    graph break under ``torch.compile``), while here the count is known where
    the batch is made. Rows, not a flat list, so that a side splits by rows
    (processes, gradient-cache chunks) with its targets.
    """
    import torch

    labels = torch.as_tensor(labels)
    rows, width = labels.shape
    selected = labels != IGNORE_INDEX
    slots = max(1, round_up(int(selected.sum(dim=1).max()) if rows else 0, multiple))
    # a stable sort of "not labelled" puts each row's labelled columns first, in column order
    order = torch.argsort((~selected).to(torch.int8), dim=1, stable=True)[:, :slots]
    positions = torch.zeros((rows, slots), dtype=torch.long)
    positions[:, :order.shape[1]] = order
    targets = torch.full((rows, slots), IGNORE_INDEX, dtype=labels.dtype)
    targets[:, :order.shape[1]] = labels.gather(1, order)
    return {"mlm_positions": positions, "mlm_labels": targets}


# ---------------------------------------------------------------------------
# ``np.random.default_rng(key)`` for many keys at once.
#
# A sequence's mask is drawn from ``default_rng([seed, 2, step, index, side])``.
# Building a generator costs ~30 us, most of it NumPy's SeedSequence hashing
# the key and PCG64 seeding itself from it, which is more than masking the
# sequence. Both algorithms are fixed by NumPy (numpy/random/bit_generator.pyx,
# pcg64.h) and are computed here for a whole batch of keys with array
# operations; one PCG64 then takes each resulting state in turn. The streams
# are exactly default_rng's (tests/test_masking.py compares them).

_MASK32 = np.uint64(0xFFFFFFFF)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_MASK128 = (1 << 128) - 1
_MASK64 = (1 << 64) - 1


def _u32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.uint64) & _MASK32


class _Hash:
    """SeedSequence's hashmix, its constant advancing with each use (vectorised over keys)."""

    def __init__(self):
        self.const = np.uint64(_INIT_A)

    def __call__(self, value: np.ndarray) -> np.ndarray:
        value = _u32(value ^ self.const)
        self.const = np.uint64((int(self.const) * _MULT_A) & 0xFFFFFFFF)
        value = _u32(value * self.const)
        return value ^ (value >> np.uint64(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = _u32(np.uint64(_MIX_L) * x + (np.uint64(1 << 32) - _u32(np.uint64(_MIX_R) * y)))
    return result ^ (result >> np.uint64(16))


def _seed_words(keys: np.ndarray) -> np.ndarray:
    """SeedSequence(key).generate_state(8, uint32) for each row of ``keys`` (uint32 words each)."""
    entropy = keys.astype(np.uint64)
    hashmix = _Hash()
    pool = [hashmix(entropy[:, i] if i < entropy.shape[1] else np.zeros(len(entropy), dtype=np.uint64))
            for i in range(_POOL)]
    for source in range(_POOL):
        for target in range(_POOL):
            if source != target:
                pool[target] = _mix(pool[target], hashmix(pool[source]))
    for source in range(_POOL, entropy.shape[1]):
        for target in range(_POOL):
            pool[target] = _mix(pool[target], hashmix(entropy[:, source]))
    const, words = _INIT_B, []
    for index in range(8):
        value = _u32(pool[index % _POOL] ^ np.uint64(const))
        const = (const * _MULT_B) & 0xFFFFFFFF
        value = _u32(value * np.uint64(const))
        words.append(value ^ (value >> np.uint64(16)))
    return np.stack(words, axis=1)


def _pcg64_state(low: int, high: int) -> dict:
    """The PCG64 state NumPy seeds from 8 uint32 words (pcg64_set_seed), given as two 128-bit
    integers: words 0-3 and words 4-7, little-endian."""
    # pcg64_set_seed reads the words as uint64 w0..w3: initstate = w0 << 64 | w1, initseq = w2 << 64 | w3
    initstate = ((low & _MASK64) << 64) | (low >> 64)
    initseq = ((high & _MASK64) << 64) | (high >> 64)
    inc = ((initseq << 1) | 1) & _MASK128
    state = inc & _MASK128                                              # state 0, one step
    state = (state + initstate) & _MASK128
    state = (state * _PCG_MULT + inc) & _MASK128
    return {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}


def seeded_generators(keys) -> Iterator[np.random.Generator]:
    """``np.random.default_rng(list(key))`` for each key, in order (one generator object, reseeded:
    use each before asking for the next). Keys of equal length, of ints in [0, 2**32), take the fast path."""
    try:
        array = np.asarray(keys)
    except ValueError:          # keys of different lengths
        array = None
    fast = (array is not None and array.ndim == 2 and array.shape[1] > 0 and array.dtype.kind in "iu"
            and (not array.size or (int(array.min()) >= 0 and int(array.max()) < 1 << 32)))
    if not fast:
        for key in keys:
            yield np.random.default_rng([int(k) for k in key])
        return
    if not len(array):
        return
    words = _seed_words(array.astype(np.uint64))
    # the 8 words as two little-endian 128-bit integers per key (Python ints: exact 128-bit arithmetic)
    halves = [[int.from_bytes(row.tobytes(), "little") for row in words[:, part:part + 4].astype("<u4")]
              for part in (0, 4)]
    bit_generator = np.random.PCG64(0)
    generator = np.random.Generator(bit_generator)
    for low, high in zip(*halves):
        bit_generator.state = _pcg64_state(low, high)
        yield generator
