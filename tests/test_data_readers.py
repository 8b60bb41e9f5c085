"""Readers of the dataset formats, each on a small fixture written here."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from qac.data.beir import read_beir, read_corpus_jsonl, write_beir
from qac.data.dataset import Dataset, Document
from qac.data.errors import DatasetUnavailableError
from qac.data.msmarco import read_msmarco_documents, read_passage_collection
from qac.data.trec import read_topics, read_trec_qrels


def write_lines(path, lines, *, compress=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def jsonl(records):
    return [json.dumps(record) for record in records]


@pytest.fixture()
def beir_dir(tmp_path):
    root = tmp_path / "tiny"
    write_lines(root / "corpus.jsonl", jsonl([
        {"_id": "d1", "title": "Aspirin", "text": "Aspirin reduces fever."},
        {"_id": "d2", "title": "", "text": "Untitled text."},
        {"_id": 3, "text": "An integer id and no title."},
        {"_id": "d4", "title": " ", "text": "  "},
    ]))
    write_lines(root / "queries.jsonl", jsonl([
        {"_id": "q1", "text": "does aspirin reduce fever", "metadata": {}},
        {"_id": "q2", "text": "untitled"},
    ]))
    write_lines(root / "qrels" / "test.tsv", ["query-id\tcorpus-id\tscore", "q1\td1\t2", "q1\td2\t0", "q2\t3\t1"])
    write_lines(root / "qrels" / "train.tsv", ["query-id\tcorpus-id\tscore", "q2\td2\t1", "q2\td2\t1"])
    return root


def test_beir_folder(beir_dir):
    skipped = Counter()
    dataset = read_beir(beir_dir, ["test", "train"], skipped=skipped)
    assert dataset.name == "tiny"
    assert dataset.corpus == {
        "d1": Document("d1", "Aspirin", "Aspirin reduces fever."),
        "d2": Document("d2", "", "Untitled text."),
        "3": Document("3", "", "An integer id and no title."),
    }
    assert dataset.corpus["d1"].full_text == "Aspirin Aspirin reduces fever."
    assert dataset.corpus["d2"].full_text == "Untitled text."
    assert dataset.queries == {"q1": "does aspirin reduce fever", "q2": "untitled"}
    assert dataset.qrels == {"test": {"q1": {"d1": 2, "d2": 0}, "q2": {"3": 1}}, "train": {"q2": {"d2": 1}}}
    assert dataset.split_queries("train") == {"q2": "untitled"}
    # d4 is empty; the repeated train judgement is kept once.
    assert skipped == Counter({"corpus_empty_text": 1, "qrels_duplicate": 1})


def test_beir_round_trip(beir_dir, tmp_path):
    dataset = read_beir(beir_dir, ["test", "train"])
    out = tmp_path / "copy"
    write_beir(dataset, out)
    again = read_beir(out, ["test", "train"])
    assert (again.corpus, again.queries, again.qrels) == (dataset.corpus, dataset.queries, dataset.qrels)
    assert (out / "qrels" / "train.tsv").read_text() == "query-id\tcorpus-id\tscore\nq2\td2\t1\n"


def test_beir_scifact_from_the_mirror(shared_data):
    dataset = read_beir(shared_data / "scifact", ["train", "test"])
    assert len(dataset.corpus) == 5183 and len(dataset.queries) == 1109
    assert sum(map(len, dataset.qrels["test"].values())) == 339
    assert len(dataset.qrels["train"]) == 809


def test_msmarco_documents_join_title_and_body(tmp_path):
    path = write_lines(tmp_path / "msmarco-docs.tsv.gz", [
        "D1\thttp://a.example/\tThe title\tThe body text.",
        "D2\thttp://b.example/\t\tBody without title.",
        "D3\thttp://c.example/\t \t ",
    ], compress=True)
    skipped = Counter()
    corpus = read_msmarco_documents(path, skipped=skipped)
    assert list(corpus) == ["D1", "D2"]
    assert corpus["D1"] == Document("D1", "The title", "The body text.")
    assert corpus["D1"].full_text == "The title The body text."
    assert corpus["D2"].full_text == "Body without title."
    assert skipped == Counter({"corpus_empty_text": 1})


def test_msmarco_passage_collection(tmp_path):
    path = write_lines(tmp_path / "collection.tsv", ["0\tThe presence of communication.", "1\tSecond passage."])
    assert read_passage_collection(path) == {"0": Document("0", "", "The presence of communication."),
                                             "1": Document("1", "", "Second passage.")}


def test_trec_topics_and_qrels(tmp_path):
    topics = write_lines(tmp_path / "topics.txt", ["1048585\twhat is paula deen's brother", "2\t Androgen receptor define"])
    qrels = write_lines(tmp_path / "qrels.txt", ["19335 Q0 1017759 0", "19335 Q0 1082489 3", "23849\t0\t1020327\t2"])
    assert read_topics(topics) == {"1048585": "what is paula deen's brother", "2": "Androgen receptor define"}
    assert read_trec_qrels(qrels) == {"19335": {"1017759": 0, "1082489": 3}, "23849": {"1020327": 2}}


def test_trec_files_from_the_mirror(shared_data):
    folder = shared_data / "trec-msmarco"
    assert len(read_topics(folder / "topics.msmarco-passage.dev-subset.txt")) == 6980
    qrels = read_trec_qrels(folder / "qrels.msmarco-passage.dev-subset.txt")
    assert sum(map(len, qrels.values())) == 7437
    assert len(read_trec_qrels(folder / "qrels.dl19-passage.txt")) == 43


def test_hub_dataset_without_a_reachable_hub_is_a_clear_error(monkeypatch):
    from qac.data.hub import read_hub_dataset

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")  # no warm cache either
    with pytest.raises(DatasetUnavailableError, match=r"BeIR/scifact.*hub reachable"):
        read_hub_dataset("BeIR/scifact", ["test"])


def test_dataset_helpers():
    dataset = Dataset("x", {}, {"q": "text"}, {"test": {"q": {"d": 1}}},
                      meta={"rel_threshold": {"test": 2}, "ignore_identical_ids": True})
    assert dataset.splits == ["test"]
    assert dataset.rel_threshold("test") == 2 and dataset.ignore_identical_ids


def test_corpus_reader_skips_nothing_that_has_text(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", jsonl([{"_id": "a", "title": "Only a title", "text": ""}]))
    assert read_corpus_jsonl(path)["a"].full_text == "Only a title"


def test_a_collection_without_judged_splits_reads_without_queries(tmp_path):
    """The prepared MS MARCO documents (pre-training's corpus, splits: []) have an empty queries.jsonl; a dataset
    with a judged split and no queries is still refused."""
    from qac.data.errors import DataFormatError

    (tmp_path / "corpus.jsonl").write_text('{"_id": "D1", "title": "t", "text": "a passage"}\n', encoding="utf-8")
    (tmp_path / "queries.jsonl").write_text("", encoding="utf-8")
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tD1\t1\n", encoding="utf-8")
    dataset = read_beir(tmp_path, [])
    assert list(dataset.corpus) == ["D1"] and dataset.queries == {} and dataset.qrels == {}
    with pytest.raises(DataFormatError, match="no queries"):
        read_beir(tmp_path, ["test"])
