"""Faster kernels compute the same thing: SDPA in the head and decoder layers, torch.compile."""

from __future__ import annotations

import copy

import pytest
import torch

from qac.models.backbone import new_layers, padding_mask, run_layers
from qac.models.cotmae import windowed_causal_mask


def _layers(implementation: str):
    from qac.models.loading import load_config

    config = load_config("tiny:minilm", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return new_layers(config, 2, seed=3, attn_implementation=implementation).double().eval()


@pytest.mark.parametrize("mask_kind", ["padding", "window"])
def test_sdpa_layers_equal_eager_layers(mask_kind):
    attention = torch.tensor([[1] * 9, [1] * 5 + [0] * 4, [1] * 2 + [0] * 7])
    mask = padding_mask(attention) if mask_kind == "padding" else windowed_causal_mask(attention, 3)
    hidden = torch.randn(3, 9, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eager, sdpa = _layers("eager"), _layers("sdpa")
    sdpa.load_state_dict(eager.state_dict())
    expected, actual = run_layers(eager, hidden, mask), run_layers(sdpa, hidden, mask)
    real = attention.bool()            # padding query positions carry no loss and are not compared
    assert torch.allclose(actual[real], expected[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", [
    "aot_eager",                                   # graph capture and autograd tracing: seconds
    pytest.param("inductor", marks=[pytest.mark.slow, pytest.mark.timeout(1800)]),   # generated kernels: minutes
])
def test_compiled_model_gives_the_same_loss(tmp_path, backend):
    from test_pretrain_corpus import write_corpus

    from qac.data.context_pairs import PairCollator, PairSampler, load_pair_corpus
    from qac.models.cocondenser import CoCondenser
    from qac.models.loading import load_tokenizer

    tokenizer = load_tokenizer("minilm")
    passages, queries = write_corpus(tmp_path, documents=3, spans=2, queries=2)
    corpus = load_pair_corpus(passages, queries, "query", query_count=2, tokenizer=tokenizer)
    batch = PairCollator(tokenizer, 40, 12, 0.15, 0.15, seed=0)(PairSampler(corpus, "query", seed=0).batch(0, 6), 0)
    model = CoCondenser.from_spec("tiny:minilm", seed=0, dropout=0.0, skip_from=1, n_head_layers=1).eval()
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    with torch.no_grad():
        expected, actual = model(batch).parts, compiled(batch).parts
    for name, value in expected.items():
        # float32 sums over a few hundred terms of size ~10: a few units of float32 rounding
        assert float(actual[name]) == pytest.approx(float(value), rel=1e-5), name


def test_compiled_cotmae_release_decoder_gives_the_same_loss():
    from qac.data.context_pairs import Pair, PairCollator
    from qac.models.cotmae import CoTMAE
    from qac.models.loading import load_tokenizer

    tokenizer = load_tokenizer("minilm")
    model = CoTMAE.from_spec("tiny:minilm", seed=0, dropout=0.0, decoder="release").eval()
    pairs = [Pair(i, f"protein {i} binds the receptor of cell {i} " * 3, f"what binds cell {i}", "query")
             for i in range(4)]
    batch = PairCollator(tokenizer, 40, 12, *model.mask_ratios, seed=0)(pairs, 0)
    compiled = torch.compile(copy.deepcopy(model), backend="aot_eager")
    with torch.no_grad():
        expected, actual = model(batch).parts, compiled(batch).parts
    for name, value in expected.items():
        assert float(actual[name]) == pytest.approx(float(value), rel=1e-5), name
