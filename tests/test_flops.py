"""MFU you can quote: step FLOPs counted once per run, the peak of the exact device, real and padded tokens."""

from __future__ import annotations

import pytest
import torch

from qac.accelerators import DENSE_PEAK_FLOPS, peak_flops
from qac.data.context_pairs import Pair, PairCollator
from qac.models.grad_cache import FullBatchStep, GradCachedStep
from qac.train.flops import META, counted_flops, flops_per_side_token, meta_copy, padded_tokens, side_widths
from qac.train.throughput import ThroughputWindow


def test_peaks_are_looked_up_by_the_exact_device_name():
    # three cards that all call themselves H100, three peaks
    assert DENSE_PEAK_FLOPS["NVIDIA H100 80GB HBM3"] == pytest.approx(989.4e12)
    assert DENSE_PEAK_FLOPS["NVIDIA H100 PCIe"] == pytest.approx(756.5e12)
    assert DENSE_PEAK_FLOPS["NVIDIA H100 NVL"] == pytest.approx(835.5e12)
    assert DENSE_PEAK_FLOPS.get("NVIDIA H100") is None            # a partial name is not guessed
    assert peak_flops(torch.device("cpu")) == ("cpu", None)


def test_mfu_counts_real_tokens_and_hfu_padded_ones():
    window = ThroughputWindow(peak=1e12)
    window.flops_per_token = {"anchor": 1e6, "context": 1e5}     # as counted on the run's first step
    batch = {"anchor": {"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])},
             "context": {"attention_mask": torch.tensor([[1, 0], [1, 1]])}}
    window.add_batch(batch)
    window.start -= 10.0                                          # ten seconds (and the few ms of this test)
    figures = window.report()
    # padded: 8 anchor and 4 context positions; real: 5 and 3
    assert figures["hfu"] == pytest.approx((8e6 + 4e5) / 10 / 1e12, rel=1e-2)
    assert figures["mfu"] / figures["hfu"] == pytest.approx((5e6 + 3e5) / (8e6 + 4e5), rel=1e-12)
    assert figures["padding_efficiency"] == pytest.approx(8 / 12)


def test_meta_copy_keeps_ties_and_leaves_the_model_alone():
    from qac.models.cocondenser import CoCondenser

    model = CoCondenser.from_spec("tiny:minilm", seed=0, n_head_layers=1, skip_from=1)
    replica = meta_copy(model)
    assert replica.lm_head.predictions.decoder.weight is replica.bert.embeddings.word_embeddings.weight
    assert all(p.device.type == "meta" for p in replica.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())


# -- BERT-base shapes on the meta device ---------------------------------------------------------------

WORDS = ("protein cell membrane signalling pathway receptor binding affinity assay cohort trial dose "
         "patients outcome mutation gene expression tumour growth factor").split()


def text(seed: int, words: int) -> str:
    return " ".join(WORDS[(seed * 7 + 3 * i) % len(WORDS)] for i in range(words))


def base_model(method: str):
    """A BERT-base sized model of ``method`` on the meta device (no weights, only shapes)."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    from qac.models.cocondenser import CoCondenser
    from qac.models.cotmae import CoTMAE
    from qac.models.master import Master

    config = BertConfig()                 # bert-base-uncased: 12 layers, 768 wide, 30,522 word-pieces
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        bert, lm_head = BertModel(config), BertForMaskedLM(config).cls
        lm_head.predictions.decoder.weight = bert.embeddings.word_embeddings.weight
        if method == "cocondenser":
            return CoCondenser(bert, lm_head)
        if method == "master":
            return Master(bert, lm_head, decoders=("npr",))
        return CoTMAE(bert, lm_head, decoder=method.split("-")[1])


def pair_batch(tokenizer, model, step: int, pairs: int = 16):
    """Passages of 60-140 words (step 0; 20-80 at other steps) and generated-query-like contexts of 4-12 words,
    as a collator pads them."""
    shortest, spread = (60, 80) if step == 0 else (20, 60)
    examples = [Pair(i, text(step * 100 + i, shortest + (i * 37 + step * 11) % spread),
                     text(step * 100 + i + 1, 4 + (i * 5 + step) % 9), "query") for i in range(pairs)]
    collator = PairCollator(tokenizer, 144, 32, *model.mask_ratios, seed=step, pad_to_multiple_of=8)
    batch = collator(examples, step)
    if "npr" in getattr(model, "tasks", ()):
        batch["npr"] = batch["context"]
    return batch


def run_step(replica, meta_batch, grad_cache: int = 0):
    step = GradCachedStep(replica, grad_cache, META) if grad_cache else FullBatchStep(replica, META)
    step.forward_backward(meta_batch)


def step_flops(model, batch, grad_cache: int = 0) -> float:
    return counted_flops(model, batch, lambda replica, meta_batch: run_step(replica, meta_batch, grad_cache))


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")        # bert-base-uncased's vocabulary


@pytest.mark.parametrize("method", ["cocondenser", "cotmae-paper", "cotmae-release", "master"])
def test_flops_counted_once_per_run_predict_another_steps_count_within_two_percent(tokenizer, method):
    """The run counts its first step only; each side's FLOPs per padded token of that step times another
    step's padded tokens of the side is that step's own count to 2% (products are linear in tokens;
    attention, a few percent of the work at these lengths, is not quite)."""
    model = base_model(method)
    first, later = pair_batch(tokenizer, model, 0), pair_batch(tokenizer, model, 1)
    assert side_widths(first) != side_widths(later)              # other lengths, other shapes
    rates = flops_per_side_token(model, first, run_step)
    assert sum(rate * padded_tokens(first[name]) for name, rate in rates.items()) == pytest.approx(
        step_flops(model, first), rel=1e-9)
    predicted = sum(rate * padded_tokens(later[name]) for name, rate in rates.items())
    counted = step_flops(model, later)
    assert abs(predicted - counted) <= 0.02 * counted


def test_the_gradient_cached_step_counts_its_extra_encoder_pass(tokenizer):
    model = base_model("cocondenser")
    batch = pair_batch(tokenizer, model, 0)
    full, cached = step_flops(model, batch), step_flops(model, batch, grad_cache=4)
    # an encoder forward (~26% of a full step) over the chunks it recomputes: 3 of the 4 anchor chunks
    # (the last keeps its first pass) and none of the one context chunk
    assert 1.15 < cached / full < 1.22


@pytest.mark.parametrize("peak", [None, 1e12])
def test_a_run_counts_its_flops_once_where_a_peak_is_known_and_logs_mfu(tmp_path, monkeypatch, peak):
    """Pre-training on the CPU, with the peak table answering ``peak`` for it: with one, the run counts its
    first step once and logs MFU and HFU at every logging step; without one (a CPU's answer), nothing is
    counted and neither is logged."""
    import qac.train.flops
    import qac.train.throughput
    from base_settings import pretrain_values
    from qac.train.pretrain import PretrainSettings, pretrain
    from test_pretrain_corpus import write_corpus

    counted = []
    count = qac.train.flops.flops_per_side_token
    monkeypatch.setattr(qac.train.flops, "flops_per_side_token",
                        lambda *args: counted.append(1) or count(*args))
    monkeypatch.setattr(qac.train.throughput, "peak_flops", lambda device: ("a device", peak))
    data = tmp_path / "data"
    write_corpus(data, documents=3, spans=2, queries=2)
    settings = PretrainSettings.from_mapping(pretrain_values(
        method="cocondenser", seed=1, init="tiny:minilm", context_type="query", query_count=1, max_len=32,
        query_max_len=12, steps=3, batch_size=4, skip_from=1, n_head_layers=1, checkpoint_every=3, log_every=1,
        dtype="fp32"))
    logged = []
    summary = pretrain(settings, passages=data / "passages.arrow", queries=data / "queries.arrow",
                       work_dir=tmp_path / "work", out_dir=tmp_path / "out", log=lambda step, m: logged.append(m))
    assert len(logged) == 3
    if peak is None:
        assert counted == [] and summary["flops_per_padded_token"] is None
        assert not any({"mfu", "hfu"} & set(metrics) for metrics in logged)
    else:
        assert counted == [1] and set(summary["flops_per_padded_token"]) == {"anchor", "context"}
        assert all(0 < metrics["mfu"] <= metrics["hfu"] for metrics in logged)
