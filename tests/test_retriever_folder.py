"""A retriever folder says how it encodes: sentence-transformers loads it and gets our vectors."""

import numpy as np
import pytest
import torch

from qac.models.biencoder import BiEncoder, pool
from qac.models.encoding import Encoding, read_encoding
from qac.retrieval.encode import encode_texts

TEXTS = ["a short text", "x",
         "a somewhat longer text about proteins and cells and the many things they do in living tissues"]


def assert_same_vectors(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal up to float32 rounding of vectors of this magnitude (two forward passes, other batching)."""
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-5 * float(np.abs(ours).max()))


@pytest.mark.parametrize("pooling, normalize", [("cls", False), ("mean", True)])
def test_a_saved_retriever_loads_in_sentence_transformers_with_our_vectors(tiny_bert_dir, tmp_path, pooling,
                                                                             normalize):
    from sentence_transformers import SentenceTransformer

    from qac.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_bert_dir))
    folder = tmp_path / "retriever"
    BiEncoder.from_pretrained(tiny_bert_dir, pooling=pooling, normalize=normalize).save(
        folder, tokenizer, query_max_len=6, passage_max_len=12, title_separator=" [SEP] ")
    encoding = read_encoding(folder)
    assert encoding == Encoding(pooling=pooling, normalize=normalize, query_max_len=6, passage_max_len=12,
                                title_separator=" [SEP] ")
    reloaded = BiEncoder.from_pretrained(folder)       # pooling and normalisation from the folder, not arguments
    assert (reloaded.pooling, reloaded.normalize) == (pooling, normalize)

    ours = encode_texts(reloaded.encoder, tokenizer, TEXTS, max_length=encoding.passage_max_len,
                        pooling=encoding.pooling, normalize=encoding.normalize)
    model = SentenceTransformer(str(folder), device="cpu")
    assert model.max_seq_length == 12        # the long text is cut where ours is
    assert_same_vectors(ours, model.encode(TEXTS, convert_to_numpy=True))
    assert_same_vectors(ours, model.encode_document(TEXTS, convert_to_numpy=True))
    queries = encode_texts(reloaded.encoder, tokenizer, TEXTS, max_length=6, pooling=pooling, normalize=normalize)
    assert_same_vectors(queries, model.encode_query(TEXTS, convert_to_numpy=True))   # cut at 6, not 12
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-6)


def test_a_plain_encoder_folder_declares_no_encoding(tiny_bert_dir):
    assert read_encoding(tiny_bert_dir) is None
    assert BiEncoder.from_pretrained(tiny_bert_dir).pooling == "cls"


def test_mean_pooling_divides_by_the_attended_tokens_and_an_empty_row_is_zero():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    pooled = pool(hidden, mask, "mean")
    assert pooled.tolist() == [[2.0, 3.0], [0.0, 0.0]]     # padding ignored; no NaN for no token
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0], [5.0, 6.0]]


# Twelve documents of one to three dozen words and six queries, each with its one relevant document: a
# random tiny encoder ranks them in some order, and both encoders must rank them in the same one.
WORDS = ("protein cell tissue gene enzyme membrane signal pathway receptor neuron cortex memory river "
         "delta basin flood rain cloud market price trade bond yield rate").split()


def corpus_and_queries():
    import random

    rng = random.Random(7)
    docs = {f"d{i}": (f"title {i}", " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 36))))
            for i in range(12)}
    queries = {f"q{i}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) for i in range(6)}
    qrels = {f"q{i}": {f"d{2 * i}": 1} for i in range(6)}
    return docs, queries, qrels


def test_sentence_transformers_retrieves_what_qac_retrieves_with_each_side_at_its_length(tiny_bert_dir, tmp_path,
                                                                                      capfd, caplog):
    """encode_query / encode_document of the folder give qac's vectors at the query length (5) and the
    document length (20), and so qac's run and RR@10, to float rounding; loading reports nothing."""
    import logging
    import warnings

    from sentence_transformers import SentenceTransformer

    from qac.evaluation.metrics import evaluate
    from qac.models.loading import load_tokenizer
    from qac.retrieval import document_text
    from qac.retrieval.search import dense_search

    tokenizer = load_tokenizer(str(tiny_bert_dir))
    folder = tmp_path / "retriever"
    BiEncoder.from_pretrained(tiny_bert_dir).save(folder, tokenizer, query_max_len=5, passage_max_len=20,
                                                  title_separator=" [SEP] ")
    encoding = read_encoding(folder)
    docs, queries, qrels = corpus_and_queries()
    texts = [document_text(title, text, encoding.title_separator) for title, text in docs.values()]
    model = BiEncoder.from_pretrained(folder)
    ours_docs = encode_texts(model.encoder, tokenizer, texts, max_length=20, pooling="cls")
    ours_queries = encode_texts(model.encoder, tokenizer, list(queries.values()), max_length=5, pooling="cls")

    capfd.readouterr()
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        st = SentenceTransformer(str(folder), device="cpu")
    loading = capfd.readouterr()
    assert not caught, [str(w.message) for w in caught]
    assert not caplog.records, [record.getMessage() for record in caplog.records]
    assert "newly initialized" not in loading.err + loading.out and "MISSING" not in loading.err + loading.out
    theirs_docs = st.encode_document(texts, convert_to_numpy=True)
    theirs_queries = st.encode_query(list(queries.values()), convert_to_numpy=True)
    assert_same_vectors(ours_docs, theirs_docs)
    assert_same_vectors(ours_queries, theirs_queries)
    assert not np.allclose(ours_queries, encode_texts(model.encoder, tokenizer, list(queries.values()),
                                                      max_length=20, pooling="cls"))   # the length matters here

    ours = evaluate(qrels, dense_search(list(queries), ours_queries, list(docs), ours_docs, k=10), ["RR@10"])
    theirs = evaluate(qrels, dense_search(list(queries), theirs_queries, list(docs), theirs_docs, k=10), ["RR@10"])
    assert theirs.aggregate["RR@10"] == pytest.approx(ours.aggregate["RR@10"], abs=1e-6)
    assert 0 < ours.aggregate["RR@10"] < 1


def test_a_folder_without_a_pooler_loads_in_qac_without_one(tiny_bert_dir, tmp_path):
    from qac.models.encoding import loading_arguments
    from qac.models.loading import load_tokenizer

    folder = tmp_path / "retriever"
    BiEncoder.from_pretrained(tiny_bert_dir).save(folder, load_tokenizer(str(tiny_bert_dir)), query_max_len=5,
                                                  passage_max_len=20)
    assert loading_arguments(folder) == {"add_pooling_layer": False}
    assert BiEncoder.from_pretrained(folder).encoder.pooler is None
    assert loading_arguments(tiny_bert_dir) == {}


def test_a_folder_written_before_the_per_side_lengths_reads_its_query_length_from_retriever_json(tmp_path):
    import json

    from qac.models.encoding import RETRIEVER_FILE, write_encoding

    write_encoding(tmp_path, Encoding(pooling="cls", normalize=False, query_max_len=7, passage_max_len=30), 64)
    config = json.loads((tmp_path / "sentence_bert_config.json").read_text())
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 30}))
    (tmp_path / RETRIEVER_FILE).write_text(json.dumps({"query_max_len": 7, "title_separator": " "}))
    assert (config["query_length"], config["document_length"]) == (7, 30)
    assert read_encoding(tmp_path) == Encoding(pooling="cls", normalize=False, query_max_len=7, passage_max_len=30)
