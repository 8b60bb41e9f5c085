"""Gradient caching gives the full-batch gradient (qac.models.grad_cache)."""

from __future__ import annotations

import pytest
import torch

from qac.models.cocondenser import CoCondenser
from qac.models.cotmae import CoTMAE
from qac.models.grad_cache import FullBatchStep, GradCachedStep, RngState
from test_models_cocondenser import make_batch

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


_BUILT: dict[float, CoCondenser] = {}


def tiny(dropout):
    """A fresh float64 copy of one tiny coCondenser per dropout value (building one takes seconds).

    Float64 because the claim under test is that gradient caching computes the
    same mathematics as the full batch: the two paths only sum in a different
    order, so in float64 they agree to ~1e-16 relative whatever the thread
    count or BLAS, while a real error (a missed term, a wrong scale) stays of
    the order of the gradient itself.
    """
    import copy

    if dropout not in _BUILT:
        _BUILT[dropout] = CoCondenser.from_spec("tiny:minilm", seed=0, dropout=dropout, n_head_layers=1, skip_from=1)
    return copy.deepcopy(_BUILT[dropout]).double()


def gradients(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def rounding_tolerance(gradients, batch) -> float:
    """How far two float64 evaluations of the same gradient may differ by rounding alone.

    Every gradient entry is a sum over the batch's tokens of products through
    the hidden width, so reordering that sum changes it by about
    ``eps * sqrt(n) * scale`` (random-walk rounding) with ``n`` the number of
    summed terms and ``scale`` the largest gradient magnitude of the model
    (entries exactly zero in exact arithmetic, such as attention key biases,
    pick up noise of that scale, not of their own). The factor 64 leaves room
    for the depth of the network; it is still ~1e-11 of the scale, far below
    anything a wrong formula would give.
    """
    eps = torch.finfo(torch.float64).eps
    scale = max(g.abs().max().item() for g in gradients.values())
    tokens = sum(int(side["attention_mask"].sum()) for side in batch.values())
    width = max(g.shape[-1] for g in gradients.values() if g.dim() == 2)
    return 64 * eps * (tokens * width) ** 0.5 * scale


def assert_same_gradients(expected, actual, batch):
    assert expected.keys() == actual.keys() and len(expected) > 20
    tolerance = rounding_tolerance(expected, batch)
    for name in expected:
        assert expected[name].dtype == torch.float64, name
        error = (expected[name] - actual[name]).abs().max().item()
        assert error <= tolerance, f"{name}: {error:.3g} > {tolerance:.3g}"


@pytest.mark.parametrize("chunk_size", [3, 8])
def test_cached_gradient_equals_full_batch_gradient(tokenizer, chunk_size):
    batch = make_batch(tokenizer, n_pairs=7)
    full, cached = tiny(0.0).train(), tiny(0.0).train()
    full_parts = FullBatchStep(full, CPU).forward_backward(batch)
    cached_parts = GradCachedStep(cached, chunk_size, CPU).forward_backward(batch)
    assert_same_gradients(gradients(full), gradients(cached), batch)
    for name, value in full_parts.items():
        assert float(cached_parts[name]) == pytest.approx(float(value), rel=1e-12)   # float64 losses


def test_loss_scaling_reaches_every_term(tokenizer):
    batch = make_batch(tokenizer, n_pairs=5)
    full, cached = tiny(0.0), tiny(0.0)
    FullBatchStep(full, CPU).forward_backward(batch, lambda loss: loss * 0.25)
    GradCachedStep(cached, 2, CPU).forward_backward(batch, lambda loss: loss * 0.25)
    reference = tiny(0.0)
    FullBatchStep(reference, CPU).forward_backward(batch)
    assert_same_gradients({k: v * 0.25 for k, v in gradients(reference).items()}, gradients(cached), batch)
    assert_same_gradients(gradients(full), gradients(cached), batch)


def test_replayed_rng_reproduces_dropout(tokenizer):
    """With dropout on, the second pass draws the masks the first pass drew, so the cached gradient is the
    full-batch gradient of the loss under those masks.

    The first pass runs the encoder alone over a chunk it recomputes later, and
    the whole side over the last chunk of each side, whose graph it keeps: so
    chunk k's masks come from the generator as the first pass left it after
    the chunks before it. The reference below draws them so, chunk by chunk,
    and computes the batch's loss from the chunks' outputs. A second pass that
    did not replay the states would draw other masks and another gradient.
    """
    from qac.models.cocondenser import SideOutput
    from qac.models.grad_cache import side_chunks

    batch = make_batch(tokenizer, n_pairs=6)
    reference, cached = tiny(0.1).train(), tiny(0.1).train()
    sides = side_chunks(batch, 3)
    assert len(sides["anchor"]) == 2                # one chunk replayed, one kept
    torch.manual_seed(123)
    outputs = {}
    for side, chunks in sides.items():
        for index, chunk in enumerate(chunks):
            if index < len(chunks) - 1:             # replayed: the encoder alone first, the side from its state
                state = torch.get_rng_state()
                with torch.no_grad():
                    reference.represent(chunk)
                after = torch.get_rng_state()
                torch.set_rng_state(state)
                outputs.setdefault(side, []).append(reference.encode_side(chunk))
                torch.set_rng_state(after)
            else:                                   # kept: the whole side, once
                outputs.setdefault(side, []).append(reference.encode_side(chunk))
    joined = {side: SideOutput(cls=torch.cat([o.cls for o in parts]), mlm_sum=sum(o.mlm_sum for o in parts),
                               head_mlm_sum=sum(o.head_mlm_sum for o in parts), masked=sum(o.masked for o in parts))
              for side, parts in outputs.items()}
    expected = reference.pair_loss(joined["anchor"], joined["context"])
    expected.loss.backward()
    torch.manual_seed(123)
    cached_parts = GradCachedStep(cached, 3, CPU).forward_backward(batch)
    for name, value in expected.parts.items():
        assert float(cached_parts[name]) == pytest.approx(float(value), rel=1e-12), name
    assert_same_gradients(gradients(reference), gradients(cached), batch)


def test_chunks_hold_about_the_same_number_of_tokens_on_both_sides():
    from qac.models.grad_cache import rows_per_chunk

    batch = {"anchor": {"input_ids": torch.zeros(64, 144)}, "context": {"input_ids": torch.zeros(64, 16)}}
    assert rows_per_chunk(batch, 8) == {"anchor": 8, "context": 72}   # 8 x 144 tokens = 72 x 16


def test_first_pass_runs_the_encoder_alone():
    """Counted FLOPs (BERT-base shapes, on the meta device): the gradient-cached step costs the full step plus
    exactly one encoder forward over the chunks it recomputes, nothing of the condenser head or the MLM heads;
    the last chunk of each side keeps its first pass and costs nothing more."""
    from torch.utils.flop_counter import FlopCounterMode

    from qac.models.backbone import encoder_with_layer
    from qac.models.grad_cache import side_chunks

    model, batch = bert_base_on_meta()
    with FlopCounterMode(display=False) as counter:
        FullBatchStep(model, torch.device("meta")).forward_backward(batch)
    full = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        GradCachedStep(model, 16, torch.device("meta")).forward_backward(batch)
    cached = counter.get_total_flops()
    sides = side_chunks(batch, 16)
    assert [len(chunks) for chunks in sides.values()] == [4, 1]     # 64 anchors by 16; 64 x 32 in 16 x 144
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        for chunk in sides["anchor"][:-1]:
            encoder_with_layer(model.bert, chunk["input_ids"], chunk["attention_mask"], 0)
    recomputed = counter.get_total_flops()
    # the contrastive loss's own products (2N x 2N scores and their gradient) are counted in both steps
    assert cached - full == recomputed
    # The encoder forward over three quarters of the anchors: ~17% of a full step (forward and backward of
    # encoder, head and MLM heads); every chunk recomputed, it would be ~26%.
    assert 0.15 < recomputed / full < 0.19


def bert_base_on_meta(pairs: int = 64, anchor_length: int = 144, context_length: int = 32):
    """coCondenser at BERT-base size on the meta device (shapes only), and a batch of query-as-context pairs."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    from qac.data.masking import masked_targets

    config = BertConfig()          # bert-base-uncased's configuration: 12 layers, 768 wide, 30,522 word-pieces
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        bert, lm_head = BertModel(config), BertForMaskedLM(config).cls
        lm_head.predictions.decoder.weight = bert.embeddings.word_embeddings.weight
        model = CoCondenser(bert, lm_head)

    def side(length):
        labels = torch.full((pairs, length), -100)
        labels[:, 1:1 + round(0.15 * (length - 2))] = 5
        tensors = {"input_ids": torch.zeros(pairs, length, dtype=torch.long),
                   "attention_mask": torch.ones(pairs, length, dtype=torch.long), "labels": labels,
                   **masked_targets(labels, 8)}
        return {name: tensor.to("meta") for name, tensor in tensors.items()}

    return model, {"anchor": side(anchor_length), "context": side(context_length)}


def test_rng_state_restores_cpu_draws():
    state = RngState(CPU)
    first = torch.rand(4)
    state.restore()
    assert torch.equal(torch.rand(4), first)


def test_a_model_without_contrastive_loss_cannot_be_cached():
    model = CoTMAE.from_spec("tiny:minilm", seed=0)
    with pytest.raises(ValueError, match="no contrastive loss"):
        GradCachedStep(model, 4, CPU)


@pytest.mark.parametrize("step", ["full", "cached"])
def test_release_loss_weights_double_both_mlm_terms(tokenizer, step):
    """pretrain.common.cocondenser_loss_weights: the gradient is linear in the MLM weight w,
    g(w) = g_contrastive + w * g_mlm, so g(2) = 2 g(1) - g(0); the logged loss is 2 MLM + 2 head MLM + contrastive."""
    batch = make_batch(tokenizer, n_pairs=5)
    runs = {}
    for weight in (0.0, 1.0, 2.0):
        model = tiny(0.0)
        model.mlm_weight = weight
        runner = FullBatchStep(model, CPU) if step == "full" else GradCachedStep(model, 2, CPU)
        runs[weight] = (runner.forward_backward(batch), gradients(model))
    # The parts stay on the device (read at logging steps only): compare them as Python floats,
    # to the rounding of their own dtype.
    parts = {name: float(value) for name, value in runs[2.0][0].items()}
    once = {name: float(value) for name, value in runs[1.0][0].items()}
    rel = 8 * torch.finfo(runs[2.0][0]["loss"].dtype).eps if torch.is_tensor(runs[2.0][0]["loss"]) else 1e-12
    assert parts["loss"] == pytest.approx(2 * parts["mlm"] + 2 * parts["head_mlm"] + parts["contrastive"], rel=rel)
    assert once["loss"] == pytest.approx(parts["mlm"] + parts["head_mlm"] + parts["contrastive"], rel=rel)
    expected = {name: 2 * runs[1.0][1][name] - runs[0.0][1][name] for name in runs[1.0][1]}
    assert_same_gradients(expected, runs[2.0][1], batch)


def test_named_loss_weights_set_the_mlm_weight():
    assert CoCondenser.from_spec("tiny:minilm", seed=0, n_head_layers=1, skip_from=1,
                                 loss_weights="release").mlm_weight == 2.0
    with pytest.raises(ValueError, match="cocondenser_loss_weights"):
        CoCondenser.from_spec("tiny:minilm", seed=0, n_head_layers=1, skip_from=1, loss_weights="2:2:1")


def test_the_paper_profiles_gradient_cache_costs_at_most_1_2_full_steps():
    """At the paper profile's chunking (``grad_cache_chunk`` anchors' worth of tokens, token streams) on its
    2,048 coCondenser pairs of MS MARCO's lengths, BERT-base on the meta device: the cached step counts at
    most 1.20x the full step's FLOPs, and the chunks fit one 80 GB GPU by an estimate of 0.45 MB of bf16
    activations a token (12 + 2 layers at 34 x 768 bytes each, the MLM logits of the masked 15%): the two
    kept chunks and a live one, under 60 GB."""
    import sys
    from pathlib import Path

    import numpy as np
    import yaml
    from torch.utils.flop_counter import FlopCounterMode

    from qac.data.masking import masked_targets
    from qac.data.streams import token_stream
    from qac.models.grad_cache import side_chunks

    repo = Path(__file__).resolve().parent.parent
    params = yaml.safe_load((repo / "profiles" / "paper" / "params.yaml").read_text(encoding="utf-8"))
    common = params["pretrain"]["common"]
    pairs = params["pretrain"]["variants"]["cocondenser-query-q5"]["batch_size"]
    assert common["unpadded"] and pairs == 2048
    sys.path.insert(0, str(repo / "benchmarks"))
    try:
        from msmarco_lengths import load
    finally:
        sys.path.remove(str(repo / "benchmarks"))
    lengths, rng = load(), np.random.default_rng(0)

    def side(drawn, limit):
        drawn = np.minimum(drawn, limit - 2) + 2            # cut with [CLS] and [SEP], as the collators cut
        mask = torch.arange(int(drawn.max()))[None, :] < torch.as_tensor(drawn)[:, None]
        labels = torch.full(mask.shape, -100)
        for row, length in enumerate(drawn):
            labels[row, 1:1 + max(1, round(0.15 * (length - 2)))] = 5
        padded = {"input_ids": torch.zeros(mask.shape, dtype=torch.long), "attention_mask": mask.long(),
                  "labels": labels, **masked_targets(labels, 8)}
        stream = token_stream(padded, 8)
        return {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in stream.items()}

    batch = {"anchor": side(rng.choice(lengths["passages"], pairs), common["max_len"]),
             "context": side(rng.choice(lengths["queries"], pairs), common["query_max_len"])}
    model, _ = bert_base_on_meta(pairs=2)
    counts = []
    for step in (FullBatchStep(model, torch.device("meta")),
                 GradCachedStep(model, common["grad_cache_chunk"], torch.device("meta"))):
        with FlopCounterMode(display=False) as counter:
            step.forward_backward(batch)
        counts.append(counter.get_total_flops())
    assert counts[1] / counts[0] <= 1.20
    chunks = side_chunks(batch, common["grad_cache_chunk"])
    largest = max(chunk["input_ids"].numel() for chunks_of in chunks.values() for chunk in chunks_of)
    held = largest + sum(chunks_of[-1]["input_ids"].numel() for chunks_of in chunks.values())
    assert held * 0.45e6 < 60e9
