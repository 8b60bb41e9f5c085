"""Unpadded training: a batch side as one token stream gives the padded side's losses and gradients.

The stream holds the same tokens, masks and labels as the padded side
(qac.data.streams), and the models compute on it what they compute on the
padded side without the padding (qac.models.unpadded). In float64 with no
dropout both layouts compute the same function, so the losses and every
parameter's gradient agree to float64 rounding: sums of the same terms in
another order, through the same layers. The bound is ``C * eps64 * scale``,
``scale`` a loss's value or the largest gradient entry of the model,
``C = 2**14`` (3.6e-12 of the scale): the embeddings' gradients sum a term
for every token of the batch with cancellation, and measure up to about 2,800
eps here; a wrong layout (a token attending to another sequence) moves
gradients by 1e-3 of their scale or more, about 1e12 eps, and the leak test
below checks that such an error is caught.
"""

from __future__ import annotations

import copy

import pytest
import torch

import training_samples
from training_samples import pairs

from qac.data.context_pairs import PairCollator
from qac.data.master import MasterCollator, WordWeights
from qac.data.masking import IGNORE_INDEX
from qac.data.streams import UnpaddedCollator, stream_chunks, token_stream
from qac.models import unpadded
from qac.models.grad_cache import FullBatchStep, GradCachedStep

CPU = torch.device("cpu")
EPS = torch.finfo(torch.float64).eps
C = 2 ** 14
METHODS = ["cocondenser", "cotmae-paper", "cotmae-release", "master"]


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")


def master_pairs(n=4):
    return training_samples.master_pairs(n, empty_continuations=True)


_BUILT: dict[str, torch.nn.Module] = {}


def build(method: str) -> torch.nn.Module:
    """A float64 tiny model of ``method`` without dropout (a fresh copy each call)."""
    from qac.models.cocondenser import CoCondenser
    from qac.models.cotmae import CoTMAE
    from qac.models.master import Master

    if method not in _BUILT:
        if method == "cocondenser":
            model = CoCondenser.from_spec("tiny:minilm", seed=0, dropout=0.0, n_head_layers=1, skip_from=1)
        elif method == "master":
            model = Master.from_spec("tiny:minilm", seed=0, dropout=0.0)
        else:
            model = CoTMAE.from_spec("tiny:minilm", seed=0, dropout=0.0, decoder=method.split("-")[1])
        _BUILT[method] = model.double()
    return copy.deepcopy(_BUILT[method]).train()


def collator(method: str, tokenizer, multiple: int = 8):
    model = build(method)
    if method == "master":
        weights = WordWeights(passages=1000, document_frequency={"the": 1000, "of": 1000, "receptor": 1})
        return MasterCollator(tokenizer, 48, 16, *model.mask_ratios, seed=7, word_weights=weights,
                              pad_to_multiple_of=multiple), master_pairs()
    return PairCollator(tokenizer, 48, 16, *model.mask_ratios, seed=0, pad_to_multiple_of=multiple), pairs()


def batches(method: str, tokenizer) -> tuple[dict, dict]:
    """The padded batch and the same batch as token streams (the unpadded collator's)."""
    padded_collator, examples = collator(method, tokenizer)
    return padded_collator(examples, 3), UnpaddedCollator(padded_collator, 8)(examples, 3)


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters()
            if parameter.grad is not None}


def run(model, step_class, batch, *args) -> tuple[dict, dict]:
    parts = step_class(model, *args, CPU).forward_backward(batch) if args else \
        step_class(model, CPU).forward_backward(batch)
    return {name: float(value) for name, value in parts.items()}, gradients(model)


def assert_close(padded: dict, unpadded_: dict, what: str) -> None:
    """Each loss within ``C`` eps of its value; each gradient within ``C`` eps of the largest gradient entry
    (a gradient that is exactly zero, such as a key bias's, is rounding against that scale)."""
    assert padded.keys() == unpadded_.keys(), what
    if all(isinstance(value, torch.Tensor) for value in padded.values()):
        scale = max(float(value.abs().max()) for value in padded.values())
        for name, value in padded.items():
            difference = float((value - unpadded_[name]).abs().max())
            RATIOS.append((difference / (EPS * scale), what, name))
            assert difference <= C * EPS * scale, (what, name, difference, scale)
        return
    for name, value in padded.items():
        difference = abs(value - unpadded_[name])
        RATIOS.append((difference / (EPS * abs(value)), what, name))
        assert difference <= C * EPS * abs(value), (what, name, difference, value)


RATIOS: list[tuple] = []        # (difference in eps of its scale, what, name), printed with -s -n0


def teardown_module():
    if RATIOS:
        print(f"\nlargest differences (eps of their scale) of {len(RATIOS)}:", sorted(RATIOS, reverse=True)[:3])


def test_a_stream_holds_the_padded_sides_tokens_and_targets(tokenizer):
    padded, streams = batches("cocondenser", tokenizer)
    for name, side in padded.items():
        stream = streams[name]
        mask = side["attention_mask"].bool()
        lengths = mask.sum(dim=1)
        assert torch.equal(stream["input_ids"], side["input_ids"][mask])
        assert torch.equal(stream["labels"], side["labels"][mask])
        assert stream["cu_seqlens"].tolist() == [0] + lengths.cumsum(0).tolist()
        assert stream["layout"].lengths == tuple(lengths.tolist())
        # each sequence starts at position 0 with [CLS]
        assert (stream["position_ids"][stream["cls_positions"]] == 0).all()
        assert (stream["input_ids"][stream["cls_positions"]] == tokenizer.cls_token_id).all()
        labelled = stream["labels"][stream["labels"] != IGNORE_INDEX]
        count = len(labelled)
        assert torch.equal(stream["mlm_labels"][:count], labelled)
        assert (stream["mlm_labels"][count:] == IGNORE_INDEX).all() and len(stream["mlm_labels"]) % 8 == 0
        assert torch.equal(stream["labels"][stream["mlm_positions"][:count]], labelled)
        assert stream["input_ids"].numel() == int(mask.sum()) < mask.numel()     # padding is gone


@pytest.mark.parametrize("method", METHODS)
def test_unpadded_step_gives_the_padded_losses_and_gradients(tokenizer, method):
    padded, streams = batches(method, tokenizer)
    assert_close(*[run(build(method), FullBatchStep, batch)[0] for batch in (padded, streams)], method)
    padded_parts, padded_grads = run(build(method), FullBatchStep, padded)
    stream_parts, stream_grads = run(build(method), FullBatchStep, streams)
    assert_close(padded_parts, stream_parts, method)
    assert_close(padded_grads, stream_grads, method)


def test_gradient_cached_unpadded_step_gives_the_full_batch_padded_gradients(tokenizer):
    """Chunks of a stream cut by tokens, the cached [CLS] gradients replayed: the padded full batch's step."""
    padded, streams = batches("cocondenser", tokenizer)
    reference = run(build("cocondenser"), FullBatchStep, padded)
    assert len(stream_chunks(streams["anchor"], 2 * streams["anchor"]["layout"].max_seqlen)) > 1
    for chunk in (1, 2, 64):
        cached = run(build("cocondenser"), GradCachedStep, streams, chunk)
        assert_close(reference[0], cached[0], f"chunk {chunk}")
        assert_close(reference[1], cached[1], f"chunk {chunk}")


def test_stream_chunks_are_whole_sequences_within_the_budget(tokenizer):
    _, streams = batches("cocondenser", tokenizer)
    side = streams["anchor"]
    budget = 2 * side["layout"].max_seqlen
    chunks = stream_chunks(side, budget)
    assert sum(len(chunk["layout"].lengths) for chunk in chunks) == len(side["layout"].lengths)
    # the fewest runs of about equal size: each within its share plus one sequence
    assert len(chunks) == -(-side["input_ids"].numel() // budget)
    share = side["input_ids"].numel() / len(chunks)
    assert all(chunk["input_ids"].numel() <= share + side["layout"].max_seqlen for chunk in chunks)
    assert torch.equal(torch.cat([chunk["input_ids"] for chunk in chunks]), side["input_ids"])
    labelled = torch.cat([chunk["mlm_labels"][chunk["mlm_labels"] != IGNORE_INDEX] for chunk in chunks])
    assert torch.equal(labelled, side["labels"][side["labels"] != IGNORE_INDEX])
    for chunk in chunks:
        assert (chunk["position_ids"][chunk["cls_positions"]] == 0).all()
        assert chunk["cu_seqlens"][0] == 0 and chunk["cu_seqlens"][-1] == chunk["input_ids"].numel()


def test_the_jagged_kernel_gives_the_masked_kernels_result(tokenizer, monkeypatch):
    """SDPA on nested tensors (the GPU path with dropout) and the block-diagonal mask: one function."""
    _, streams = batches("cocondenser", tokenizer)
    results = {}
    for kernel in ("mask", "jagged"):
        monkeypatch.setattr(unpadded, "ATTENTION", kernel)
        results[kernel] = run(build("cocondenser"), FullBatchStep, streams)
    assert_close(results["mask"][0], results["jagged"][0], "losses")
    assert_close(results["mask"][1], results["jagged"][1], "gradients")


def test_a_token_attending_across_sequences_is_caught(tokenizer, monkeypatch):
    """The tolerance is tight enough to see attention leak from one sequence into the next."""
    padded, streams = batches("cocondenser", tokenizer)
    reference = run(build("cocondenser"), FullBatchStep, padded)[0]
    monkeypatch.setattr(unpadded, "ATTENTION", "mask")      # the kernel whose "may attend" the leak replaces
    monkeypatch.setattr(unpadded.Stream, "allowed",
                        lambda self: torch.ones(len(self.sequence_ids), len(self.sequence_ids),
                                                             dtype=torch.bool))
    leaking = run(build("cocondenser"), FullBatchStep, streams)[0]
    measured = len(RATIOS)
    with pytest.raises(AssertionError):
        assert_close(reference, leaking, "leak")
    del RATIOS[measured:]


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_unpadded_fine_tuning_gives_the_padded_loss_and_gradients(tokenizer, pooling):
    from qac.models.biencoder import BiEncoder
    from qac.models.loading import load_model

    queries = tokenizer([f"what binds receptor {i}" + " of the cell" * i for i in range(3)], padding=True,
                        return_tensors="pt")
    passages = tokenizer([f"the protein {i} binds the receptor " * (1 + i % 3) for i in range(6)], padding=True,
                         return_tensors="pt")
    encoder = load_model("tiny:minilm", seed=0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).double()
    results = []
    for layout in (dict, token_stream):
        model = BiEncoder(copy.deepcopy(encoder), pooling=pooling).train()
        loss = model(layout(queries), layout(passages))
        loss.backward()
        results.append(({"loss": float(loss)}, gradients(model)))
    assert_close(results[0][0], results[1][0], "loss")
    assert_close(results[0][1], results[1][1], "gradients")


@pytest.mark.parametrize("method", ["cocondenser", "cotmae", "master"])
def test_pretraining_unpadded_logs_the_padded_runs_losses(tmp_path, method):
    """The loop end to end (``pretrain.common.unpadded``): the same logged losses, step by step, in float64.

    Three steps of AdamW carry the rounding of the first step's gradients into
    the weights (AdamW normalises each gradient, so a parameter whose gradient
    is rounding alone moves by up to the learning rate): the later losses agree
    to 1e-9 of their value, not to eps.
    """
    from base_settings import pretrain_values
    from test_pretrain_corpus import write_corpus, write_master_inputs

    from qac.train.pretrain import PretrainSettings, pretrain

    data = tmp_path / "data"
    write_corpus(data, documents=4, spans=3, queries=2)
    extra = None
    values = pretrain_values(method=method, seed=3, init="tiny:minilm", context_type="query", query_count=2,
                             max_len=40, query_max_len=12, steps=3, batch_size=6, skip_from=1, n_head_layers=1,
                             lr=1e-4, checkpoint_every=3, log_every=1, dtype="fp64", dropout=0.0,
                             grad_cache_chunk=2 if method == "cocondenser" else 0, loader_workers=0)
    if method == "master":
        write_master_inputs(data)
        values.update(context_type="passage", passage_context="next", master_dor_queries=2)
        extra = {"continuations": data / "continuations.arrow", "word_frequencies": data / "word_frequencies.json"}
    logged = {}
    for unpadded_ in (False, True):
        steps: list[dict] = []
        pretrain(PretrainSettings.from_mapping({**values, "unpadded": unpadded_}), passages=data / "passages.arrow",
                 queries=data / "queries.arrow", work_dir=tmp_path / f"work{unpadded_}",
                 out_dir=tmp_path / f"out{unpadded_}", extra_inputs=extra,
                 log=lambda step, metrics: steps.append(metrics))
        logged[unpadded_] = steps
    assert len(logged[True]) == 3
    for padded_step, stream_step in zip(logged[False], logged[True]):
        for name in padded_step:
            if name.startswith(("loss", "mlm", "head_mlm", "contrastive", "decoder")) or name in ("mkp", "npr"):
                assert stream_step[name] == pytest.approx(padded_step[name], rel=1e-9, abs=0), name
    first = logged[False][0]
    assert abs(logged[True][0]["loss"] - first["loss"]) <= C * EPS * first["loss"]


def test_fine_tuning_unpadded_logs_the_padded_runs_losses(tiny_bert_dir):
    """``finetune.unpadded``: the loop's batches as token streams (collated by two loader processes, so
    the host layout crosses a pickle), the same losses in float32 to its rounding through a few AdamW steps."""
    from transformers import AutoTokenizer

    from base_settings import finetune_settings
    from qac.models.biencoder import BiEncoder
    from qac.train.finetune import train_biencoder
    from qac.train.groups import GroupSampler, TrainingQuery

    topics = ["apple", "river", "violin", "glacier", "solar", "chess", "coffee", "volcano"]
    queries = [TrainingQuery(f"q{i}", f"about {t}" + " and more" * (i % 3), (f"d{i}",), (f"n{i}",))
               for i, t in enumerate(topics)]
    passage_text = {f"d{i}": f"{t} {t} facts" + " seen here" * i for i, t in enumerate(topics)}
    passage_text.update({f"n{i}": f"unrelated filler number {i}" for i in range(8)})
    losses = {}
    for unpadded_, workers in ((False, 0), (True, 2)):
        settings = finetune_settings(log_every=1, loader_workers=workers, prefetch_batches=2, query_max_len=12,
                                     passage_max_len=16, train_n_passages=2, batch_size=4, epochs=2, lr=1e-3,
                                     warmup_ratio=0.0, seed=0, unpadded=unpadded_)
        model = BiEncoder.from_pretrained(tiny_bert_dir)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        losses[unpadded_] = train_biencoder(model, AutoTokenizer.from_pretrained(tiny_bert_dir),
                                            GroupSampler(queries, sorted(passage_text), 1, seed=0), passage_text,
                                            settings)
    assert len(losses[True]) == 4
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
