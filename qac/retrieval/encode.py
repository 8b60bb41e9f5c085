"""Dense encoding of queries and passages into float32 vectors.

Texts are tokenised once, sorted by length and encoded in batches of similar
length (little padding, so much less compute), then put back in input order.
Pooling is the [CLS] vector (the paper's and Tevatron's choice) or the
attention-masked mean. On GPU the forward pass runs under autocast (bf16, or
fp16 without bf16 support; ``qac.distributed.autocast_dtype``); outputs are
always float32 numpy arrays, which callers store as ``.npy``.

Under ``torchrun`` each rank encodes a contiguous share of the texts
(:func:`shard_bounds`) and :func:`encode_distributed` gathers the shares on
rank 0 in order.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np

POOLINGS = ("cls", "mean")


def pool(hidden, attention_mask, pooling: str):
    """[CLS] vector or masked mean of the last hidden states."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")


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
) -> np.ndarray:
    """Encode ``texts`` with a Hugging Face encoder; returns ``float32 [len(texts), hidden]`` in input order.

    ``desc`` labels the progress bar (shown on a terminal, rank 0 only). ``normalize``
    L2-normalises each vector (a model trained for cosine similarity, such as
    all-MiniLM-L6-v2: dot products of the outputs are then its cosines).
    ``token_ids``: the texts' ids as stored beside them (no special tokens,
    qac.data.tokens), which skips tokenisation; batches are then padded as
    integer arrays.
    """
    import torch

    from qac.console import progress

    from qac.distributed import autocast_dtype

    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    hidden_size = model.config.hidden_size
    if len(texts) == 0:
        return np.zeros((0, hidden_size), dtype=np.float32)

    if token_ids is None:
        token_ids = tokenizer(list(texts), truncation=True, max_length=max_length,
                              add_special_tokens=True)["input_ids"]
    else:
        from qac.data.tokens import SpecialTokens, with_special_tokens

        special = SpecialTokens.of(tokenizer)
        token_ids = [with_special_tokens(ids, max_length, special) for ids in token_ids]
    pad_id = tokenizer.pad_token_id or 0
    order = np.argsort([-len(ids) for ids in token_ids], kind="stable") if sort_by_length else np.arange(len(texts))
    amp = autocast_dtype(dtype, device)
    autocast = torch.autocast(device_type=device.type, dtype=amp) if amp is not None else contextlib.nullcontext()

    out = np.empty((len(texts), hidden_size), dtype=np.float32)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), autocast, progress(total=len(texts), desc=desc, unit="text") as bar:
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                batch = {key: torch.from_numpy(value).to(device)
                         for key, value in pad_ids([token_ids[i] for i in rows], pad_id).items()}
                output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
                pooled = pool(hidden, batch["attention_mask"], pooling).float()
                if normalize:
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
                out[rows] = pooled.cpu().numpy()
                bar.update(len(rows))
    finally:
        model.train(was_training)
    return out


def pad_ids(sequences: Sequence, pad_id: int) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask`` (int64) of sequences padded on the right to the longest."""
    lengths = np.fromiter((len(ids) for ids in sequences), dtype=np.int64, count=len(sequences))
    flat = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in sequences])
    rows = np.repeat(np.arange(len(sequences)), lengths)
    columns = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    input_ids = np.full((len(sequences), int(lengths.max())), pad_id, dtype=np.int64)
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
