"""Dense retrieval end to end on the tiny model: the same run as encoding and brute-force search by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from qac.retrieval.dense import DenseSettings, dense_retrieve
from qac.retrieval.encode import encode_texts

DOCS = {"d1": "cats sit on mats", "d2": "dogs run in parks", "d3": "markets fell today", "d4": "a cat and a dog"}
QUERIES = {"q1": "where do cats sit", "q2": "stock markets"}


# [CLS] vectors, inner products, on the CPU in fp32.
SETTINGS = DenseSettings(query_max_length=32, passage_max_length=32, batch_size=128, pooling="cls", dtype="fp32",
                         depth=1000, normalize=False)


@pytest.fixture(scope="module")
def tiny():
    from qac.models.loading import load_model, load_tokenizer

    return load_model("tiny:minilm", seed=0).eval(), load_tokenizer("minilm")


def test_run_equals_brute_force_over_cls_embeddings(tiny):
    model, tokenizer = tiny
    settings = dataclasses.replace(SETTINGS, query_max_length=16, passage_max_length=16, batch_size=2, depth=3)
    run = dense_retrieve(model, tokenizer, list(DOCS), list(DOCS.values()), QUERIES, settings)
    passages = encode_texts(model, tokenizer, list(DOCS.values()), max_length=16)
    queries = encode_texts(model, tokenizer, list(QUERIES.values()), max_length=16)
    scores = queries @ passages.T
    for row, qid in enumerate(QUERIES):
        expected = [list(DOCS)[i] for i in np.argsort(-scores[row])[:3]]
        assert list(run[qid]) == expected
        assert [run[qid][d] for d in expected] == pytest.approx(sorted(scores[row], reverse=True)[:3], abs=1e-4)


def test_precomputed_passage_embeddings_are_used(tiny):
    model, tokenizer = tiny
    query = encode_texts(model, tokenizer, ["anything"], max_length=32)[0]
    passages = np.stack([-query, -query, query, -query])     # only d3 scores positively
    run = dense_retrieve(model, tokenizer, list(DOCS), list(DOCS.values()), {"q": "anything"},
                         dataclasses.replace(SETTINGS, depth=1), passage_embeddings=passages)
    assert list(run["q"]) == ["d3"]
