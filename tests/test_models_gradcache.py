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
    # One chunk per side consumes the generator in the order the full-batch step
    # does (anchors, then contexts), so with dropout on the two paths agree only
    # if the re-run replays the generator state of the first pass.
    batch = make_batch(tokenizer, n_pairs=6)
    full, cached = tiny(0.1).train(), tiny(0.1).train()
    torch.manual_seed(123)
    full_parts = FullBatchStep(full, CPU).forward_backward(batch)
    after_full = torch.get_rng_state()
    torch.manual_seed(123)
    cached_parts = GradCachedStep(cached, 6, CPU).forward_backward(batch)
    assert torch.equal(torch.get_rng_state(), after_full)      # the generator ends where the full step left it
    assert float(cached_parts["contrastive"]) == pytest.approx(float(full_parts["contrastive"]), rel=1e-12)
    assert_same_gradients(gradients(full), gradients(cached), batch)


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
