"""One optimisation step's forward and backward: the full batch at once, or gradient-cached.

Both classes have one method, ``forward_backward(batch, scale_loss)``, which
accumulates the batch's gradient into the parameters and returns the logged
loss parts as detached 0-dim tensors on the device (read them with ``float``
only when logging: each read waits for the device); the training loop does
not know which one it holds.

:class:`GradCachedStep` (Gao et al., "Scaling Deep Contrastive Learning Batch
Size under Memory Limited Setup", 2021) lets the contrastive loss see a batch
far larger than fits in memory with its activations:

1. run the encoder alone over every chunk without autograd and keep only
   the [CLS] vectors (and the RNG state before each chunk): the condenser
   head and the MLM heads take no part in the contrastive loss, so this pass
   costs one encoder forward (``represent``), about a quarter of a full step.
   The last chunk of each side runs its whole side with autograd instead
   (``encode_side``) and keeps its graph: step 3 would only repeat it, so a
   side cut into k chunks pays the extra encoder forward on k - 1 of them
   (under DDP the very last chunk is recomputed: its backward must be the one
   that synchronises, right after its own forward);
2. compute the contrastive loss on those vectors and back-propagate it to
   them alone, which gives d loss / d [CLS] for every sequence;
3. re-run each other chunk with autograd through the whole side (``encode_side``),
   replaying its RNG state so the encoder draws the same dropout masks (it
   draws first), and back-propagate ``<[CLS], cached gradient>`` plus the
   chunk's own MLM terms.

By the chain rule the accumulated gradient equals the full-batch gradient of
the loss under the dropout masks drawn. A chunk holds about ``chunk_size``
anchor sequences' worth of tokens on either side (a side of short queries
gets more rows per chunk; a token stream is cut by its tokens, whole
sequences to a chunk), so each chunk gives the device the same amount of
work; each pass runs in one autocast region, so weights are cast once a pass.
The kept chunks' activations stay in memory while the other chunks run: a
chunk's memory is held at most three times at once (the two kept, one live).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from qac.data.streams import is_stream, stream_chunks
from qac.distributed import autocast_context
from qac.models.losses import all_reduce_sum, at_least_fp32, process_group

ScaleLoss = Callable[[torch.Tensor], torch.Tensor]


def _identity(loss: torch.Tensor) -> torch.Tensor:
    return loss


def bare_model(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside its DDP and ``torch.compile`` wrappers."""
    model = getattr(module, "module", module)
    return getattr(model, "_orig_mod", model)


class FullBatchStep:
    """Forward the whole (micro-)batch with autograd, back-propagate its loss."""

    def __init__(self, module: torch.nn.Module, device: torch.device, autocast_dtype: torch.dtype | None = None):
        self.module = module            # the model, or its DDP wrapper
        self.model = bare_model(module)
        self.device = device
        self.autocast_dtype = autocast_dtype

    def on(self, module: torch.nn.Module, device: torch.device) -> "FullBatchStep":
        """The same step for another copy of the model (a FLOP count's replica on the meta device)."""
        return FullBatchStep(module, device)

    def forward_backward(self, batch: dict, scale_loss: ScaleLoss = _identity) -> dict[str, torch.Tensor]:
        with autocast_context(self.device, self.autocast_dtype):
            output = self.module(batch)
        scale_loss(output.loss).backward()
        return {name: value.detach() for name, value in output.parts.items()}


class RngState:
    """CPU (and current CUDA device) generator state, to replay dropout exactly."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def split_side(side: dict[str, torch.Tensor], rows: int) -> list[dict[str, torch.Tensor]]:
    """``side`` cut into chunks of ``rows`` sequences (the last one shorter)."""
    total = next(iter(side.values())).shape[0]
    return [{name: tensor[start:start + rows] for name, tensor in side.items()} for start in range(0, total, rows)]


def rows_per_chunk(batch: dict, chunk_size: int) -> dict[str, int]:
    """Rows of each side in a chunk of about ``chunk_size`` anchors' tokens (padded lengths, known on the host)."""
    tokens = chunk_size * batch["anchor"]["input_ids"].shape[1]
    return {side: max(1, tokens // max(1, batch[side]["input_ids"].shape[1])) for side in ("anchor", "context")}


def side_chunks(batch: dict, chunk_size: int) -> dict[str, list[dict]]:
    """Each side of ``batch`` cut into chunks of about ``chunk_size`` anchors' tokens.

    Padded sides by rows (:func:`rows_per_chunk`); token streams by their
    tokens, whole sequences to a chunk, up to ``chunk_size`` times the longest
    anchor (the host layout says where to cut: qac.data.streams.stream_chunks).
    """
    if is_stream(batch["anchor"]):
        tokens = chunk_size * batch["anchor"]["layout"].max_seqlen
        return {side: stream_chunks(batch[side], tokens) for side in ("anchor", "context")}
    rows = rows_per_chunk(batch, chunk_size)
    return {side: split_side(batch[side], rows[side]) for side in ("anchor", "context")}


def chunk_rows(chunk: dict) -> int:
    """Sequences in a chunk (a shape, known on the host)."""
    return chunk["cls_positions"].shape[0] if is_stream(chunk) else chunk["input_ids"].shape[0]


class GradCachedStep:
    """:class:`FullBatchStep` for coCondenser with the contrastive loss computed by gradient caching."""

    def __init__(self, module: torch.nn.Module, chunk_size: int, device: torch.device,
                 autocast_dtype: torch.dtype | None = None):
        model = bare_model(module)
        if not getattr(model, "supports_grad_cache", False):
            raise ValueError(f"{type(model).__name__} has no contrastive loss to cache")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        self.module = module
        self.model = model
        self.chunk_size = chunk_size
        self.device = device
        self.autocast_dtype = autocast_dtype

    def on(self, module: torch.nn.Module, device: torch.device) -> "GradCachedStep":
        """The same chunking for another copy of the model (a FLOP count's replica on the meta device)."""
        return GradCachedStep(module, self.chunk_size, device)

    def kept_chunks(self, sides: dict[str, list]) -> set[int]:
        """Indices (in the order anchors then contexts) of the chunks whose first pass keeps its graph: the
        last of each side, whose recomputation would repeat the first pass exactly. Under DDP the last chunk
        of all is recomputed: its backward must follow its own forward outside ``no_sync``, with no other
        forward and backward between them."""
        last_anchor = len(sides["anchor"]) - 1
        kept = {last_anchor, last_anchor + len(sides["context"])}
        if getattr(self.module, "no_sync", None) is not None:
            kept.discard(last_anchor + len(sides["context"]))
        return kept

    def first_pass(self, chunks: list, kept: set[int]) -> tuple[list, dict[str, list]]:
        """Per chunk its generator state (to replay) or, for a kept chunk, its output with its graph; and the
        [CLS] vectors of each side, detached. The other chunks run the encoder alone, without autograd."""
        replays, vectors = [], {"anchor": [], "context": []}
        no_sync = getattr(self.module, "no_sync", None)
        with torch.no_grad(), autocast_context(self.device, self.autocast_dtype):
            for index, (side, chunk) in enumerate(chunks):
                if index in kept:
                    with torch.enable_grad(), (contextlib.nullcontext() if no_sync is None else no_sync()):
                        output = self.module(chunk, mode="side")
                    replays.append(output)
                    vectors[side].append(at_least_fp32(output.cls.detach()))
                else:
                    replays.append(RngState(self.device))
                    vectors[side].append(at_least_fp32(self.model.represent(chunk)))
        return replays, vectors

    def forward_backward(self, batch: dict, scale_loss: ScaleLoss = _identity) -> dict[str, torch.Tensor]:
        sides = side_chunks(batch, self.chunk_size)
        chunks = [(side, chunk) for side in ("anchor", "context") for chunk in sides[side]]
        rows = {side: [chunk_rows(chunk) for chunk in sides[side]] for side in sides}

        # 1. [CLS] vectors of every chunk: the encoder alone without activations, or the kept chunks' whole pass.
        replays, vectors = self.first_pass(chunks, self.kept_chunks(sides))

        # 2. Contrastive loss and its gradient with respect to the vectors.
        anchors = torch.cat(vectors["anchor"]).requires_grad_()
        contexts = torch.cat(vectors["context"]).requires_grad_()
        contrastive = self.model.contrastive(anchors, contexts)
        scale_loss(contrastive.backward).backward()
        cached = {"anchor": anchors.grad.split(rows["anchor"]), "context": contexts.grad.split(rows["context"])}

        # 3. Each chunk again with autograd (a kept one as the first pass left it); DDP synchronises on the
        # last backward only.
        _, world_size = process_group()
        local_masked = sum((batch[side]["labels"] != -100).sum() for side in ("anchor", "context"))
        masked = all_reduce_sum(local_masked.to(torch.get_default_dtype())).clamp(min=1)
        # float64 sums: the logged values must not lose what a float64 model computes
        mlm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        head_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        position = {"anchor": 0, "context": 0}
        weight = getattr(self.model, "mlm_weight", 1.0)
        no_sync = getattr(self.module, "no_sync", None)
        # One autocast region for every chunk, so the weights are cast to the autocast dtype once;
        # each backward runs with autocast off (a nested region, which keeps the casts cached).
        with autocast_context(self.device, self.autocast_dtype):
            for index, ((side, chunk), replay) in enumerate(zip(chunks, replays)):
                last = index == len(chunks) - 1
                with (contextlib.nullcontext() if last or no_sync is None else no_sync()):
                    if isinstance(replay, RngState):
                        replay.restore()
                        output = self.module(chunk, mode="side")
                    else:
                        output = replay
                    gradient = cached[side][position[side]]
                    position[side] += 1
                    # The MLM terms are per-chunk sums over the global number of masked
                    # tokens, times W for DDP's averaging (qac.models.losses.mean_over_processes).
                    mlm_terms = weight * (output.mlm_sum + output.head_mlm_sum) * world_size / masked
                    surrogate = (at_least_fp32(output.cls) * gradient).sum() + scale_loss(mlm_terms)
                    with autocast_context(self.device, self.autocast_dtype, enabled=False):
                        surrogate.backward()
                mlm_sum += output.mlm_sum.detach()
                head_sum += output.head_mlm_sum.detach()

        mlm = all_reduce_sum(mlm_sum) / masked
        head_mlm = all_reduce_sum(head_sum) / masked
        value = contrastive.value.detach()
        return {"loss": weight * (mlm + head_mlm) + value, "mlm": mlm, "head_mlm": head_mlm, "contrastive": value}
