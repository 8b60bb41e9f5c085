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
