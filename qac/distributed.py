"""torch.distributed set-up from the environment ``torchrun`` provides.

Nothing here is home-made distribution: ``torchrun`` starts the processes and
sets RANK / WORLD_SIZE / LOCAL_RANK; we only open the process group (NCCL on
GPU, gloo on CPU) and pick the device.

On several nodes (``torchrun --nnodes N``) every node has a LOCAL_RANK 0. So
the rank that decides who writes, which shard a process takes and where its
share goes in a gather is always the global RANK (``DistContext.rank``); the
local rank only picks the GPU of its node (and a progress bar's line on that
node's terminal). tests/test_multinode.py runs two nodes on one machine.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: "object"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistContext:
    """Join the process group when launched by torchrun; a single process otherwise."""
    import torch
    import torch.distributed as dist

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but this node has {torch.cuda.device_count()} GPU(s) visible: "
                               "start at most one process per GPU (torchrun --nproc-per-node)")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        # Ranks wait for rank 0 at barriers while it searches or writes a
        # corpus-sized index; the default 10-minute timeout is too short at
        # MS MARCO scale. QAC_DIST_TIMEOUT_MINUTES overrides.
        timeout = datetime.timedelta(minutes=float(os.environ.get("QAC_DIST_TIMEOUT_MINUTES", "180")))
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=timeout)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_object(compute):
    """``compute()`` run on rank 0 only and its (picklable) result given to every process.

    For work that every process needs the answer of but that should happen
    once, such as hashing a corpus-sized input file.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return compute()
    holder = [compute() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def sum_over_ranks(value: int, device) -> int:
    """Sum an integer over the torchrun ranks (the value itself in a single process); also a barrier."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    total = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(total)
    return int(total.item())


def cleanup() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def autocast_context(device, dtype, enabled: bool = True):
    """``torch.autocast`` to ``dtype`` on ``device``'s type; no autocast (a null context) when ``dtype`` is None.

    ``enabled=False`` inside an autocast region turns it off for a while without
    clearing the region's cached weight casts (backward passes run so).
    """
    import contextlib

    import torch

    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype, enabled=enabled)


def autocast_dtype(setting: str, device) -> "object | None":
    """Mixed-precision dtype for a ``dtype`` param: auto = bf16 (fp16 without bf16) on GPU, none on CPU.

    An explicit ``bf16`` or ``fp16`` holds on CPU too (worth it where the CPU has bf16 instructions, such
    as AVX512-BF16 or AMX; emulated elsewhere, and slower than fp32). ``fp64`` (a model held in float64,
    see qac.train.pretrain) uses no autocast either.
    """
    import torch

    choices = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if setting in ("fp32", "float32", "fp64", "float64"):
        return None
    if setting == "auto":
        if getattr(device, "type", "cpu") != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if setting not in choices:
        raise ValueError(f"dtype must be auto, fp32, fp64, bf16 or fp16, got {setting!r}")
    return choices[setting]
