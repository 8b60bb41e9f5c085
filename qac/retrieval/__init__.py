"""Retrieval: BM25 (bm25s), dense encoding, FAISS search and hard-negative mining.

- :mod:`qac.retrieval.bm25`: ``BM25Index(doc_ids, texts, BM25Settings.from_params(params.bm25)).search(queries, k)``;
- :mod:`qac.retrieval.encode`: ``encode_texts`` (length-sorted, [CLS]/mean pooling, autocast on GPU),
  ``encode_distributed`` (shares across torchrun ranks, gathered on rank 0);
- :mod:`qac.retrieval.search`: exact FAISS inner-product ``search`` / ``dense_search``;
- :mod:`qac.retrieval.dense`: ``dense_retrieve`` (encode corpus and queries, search, return a run);
- :mod:`qac.retrieval.mining`: ``mine_hard_negatives`` and the negatives-file records.

A run is ``{query id: {doc id: score}}`` everywhere, ranked by trec_eval's
order (``qac.evaluation.metrics.trec_order``).
"""

from __future__ import annotations

from qac.params.vocabulary import TITLE_JOINS


def document_text(title: str | None, text: str | None, separator: str = " ") -> str:
    """The text a document is retrieved by: title, ``separator``, body; stripped.

    A space for BM25 and, by default, dense retrieval. The release's fine-tuning
    and in-domain evaluation (Tevatron) encode ``title + [SEP] + text`` instead
    (:func:`title_separator`); a document without a title is then its body alone.
    """
    if separator == " ":
        return f"{title or ''} {text or ''}".strip()
    title, text = (title or "").strip(), (text or "").strip()
    return f"{title}{separator}{text}" if title else text


def title_separator(join: str, tokenizer) -> str:
    """What joins title and text for a dense encoder (``finetune.title_join``): ``space`` or ``sep``.

    ``sep`` is the tokenizer's separator token (``[SEP]`` for BERT), which its
    tokenizer reads back as that special token, as Tevatron's MS MARCO corpus has it.
    """
    if join == "space":
        return " "
    if join == "sep":
        if not getattr(tokenizer, "sep_token", None):
            raise ValueError("finetune.title_join is 'sep' but the encoder's tokenizer has no separator token")
        return tokenizer.sep_token
    raise ValueError(f"finetune.title_join: {join!r} is not one of {', '.join(TITLE_JOINS)}")
