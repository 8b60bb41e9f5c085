"""Losses of the pre-training models, written once for one process and for many.

Every loss term is a mean over items (masked tokens, sequences) of the whole
global batch, however many processes hold it. A term is returned as a
:class:`LossTerm`: ``backward`` is what this process back-propagates, ``value``
the term's global value for logging (the same on every process).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import torch
import torch.nn.functional as F

from qac.data.masking import IGNORE_INDEX, masked_targets


class LossTerm(NamedTuple):
    backward: torch.Tensor   # this process's contribution; carries the graph
    value: torch.Tensor      # global value of the term, detached


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32, or float64 if it is float64.

    Losses are computed in float32 whatever autocast produced (half precision
    overflows in softmax sums); a float64 model keeps float64 end to end, which
    is what lets the tests compare gradients at rounding level.
    """
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def process_group() -> tuple[int, int]:
    """``(global rank, world size)`` of this process; ``(0, 1)`` outside torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum of a detached tensor over all processes (the tensor itself when alone)."""
    import torch.distributed as dist

    value = value.detach().clone()
    if process_group()[1] > 1 and value.device.type != "meta":   # meta: a FLOP count (qac.train.flops)
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def mean_over_processes(local_sum: torch.Tensor, local_count: torch.Tensor | int) -> LossTerm:
    """Global mean of a per-item loss whose local sum and item count this process holds.

    DDP averages gradients over the W processes, so each process back-propagates
    ``W * local_sum / global_count``: the average of these gradients is the
    gradient of ``sum_all / global_count``, the mean a single process would
    compute on the whole batch, even when processes hold different numbers of
    items (masked tokens differ from one shard to another).
    """
    _, world_size = process_group()
    count = all_reduce_sum(torch.as_tensor(local_count, dtype=torch.float64, device=local_sum.device))
    count = count.clamp(min=1).to(local_sum.dtype)
    value = all_reduce_sum(local_sum) / count
    return LossTerm(backward=local_sum * world_size / count, value=value)


VOCABULARY_MULTIPLE = 64     # the MLM head's output rows, padded: 30,522 -> 30,528 (tensor-core tiles)


def vocabulary_logits(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """BERT's MLM head on ``hidden`` with its vocabulary padded to a multiple of :data:`VOCABULARY_MULTIPLE`.

    The product's output dimension is BERT's vocabulary, 30,522, a multiple of
    2 only: the matrix kernels run it in tiles of 64 or 128 columns with a
    ragged last one. The padded rows of the (tied, unpadded) decoder weight are
    zeros and their bias -inf: their logits are -inf, their softmax exactly 0,
    so no label (every one below the vocabulary size) can target them, the
    cross-entropy and every gradient are the unpadded head's, and the padding
    receives no gradient. A head of another shape runs as it is. Token streams
    (``unpadded``) take this head; the padded layout keeps the plain one, whose
    bits its committed runs were trained with (the padded product sums in
    another order, a difference of float rounding).
    """
    predictions = getattr(lm_head, "predictions", None)
    decoder = getattr(predictions, "decoder", None)
    if decoder is None or decoder.bias is None:
        return lm_head(hidden)
    vocabulary = decoder.weight.shape[0]
    extra = -vocabulary % VOCABULARY_MULTIPLE
    if not extra:
        return predictions(hidden)
    weight = F.pad(decoder.weight, (0, 0, 0, extra))
    bias = F.pad(decoder.bias, (0, extra), value=float("-inf"))
    return F.linear(predictions.transform(hidden), weight, bias)


def masked_lm_sum(lm_head: torch.nn.Module, hidden: torch.Tensor, side: Mapping[str, torch.Tensor],
                  full_vocab_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of the MLM head at a side's masked positions, and their number.

    Only masked positions (about 15% of the tokens) go through the vocabulary
    projection: the head's cost is proportional to the number of rows it sees,
    and the vocabulary matrix dominates it. The rows are gathered with the
    positions the collator listed (``mlm_positions``, ``mlm_labels``:
    qac.data.masking.masked_targets), a shape known before the step runs, so
    the step makes no host-device sync and compiles into one graph; their
    ignored slots add nothing. A side without them (built by hand) has them
    computed here, which costs that sync. With ``full_vocab_logits`` the head
    runs over every position (the usual BertForMaskedLM way), which gives the
    same loss at a higher cost; it exists to measure that cost.
    """
    if full_vocab_logits:
        return dense_lm_sum(lm_head, hidden, side["labels"])
    if "mlm_positions" in side:
        positions, labels = side["mlm_positions"], side["mlm_labels"]
    else:
        targets = masked_targets(side["labels"].cpu())
        positions, labels = (targets[name].to(hidden.device) for name in ("mlm_positions", "mlm_labels"))
    if hidden.dim() == 2:       # a token stream (qac.data.streams): positions index its tokens
        logits = vocabulary_logits(lm_head, hidden.index_select(0, positions))
    else:
        rows, length = hidden.shape[:2]
        flat = (positions + torch.arange(rows, device=positions.device)[:, None] * length).flatten()
        logits = lm_head(hidden.flatten(0, 1).index_select(0, flat))
    labels = labels.flatten()
    loss = F.cross_entropy(at_least_fp32(logits), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (labels != IGNORE_INDEX).sum()


def dense_lm_sum(lm_head: torch.nn.Module, hidden: torch.Tensor,
                 labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`masked_lm_sum` with the head over every position, ``labels`` ``[B, L]`` (``-100``: no loss).

    For targets that cover nearly every token (the release decoder's next
    token, where only padding is left out), and to measure the cost of
    projecting every position.
    """
    logits = vocabulary_logits(lm_head, hidden) if hidden.dim() == 2 else lm_head(hidden)
    loss = F.cross_entropy(at_least_fp32(logits.flatten(0, -2)), labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")
    return loss, (labels != IGNORE_INDEX).sum()


def gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Rows of every process concatenated in global-rank order; this process's rows keep their graph.

    ``all_gather`` returns tensors without autograd history, so the slot of this
    process is replaced by the local tensor itself. The slot is the process's
    GLOBAL rank (the order ``all_gather`` fills its list in); using the local
    rank instead, as the reference release does, puts the grad-carrying rows in
    the wrong slot on every node but the first.
    """
    import torch.distributed as dist

    rank, world_size = process_group()
    if world_size == 1:
        return local
    slots = [torch.empty_like(local) for _ in range(world_size)]
    if local.device.type != "meta":             # meta: a FLOP count (qac.train.flops), the shapes suffice
        dist.all_gather(slots, local.detach().contiguous())
    slots[rank] = local
    return torch.cat(slots, dim=0)


class PairContrastiveLoss(torch.nn.Module):
    """In-batch contrastive loss over both sides of every pair (coCondenser).

    With N pairs in the global batch the 2N [CLS] vectors are scored against each
    other by dot product / temperature; for each sequence the paired sequence is
    the positive, the other 2N - 2 are negatives, itself is excluded; the loss is
    the cross-entropy averaged over the 2N sequences.
    """

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature

    def scores_loss(self, anchors: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """The loss over one set of N pairs held in one place."""
        n_pairs = anchors.shape[0]
        reps = at_least_fp32(torch.cat([anchors, contexts], dim=0))
        scores = reps @ reps.T / self.temperature
        scores = scores.masked_fill(torch.eye(2 * n_pairs, dtype=torch.bool, device=scores.device), float("-inf"))
        rows = torch.arange(2 * n_pairs, device=scores.device)
        targets = (rows + n_pairs) % (2 * n_pairs)
        return F.cross_entropy(scores, targets)

    def forward(self, anchors: torch.Tensor, contexts: torch.Tensor) -> LossTerm:
        """Loss over the global batch from this process's ``anchors`` and ``contexts`` [CLS] vectors.

        Every process gathers all vectors (its own slot keeps its graph) and
        computes the loss of the whole global batch, so its gradient is the exact
        gradient of the global loss with respect to its own vectors. DDP then
        averages the W processes' gradients; back-propagating ``W * loss`` turns
        that average into the sum over processes, which is the full-batch
        gradient. (Computing only the local rows, as some toolkits do, would
        drop the gradient that other processes' rows send to these vectors.)
        """
        _, world_size = process_group()
        loss = self.scores_loss(gather_with_grad(anchors), gather_with_grad(contexts))
        return LossTerm(backward=loss * world_size, value=loss.detach())
