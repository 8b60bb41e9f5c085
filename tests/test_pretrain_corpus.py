"""A small passages.arrow / queries.arrow pair in the formats of docs/architecture.md.

``write_corpus`` is imported by the other pre-training tests; the tests here
check that the fixture means what they assume.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qac.data.arrowstore import iter_records, write_passages, write_queries, PASSAGES_SCHEMA, QUERIES_SCHEMA

WORDS = ("protein cell membrane receptor binding signal pathway gene expression tumour growth factor "
         "immune response vaccine trial patient dose effect study cohort risk mortality infection virus "
         "antibody structure enzyme activity inhibitor metabolism insulin glucose liver kidney heart "
         "neuron brain memory sleep stress hormone therapy outcome randomized placebo evidence").split()


def _sentence(rng: np.random.Generator, length: int) -> str:
    return " ".join(rng.choice(WORDS, size=length)) + "."


def write_corpus(directory: Path, documents: int = 6, spans: int = 3, queries: int = 4, seed: int = 0,
                 single_span_documents: int = 1, tokenizer: str = "minilm") -> tuple[Path, Path]:
    """Documents of ``spans`` passages each (plus single-span documents with no passage context),
    with the token ids of ``tokenizer`` (a model spec), as the split and generation stages write them."""
    from qac.models.loading import load_tokenizer

    rng = np.random.default_rng(seed)
    passages, query_records = [], []
    layout = [spans] * documents + [1] * single_span_documents
    for doc, count in enumerate(layout):
        pids = [f"d{doc}#{k}" for k in range(count)]
        for k, pid in enumerate(pids):
            text = " ".join(_sentence(rng, int(rng.integers(6, 14))) for _ in range(3))
            others = [other for other in pids if other != pid]
            passages.append({"pid": pid, "doc_id": f"d{doc}", "position": k, "text": text,
                             "n_tokens": len(text.split()),
                             "contexts": {"nearby": [p for p in pids if abs(pids.index(p) - k) == 1],
                                          "random_sampled": others[:1],
                                          "overlap": text.split(".")[-2].strip() if count > 1 else ""}})
            query_records.append({"pid": pid, "queries": [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 7))))
                                                          for _ in range(queries)]})
    directory.mkdir(parents=True, exist_ok=True)
    passages_path, queries_path = directory / "passages.arrow", directory / "queries.arrow"
    loaded = load_tokenizer(tokenizer)
    write_passages(passages_path, passages, tokenizer=loaded, tokenizer_name=tokenizer)
    write_queries(queries_path, query_records, tokenizer=loaded, tokenizer_name=tokenizer)
    return passages_path, queries_path


def write_master_inputs(directory: Path, tokenizer_spec: str = "tiny:minilm") -> dict[str, Path]:
    """MASTER's other inputs beside a :func:`write_corpus` folder: word frequencies and one continuation per passage."""
    import json

    from qac.data.master import count_word_frequencies
    from qac.models.loading import load_tokenizer

    passages_path = directory / "passages.arrow"
    frequencies = directory / "word_frequencies.json"
    frequencies.write_text(json.dumps(count_word_frequencies(passages_path, load_tokenizer(tokenizer_spec))))
    rng = np.random.default_rng(1)
    continuations = directory / "continuations.arrow"
    write_queries(continuations, [{"pid": record["pid"], "queries": [" ".join(rng.choice(WORDS, size=8))]}
                                  for record in iter_records(passages_path, PASSAGES_SCHEMA)],
                  tokenizer=load_tokenizer(tokenizer_spec), tokenizer_name=tokenizer_spec)
    return {"word_frequencies": frequencies, "continuations": continuations}


def test_fixture_has_single_span_documents_without_passage_context(tmp_path):
    passages_path, queries_path = write_corpus(tmp_path, documents=2, spans=3, queries=2)
    records = list(iter_records(passages_path, PASSAGES_SCHEMA))
    assert len(records) == 2 * 3 + 1
    single = records[-1]
    assert single["contexts"] == {"nearby": [], "random_sampled": [], "overlap": ""}
    assert records[1]["contexts"]["nearby"] == ["d0#0", "d0#2"]
    assert all(len(record["queries"]) == 2 for record in iter_records(queries_path, QUERIES_SCHEMA))
