"""Token ids stored beside the texts of the stage files, and the tokenizer that made them.

Texts are tokenised once, by the stage that writes them (passages by
split_passages, generated queries by generate_queries, the fine-tuning and
evaluation corpora by tokenize_corpus); training and encoding then slice, pad and
mask integer arrays. Ids are stored *without* special tokens and without
truncation: a reader adds the model's special tokens and cuts to its own length
(:func:`with_special_tokens`), which gives exactly what
``tokenizer(text, truncation=True, max_length=L)`` gives (tested on real text).

Each file records the tokenizer it was made with in its Arrow schema metadata
(:class:`TokenizerStamp`: the spec it was loaded from and a hash of its
vocabulary and special tokens). A reader whose tokenizer hashes differently
stops before any slow work (:func:`check_stamp`): ids of another vocabulary
would train on the wrong tokens without any error.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from qac.data.errors import DataFormatError

METADATA_KEY = b"qac.tokenizer"


@dataclass(frozen=True)
class TokenizerStamp:
    """The tokenizer a file's ids come from: the spec it was loaded from, and the hash that decides."""

    name: str
    hash: str

    @classmethod
    def of(cls, tokenizer, name: str | None = None) -> "TokenizerStamp":
        return cls(name=str(name or getattr(tokenizer, "name_or_path", "")), hash=vocabulary_hash(tokenizer))

    def metadata(self) -> dict[bytes, bytes]:
        return {METADATA_KEY: json.dumps({"name": self.name, "hash": self.hash}, sort_keys=True).encode()}

    @classmethod
    def from_schema(cls, schema) -> "TokenizerStamp | None":
        raw = (schema.metadata or {}).get(METADATA_KEY)
        if raw is None:
            return None
        value = json.loads(raw)
        return cls(name=value["name"], hash=value["hash"])


def vocabulary_hash(tokenizer) -> str:
    """MD5 of the vocabulary (piece -> id) and the special tokens with their ids.

    Two tokenizers with the same hash turn the same pieces into the same ids
    (``Luyu/condenser`` and ``bert-base-uncased`` share one).
    """
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    special = sorted((str(token), int(tokenizer.convert_tokens_to_ids(token)))
                     for token in tokenizer.all_special_tokens)
    payload = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.md5(payload.encode("utf-8")).hexdigest()


def check_stamp(path: str | os.PathLike, schema, tokenizer, name: str, column: str) -> None:
    """Stop, naming both tokenizers, unless ``path``'s ids were made by ``tokenizer``."""
    if column not in schema.names:
        raise DataFormatError(path, None, column,
                              "this file holds no token ids (it was written before texts were tokenised once): "
                              "rerun the stage that writes it (dvc repro)")
    stamp = TokenizerStamp.from_schema(schema)
    ours = TokenizerStamp.of(tokenizer, name)
    if stamp is None:
        raise DataFormatError(path, None, column, "the file does not record the tokenizer its ids were made "
                              "with; rerun the stage that writes it (dvc repro)")
    if stamp.hash != ours.hash:
        raise DataFormatError(path, None, column,
                              f"token ids were made by tokenizer {stamp.name!r} (vocabulary hash {stamp.hash}), "
                              f"but this stage reads them with {ours.name!r} (hash {ours.hash}), whose vocabulary "
                              "or special tokens differ; make the tokenizer that writes the file (split.tokenizer) "
                              "the one of the model that reads it, or rerun the writing stage with it")


# The characters a text's first N tokens can come from, at most: N x 64. The tokenizers of the models here
# (WordPiece, byte-level BPE, SentencePiece) give a token for every one to six characters of ordinary text
# (English averages about 4.5), and WordPiece makes a word of over 100 characters one [UNK]; 64 per token is
# over ten times what any normal text needs, so the first N tokens of the cut text are those of the whole
# text, while a 40 MB line costs the tokenizer N x 64 characters instead of 40 MB (tokenised whole, then
# truncated, it took 46 s and 4.9 GB). Only a text of words over 64 characters long on average, or of runs of
# whitespace or ignored characters that long, could tokenise otherwise.
CHARS_PER_TOKEN = 64
_LAST_SPACE = re.compile(r".*\s", re.DOTALL)


def cut_end(text: str, max_tokens: int, start: int = 0, end: int | None = None) -> int:
    """Where :func:`cut_for_tokens` cuts ``text[start:end]`` (an index into ``text``; no copy is made)."""
    end = len(text) if end is None else end
    limit = max(1, max_tokens) * CHARS_PER_TOKEN
    if end - start <= limit:
        return end
    space = _LAST_SPACE.match(text, start + limit // 2, start + limit)
    return space.end() - 1 if space else start + limit


def cut_for_tokens(text: str, max_tokens: int) -> str:
    """``text`` cut to what its first ``max_tokens`` tokens can come from (``max_tokens`` x
    :data:`CHARS_PER_TOKEN` characters), before the word that limit falls in, so no piece of a word the whole
    text lacks is made; a shorter text as it is."""
    end = cut_end(text, max_tokens)
    return text if end == len(text) else text[:end]


def cut_texts(texts: Sequence[str], max_tokens: int) -> list[str]:
    """:func:`cut_for_tokens` of each text: what a tokenizer truncating at ``max_tokens`` is given."""
    return [cut_for_tokens(text, max_tokens) for text in texts]


class TextEncoder:
    """Ids of texts without special tokens and without truncation, many texts per call.

    A fast tokenizer's Rust backend is copied without the truncation and
    padding a ``tokenizer.json`` may carry (sentence-transformers models
    truncate at 128): stored ids are the whole text.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._backend = None
        if getattr(tokenizer, "is_fast", False):
            from tokenizers import Tokenizer

            self._backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            self._backend.no_truncation()
            self._backend.no_padding()

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        if self._backend is not None:
            return [encoding.ids for encoding in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        return self.tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False,
                              return_token_type_ids=False, verbose=False)["input_ids"]


@dataclass(frozen=True)
class SpecialTokens:
    """How a model wraps one sequence: ``prefix + ids + suffix`` (BERT: [CLS] ids [SEP])."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    pad_id: int

    @classmethod
    def of(cls, tokenizer) -> "SpecialTokens":
        # Worked out from the tokenizer itself, so any single-sequence template is honoured.
        plain = tokenizer("a b", add_special_tokens=False)["input_ids"]
        wrapped = tokenizer("a b", add_special_tokens=True)["input_ids"]
        start = next(i for i in range(len(wrapped)) if wrapped[i:i + len(plain)] == plain)
        pad = tokenizer.pad_token_id
        return cls(prefix=tuple(wrapped[:start]), suffix=tuple(wrapped[start + len(plain):]),
                   pad_id=0 if pad is None else int(pad))

    @property
    def count(self) -> int:
        return len(self.prefix) + len(self.suffix)


def with_special_tokens(ids, max_len: int, special: SpecialTokens) -> np.ndarray:
    """``prefix + ids[:max_len - count] + suffix`` as int64: what the tokenizer gives with truncation to ``max_len``."""
    # Filled in place rather than concatenated: this runs once per sequence of every batch.
    body = ids[:max(0, max_len - special.count)]
    start, end = len(special.prefix), len(special.prefix) + len(body)
    wrapped = np.empty(end + len(special.suffix), dtype=np.int64)
    wrapped[:start] = special.prefix
    wrapped[start:end] = body
    wrapped[end:] = special.suffix
    return wrapped
