"""Which parameters weight decay leaves alone (pretrain.common.decay_exempt), on the models the recipes build."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import BertConfig, BertModel

from qac.models.cotmae import ReleaseDecoder
from qac.train.optim import build_optimizer, decay_exempt_names

from base_settings import pretrain_settings

CONFIG = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=32)


class _EncoderWithReleaseDecoder(torch.nn.Module):
    """CoT-MAE's parts as the release recipe holds them: a BERT encoder and GPT-2 decoder blocks."""

    def __init__(self):
        super().__init__()
        self.encoder = BertModel(CONFIG, add_pooling_layer=False)
        self.decoder = ReleaseDecoder(CONFIG, layers=1, seed=0)


def _layer_norm_weights(model: torch.nn.Module) -> set[str]:
    return {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, torch.nn.LayerNorm)}


def test_norm_layers_exempts_the_gpt2_decoders_layer_norms_and_names_does_not():
    model = _EncoderWithReleaseDecoder()
    by_names, by_layers = decay_exempt_names(model, "names"), decay_exempt_names(model, "norm_layers")
    decoder_norms = {name for name in _layer_norm_weights(model) if name.startswith("decoder.")}
    assert {"decoder.h.0.ln_1.weight", "decoder.h.0.ln_2.weight", "decoder.ln_f.weight"} <= decoder_norms
    assert decoder_norms <= by_layers and not decoder_norms & by_names
    assert by_layers - by_names == decoder_norms            # the only difference
    biases = {name for name, _ in model.named_parameters() if name.endswith("bias")}
    assert biases <= by_names and biases <= by_layers
    # Nothing else is exempt: every matrix and embedding is decayed under both rules.
    matrices = {name for name, parameter in model.named_parameters() if parameter.dim() > 1}
    assert not matrices & (by_names | by_layers)


def test_both_rules_agree_on_berts_own_modules():
    model = BertModel(CONFIG)
    assert decay_exempt_names(model, "names") == decay_exempt_names(model, "norm_layers")


def test_the_optimizer_groups_follow_the_rule():
    model = _EncoderWithReleaseDecoder()
    for rule in ("names", "norm_layers"):
        optimizer, _ = build_optimizer(model, lr=1e-3, weight_decay=0.01, warmup_ratio=0.0, total_steps=4,
                                       device=torch.device("cpu"), decay_exempt=rule)
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        undecayed = {names[id(p)] for group in optimizer.param_groups if group["weight_decay"] == 0.0
                     for p in group["params"]}
        assert undecayed == decay_exempt_names(model, rule)
        assert sum(len(group["params"]) for group in optimizer.param_groups) == len(names)


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="decay_exempt"):
        decay_exempt_names(BertModel(CONFIG), "layernorm")


def test_the_rule_shapes_the_weights_so_it_is_in_the_fingerprint():
    settings = pretrain_settings(method="cotmae")
    assert settings.decay_exempt == "names"             # the base's: runs before the switch had it
    other = dataclasses.replace(settings, decay_exempt="norm_layers")
    assert other.fingerprint() != settings.fingerprint()     # a checkpoint of one is never resumed as the other
