"""Dense encoding of queries and passages into float32 vectors.

Texts are tokenised once (or read as stored ids), sorted by length and encoded
in batches of similar length (little padding, so much less compute), then put
back in input order. A ``torch.utils.data.DataLoader`` pads the batches
(optionally in worker processes, pinned memory, batches prepared ahead); the
batches are fixed before the loader starts, so the results do not depend on
the number of workers.
Pooling is the [CLS] vector (the paper's and Tevatron's choice) or the
attention-masked mean. On GPU the forward pass runs under autocast (bf16, or
fp16 without bf16 support; ``qac.distributed.autocast_dtype``); outputs are
always float32 numpy arrays, which callers store as ``.npy``.

Under ``torchrun`` each rank encodes a contiguous share of the texts
(:func:`shard_bounds`) and :func:`encode_distributed` gathers the shares on
rank 0 in order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from qac.console import progress
from qac.data.masking import round_up
from qac.data.tokens import SpecialTokens, cut_texts, with_special_tokens
from qac.distributed import autocast_context, autocast_dtype
from qac.models.encoding import POOLINGS


def encode_texts(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    max_length: int,
    batch_size: int = 128,
    pooling: str = "cls",
    device=None,
    dtype: str = "auto",
    sort_by_length: bool = True,
    desc: str = "encode",
    normalize: bool = False,
    token_ids: Sequence | None = None,
    loader_workers: int = 0,
    prefetch_batches: int = 4,
) -> np.ndarray:
    """Encode ``texts`` with a Hugging Face encoder; returns ``float32 [len(texts), hidden]`` in input order.

    ``desc`` labels the progress bar (shown on a terminal, rank 0 only). ``normalize``
    L2-normalises each vector (a model trained for cosine similarity, such as
    all-MiniLM-L6-v2: dot products of the outputs are then its cosines).
    ``token_ids``: the texts' ids as stored beside them (no special tokens,
    qac.data.tokens), which skips tokenisation; batches are then padded as
    integer arrays. ``loader_workers`` processes pad batches ahead of the
    forward pass (0: in this process), ``prefetch_batches`` each; the batches
    and so the results are the same for any worker count.
    """
    import torch

    # here, not at the top: it loads torch
    from qac.models.biencoder import pool

    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if loader_workers < 0:
        raise ValueError(f"loader_workers must be >= 0, got {loader_workers}")
    if prefetch_batches < 1:
        raise ValueError(f"prefetch_batches must be >= 1, got {prefetch_batches}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    hidden_size = model.config.hidden_size
    if len(texts) == 0:
        return np.zeros((0, hidden_size), dtype=np.float32)

    if token_ids is None:
        token_ids = tokenizer(cut_texts(texts, max_length), truncation=True, max_length=max_length,
                              add_special_tokens=True)["input_ids"]
    else:
        special = SpecialTokens.of(tokenizer)
        token_ids = [with_special_tokens(ids, max_length, special) for ids in token_ids]
    pad_id = tokenizer.pad_token_id or 0
    order = np.argsort([-len(ids) for ids in token_ids], kind="stable") if sort_by_length else np.arange(len(texts))
    amp = autocast_dtype(dtype, device)
    autocast = autocast_context(device, amp)

    batches = EncodeBatches(token_ids, [order[start:start + batch_size] for start in range(0, len(order), batch_size)],
                            pad_id)
    loader = encode_loader(batches, loader_workers, prefetch_batches, device)

    out = np.empty((len(texts), hidden_size), dtype=np.float32)
    copies = HostCopies(out, ahead=prefetch_batches)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), autocast, progress(total=len(texts), desc=desc, unit="text") as bar:
            for rows, input_ids, attention_mask in loader:
                input_ids = input_ids.to(device, non_blocking=True)
                attention_mask = attention_mask.to(device, non_blocking=True)
                output = model(input_ids=input_ids, attention_mask=attention_mask)
                hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
                pooled = pool(hidden, attention_mask, pooling).float()
                if normalize:
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
                copies.add(rows.numpy(), pooled)
                bar.update(len(rows))
            copies.finish()
    finally:
        model.train(was_training)
    return out


class HostCopies:
    """Vectors copied from the device into ``out`` without stopping the host at every batch.

    On a GPU each batch's vectors go to pinned host memory asynchronously and are
    written into ``out`` once that copy is done, at most ``ahead`` batches later:
    the host pads and launches the next batches while the device works, instead of
    waiting for each batch (a wait per batch left the device idle while the next
    one was padded). On the CPU the vectors are written at once.
    """

    def __init__(self, out: np.ndarray, ahead: int):
        from collections import deque

        self.out = out
        self.ahead = max(1, ahead)
        self.pending = deque()

    def add(self, rows: np.ndarray, vectors) -> None:
        import torch

        if vectors.device.type != "cuda":
            self.out[rows] = vectors.cpu().numpy()
            return
        host = torch.empty(vectors.shape, dtype=vectors.dtype, pin_memory=True)
        host.copy_(vectors, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self.pending.append((rows, host, copied))
        self._write(keep=self.ahead)

    def finish(self) -> None:
        self._write(keep=0)

    def _write(self, keep: int) -> None:
        while len(self.pending) > keep:
            rows, host, copied = self.pending.popleft()
            copied.synchronize()
            self.out[rows] = host.numpy()


class EncodeBatches:
    """Map-style dataset of fixed batches: item ``i`` is ``(rows, input_ids, attention_mask)`` of batch ``i``.

    ``rows`` are the batch's positions in the input (int64 tensor); ids are
    padded on the right with ``pad_id`` to the batch's longest sequence.
    """

    def __init__(self, token_ids: Sequence, batches: Sequence[np.ndarray], pad_id: int):
        self.token_ids = token_ids
        self.batches = batches
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int):
        import torch

        rows = np.asarray(self.batches[index], dtype=np.int64)
        padded = pad_ids([self.token_ids[i] for i in rows], self.pad_id)
        return (torch.from_numpy(rows), torch.from_numpy(padded["input_ids"]),
                torch.from_numpy(padded["attention_mask"]))


def encode_loader(batches: EncodeBatches, workers: int, prefetch: int, device):
    """A DataLoader yielding ``batches`` in order: ``workers`` processes, pinned memory on CUDA."""
    import torch

    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False, num_workers=workers,
                                       pin_memory=device.type == "cuda",
                                       prefetch_factor=prefetch if workers > 0 else None,
                                       generator=torch.Generator())


def pad_ids(sequences: Sequence, pad_id: int, multiple: int = 1) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask`` (int64) of sequences padded on the right to the longest,
    rounded up to a multiple of ``multiple``."""
    lengths = np.fromiter((len(ids) for ids in sequences), dtype=np.int64, count=len(sequences))
    flat = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in sequences])
    rows = np.repeat(np.arange(len(sequences)), lengths)
    columns = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    input_ids = np.full((len(sequences), round_up(int(lengths.max()), multiple)), pad_id, dtype=np.int64)
    attention = np.zeros(input_ids.shape, dtype=np.int64)
    input_ids[rows, columns] = flat
    attention[rows, columns] = 1
    return {"input_ids": input_ids, "attention_mask": attention}


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """The contiguous slice ``[start, end)`` of ``n`` items that ``rank`` of ``world_size`` handles."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def encode_distributed(model, tokenizer, texts: Sequence[str], ctx, **kwargs) -> np.ndarray | None:
    """Encode ``texts`` across the ranks of ``ctx`` (a ``DistContext``); the full array on rank 0, None elsewhere.

    Without a process group this is :func:`encode_texts`.
    """
    if not ctx.enabled:
        return encode_texts(model, tokenizer, texts, **kwargs)
    import torch.distributed as dist

    start, end = shard_bounds(len(texts), ctx.rank, ctx.world_size)
    share = encode_texts(model, tokenizer, texts[start:end], **kwargs)
    shares = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(share, shares, dst=0)
    return np.concatenate(shares, axis=0) if ctx.is_main else None
