"""BM25 through bm25s: document text, ranking, stemming and stopwords."""

from __future__ import annotations

import pytest

from qac.retrieval import document_text
from qac.retrieval.bm25 import BM25Index, BM25Settings

DOC_IDS = ["cats", "dogs", "both", "other"]
TEXTS = ["the cat sat on the mat", "dogs are running in the park", "a cat chased a dog", "stock market news"]


def test_document_text_joins_title_and_text():
    assert document_text("Title", "body ") == "Title body"
    assert document_text("", " body") == "body"
    assert document_text(None, "body") == "body"


def test_documents_sharing_no_term_are_not_returned():
    run = BM25Index(DOC_IDS, TEXTS).search({"q": "market"}, k=10)
    assert list(run["q"]) == ["other"]


def test_stemming_matches_inflected_forms():
    index = BM25Index(DOC_IDS, TEXTS)
    assert set(index.search({"q": "cats"}, k=10)["q"]) == {"cats", "both"}
    unstemmed = BM25Index(DOC_IDS, TEXTS, BM25Settings(stemmer=None))
    assert unstemmed.search({"q": "cats"}, k=10)["q"] == {}


def test_stopword_only_query_retrieves_nothing_and_k_is_capped():
    index = BM25Index(DOC_IDS, TEXTS)
    run = index.search({"stop": "the and a", "q": "cat dog"}, k=100)
    assert run["stop"] == {}
    assert list(run["q"])[0] == "both"          # the only document with both terms
    assert all(score > 0 for score in run["q"].values())


def test_shorter_document_scores_higher_for_the_same_match():
    run = BM25Index(["short", "long"], ["cat", "cat " + "filler words here " * 10]).search({"q": "cat"})
    assert run["q"]["short"] > run["q"]["long"]


def test_mismatched_inputs_are_rejected():
    with pytest.raises(ValueError, match="document ids"):
        BM25Index(["a"], ["x", "y"])


def test_scifact_ndcg_matches_published_bm25(shared_data):
    """BEIR reports BM25 nDCG@10 = 0.665 on SciFact test (Lucene); bm25s with stemming reports about 0.68."""
    from qac.data.beir import read_beir
    from qac.evaluation.metrics import evaluate

    dataset = read_beir(shared_data / "scifact", ["test"])
    index = BM25Index(list(dataset.corpus), [document.full_text for document in dataset.corpus.values()])
    run = index.search(dataset.split_queries("test"), k=100)
    ndcg = evaluate(dataset.qrels["test"], run, ["nDCG@10"]).aggregate["nDCG@10"]
    assert 0.65 < ndcg < 0.70
