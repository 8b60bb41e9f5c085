"""Passage splitting: grouping rules, long sentences, contexts, determinism, and the
<= max_len guarantee on real SciFact text."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from nltk.tokenize.punkt import PunktSentenceTokenizer

from qac.data.beir import iter_corpus_jsonl
from qac.data.punkt import PRETRAINED, TRAINED, load_sentence_splitter, prepare_punkt, train_parameters
from qac.data.splitting import (SplitSettings, TokenCounter, cut_to_fit, document_rng, draw_targets,
                                group_units, overlap_range, split_corpus_file, split_documents)
from qac.data.arrowstore import PASSAGES_SCHEMA, iter_records
from base_settings import split_settings


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


@pytest.fixture(scope="module")
def counter(tokenizer):
    return TokenCounter(tokenizer)


def settings(**overrides) -> SplitSettings:
    return split_settings(**{**dict(max_len=9, short_span_prob=0.0, random_sampled_window=100, overlap_sentences=2,
                                    seed=42), **overrides})


# --- grouping ---------------------------------------------------------------

def test_group_units_fills_each_passage_up_to_its_target():
    # 50+50 = 100 <= 128, +50 = 150 > 128: the third unit starts the next passage.
    assert group_units([50, 50, 50, 30], itertools.repeat(128)) == [(0, 2), (2, 4)]


def test_group_units_takes_one_unit_even_when_a_short_target_is_smaller():
    targets = itertools.chain([10], itertools.repeat(128))
    # Target 10 < 50: the passage still takes unit 0; then 50+50 = 100, +30 = 130 > 128.
    assert group_units([50, 50, 50, 30], targets) == [(0, 1), (1, 3), (3, 4)]


def test_group_units_of_an_empty_document_is_empty():
    assert group_units([], itertools.repeat(128)) == []


def test_short_span_targets_follow_short_span_prob():
    rng = document_rng(0, "doc")
    targets = list(itertools.islice(draw_targets(rng, settings(max_len=144, short_span_prob=0.15)), 20000))
    assert all(2 <= target <= 144 for target in targets)
    short = sum(target < 144 for target in targets) / len(targets)
    # P(short draw) = 0.15, and a short draw equals 144 with probability 1/143.
    assert abs(short - 0.15 * 142 / 143) < 0.01
    assert min(targets) == 2
    assert list(itertools.islice(draw_targets(rng, settings(max_len=144, short_span_prob=0.0)), 50)) == [144] * 50


def test_document_rng_does_not_depend_on_the_process_hash_seed():
    code = "from qac.data.splitting import document_rng; print(document_rng(7, 'MED-10').random())"
    values = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(values) == 1
    assert float(values.pop()) == document_rng(7, "MED-10").random()
    assert document_rng(7, "a").random() != document_rng(8, "a").random()


# --- one small document, worked by hand -------------------------------------

TEXT = "Alpha beta gamma. Delta epsilon. Zeta eta theta iota."
# minilm tokens: [alpha beta gamma .] = 4, [delta epsilon .] = 3, [zeta eta theta io ##ta .] = 6


def test_split_of_a_hand_worked_document(counter):
    [split] = split_documents([("d1", TEXT)], PunktSentenceTokenizer(), counter, settings(max_len=9))
    assert split.sentences == 3 and split.long_sentences == 0
    first, second = split.passages
    # Each text's and overlap's token ids are stored beside it (no special tokens): those of the tokenizer.
    ids = {key: [passage.pop(key) for passage in split.passages] for key in ("input_ids", "overlap_ids")}
    tokens = counter.tokenizer.convert_ids_to_tokens
    assert tokens(ids["input_ids"][1]) == ["zeta", "eta", "theta", "io", "##ta", "."]
    assert ids["input_ids"] == counter.ids([first["text"], second["text"]])
    assert ids["overlap_ids"] == [counter.ids([first["contexts"]["overlap"]])[0], []]
    # 4 + 3 = 7 <= 9, + 6 = 13 > 9.
    assert first == {
        "pid": "d1#0", "doc_id": "d1", "position": 0, "text": "Alpha beta gamma. Delta epsilon.", "n_tokens": 7,
        "contexts": {"nearby": ["d1#1"], "random_sampled": ["d1#1"],
                     # last 2 sentences (7 tokens) + the next (6) = 13 > 9: the first is dropped, 3 + 6 = 9.
                     "overlap": "Delta epsilon. Zeta eta theta iota."},
    }
    assert second["text"] == "Zeta eta theta iota." and second["n_tokens"] == 6
    assert second["contexts"] == {"nearby": ["d1#0"], "random_sampled": ["d1#0"], "overlap": ""}


def test_contexts_of_a_longer_document(counter):
    text = " ".join(f"Sentence number {word}." for word in
                    ["one", "two", "three", "four", "five", "six", "seven"])  # 4 tokens each
    [split] = split_documents([("d", text)], PunktSentenceTokenizer(), counter,
                              settings(max_len=4, random_sampled_window=2))
    pids = [p["pid"] for p in split.passages]
    assert pids == [f"d#{k}" for k in range(7)]
    middle = split.passages[3]["contexts"]
    assert middle["nearby"] == ["d#2", "d#4"]
    assert middle["random_sampled"] == ["d#1", "d#2", "d#4", "d#5"]
    # One sentence per passage and max_len 4: the overlap is the next sentence alone
    # after dropping the passage's own (4 + 4 > 4).
    assert overlap_range(3, 4, [4] * 7, settings(max_len=4)) is None
    assert overlap_range(3, 4, [4] * 7, settings(max_len=8)) == (3, 5)
    assert split.passages[0]["contexts"]["random_sampled"] == ["d#1", "d#2"]
    assert all(p["contexts"]["overlap"] == "" for p in split.passages)


def test_single_passage_documents_are_kept_without_contexts(counter):
    [split] = split_documents([("s", "Just one sentence.")], PunktSentenceTokenizer(), counter, settings())
    assert [p["text"] for p in split.passages] == ["Just one sentence."]
    assert split.passages[0]["contexts"] == {"nearby": [], "random_sampled": [], "overlap": ""}


# --- sentences longer than max_len -------------------------------------------

def test_a_long_sentence_is_cut_at_word_starts(counter):
    words = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
             "sixteen seventeen eighteen nineteen twenty.")
    pieces = cut_to_fit(words, (0, len(words)), 8, counter)
    assert [words[s:e] for (s, e), _ in pieces] == [
        "one two three four five six seven eight",
        "nine ten eleven twelve thirteen fourteen fifteen sixteen",
        "seventeen eighteen nineteen twenty.",
    ]
    assert [n for _, n in pieces] == [8, 8, 5]


def test_a_long_word_is_cut_inside_and_every_piece_fits(counter, tokenizer):
    word = "Pneumonoultramicroscopicsilicovolcanoconiosis"
    pieces = cut_to_fit(word, (0, len(word)), 4, counter)
    texts = [word[s:e] for (s, e), _ in pieces]
    assert "".join(texts) == word
    for text, (_, n_tokens) in zip(texts, pieces):
        assert n_tokens == len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= 4


def test_no_passage_exceeds_max_len_even_with_long_sentences(counter, tokenizer):
    text = ("Short start. " + " ".join(["averyveryverylongwordthatkeepsgoing"] * 12)
            + " tail words here. Another sentence follows.")
    [split] = split_documents([("x", text)], PunktSentenceTokenizer(), counter,
                              settings(max_len=10, short_span_prob=0.5))
    assert split.long_sentences == 1
    for passage in split.passages:
        ids = tokenizer(passage["text"], add_special_tokens=False)["input_ids"]
        assert len(ids) == passage["n_tokens"] <= 10
    assert " ".join(p["text"] for p in split.passages).split() == text.split()


# --- real data: SciFact from the mirror --------------------------------------

@pytest.fixture(scope="module")
def scifact_documents(shared_data):
    documents = iter_corpus_jsonl(shared_data / "scifact" / "corpus.jsonl")
    return [(d.doc_id, d.full_text) for d in itertools.islice(documents, 1000)]


@pytest.fixture(scope="module")
def scifact_punkt(scifact_documents, tmp_path_factory):
    directory = tmp_path_factory.mktemp("punkt") / "punkt"
    model = prepare_punkt("trained", directory, lambda: (text for _, text in scifact_documents), "first-1000")
    assert model == TRAINED
    return directory


def test_every_scifact_passage_fits_after_retokenizing(scifact_documents, scifact_punkt, counter, tokenizer):
    max_len = 64  # small, so that many sentences are cut
    splits = split_documents(scifact_documents, load_sentence_splitter(scifact_punkt), counter,
                             settings(max_len=max_len, short_span_prob=0.15))
    passages = [p for split in splits for p in split.passages]
    assert sum(split.long_sentences for split in splits) > 10
    lengths = [len(ids) for ids in tokenizer([p["text"] for p in passages], add_special_tokens=False)["input_ids"]]
    assert max(lengths) <= max_len
    assert lengths == [p["n_tokens"] for p in passages]
    overlaps = [p["contexts"]["overlap"] for p in passages if p["contexts"]["overlap"]]
    assert max(len(ids) for ids in tokenizer(overlaps, add_special_tokens=False)["input_ids"]) <= max_len
    # Nothing is lost or reordered: the passages of a document give back its words.
    for (doc_id, text), split in zip(scifact_documents, splits):
        assert " ".join(p["text"] for p in split.passages).split() == text.split(), doc_id


def test_every_long_sentence_of_the_whole_scifact_corpus_is_cut_to_fit(shared_data, scifact_punkt, counter,
                                                                      tokenizer):
    # The full-corpus version of the property where it can fail: only sentences
    # longer than max_len are cut; grouping whole sentences is checked above.
    splitter = load_sentence_splitter(scifact_punkt)
    max_len = 64
    texts = [d.full_text for d in iter_corpus_jsonl(shared_data / "scifact" / "corpus.jsonl")]
    # A WordPiece token covers at least one character: shorter sentences cannot be too long.
    spans = [(text, (s, e)) for text in texts for s, e in splitter.span_tokenize(text) if e - s > max_len]
    lengths = counter.lengths([text[s:e] for text, (s, e) in spans])
    long = [(text, span) for (text, span), n in zip(spans, lengths) if n > max_len]
    assert len(texts) == 5183 and len(long) > 100
    pieces = [(text, piece) for text, span in long for piece, _ in cut_to_fit(text, span, max_len, counter)]
    piece_lengths = [len(ids) for ids in
                     tokenizer([text[s:e] for text, (s, e) in pieces], add_special_tokens=False)["input_ids"]]
    assert max(piece_lengths) <= max_len


def test_output_does_not_depend_on_chunking(scifact_documents, scifact_punkt):
    from qac.data.splitting import iter_split_corpus

    common = dict(tokenizer_spec="minilm", punkt_dir=scifact_punkt, settings=settings(max_len=64, short_span_prob=0.15))
    documents = scifact_documents[:100]
    by_64 = list(iter_split_corpus(documents, chunk_size=64, **common))
    by_7 = list(iter_split_corpus(documents, chunk_size=7, **common))
    assert by_64 == by_7 and [split.doc_id for split in by_7] == [doc_id for doc_id, _ in documents]


@pytest.mark.slow  # starts worker processes
def test_output_is_identical_with_one_or_two_workers(shared_data, scifact_documents, scifact_punkt, tmp_path,
                                                     monkeypatch):
    monkeypatch.setattr("qac.data.arrowstore.ROWS_PER_BATCH", 16)   # several record batches in the file
    corpus = tmp_path / "corpus.jsonl"
    with open(shared_data / "scifact" / "corpus.jsonl", encoding="utf-8") as source:
        corpus.write_text("".join(itertools.islice(source, 60)), encoding="utf-8")
    punkt = tmp_path / "punkt"
    common = dict(tokenizer_spec="minilm", settings=settings(max_len=64, short_span_prob=0.15),
                  punkt="trained", progress=False)
    one, _ = split_corpus_file(corpus, tmp_path / "one.arrow", punkt, workers=1, chunk_size=64, **common)
    trained = {path.name: path.read_bytes() for path in punkt.iterdir()}
    two, model = split_corpus_file(corpus, tmp_path / "two.arrow", punkt, workers=2, chunk_size=7, **common)
    assert model == TRAINED
    assert {path.name: path.read_bytes() for path in punkt.iterdir()} == trained  # reused, not retrained
    assert (tmp_path / "one.arrow").read_bytes() == (tmp_path / "two.arrow").read_bytes()
    assert one == two and one.documents == 60 and one.max_tokens <= 64 and one.passages > 16
    assert not list(tmp_path.glob(".*.tmp"))


def test_same_seed_same_passages_other_seed_other_passages(scifact_documents, scifact_punkt, counter):
    splitter = load_sentence_splitter(scifact_punkt)
    documents = scifact_documents[:200]

    def run(seed):
        splits = split_documents(documents, splitter, counter, settings(max_len=128, short_span_prob=0.15, seed=seed))
        return json.dumps([split.passages for split in splits])

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_split_output_does_not_depend_on_batching(scifact_documents, scifact_punkt, tokenizer):
    splitter = load_sentence_splitter(scifact_punkt)
    documents = scifact_documents[:40]
    common = settings(max_len=32, short_span_prob=0.15)
    batched = split_documents(documents, splitter, TokenCounter(tokenizer, batched=True), common)
    one_by_one = split_documents(documents, splitter, TokenCounter(tokenizer, batched=False), common)
    assert batched == one_by_one


# --- Punkt ------------------------------------------------------------------

def test_trained_punkt_round_trips_and_is_reused(scifact_documents, tmp_path):
    calls = Counter()

    def texts():
        calls["train"] += 1
        return (text for _, text in scifact_documents[:150])

    directory = tmp_path / "punkt"
    assert prepare_punkt("trained", directory, texts, "md5-a") == TRAINED
    files = {path.name: path.read_bytes() for path in directory.iterdir()}
    assert set(files) == {"abbrev_types.txt", "collocations.tab", "sent_starters.txt", "ortho_context.tab",
                          "punkt.json"}
    assert prepare_punkt("trained", directory, texts, "md5-a") == TRAINED
    assert calls["train"] == 1                      # same corpus: reused
    prepare_punkt("trained", directory, texts, "md5-b")
    assert calls["train"] == 2                      # another corpus: retrained
    assert {path.name: path.read_bytes() for path in directory.iterdir()}.keys() == files.keys()
    # The saved files split like the parameters fresh from the trainer.
    fresh = PunktSentenceTokenizer(train_parameters(texts()))
    reloaded = load_sentence_splitter(directory)
    for _, text in scifact_documents[:150]:
        assert list(reloaded.span_tokenize(text)) == list(fresh.span_tokenize(text))


def _offline_nltk(monkeypatch, tmp_path):
    """NLTK with an empty data path and a network that refuses every connection (the downloader's urlopen)."""
    import urllib.error

    import nltk
    import nltk.downloader

    requested = []

    def refuse(url, *args, **kwargs):
        requested.append(str(getattr(url, "full_url", url)))
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk_data")])
    monkeypatch.setattr(nltk.downloader, "urlopen", refuse)
    monkeypatch.setattr(nltk.downloader._downloader, "_download_dir", str(tmp_path / "nltk_data"))
    return requested


def test_punkt_settings_are_explicit_and_pretrained_never_falls_back(monkeypatch, tmp_path):
    import qac.data.punkt as punkt

    requested = _offline_nltk(monkeypatch, tmp_path)
    assert prepare_punkt("trained", tmp_path / "p", lambda: iter(["One sentence. Another one."]), "x") == TRAINED
    with pytest.raises(ValueError, match="split.punkt"):   # no silent choice between the two any more
        prepare_punkt("auto", tmp_path / "a", lambda: iter([]), "x")
    with pytest.raises(ValueError, match="split.punkt"):
        prepare_punkt("english", tmp_path / "s", lambda: iter([]), "x")
    texts_read = []
    with pytest.raises(punkt.PunktUnavailableError) as caught:
        prepare_punkt("pretrained", tmp_path / "q", lambda: texts_read.append(1) or iter([]), "x")
    message = str(caught.value)
    assert requested, "NLTK's downloader was not asked for the package"
    assert "python -m nltk.downloader punkt_tab" in message and "network is unreachable" in message
    assert "split.punkt: trained" in message and "\n" not in message
    assert not (tmp_path / "q").exists() and not texts_read   # nothing written, nothing trained instead
    monkeypatch.setattr(punkt, "pretrained_english_available", lambda: True)
    assert prepare_punkt("pretrained", tmp_path / "r", lambda: iter([]), "x") == PRETRAINED
    assert json.loads((tmp_path / "r" / "punkt.json").read_text())["model"] == PRETRAINED


# --- the stage ------------------------------------------------------------------

def split_stage_project(shared_data: Path, tmp_path: Path, monkeypatch, documents: int, profile: str, split: dict):
    """The split_passages stage, imported, with the first ``documents`` of SciFact prepared under
    ``tmp_path/data/<profile>`` and the smoke parameters (``split`` merged in) as its params file."""
    import yaml

    from qac.data.beir import read_beir
    from qac.data.prepared import prepare_dataset, write_prepared
    from stages import load_stage
    from test_release_data import smoke_params

    dataset = read_beir(shared_data / "scifact", [], name="scifact")
    dataset.corpus = dict(itertools.islice(dataset.corpus.items(), documents))
    write_prepared(prepare_dataset(dataset), tmp_path / "data" / profile / "datasets" / "scifact")
    params = smoke_params(profile=profile, seed=3, data_dir="data", split=split)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QAC_PARAMS", str(tmp_path / "params.yaml"))
    return load_stage("split_passages"), dataset


def test_split_stage_writes_passages_punkt_and_metrics(shared_data, tmp_path, monkeypatch, mlflow_store):
    stage, dataset = split_stage_project(
        shared_data, tmp_path, monkeypatch, 40, "smoke",
        split={"tokenizer": "minilm", "max_len": 48, "short_span_prob": 0.15, "workers": 1, "punkt": "trained",
               "punkt_train_documents": None, "max_documents": None})
    assert stage.main() == 0

    out = tmp_path / "data" / "smoke"
    passages = list(iter_records(out / "passages.arrow", PASSAGES_SCHEMA))
    assert [p["doc_id"] for p in passages][0] == next(iter(dataset.corpus))
    assert max(p["n_tokens"] for p in passages) <= 48
    metrics = json.loads((out / "metrics" / "split.json").read_text())
    assert metrics["documents"] == 40 and metrics["passages"] == len(passages)
    assert metrics["punkt"] == TRAINED and (out / "punkt" / "abbrev_types.txt").is_file()
    assert metrics["mean_tokens"] == pytest.approx(sum(p["n_tokens"] for p in passages) / len(passages))

    import mlflow

    [run] = mlflow.search_runs(experiment_names=["qac-smoke"], filter_string="tags.`qac.kind` = 'split'",
                               output_format="list")
    assert run.info.run_name == "split_passages"
    assert run.data.tags["qac.punkt"] == TRAINED
    assert run.data.metrics["passages"] == len(passages) and run.data.metrics["max_tokens"] <= 48
    assert {"sentences", "mean_tokens", "seconds"} <= set(run.data.metrics)


def test_split_stage_without_nltk_punkt_and_network_stops_with_the_command(shared_data, tmp_path, monkeypatch,
                                                                            capsys):
    _offline_nltk(monkeypatch, tmp_path)
    stage, _ = split_stage_project(shared_data, tmp_path, monkeypatch, 5, "paper",
                                   split={"max_len": 48, "workers": 1, "punkt": "pretrained", "max_documents": None})
    with pytest.raises(SystemExit) as caught:
        stage.main()
    assert "python -m nltk.downloader punkt_tab" in str(caught.value.code)
    out = tmp_path / "data" / "paper"
    assert not (out / "passages.arrow").exists() and not (out / "punkt").exists()
