"""MASTER: each decoder's inputs and labels, its loss, switching decoders off, and the [CLS] bottleneck.

(qac.models.master, qac.data.master)
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re

import numpy as np
import pytest
import torch

from qac.data.masking import IGNORE_INDEX, MaskingVocab, weighted_word_mask, word_spans, word_strings
from qac.data.master import MasterCollator, MasterPair, WordWeights
from qac.models.master import Master
from qac.params.vocabulary import MASTER_TASKS


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


@pytest.fixture(scope="module")
def weights():
    # "the" and "of" are in every passage (idf 1); "receptor" in 1 of 1000; the rest unseen.
    return WordWeights(passages=1000, document_frequency={"the": 1000, "of": 1000, "receptor": 1})


_BUILT: dict[tuple, Master] = {}


def tiny(decoders=MASTER_TASKS, weights=None) -> Master:
    """A fresh copy of a tiny MASTER (building one takes seconds)."""
    if decoders not in _BUILT:
        _BUILT[decoders] = Master.from_spec("tiny:minilm", seed=0, dropout=0.0, decoders=decoders).eval()
    model = copy.deepcopy(_BUILT[decoders])
    model.weights.update(weights or {})
    return model


def pairs(n=3):
    return [MasterPair(i, f"the protein {i} binds the receptor of the cell membrane in study {i}",
                       f"the membrane of cell {i} grows", "passage", row=i,
                       queries=(f"what binds receptor {i}", "which protein binds"),
                       continuation=f"and then the cell {i} divided twice")
            for i in range(n)]


def collate(tokenizer, weights, decoder_rate=0.5, mask_rate=0.3, decoders=MASTER_TASKS, batch=None, step=0):
    collator = MasterCollator(tokenizer, 48, 16, mask_rate, decoder_rate, seed=7, decoders=decoders,
                              word_weights=weights)
    return collator(batch or pairs(), step)


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=True)["input_ids"]


# -- worked examples: what each decoder reads and must recover ---------------------------------------

def test_worked_example_unmasked_texts_of_every_decoder(tokenizer, weights):
    """With a decoder mask rate of 0 each decoder reads its whole text: this is what it reads."""
    batch = collate(tokenizer, weights, decoder_rate=0.0, mask_rate=0.0, batch=pairs(1))
    anchor = ids(tokenizer, "the protein 0 binds the receptor of the cell membrane in study 0")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    expected = {
        "mkp": anchor, "npr": ids(tokenizer, "the membrane of cell 0 grows"),
        "dor": [cls_id] + tokenizer("what binds receptor 0", add_special_tokens=False)["input_ids"] + [sep_id]
               + tokenizer("which protein binds", add_special_tokens=False)["input_ids"] + [sep_id],
        "gor": ids(tokenizer, "and then the cell 0 divided twice")}
    for task, expected_ids in expected.items():
        assert batch[task]["input_ids"][0].tolist() == expected_ids, task
        assert (batch[task]["labels"] == IGNORE_INDEX).all(), task
    # CMP with an encoder that masked nothing: every word the encoder saw is to be recovered
    cmp = batch["cmp"]
    maskable = [p for p, token in enumerate(anchor) if token not in (cls_id, sep_id)]
    assert [p for p in range(len(anchor)) if cmp["labels"][0, p] != IGNORE_INDEX] == maskable
    assert cmp["labels"][0, maskable].tolist() == [anchor[p] for p in maskable]


# -- MASTER's release details (pretrain.common.master_dor_crop, master_empty_continuation, master_decoder_init) --

DOR_LEN = 8     # the decoder's length: shorter than the two joined queries (9 tokens and [CLS])


def _unmasked(tokenizer, weights, batch, **details):
    collator = MasterCollator(tokenizer, DOR_LEN, 16, 0.0, 0.0, seed=7, word_weights=weights, **details)
    return collator, [collator(batch, step) for step in range(8)]


def test_dor_window_keeps_a_random_window_of_the_joined_queries_where_start_keeps_their_beginning(tokenizer, weights):
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    batch = pairs(2)
    body = [token for query in batch[0].queries
            for token in tokenizer(query, add_special_tokens=False)["input_ids"] + [sep_id]]
    assert len(body) + 1 > DOR_LEN                        # longer than the decoder's text
    _, start = _unmasked(tokenizer, weights, batch, dor_crop="start")
    _, window = _unmasked(tokenizer, weights, batch, dor_crop="window")
    width = DOR_LEN - 2
    assert all(b["dor"]["input_ids"][0].tolist() == [cls_id, *body[:width], sep_id] for b in start)
    windows = set()
    for b in window:
        row = b["dor"]["input_ids"][0].tolist()
        assert len(row) == DOR_LEN and row[0] == cls_id and row[-1] == sep_id
        offset = next(i for i in range(len(body) - width + 1) if body[i:i + width] == row[1:-1])   # of the body
        windows.add(offset)
    assert len(windows) > 1                               # drawn per step, not fixed
    _, again = _unmasked(tokenizer, weights, batch, dor_crop="window")
    assert all(torch.equal(a["dor"]["input_ids"], b["dor"]["input_ids"]) for a, b in zip(window, again))
    short = [MasterPair(0, "the cell", "the cell", "passage", row=0, queries=("why",), continuation="x")]
    _, fits = _unmasked(tokenizer, weights, short, dor_crop="window")   # a text that fits is never cut
    assert fits[0]["dor"]["input_ids"][0].tolist() == [cls_id, *tokenizer("why", add_special_tokens=False)
                                                       ["input_ids"], sep_id]


@pytest.mark.parametrize("empty_continuation", ["no_label", "anchor"])
def test_an_empty_continuation_gives_gor_no_label_or_the_anchors_text(tokenizer, weights, empty_continuation):
    batch = pairs(2)
    batch[1] = dataclasses.replace(batch[1], continuation="  ")
    collator = MasterCollator(tokenizer, 48, 16, 0.3, 0.5, seed=7, word_weights=weights,
                              empty_continuation=empty_continuation)
    gor, anchor = (collator(batch, 0)[side] for side in ("gor", "anchor"))
    length = int(gor["attention_mask"][1].sum())
    def original(side, row=1):      # the text before masking: labels where masked, else the input
        return side["labels"][row].where(side["labels"][row] != IGNORE_INDEX, side["input_ids"][row])

    if empty_continuation == "no_label":
        assert length == 2 and (gor["labels"][1] == IGNORE_INDEX).all()
    else:   # the anchor's tokens (its own masks drawn on GOR's side), with labels to recover
        assert length == int(anchor["attention_mask"][1].sum())
        assert torch.equal(original(gor)[:length], original(anchor)[:length])
        assert (gor["labels"][1] != IGNORE_INDEX).any()
    continuation = ids(tokenizer, "and then the cell 0 divided twice")     # a pair with one keeps its own
    assert original(gor, 0)[:len(continuation)].tolist() == continuation


def test_decoder_init_torch_keeps_pytorchs_defaults_and_bert_draws_berts():
    bert = Master.from_spec("tiny:minilm", seed=0, dropout=0.0, decoders=("dor",))
    torch_init = Master.from_spec("tiny:minilm", seed=0, dropout=0.0, decoders=("dor",), decoder_init="torch")
    assert torch.equal(bert.bert.embeddings.word_embeddings.weight, torch_init.bert.embeddings.word_embeddings.weight)
    dense = lambda model: model.decoders["dor"][0].intermediate.dense
    spread = bert.bert.config.initializer_range
    assert abs(float(dense(bert).weight.std()) - spread) < 0.1 * spread and not dense(bert).bias.any()
    bound = 1 / math.sqrt(dense(torch_init).in_features)        # nn.Linear's Kaiming-uniform bound
    assert float(dense(torch_init).weight.abs().max()) <= bound and dense(torch_init).bias.any()
    assert float(dense(torch_init).weight.std()) > 1.5 * spread
    assert torch_init.describe()["decoder_init"] == "torch" and "decoder_init" not in bert.describe()
    with pytest.raises(ValueError, match="bert or torch"):
        Master.from_spec("tiny:minilm", seed=0, decoders=("dor",), decoder_init="xavier")


def _masked(side, row=0):
    return [p for p in range(side["labels"].shape[1]) if side["labels"][row, p] != IGNORE_INDEX]


def test_worked_example_cmp_masks_exactly_what_the_encoder_saw(tokenizer, weights):
    batch = collate(tokenizer, weights)
    anchor, cmp = batch["anchor"], batch["cmp"]
    for row in range(3):
        length = int(anchor["attention_mask"][row].sum())
        original = anchor["labels"][row].where(anchor["labels"][row] != IGNORE_INDEX, cmp["labels"][row])
        encoder_masked, cmp_masked = set(_masked(anchor, row)), set(_masked(cmp, row))
        assert encoder_masked and cmp_masked
        assert encoder_masked | cmp_masked == set(range(1, length - 1))     # every token but [CLS], [SEP]
        assert not encoder_masked & cmp_masked
        # the decoder reads the original tokens at the encoder's masked positions
        for position in encoder_masked:
            assert cmp["input_ids"][row, position] == original[position]


@pytest.mark.parametrize("task", ["mkp", "npr", "dor", "gor"])
def test_worked_example_half_of_each_text_is_masked(tokenizer, weights, task):
    """50% of the maskable tokens (whole words, so within a word of it); labels hold the original ids."""
    plain = collate(tokenizer, weights, decoder_rate=0.0, mask_rate=0.0)
    batch = collate(tokenizer, weights)
    for row in range(3):
        text = plain[task]["input_ids"][row]
        length = int(plain[task]["attention_mask"][row].sum())
        masked = _masked(batch[task], row)
        maskable = length - 2 - (int((text[1:length - 1] == tokenizer.sep_token_id).sum()) if task == "dor" else 0)
        assert len(masked) == round(0.5 * maskable)
        assert batch[task]["labels"][row, masked].tolist() == text[masked].tolist()
        untouched = [p for p in range(length) if p not in masked]
        assert batch[task]["input_ids"][row, untouched].tolist() == text[untouched].tolist()
        chosen = batch[task]["input_ids"][row, masked]
        # 80/10/10: most chosen tokens are [MASK]
        assert (chosen == tokenizer.mask_token_id).sum() >= len(masked) // 2


def test_npr_reads_a_query_context_with_the_query_length_limit(tokenizer, weights):
    long_query = " ".join(["membrane"] * 40)
    batch = collate(tokenizer, weights, decoder_rate=0.0,
                    batch=[MasterPair(0, "the protein binds", long_query, "query", row=0)])
    assert batch["npr"]["input_ids"].shape[1] == 16
    assert batch["dor"]["input_ids"][0].tolist() == [tokenizer.cls_token_id, tokenizer.sep_token_id]
    assert (batch["dor"]["labels"] == IGNORE_INDEX).all()          # no queries: nothing to recover


def test_mkp_draws_words_in_proportion_to_their_idf(tokenizer, weights):
    """Budget one word: the first word drawn is word i with probability w_i / sum(w) (hand computation)."""
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    sequence = ids(tokenizer, "the receptor of")
    words = word_strings(tokenizer.convert_ids_to_tokens(sequence), word_spans(sequence, vocab))
    assert words == ["the", "receptor", "of"]
    idf = [weights.idf(word) for word in words]
    assert idf[0] == idf[2] == 1.0 and idf[1] == pytest.approx(math.log(1001 / 2) + 1)
    draws = 4000
    counts = np.zeros(3)
    for seed in range(draws):
        _, labels = weighted_word_mask(sequence, vocab, 1 / 3, idf, np.random.default_rng(seed))
        counts[[p - 1 for p, label in enumerate(labels) if label != IGNORE_INDEX]] += 1
    assert counts.sum() == draws
    expected = np.asarray(idf) / sum(idf)
    standard_error = np.sqrt(expected * (1 - expected) / draws)
    assert np.all(np.abs(counts / draws - expected) < 4 * standard_error), (counts / draws, expected)


@pytest.mark.parametrize("npr_mask", ["uniform", "keyword"])
def test_npr_masks_keywords_by_tfidf_weight_as_mkp_or_uniformly(tokenizer, weights, npr_mask):
    """master_npr_mask keyword (MASTER's paper and release): NPR's one masked word of three is "receptor"
    with probability idf / sum(idf) = 7.2 / 9.2, as MKP draws; uniform: 1/3. Over 1200 steps (seeded per
    step) the share is within four standard errors of that."""
    collator = MasterCollator(tokenizer, 48, 16, 0.3, 1 / 3, seed=7, decoders=("npr",), word_weights=weights,
                              npr_mask=npr_mask)
    pair = MasterPair(0, "a protein binds", "the receptor of", "passage", row=0)
    steps = 1200
    hits = 0
    for step in range(steps):
        labels = collator([pair], step)["npr"]["labels"][0].tolist()
        masked = [position for position, label in enumerate(labels) if label != IGNORE_INDEX]
        assert len(masked) == 1
        hits += masked == [2]            # [CLS] the receptor of [SEP]: "receptor" is position 2
    idf = [weights.idf(word) for word in ("the", "receptor", "of")]
    expected = idf[1] / sum(idf) if npr_mask == "keyword" else 1 / 3
    assert abs(hits / steps - expected) < 4 * math.sqrt(expected * (1 - expected) / steps), (hits / steps, expected)


def test_keyword_npr_is_the_mkp_draw_on_the_npr_text(tokenizer, weights):
    """The keyword NPR mask is MKP's weighted draw on the context, with NPR's generator (side 1)."""
    collator = MasterCollator(tokenizer, 48, 16, 0.3, 0.5, seed=7, word_weights=weights, npr_mask="keyword")
    batch = collator(pairs(), 3)
    for row, pair in enumerate(pairs()):
        context = ids(tokenizer, pair.context)
        expected = collator.keyword_mask(context, np.random.default_rng([7, 2, 3, pair.index, 1]))
        length = len(context)
        assert batch["npr"]["input_ids"][row, :length].tolist() == expected[0]
        assert batch["npr"]["labels"][row, :length].tolist() == expected[1]


def test_keyword_npr_needs_word_frequencies(tokenizer):
    with pytest.raises(ValueError, match="npr decoder.*word frequencies"):
        MasterCollator(tokenizer, 48, 16, 0.3, 0.5, seed=0, decoders=("npr",), npr_mask="keyword")
    with pytest.raises(ValueError, match="npr_mask 'tfidf'"):
        MasterCollator(tokenizer, 48, 16, 0.3, 0.5, seed=0, decoders=("npr",), npr_mask="tfidf")


def test_masks_are_seeded_per_pair_and_side(tokenizer, weights):
    one, again = collate(tokenizer, weights), collate(tokenizer, weights)
    for task in ("anchor",) + MASTER_TASKS:
        assert torch.equal(one[task]["input_ids"], again[task]["input_ids"])
    # a pair masks the same tokens alone as in a batch
    alone = collate(tokenizer, weights, batch=pairs(3)[2:])
    for task in ("anchor",) + MASTER_TASKS:
        length = int(alone[task]["attention_mask"][0].sum())
        assert torch.equal(alone[task]["labels"][0, :length], one[task]["labels"][2, :length]), task
    other_step = collate(tokenizer, weights, step=1)
    assert not torch.equal(other_step["mkp"]["labels"], one["mkp"]["labels"])


# -- losses -------------------------------------------------------------------------------------------

def _hand_decoder_loss(model, task, batch) -> float:
    """Mean cross-entropy of the LM head over the decoder's labelled positions, every position projected."""
    with torch.no_grad():
        cls = model.bert(input_ids=batch["anchor"]["input_ids"],
                         attention_mask=batch["anchor"]["attention_mask"]).last_hidden_state[:, 0]
        side = batch[task]
        embeddings = model.bert.embeddings(input_ids=side["input_ids"])
        hidden = torch.cat([cls[:, None], embeddings[:, 1:]], dim=1)
        keep = side["attention_mask"][:, None, None, :].bool()
        for layer in model.decoders[task]:
            hidden = layer(hidden, keep)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        logits = model.lm_head(hidden)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), side["labels"].flatten()).item()


def test_each_decoder_loss_matches_a_hand_computation(tokenizer, weights):
    model = tiny(weights={"mkp": 1.0, "cmp": 0.5, "npr": 2.0, "dor": 1.0, "gor": 0.25})
    batch = collate(tokenizer, weights)
    with torch.no_grad():
        parts = model(batch).parts
    for task in MASTER_TASKS:
        assert parts[task].item() == pytest.approx(_hand_decoder_loss(model, task, batch), rel=1e-5), task
    with torch.no_grad():
        encoded = model.bert(input_ids=batch["anchor"]["input_ids"],
                             attention_mask=batch["anchor"]["attention_mask"]).last_hidden_state
        mlm = torch.nn.functional.cross_entropy(model.lm_head(encoded).flatten(0, 1),
                                                batch["anchor"]["labels"].flatten())
    assert parts["mlm"].item() == pytest.approx(mlm.item(), rel=1e-5)
    total = mlm.item() + sum(model.weights[task] * parts[task].item() for task in MASTER_TASKS)
    assert parts["loss"].item() == pytest.approx(total, rel=1e-5)


@pytest.mark.parametrize("task", MASTER_TASKS)
def test_turning_a_decoder_off_removes_exactly_its_loss_term(tokenizer, weights, task):
    full = tiny()
    without = tiny(decoders=tuple(t for t in MASTER_TASKS if t != task))
    assert task not in without.decoders
    batch = collate(tokenizer, weights)
    reduced = collate(tokenizer, weights, decoders=without.tasks)
    assert task not in reduced
    for side in reduced:      # the other sides are masked exactly alike
        assert torch.equal(reduced[side]["input_ids"], batch[side]["input_ids"])
    with torch.no_grad():
        all_parts, some_parts = full(batch).parts, without(reduced).parts
    assert set(all_parts) - set(some_parts) == {task}
    for name in some_parts:
        if name != "loss":
            assert some_parts[name].item() == pytest.approx(all_parts[name].item(), rel=1e-6), name
    assert (all_parts["loss"] - some_parts["loss"]).item() == pytest.approx(all_parts[task].item(), rel=1e-5)


@pytest.mark.parametrize("task", MASTER_TASKS)
def test_gradient_reaches_the_encoder_only_through_cls(tokenizer, weights, task):
    model = tiny().double()
    batch = collate(tokenizer, weights)
    anchor = batch["anchor"]
    encoded = model.bert(input_ids=anchor["input_ids"], attention_mask=anchor["attention_mask"]).last_hidden_state
    loss_sum, count = model.decode(task, encoded[:, 0], batch[task])
    assert count > 0
    layers = [p for p in model.bert.encoder.parameters()]
    by_state, *by_layer = torch.autograd.grad(loss_sum, [encoded] + layers, retain_graph=True)
    # d loss / d encoder output: zero at every token but [CLS], non-zero at [CLS]
    assert torch.count_nonzero(by_state[:, 1:]) == 0
    assert torch.count_nonzero(by_state[:, 0]) > 0
    # and the encoder layers' gradient is exactly the chain rule through the [CLS] vectors
    through_cls = torch.autograd.grad((encoded[:, 0] * by_state[:, 0]).sum(), layers)
    for got, want in zip(by_layer, through_cls):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_decoders_use_sdpa_and_share_embeddings_and_head():
    model = tiny()
    for task in MASTER_TASKS:
        assert model.decoders[task][0].attention.self.config._attn_implementation == "sdpa"
    assert model.lm_head.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    # decoders are seeded by task: each starts from its own weights, the same whichever others are on
    alone = tiny(decoders=("gor",))
    torch.testing.assert_close(alone.decoders["gor"].state_dict(), model.decoders["gor"].state_dict(), rtol=0, atol=0)
    assert not torch.equal(model.decoders["mkp"][0].output.dense.weight, model.decoders["gor"][0].output.dense.weight)


@pytest.mark.parametrize("setting, message", [
    ({"master_decoders": ["mkp", "xyz"]}, "parameter pretrain.variants.bad.master_decoders.1: expected one of"),
    ({"master_decoders": ["mkp", "mkp"]}, "parameter pretrain.variants.bad.master_decoders: names a decoder twice"),
    ({"master_weights": {"npx": 1.0}}, "parameter pretrain.variants.bad.master_weights.npx: unknown key"),
])
def test_bad_settings_are_refused_by_the_schema(setting, message):
    from qac.config import render_profile
    from qac.params import ParamsError, validate_params

    params = render_profile("smoke")
    params["pretrain"]["variants"]["bad"] = {"method": "master", "context_type": "passage", **setting}
    with pytest.raises(ParamsError, match=re.escape(message)):
        validate_params(params)


def test_a_collator_without_word_frequencies_is_refused(tokenizer):
    with pytest.raises(ValueError, match="word frequencies"):
        MasterCollator(tokenizer, 48, 16, 0.3, 0.5, seed=0, decoders=("mkp",))


def test_export_drops_the_decoders(tokenizer, tmp_path):
    from safetensors import safe_open

    model = tiny()
    model.save_encoder(tmp_path / "encoder", tokenizer)
    with safe_open(tmp_path / "encoder" / "model.safetensors", "pt") as handle:
        keys = list(handle.keys())
    assert keys and not [k for k in keys if "decoders" in k or k.startswith("cls")]
