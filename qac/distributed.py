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

from qac.timeouts import timeout_minutes
from qac.errors import UserError


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
        timeout = datetime.timedelta(minutes=timeout_minutes("QAC_DIST_TIMEOUT_MINUTES"))
        store = _rendezvous(rank, world_size)
        store.set_timeout(timeout)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
                                world_size=world_size, timeout=timeout)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def _rendezvous(rank: int, world_size: int):
    """The ranks' meeting point (``env://``, as ``init_process_group`` does), waited for a bounded time.

    The collectives' timeout is hours (a rank waits while another writes an index); the meeting itself
    takes seconds under torchrun, whose agents have met before starting any rank. WORLD_SIZE and RANK left
    over in a shell would otherwise hold a single process for those hours waiting for ranks that were never
    started. QAC_RENDEZVOUS_TIMEOUT_MINUTES (default 10) bounds the wait.
    """
    import sys

    from torch.distributed import rendezvous

    wait = timeout_minutes("QAC_RENDEZVOUS_TIMEOUT_MINUTES")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if missing:
        raise UserError(f"WORLD_SIZE={world_size} and RANK={rank} are set but {' and '.join(missing)} not: torchrun "
                        "sets all of them for the processes it starts. Left over in the shell? Unset WORLD_SIZE, "
                        "RANK and LOCAL_RANK to run as one process; else start the stage with torchrun "
                        "(docs/cluster.md)")
    at = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    launched_by_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    if not launched_by_torchrun and rank == 0:
        print(f"WORLD_SIZE={world_size} and RANK={rank} are set but torchrun did not start this process: waiting "
              f"up to {wait:g} min for the other ranks at {at} (unset WORLD_SIZE and RANK to run as one process)",
              file=sys.stderr, flush=True)
    try:
        store, _, _ = next(rendezvous("env://", rank, world_size, timeout=datetime.timedelta(minutes=wait)))
    except (RuntimeError, ValueError) as error:      # DistStoreError / DistNetworkError, or a variable missing
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        started = ("torchrun started this process" if launched_by_torchrun else
                   "torchrun did not start this process (WORLD_SIZE and RANK left over in the shell? unset "
                   "WORLD_SIZE RANK LOCAL_RANK MASTER_ADDR MASTER_PORT to run as one process)")
        raise UserError(f"rank {rank} of {world_size} could not meet the other ranks at {at} within {wait:g} "
                        f"min ({reason}); {started}. Start every rank with torchrun (docs/cluster.md), or raise "
                        "QAC_RENDEZVOUS_TIMEOUT_MINUTES where nodes start far apart") from error
    return store


def require_even_split(batch_size: int, world_size: int, key: str, micro_batches: int = 1,
                       micro_batches_key: str | None = None) -> None:
    """Refuse, before any data loads, a global batch that the torchrun processes cannot share equally.

    ``key`` names the parameter (``finetune.batch_size``); each process takes ``micro_batches`` equal
    micro-batches of its share (gradient accumulation, named by ``micro_batches_key``).
    """
    parts = micro_batches * world_size
    if batch_size % parts == 0:
        return

    split = f"{world_size} torchrun process(es)"
    if micro_batches > 1:
        split += f" x {micro_batches} micro-batches ({micro_batches_key} = {micro_batches})"
    counts = [n for n in range(1, min(batch_size, 64) + 1) if batch_size % (n * micro_batches) == 0]
    raise UserError(f"{key} = {batch_size} does not split into equal shares over {split}: set {key} to a multiple "
                    f"of {parts}, or start a number of processes that divides it (here: "
                    f"{', '.join(map(str, counts[:8])) or 'none'})")


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
