"""Texts are cut before they are tokenised, to what their first max_len tokens can come from.

A normal text gives the same token ids with and without the cut, for a WordPiece and a byte-level BPE
tokenizer and lengths from a query's to a passage's; a 40 MB line hands the tokenizer at most
max_len x CHARS_PER_TOKEN characters wherever texts are tokenised with a maximum length (counted, not
timed).
"""

from __future__ import annotations

import random

import pytest

from qac.data.tokens import CHARS_PER_TOKEN, cut_for_tokens, cut_texts

WORDS = ("the protein binds its receptor at the cell membrane , while glaciers retreat ; naïve café "
         "Zürich 北京 données (2019) e-mail well-known 3.14 %").split()
HUGE = "x" * 40_000_000 + " tail"          # one 40 MB line, one "word"
SPACED = "word " * 8_000_000               # one 40 MB line of words


def normal_texts() -> list[str]:
    rng = random.Random(3)
    texts = [" ".join(rng.choice(WORDS) for _ in range(n)) for n in (1, 5, 40, 200, 2_000, 20_000)]
    texts.append("\n".join(texts[-2:]))                                   # several lines
    texts.append("https://" + "a" * 150 + " " + " ".join(WORDS) * 50)   # a word WordPiece makes [UNK]
    texts.append("word\t\t  " * 3_000)                                   # runs of whitespace
    return texts


def byte_level_bpe():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator(normal_texts(), trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>"],
                                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")


@pytest.fixture(scope="module", params=["wordpiece", "byte-level-bpe"])
def tokenizer(request):
    from qac.data.tokenizer import load_tokenizer

    return load_tokenizer("minilm") if request.param == "wordpiece" else byte_level_bpe()


@pytest.mark.parametrize("max_len", [8, 32, 144, 512])
def test_a_normal_text_gives_the_same_ids_with_and_without_the_cut(tokenizer, max_len):
    texts = normal_texts()
    assert any(cut_for_tokens(text, max_len) != text for text in texts)      # the cut does cut
    whole = tokenizer(texts, truncation=True, max_length=max_len)["input_ids"]
    cut = tokenizer(cut_texts(texts, max_len), truncation=True, max_length=max_len)["input_ids"]
    assert cut == whole


def test_the_cut_is_bounded_and_falls_between_words():
    assert len(cut_for_tokens(HUGE, 144)) == 144 * CHARS_PER_TOKEN        # no space to cut at: the bound
    spaced = cut_for_tokens(SPACED, 144)
    assert len(spaced) <= 144 * CHARS_PER_TOKEN and spaced.endswith("word") and SPACED.startswith(spaced)
    short = "a short query"
    assert cut_for_tokens(short, 8) is short


class CountingTokenizer:
    """A tokenizer that counts the characters it is handed (and passes everything through)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.handed = tokenizer, []

    def __call__(self, texts, *args, **kwargs):
        self.handed.extend(len(text) for text in ([texts] if isinstance(texts, str) else texts))
        return self.tokenizer(texts, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_dense_encoding_hands_the_tokenizer_a_bounded_text(tiny_bert_dir):
    from transformers import AutoModel, AutoTokenizer

    from qac.retrieval.encode import encode_texts

    counting = CountingTokenizer(AutoTokenizer.from_pretrained(tiny_bert_dir))
    vectors = encode_texts(AutoModel.from_pretrained(tiny_bert_dir), counting, [HUGE, SPACED, "short"],
                           max_length=32, batch_size=2, pooling="cls", device="cpu")
    assert vectors.shape[0] == 3
    assert max(counting.handed) <= 32 * CHARS_PER_TOKEN


def test_fine_tuning_tokenises_bounded_texts(tiny_bert_dir, monkeypatch):
    from transformers import AutoTokenizer

    import qac.data.tokens
    from base_settings import finetune_settings
    from qac.train.finetune import step_batches
    from qac.train.groups import GroupSampler, TrainingQuery

    handed = []
    encode = qac.data.tokens.TextEncoder.__call__
    monkeypatch.setattr(qac.data.tokens.TextEncoder, "__call__",
                        lambda self, texts: handed.extend(map(len, texts)) or encode(self, texts))
    queries = [TrainingQuery(f"q{i}", f"about {word}" + " really" * 10_000 * (i == 0), (f"d{i}",), (f"n{i}",))
               for i, word in enumerate(["rivers", "glaciers"])]
    passage_text = {"d0": HUGE, "d1": SPACED, "n0": "a negative", "n1": "another negative"}
    settings = finetune_settings(query_max_len=8, passage_max_len=16, train_n_passages=2, batch_size=2, epochs=1,
                                 loader_workers=0)
    batches = step_batches(GroupSampler(queries, sorted(passage_text), 1, seed=0), passage_text,
                           AutoTokenizer.from_pretrained(tiny_bert_dir), settings, per_epoch=1, rank=0, world_size=1)
    assert len(batches) == 1 and max(handed) <= 16 * CHARS_PER_TOKEN


def test_generator_training_pairs_are_cut_before_tokenising():
    from base_settings import generator_training_settings
    from qac.querygen.generator_pairs import Pair
    from qac.querygen.train_generator import build_generator, encode_pairs

    _, tokenizer = build_generator("prefix_lm", "tiny:minilm", seed=0)
    counting = CountingTokenizer(tokenizer)
    settings = generator_training_settings(max_source_len=24, max_target_len=8)
    batch = encode_pairs(counting, [Pair(HUGE, SPACED, "query", "q0", "d0"), Pair("a passage", "a query", "query",
                                                                                    "q1", "d1")], settings)
    assert batch["input_ids"].shape[0] == 2
    assert max(counting.handed) <= 24 * CHARS_PER_TOKEN


# --- passage splitting: the whole text becomes passages, yet no tokenizer call sees more than a window ----

def splitting_counter(monkeypatch):
    """A TokenCounter of the MiniLM tokenizer and the longest text any of its calls was handed."""
    from qac.data.splitting import TokenCounter
    from qac.data.tokenizer import load_tokenizer

    longest = [0]
    counter = TokenCounter(load_tokenizer("minilm"))
    for name in ("ids", "offsets"):
        method = getattr(counter, name)

        def counted(texts, method=method):
            longest[0] = max([longest[0], *map(len, [texts] if isinstance(texts, str) else texts)])
            return method(texts)
        monkeypatch.setattr(counter, name, counted)
    return counter, longest


def test_a_sentence_of_megabytes_is_split_whole_with_bounded_tokenizer_calls(monkeypatch):
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    from base_settings import split_settings
    from qac.data.splitting import WINDOW_PIECES, split_documents

    counter, longest = splitting_counter(monkeypatch)
    rng = random.Random(5)
    line = " ".join(rng.choice(["protein", "membrane", "receptor", "glacier", "violin", "binding"])
                    for _ in range(400_000))                               # one 3 MB sentence, no full stop
    [split] = split_documents([("big", line)], PunktSentenceTokenizer(), counter,
                              split_settings(max_len=32, short_span_prob=0.0, spans="bounded"))
    assert longest[0] <= 32 * CHARS_PER_TOKEN * WINDOW_PIECES < len(line) / 100
    texts = [passage["text"] for passage in split.passages]
    assert all(0 < passage["n_tokens"] <= 32 for passage in split.passages)
    assert " ".join(texts).split() == line.split()                       # every word, in order, once


def test_a_normal_long_sentence_is_cut_as_before(monkeypatch):
    from qac.data.splitting import WINDOW_PIECES, cut_to_fit

    counter, _ = splitting_counter(monkeypatch)
    sentence = " ".join(WORDS * 40)
    assert len(sentence) < 32 * CHARS_PER_TOKEN * WINDOW_PIECES           # cut from its whole tokenization
    pieces = cut_to_fit(sentence, (0, len(sentence)), 32, counter)
    windowed = cut_to_fit(sentence * 30, (0, len(sentence) * 30), 32, counter)   # cut window by window
    assert [sentence[a:b] for (a, b), _ in pieces][:5] == [(sentence * 30)[a:b] for (a, b), _ in windowed][:5]
    assert all(length <= 32 for _, length in windowed)
