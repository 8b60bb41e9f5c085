"""CoT-MAE: both decoders, their masks and labels, and export (qac.models.cotmae)."""

from __future__ import annotations

import pytest
import torch

from qac.data.pairs import PairCollator
from qac.models.cotmae import CoTMAE, next_token_labels, windowed_causal_mask
from test_models_cocondenser import make_batch


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


_BUILT: dict[str, CoTMAE] = {}


def tiny(decoder, decoder_weight=1.0):
    """A fresh copy of one tiny CoT-MAE per decoder (building one takes seconds)."""
    import copy

    if decoder not in _BUILT:
        _BUILT[decoder] = CoTMAE.from_spec("tiny:minilm", seed=0, dropout=0.0, decoder=decoder).eval()
    model = copy.deepcopy(_BUILT[decoder])
    model.decoder_weight = decoder_weight
    return model


def test_window_three_sees_cls_and_the_two_previous_tokens():
    allowed = windowed_causal_mask(torch.tensor([[1, 1, 1, 1, 1, 0]]), window=3)[0, 0]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 0, 1, 1, 1, 0],
        [1, 0, 0, 1, 1, 0],   # a padding query position; its key column is masked for everyone
    ], dtype=torch.bool)
    assert torch.equal(allowed, expected)


def test_next_token_labels_shift_left_and_stop_at_padding():
    ids = torch.tensor([[101, 7, 8, 102, 0], [101, 9, 102, 0, 0]])
    mask = (ids != 0).long()
    assert next_token_labels(ids, mask).tolist() == [[7, 8, 102, -100, -100], [9, 102, -100, -100, -100]]


def test_mask_ratios_follow_the_decoder():
    assert tiny("paper").mask_ratios == (0.30, 0.45)
    assert tiny("release").mask_ratios == (0.30, 0.0)


def _states(model, batch, position=None, token=None):
    context = {k: v.clone() for k, v in batch["context"].items()}
    if position is not None:
        context["input_ids"][:, position] = token
    cls = torch.zeros(context["input_ids"].shape[0], model.bert.config.hidden_size)
    with torch.no_grad():
        return model.decoder_states(cls, context)[0]


def test_release_decoder_is_causal_within_its_window(tokenizer):
    model = tiny("release")
    batch = PairCollator(tokenizer, 48, 16, 0.3, 0.0, seed=0)(
        [__import__("qac.data.pairs", fromlist=["Pair"]).Pair(0, "a passage", "one two three four five six", "query")], 0)
    base = _states(model, batch)
    later = _states(model, batch, position=5, token=2000)
    assert torch.allclose(later[:, :5], base[:, :5]) and not torch.allclose(later[:, 5], base[:, 5])
    early = _states(model, batch, position=1, token=2000)
    # position 4 sees [CLS] and positions 2..4 only: token 1 is outside its window
    assert torch.allclose(early[:, 4:], base[:, 4:]) and not torch.allclose(early[:, 3], base[:, 3])


def test_paper_decoder_is_bidirectional(tokenizer):
    model = tiny("paper")
    batch = make_batch(tokenizer, n_pairs=1, mask_ratio=0.45)
    base = _states(model, batch)
    changed = _states(model, batch, position=3, token=2000)
    assert not torch.allclose(changed[:, 1], base[:, 1])


@pytest.mark.parametrize("decoder", ["paper", "release"])
def test_loss_is_encoder_mlm_plus_weighted_decoder_loss(tokenizer, decoder):
    model = tiny(decoder, decoder_weight=0.5)
    ratios = model.mask_ratios
    from qac.data.pairs import Pair

    pairs = [Pair(i, f"protein {i} binds the receptor of cell {i} " * 3, f"what binds cell {i}", "query")
             for i in range(4)]
    batch = PairCollator(tokenizer, 48, 12, *ratios, seed=1)(pairs, 0)
    output = model(batch)
    parts = output.parts
    assert parts["loss"].item() == pytest.approx((parts["mlm"] + 0.5 * parts["decoder"]).item(), rel=1e-6)
    # decoder term = mean cross-entropy of the shared LM head at the decoder's labelled positions
    with torch.no_grad():
        cls = model.bert(input_ids=batch["anchor"]["input_ids"],
                         attention_mask=batch["anchor"]["attention_mask"]).last_hidden_state[:, 0]
        states, labels = model.decoder_states(cls, batch["context"])
        expected = torch.nn.functional.cross_entropy(model.lm_head(states).flatten(0, 1), labels.flatten())
    assert parts["decoder"].item() == pytest.approx(expected.item(), rel=1e-5)
    if decoder == "release":
        assert (labels != -100).sum() == batch["context"]["attention_mask"].sum() - 4   # every token but [CLS]


def test_export_drops_the_decoder(tokenizer, tmp_path):
    from safetensors import safe_open

    model = tiny("release")
    model.save_encoder(tmp_path / "encoder", tokenizer)
    with safe_open(tmp_path / "encoder" / "model.safetensors", "pt") as handle:
        keys = list(handle.keys())
    assert keys and not [k for k in keys if "decoder" in k or k.startswith("cls")]
