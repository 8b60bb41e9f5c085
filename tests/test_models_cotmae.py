"""CoT-MAE: both decoders, their masks and labels, and export (qac.models.cotmae)."""

from __future__ import annotations

import pytest
import torch

from qac.data.context_pairs import PairCollator
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
        [__import__("qac.data.context_pairs", fromlist=["Pair"]).Pair(0, "a passage", "one two three four five six", "query")], 0)
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
    from qac.data.context_pairs import Pair

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


# -- the release decoder: transformers' GPT2Block as in the authors' code ------------------------------------

def _release_batch(tokenizer, texts=("one two three four five six seven", "alpha beta gamma")):
    from qac.data.context_pairs import Pair

    pairs = [Pair(i, f"passage {i} about a protein", text, "query") for i, text in enumerate(texts)]
    return PairCollator(tokenizer, 48, 16, 0.3, 0.0, seed=0)(pairs, 0)


def test_release_decoder_is_gpt2_blocks_with_a_config_cast_from_bert():
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    model = tiny("release")
    bert, decoder = model.bert.config, model.decoder
    assert len(decoder.h) == 1 and all(type(block) is GPT2Block for block in decoder.h)
    gpt2 = decoder.h[0].attn.config
    assert (gpt2.vocab_size, gpt2.n_positions, gpt2.n_embd, gpt2.n_layer, gpt2.n_head) == (
        bert.vocab_size, bert.max_position_embeddings, bert.hidden_size, 1, bert.num_attention_heads)
    assert (gpt2.activation_function, gpt2.resid_pdrop, gpt2.embd_pdrop, gpt2.attn_pdrop) == (
        bert.hidden_act, bert.hidden_dropout_prob, bert.hidden_dropout_prob, bert.attention_probs_dropout_prob)
    assert (gpt2.layer_norm_epsilon, gpt2.initializer_range) == (bert.layer_norm_eps, bert.initializer_range)
    assert gpt2._attn_implementation == "sdpa"
    assert decoder.ln_f.eps == bert.layer_norm_eps and decoder.drop.p == bert.hidden_dropout_prob
    assert model.describe()["decoder_layers"] == 1


def _gpt2_block_by_hand(block, hidden, allowed):
    """One pre-layer-norm GPT-2 block written out from its weights (Conv1D: x @ W + b)."""
    heads = block.attn.num_heads
    batch, length, width = hidden.shape
    ln = torch.nn.functional.layer_norm
    x = ln(hidden, (width,), block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
    q, k, v = (x @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(width, dim=-1)
    q, k, v = (t.view(batch, length, heads, -1).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / (width // heads) ** 0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    attended = (weights @ v).transpose(1, 2).reshape(batch, length, width)
    hidden = hidden + attended @ block.attn.c_proj.weight + block.attn.c_proj.bias
    x = ln(hidden, (width,), block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
    inner = torch.nn.functional.gelu(x @ block.mlp.c_fc.weight + block.mlp.c_fc.bias)
    return hidden + inner @ block.mlp.c_proj.weight + block.mlp.c_proj.bias


def test_release_decoder_loss_equals_a_hand_computation(tokenizer):
    model = tiny("release", decoder_weight=1.0).double()
    batch = _release_batch(tokenizer)
    context = batch["context"]
    output = model(batch)
    with torch.no_grad():
        anchor = batch["anchor"]
        cls = model.bert(input_ids=anchor["input_ids"], attention_mask=anchor["attention_mask"]).last_hidden_state[:, 0]
        hidden = torch.cat([cls[:, None], model.bert.embeddings(input_ids=context["input_ids"])[:, 1:]], dim=1)
        length = hidden.shape[1]
        t, s = torch.arange(length)[:, None], torch.arange(length)[None, :]
        allowed = ((s == 0) | ((s <= t) & (s >= t - 2)))[None, None] & context["attention_mask"].bool()[:, None, None, :]
        for block in model.decoder.h:
            hidden = _gpt2_block_by_hand(block, hidden, allowed)
        hidden = torch.nn.functional.layer_norm(hidden, hidden.shape[-1:], model.decoder.ln_f.weight,
                                                model.decoder.ln_f.bias, model.decoder.ln_f.eps)
        logits = model.lm_head(hidden)[:, :-1]                # position t predicts token t + 1
        targets = context["input_ids"][:, 1:]
        real = context["attention_mask"][:, 1:].bool()
        expected = torch.nn.functional.cross_entropy(logits[real], targets[real])
    assert real.sum() == context["attention_mask"].sum() - len(targets)
    # float64 end to end: differences are rounding of a sum of ~30 terms of size ~10
    assert output.parts["decoder"].item() == pytest.approx(expected.item(), rel=1e-10)


def _release_logits(model, batch, position=None, token=None, row=0):
    context = {k: v.clone() for k, v in batch["context"].items()}
    if position is not None:
        context["input_ids"][row, position] = token
    cls = torch.ones(context["input_ids"].shape[0], model.bert.config.hidden_size)
    with torch.no_grad():
        return model.lm_head(model.decoder_states(cls, context)[0])


def test_release_decoder_logits_honour_the_window_and_padding(tokenizer):
    model = tiny("release")
    batch = _release_batch(tokenizer)
    real = batch["context"]["attention_mask"].bool()
    base = _release_logits(model, batch)
    early = _release_logits(model, batch, position=1, token=2000)
    # window 3: position 4 sees [CLS] and positions 2..4, not 1; position 3 sees position 1
    assert torch.equal(early[0, 4:][real[0, 4:]], base[0, 4:][real[0, 4:]])
    assert not torch.allclose(early[0, 3], base[0, 3])
    assert torch.equal(early[0, :1], base[0, :1])                   # nor does anything before it change
    inside = _release_logits(model, batch, position=3, token=2000)
    assert not torch.allclose(inside[0, 5], base[0, 5]) and torch.equal(inside[0, 6:][real[0, 6:]],
                                                                         base[0, 6:][real[0, 6:]])
    # a padded token of the short row changes none of its real positions (with right padding causality
    # alone keeps it out; the mask also drops padding keys, as the boolean mask test above shows)
    padded = int(real[1].sum())
    assert padded < real.shape[1]
    changed = _release_logits(model, batch, position=padded, token=2000, row=1)
    assert torch.equal(changed[1][real[1]], base[1][real[1]])


def test_release_decoder_sdpa_equals_eager(tokenizer):
    batch = _release_batch(tokenizer)
    sdpa = tiny("release").double()
    eager = CoTMAE(copy_module(sdpa.bert), copy_module(sdpa.lm_head), decoder="release",
                   attn_implementation="eager").double().eval()
    eager.decoder.load_state_dict(sdpa.decoder.state_dict())
    assert eager.decoder.h[0].attn.config._attn_implementation == "eager"
    real = batch["context"]["attention_mask"].bool()
    expected, actual = _release_logits(eager, batch), _release_logits(sdpa, batch)
    assert torch.allclose(actual[real], expected[real], rtol=0, atol=1e-10)


def copy_module(module):
    import copy

    return copy.deepcopy(module)


def test_release_decoder_gradient_reaches_the_encoder(tokenizer):
    model = tiny("release").train()
    batch = _release_batch(tokenizer)
    anchor = batch["anchor"]
    encoded = model.bert(input_ids=anchor["input_ids"], attention_mask=anchor["attention_mask"]).last_hidden_state
    total, count = model.decode(encoded[:, 0], batch["context"])
    (total / count).backward()
    last_layer = model.bert.encoder.layer[-1]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in last_layer.parameters())   # through [CLS]
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0   # shared embeddings, tied head
    assert model.lm_head.predictions.transform.dense.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.decoder.parameters())


def test_release_decoder_initialisation_is_gpt2s():
    import math

    from transformers import BertConfig

    from qac.models.cotmae import ReleaseDecoder

    config = BertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072, initializer_range=0.02)
    layers = 3
    decoder = ReleaseDecoder(config, layers, seed=5)

    def close(weight, std):
        weight = weight.detach()
        # the sample std of N normal draws has relative standard error sqrt(1 / (2N)); allow 5 of them
        tolerance = 5 * math.sqrt(2 / weight.numel()) / 2
        return float(weight.std()) == pytest.approx(std, rel=tolerance) and abs(float(weight.mean())) < 5 * std / math.sqrt(weight.numel())

    for block in decoder.h:
        for projection in (block.attn.c_proj, block.mlp.c_proj):
            assert close(projection.weight, 0.02 / math.sqrt(2 * layers))
        for weight in (block.attn.c_attn.weight, block.mlp.c_fc.weight):
            assert close(weight, 0.02)
        for norm in (block.ln_1, block.ln_2):
            assert torch.equal(norm.weight, torch.ones(768)) and torch.equal(norm.bias, torch.zeros(768))
        biases = [block.attn.c_attn.bias, block.attn.c_proj.bias, block.mlp.c_fc.bias, block.mlp.c_proj.bias]
        assert all(not b.any() for b in biases)
    assert torch.equal(decoder.ln_f.weight, torch.ones(768)) and not decoder.ln_f.bias.any()
    again = ReleaseDecoder(config, layers, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(decoder.state_dict().values(), again.state_dict().values()))
