"""The benchmarks' text: passage pairs and queries of the paper's lengths.

``(passage, the next passage of the same document, a query)`` triples, from
SciFact in the data mirror (``qac.config.data_mirror``) when it is there,
otherwise generated from the uncased vocabulary that travels with the
benchmarks (``benchmarks/bert-base-uncased/vocab.txt``), so a benchmark runs
on a machine that holds nothing but the checkout. The generated text has no
meaning, only the shape the step sees: words drawn with a Zipf-like
frequency, a quarter of them split into two or three word pieces (about 1.3
pieces a word, as in English prose), so a 110-word passage reaches the
144-token limit; queries of 6 to 20 words. As in the paper's splitting, 15%
of the spans are short (uniform length).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent
MODEL_DIR = BENCHMARKS / "bert-base-uncased"        # config.json and the uncased vocabulary
PASSAGE_WORDS = 110


def scifact_dir() -> Path | None:
    """``scifact/`` of the data mirror, None when the mirror lacks it."""
    from qac.config import data_mirror

    folder = data_mirror() / "scifact"
    return folder if (folder / "corpus.jsonl").exists() and (folder / "queries.jsonl").exists() else None


def span_lengths(rng, words: int) -> tuple[int, int]:
    return tuple(int(rng.integers(2, words + 1)) if rng.random() < 0.15 else words for _ in range(2))


def scifact_triples(folder: Path, count: int, words: int = PASSAGE_WORDS) -> list[tuple[str, str, str]]:
    """Abstract spans of SciFact (a passage, the next span of its abstract) with a claim each."""
    rng = np.random.default_rng(0)
    claims = [json.loads(line)["text"] for line in open(folder / "queries.jsonl", encoding="utf-8")]
    triples = []
    for line in open(folder / "corpus.jsonl", encoding="utf-8"):
        record = json.loads(line)
        tokens = (record["title"] + " " + record["text"]).split()
        first, second = span_lengths(rng, words)
        if len(tokens) >= first + second:
            triples.append((" ".join(tokens[:first]), " ".join(tokens[first:first + second]),
                            claims[len(triples) % len(claims)]))
        if len(triples) == count:
            break
    return triples


def synthetic_triples(count: int, words: int = PASSAGE_WORDS, vocab: Path = MODEL_DIR / "vocab.txt",
                      seed: int = 0) -> list[tuple[str, str, str]]:
    """``count`` generated triples (deterministic for a seed)."""
    entries = vocab.read_text(encoding="utf-8").split("\n")
    stems = [entry for entry in entries if entry.isalpha() and entry.isascii() and len(entry) > 1]
    pieces = [entry[2:] for entry in entries if entry.startswith("##") and entry[2:].isalpha()
              and entry[2:].isascii()]
    rng = np.random.default_rng(seed)
    frequency = 1.0 / (np.arange(len(stems)) + 20.0)      # the vocabulary lists common words first
    frequency /= frequency.sum()

    def text(length: int) -> str:
        chosen = rng.choice(len(stems), size=length, p=frequency)
        splits = rng.choice(3, size=length, p=[0.75, 0.2, 0.05])
        out = []
        for position, (stem, extra) in enumerate(zip(chosen, splits)):
            word = stems[stem] + "".join(pieces[i] for i in rng.integers(len(pieces), size=extra))
            out.append(word + ("." if position % 17 == 16 else ","  if position % 7 == 6 else ""))
        return " ".join(out)

    triples = []
    for _ in range(count):
        first, second = span_lengths(rng, words)
        triples.append((text(first), text(second), text(int(rng.integers(6, 21)))))
    return triples


def text_triples(count: int, source: str = "auto") -> tuple[list[tuple[str, str, str]], str]:
    """``(triples, where they come from)``; ``source``: auto (SciFact when mirrored), scifact or synthetic."""
    folder = scifact_dir() if source in ("auto", "scifact") else None
    if source == "scifact" and folder is None:
        raise SystemExit("--text scifact: the data mirror (QAC_DATA_MIRROR) has no scifact/corpus.jsonl")
    if folder is not None:
        return scifact_triples(folder, count), "SciFact from the data mirror (abstract spans + claims)"
    return synthetic_triples(count), "synthetic text from the uncased vocabulary (benchmarks/sample_text.py)"


def msmarco_length_triples(count: int, seed: int = 0,
                           vocab: Path = MODEL_DIR / "vocab.txt") -> list[tuple[str, str, str]]:
    """``count`` generated triples whose token lengths are drawn from MS MARCO's
    (``benchmarks/msmarco_lengths.json``): each word a whole entry of the uncased vocabulary, one
    token, so a text of n words is n tokens. Passage and context lengths are drawn independently, the
    query's from the query lengths; drawn from ``seed``, the same triples every run."""
    from msmarco_lengths import load

    lengths = load()
    entries = vocab.read_text(encoding="utf-8").split("\n")
    words = [entry for entry in entries if entry.isalpha() and entry.isascii() and len(entry) > 1]
    rng = np.random.default_rng(seed)
    frequency = 1.0 / (np.arange(len(words)) + 20.0)       # the vocabulary lists common words first
    frequency /= frequency.sum()

    def text(length: int) -> str:
        return " ".join(words[i] for i in rng.choice(len(words), size=int(length), p=frequency))

    passages = rng.choice(lengths["passages"], size=(count, 2))
    queries = rng.choice(lengths["queries"], size=count)
    return [(text(first), text(second), text(query)) for (first, second), query in zip(passages, queries)]
