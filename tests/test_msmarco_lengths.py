"""The benchmarks' MS MARCO lengths: the shipped histograms have the published statistics and are what
their generator writes; the sample drawn from them has those lengths in tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def lengths_module():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import msmarco_lengths
        import sample_text
    finally:
        sys.path.remove(str(BENCHMARKS))
    return msmarco_lengths, sample_text


def test_the_histograms_have_ms_marcos_published_statistics(lengths_module):
    msmarco_lengths, _ = lengths_module
    lengths = msmarco_lengths.load()
    passages, queries = lengths["passages"], lengths["queries"]
    assert passages.mean() == pytest.approx(80.6, abs=0.05)
    assert np.median(passages) == 71 and np.percentile(passages, 95) == pytest.approx(142, abs=0.5)
    assert (passages > 144).mean() == pytest.approx(0.045, abs=0.001)
    assert queries.mean() == pytest.approx(9.0, abs=0.05) and queries.max() == 44


def test_the_shipped_file_is_what_the_generator_writes(lengths_module):
    import json

    msmarco_lengths, _ = lengths_module
    assert json.loads(msmarco_lengths.LENGTHS_FILE.read_text(encoding="utf-8")) == msmarco_lengths.build()


def test_a_sampled_text_is_as_many_tokens_as_its_drawn_length(lengths_module):
    from transformers import BertTokenizerFast

    _, sample_text = lengths_module
    tokenizer = BertTokenizerFast(vocab_file=str(sample_text.MODEL_DIR / "vocab.txt"), do_lower_case=True)
    triples = sample_text.msmarco_length_triples(400)
    counted = {side: np.array([len(ids) for ids in tokenizer([t[index] for t in triples],
                                                             add_special_tokens=False)["input_ids"]])
               for index, side in enumerate(("passage", "context", "query"))}
    assert all((counted[side] == [len(t[index].split()) for t in triples]).all()
               for index, side in enumerate(counted))
    assert 75 < counted["passage"].mean() < 86 and 8 < counted["query"].mean() < 10
