"""A pre-training step with static shapes: no data-dependent op between the batch and the optimizer step.

A data-dependent op (``nonzero``, ``masked_select``, a boolean-mask index, a
``.item()``) makes the host wait for the device and splits a compiled graph.
Each method's step (coCondenser, CoT-MAE with either decoder, MASTER, and the
gradient-cached coCondenser step), padded and as token streams (unpadded), runs
here under a dispatch mode that records
every op; the masked positions come from the collator
(qac.data.masking.masked_targets), so the losses gather rows with
``index_select``. The losses equal the boolean-index selection they replace,
and padding lengths to a multiple of 8 changes the batch by padding alone.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from training_samples import master_pairs, pairs

from qac.data.context_pairs import PairCollator
from qac.data.master import MasterCollator, WordWeights
from qac.data.masking import IGNORE_INDEX, masked_targets
from qac.data.streams import UnpaddedCollator, stream_chunks
from qac.models import unpadded
from qac.models.grad_cache import FullBatchStep, GradCachedStep
from qac.models.losses import at_least_fp32
from qac.train.optim import build_optimizer

CPU = torch.device("cpu")
SYNCING = {"aten.nonzero", "aten.masked_select", "aten._local_scalar_dense", "aten.item", "aten.unique",
           "aten._unique2", "aten.masked_scatter"}


class DataDependentOps(TorchDispatchMode):
    """Records every op that needs the device's data on the host: a sync (and a graph break) on a GPU."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        name = str(func.overloadpacket)
        if name in SYNCING or (name.startswith("aten.index") and self._boolean_index(args)):
            self.ops.append(name if name in SYNCING else f"{name} with a boolean index")
        return func(*args, **(kwargs or {}))

    @staticmethod
    def _boolean_index(args) -> bool:
        indices = [a for a in args if isinstance(a, (list, tuple))]
        return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for group in indices for t in group)


def test_the_recorder_catches_what_the_step_must_not_do():
    values = torch.arange(6.0)
    with DataDependentOps() as recorder:
        values[values > 2].sum()
        values.nonzero()
        float(values.sum())
        values.masked_select(values > 1)
    assert recorder.ops == ["aten.index with a boolean index", "aten.nonzero", "aten._local_scalar_dense",
                            "aten.masked_select"]


@pytest.fixture(scope="module")
def tokenizer():
    from qac.models.loading import load_tokenizer

    return load_tokenizer("minilm")




WEIGHTS = WordWeights(passages=1000, document_frequency={"the": 1000, "of": 1000, "receptor": 1})
_BUILT: dict[str, torch.nn.Module] = {}


def build(method: str) -> torch.nn.Module:
    """A fresh copy of a tiny model of ``method`` (building one takes seconds)."""
    from qac.models.cocondenser import CoCondenser
    from qac.models.cotmae import CoTMAE
    from qac.models.master import Master

    if method not in _BUILT:
        if method == "cocondenser":
            model = CoCondenser.from_spec("tiny:minilm", seed=0, dropout=0.1, n_head_layers=1, skip_from=1)
        elif method == "master":
            model = Master.from_spec("tiny:minilm", seed=0, dropout=0.1)
        else:
            model = CoTMAE.from_spec("tiny:minilm", seed=0, dropout=0.1, decoder=method.split("-")[1])
        _BUILT[method] = model
    return copy.deepcopy(_BUILT[method]).train()


def collate(method: str, tokenizer, multiple: int = 8, unpadded: bool = False) -> dict:
    model = build(method)
    if method == "master":
        collator = MasterCollator(tokenizer, 48, 16, *model.mask_ratios, seed=7, word_weights=WEIGHTS,
                                  pad_to_multiple_of=multiple)
        examples = master_pairs()
    else:
        collator = PairCollator(tokenizer, 48, 16, *model.mask_ratios, seed=0, pad_to_multiple_of=multiple)
        examples = pairs()
    return (UnpaddedCollator(collator, multiple) if unpadded else collator)(examples, 0)


METHODS = ["cocondenser", "cotmae-paper", "cotmae-release", "master"]


@pytest.fixture(autouse=True)
def static_attention_kernel(monkeypatch):
    """Streams attend by the block-diagonal mask here: the kernel a GPU step runs without attention dropout
    (varlen) has no CPU build, and the CPU's own (jagged) builds its nested tensors from the offsets on the
    host, as it does on CUDA under attention dropout; the mask has varlen's static shapes."""
    monkeypatch.setattr(unpadded, "ATTENTION", "mask")

LAYOUTS = ["padded", "unpadded"]      # unpadded: token streams (qac.data.streams)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("method", METHODS + ["gradcache"])
def test_one_step_runs_no_data_dependent_op(tokenizer, method, layout):
    """Forward, backward and the (fused) AdamW step of each method record no op that reads device data."""
    model = build("cocondenser" if method == "gradcache" else method)
    batch = collate("cocondenser" if method == "gradcache" else method, tokenizer, unpadded=layout == "unpadded")
    optimizer, _ = build_optimizer(model, lr=1e-4, weight_decay=0.01, warmup_ratio=0.1, total_steps=10,
                                   device=CPU, fused=True)
    step = GradCachedStep(model, 2, CPU) if method == "gradcache" else FullBatchStep(model, CPU)
    with DataDependentOps() as recorder:
        parts = step.forward_backward(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert recorder.count > 100             # the mode saw the step
    assert recorder.ops == []
    assert all(torch.isfinite(value) for value in parts.values())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("method", METHODS)
def test_compiled_forward_and_loss_has_no_graph_break(tokenizer, method, layout):
    model = build(method)
    batch = collate(method, tokenizer, unpadded=layout == "unpadded")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(batch)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [reason.reason.splitlines()[0] for reason in explained.break_reasons]
    assert explained.graph_count == 1


def test_gradient_cached_chunk_and_contrastive_loss_compile_without_graph_break(tokenizer):
    """The two computations a gradient-cached step repeats: a chunk's side (both passes) and the loss on vectors."""
    model = build("cocondenser")
    side = collate("cocondenser", tokenizer)["anchor"]
    chunk = {name: tensor[:2] for name, tensor in side.items()}
    stream = stream_chunks(collate("cocondenser", tokenizer, unpadded=True)["anchor"], 2 * 48)[0]
    torch._dynamo.reset()
    for explained in (torch._dynamo.explain(model)(chunk, mode="side"),
                      torch._dynamo.explain(model)(stream, mode="side"),
                      torch._dynamo.explain(model.represent)(stream),
                      torch._dynamo.explain(model.represent)(chunk),
                      torch._dynamo.explain(model.contrastive)(torch.randn(4, 64), torch.randn(4, 64))):
        assert explained.graph_break_count == 0, [reason.reason.splitlines()[0] for reason in explained.break_reasons]
    torch._dynamo.reset()


def boolean_index_lm_sum(lm_head, hidden, side_or_labels, full_vocab_logits=False):
    """The MLM sum as it was: rows selected with a boolean mask (an ``aten.nonzero`` each)."""
    labels = side_or_labels["labels"] if isinstance(side_or_labels, dict) else side_or_labels
    selected = labels != IGNORE_INDEX
    loss = F.cross_entropy(at_least_fp32(lm_head(hidden[selected])), labels[selected], reduction="sum")
    return loss, selected.sum()


@pytest.mark.parametrize("method", METHODS)
def test_gathered_losses_equal_the_boolean_index_losses(tokenizer, method, monkeypatch):
    """Same batch, same weights, no dropout: every loss term as the boolean-index selection gives it."""
    import qac.models.cocondenser
    import qac.models.cotmae
    import qac.models.master

    model = build(method).eval()
    batch = collate(method, tokenizer)
    gathered = model(batch).parts
    for module in (qac.models.cocondenser, qac.models.cotmae, qac.models.master):
        monkeypatch.setattr(module, "masked_lm_sum", boolean_index_lm_sum)
    monkeypatch.setattr(qac.models.cotmae, "dense_lm_sum", boolean_index_lm_sum)
    reference = model(batch).parts
    assert gathered.keys() == reference.keys()
    for name, value in reference.items():
        # float32 sums of ~100 terms of size ~ln(vocab) in another order: a few float32 ulps of the value
        tolerance = 64 * torch.finfo(torch.float32).eps * abs(float(value))
        assert abs(float(gathered[name]) - float(value)) <= tolerance, name


@pytest.mark.parametrize("method", ["cocondenser", "master"])
def test_padding_to_a_multiple_of_eight_adds_padding_only(tokenizer, method):
    """Lengths rounded up to 8: the same tokens, masks and labels, then padding; the same loss to rounding."""
    model = build(method).eval()
    exact, padded = collate(method, tokenizer, multiple=1), collate(method, tokenizer, multiple=8)
    for name, side in exact.items():
        width = side["input_ids"].shape[1]
        wide = padded[name]
        assert wide["input_ids"].shape[1] % 8 == 0 and wide["input_ids"].shape[1] >= width, name
        for key in ("input_ids", "attention_mask", "labels"):
            assert torch.equal(wide[key][:, :width], side[key]), (name, key)
        assert (wide["attention_mask"][:, width:] == 0).all() and (wide["labels"][:, width:] == IGNORE_INDEX).all()
        # the gathered targets are each row's labelled tokens in order, then ignored slots
        for row in range(side["labels"].shape[0]):
            labelled = side["labels"][row][side["labels"][row] != IGNORE_INDEX]
            for targets in (side, wide):
                listed = targets["mlm_labels"][row]
                assert torch.equal(listed[:len(labelled)], labelled), name
                assert (listed[len(labelled):] == IGNORE_INDEX).all(), name
                assert torch.equal(targets["labels"][row, targets["mlm_positions"][row, :len(labelled)]], labelled)
        assert wide["mlm_positions"].shape[1] % 8 == 0
    exact_loss, padded_loss = model(exact).parts["loss"], model(padded).parts["loss"]
    assert abs(float(padded_loss) - float(exact_loss)) <= 64 * torch.finfo(torch.float32).eps * float(exact_loss)


def test_masked_targets_lay_out_each_rows_labels_in_order():
    labels = torch.tensor([[-100, 5, -100, 7, 9], [-100, -100, -100, -100, -100], [3, -100, -100, -100, -100]])
    targets = masked_targets(labels, multiple=4)
    assert targets["mlm_positions"].tolist() == [[1, 3, 4, 0], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert targets["mlm_labels"].tolist() == [[5, 7, 9, -100], [-100] * 4, [3, -100, -100, -100]]
    # more slots than columns: the extra slots point at column 0 with no label
    wide = masked_targets(torch.tensor([[4, 5, 6]]), multiple=8)
    assert wide["mlm_positions"].tolist() == [[0, 1, 2, 0, 0, 0, 0, 0]]
    assert wide["mlm_labels"].tolist() == [[4, 5, 6] + [-100] * 5]
