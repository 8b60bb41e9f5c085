"""coCondenser: contrastive loss, MLM terms, condenser head and export (qac.models.cocondenser)."""

from __future__ import annotations

import math

import pytest
import torch

from qac.data.context_pairs import Pair, PairCollator
from qac.data.masking import masked_targets
from qac.models.cocondenser import CoCondenser
from qac.models.losses import PairContrastiveLoss, masked_lm_sum


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


_BUILT: list[CoCondenser] = []


def tiny_eval():
    """A fresh copy of one tiny coCondenser without dropout (building one takes seconds)."""
    import copy

    if not _BUILT:
        _BUILT.append(CoCondenser.from_spec("tiny:minilm", seed=0, dropout=0.0, n_head_layers=1, skip_from=1))
    return copy.deepcopy(_BUILT[0]).eval()


def make_batch(tokenizer, n_pairs=4, step=0, mask_ratio=0.15):
    pairs = [Pair(i, f"the protein {i} binds the receptor of the cell membrane in study {i} " * (1 + i % 3),
                  f"what binds receptor {i}", "query") for i in range(n_pairs)]
    return PairCollator(tokenizer, 48, 12, mask_ratio, mask_ratio, seed=0)(pairs, step)


def test_contrastive_loss_matches_a_hand_written_softmax():
    torch.manual_seed(0)
    anchors, contexts = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    vectors = list(anchors) + list(contexts)
    temperature = 0.5
    total = 0.0
    for i, query in enumerate(vectors):
        positive = (i + 3) % 6
        scores = {j: float(query @ other) / temperature for j, other in enumerate(vectors) if j != i}
        total += -scores[positive] + math.log(sum(math.exp(s) for s in scores.values()))
    term = PairContrastiveLoss(temperature)(anchors, contexts)
    assert term.value.item() == pytest.approx(total / 6, rel=1e-6)
    assert term.backward.item() == pytest.approx(total / 6, rel=1e-6)   # one process: no scaling


def test_masked_only_logits_give_the_full_vocabulary_loss_and_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50)
    hidden = torch.randn(2, 6, 8, requires_grad=True)
    labels = torch.full((2, 6), -100)
    labels[0, 1], labels[1, 4], labels[1, 5] = 3, 17, 49
    # the collator's gathered positions (padded to 8 slots a row), and positions derived here from the labels
    sparse, count = masked_lm_sum(head, hidden, {"labels": labels, **masked_targets(labels, multiple=8)})
    (sparse_grad,) = torch.autograd.grad(sparse, hidden)
    derived, _ = masked_lm_sum(head, hidden, {"labels": labels})
    dense, _ = masked_lm_sum(head, hidden, {"labels": labels}, full_vocab_logits=True)
    (dense_grad,) = torch.autograd.grad(dense, hidden)
    reference = torch.nn.functional.cross_entropy(head(hidden).reshape(-1, 50), labels.reshape(-1), reduction="sum")
    assert count.item() == 3
    assert sparse.item() == pytest.approx(reference.item(), rel=1e-6)
    assert derived.item() == pytest.approx(reference.item(), rel=1e-6)
    assert dense.item() == pytest.approx(reference.item(), rel=1e-6)
    torch.testing.assert_close(sparse_grad, dense_grad)


def test_encoder_mlm_term_equals_bert_for_masked_lm(tokenizer):
    from transformers import BertForMaskedLM

    model = tiny_eval()
    side = make_batch(tokenizer)["anchor"]
    reference = BertForMaskedLM(model.bert.config).eval()
    reference.bert.load_state_dict({k: v for k, v in model.bert.state_dict().items() if "pooler" not in k})
    reference.cls.load_state_dict(model.lm_head.state_dict())
    expected = reference(input_ids=side["input_ids"], attention_mask=side["attention_mask"],
                         labels=side["labels"]).loss
    output = model.encode_side(side)
    assert (output.mlm_sum / output.masked).item() == pytest.approx(expected.item(), rel=1e-5)


def _perturbed(model, side, layer, positions):
    """encode_side with ``positions`` of ``layer``'s output shifted (before anyone else sees it)."""
    def shift(module, args, output):
        output = output.clone()
        output[:, positions] += 5.0
        return output
    hook = layer.register_forward_hook(shift, prepend=True)
    try:
        return model.encode_side(side)
    finally:
        hook.remove()


def test_condenser_head_reads_the_last_cls_and_the_skip_layer_tokens(tokenizer):
    model = tiny_eval()
    side = make_batch(tokenizer)["anchor"]
    with torch.no_grad():
        base = model.encode_side(side)
        last_tokens = _perturbed(model, side, model.bert.encoder.layer[1], slice(1, None))
        last_cls = _perturbed(model, side, model.bert.encoder.layer[1], slice(0, 1))
        skip_tokens = _perturbed(model, side, model.bert.encoder.layer[0], slice(1, None))
    # last layer's tokens feed the encoder MLM only; its [CLS] feeds the head
    assert last_tokens.head_mlm_sum.item() == pytest.approx(base.head_mlm_sum.item(), rel=1e-6)
    assert last_tokens.mlm_sum.item() != pytest.approx(base.mlm_sum.item(), rel=1e-4)
    assert last_cls.head_mlm_sum.item() != pytest.approx(base.head_mlm_sum.item(), rel=1e-6)
    # layer skip_from (=1, the output of the first layer) feeds the head's token positions
    assert skip_tokens.head_mlm_sum.item() != pytest.approx(base.head_mlm_sum.item(), rel=1e-6)


def test_forward_sums_three_terms(tokenizer):
    model = tiny_eval()
    output = model(make_batch(tokenizer))
    parts = output.parts
    assert set(parts) == {"loss", "mlm", "head_mlm", "contrastive"}
    assert parts["loss"].item() == pytest.approx((parts["mlm"] + parts["head_mlm"] + parts["contrastive"]).item())
    assert output.loss.item() == pytest.approx(parts["loss"].item(), rel=1e-6)
    assert math.log(6) < parts["contrastive"].item() < 3 * math.log(8)   # 2B - 1 = 7 candidates, random model


def test_save_encoder_writes_a_bert_folder_automodel_loads(tokenizer, tmp_path):
    from transformers import AutoModel

    model = tiny_eval()
    model.save_encoder(tmp_path / "encoder", tokenizer)
    assert (tmp_path / "encoder" / "model.safetensors").exists()
    assert (tmp_path / "encoder" / "tokenizer_config.json").exists()
    from safetensors import safe_open

    with safe_open(tmp_path / "encoder" / "model.safetensors", "pt") as handle:
        keys = list(handle.keys())
    assert not [k for k in keys if k.startswith(("head", "cls", "lm_head"))]
    loaded = AutoModel.from_pretrained(tmp_path / "encoder").eval()
    ids = tokenizer(["a protein binds"], return_tensors="pt")
    torch.testing.assert_close(loaded(**ids).last_hidden_state, model.bert(**ids).last_hidden_state)


def test_invalid_skip_layer_is_rejected():
    with pytest.raises(ValueError, match="skip_from=5"):
        CoCondenser.from_spec("tiny:minilm", skip_from=5)
