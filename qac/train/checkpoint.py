"""Resumable training checkpoints: model with heads, optimizer, scheduler, RNG, step.

A checkpoint is a directory written atomically by rank 0 (a crash while
writing leaves the previous checkpoint intact):

- ``model.pt``, ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``: state dicts;
- ``rng.pt``: the torch CPU (and CUDA) generator state of every process, so
  dropout continues exactly where it stopped;
- ``state.json``: ``step`` (optimizer steps done), ``data_position`` (pairs
  consumed; batches are a function of the step, see qac.data.context_pairs),
  ``world_size``, ``fingerprint`` (hash of the settings and the input files
  that shape the run; a checkpoint of other settings or other data is never
  resumed) and whatever the caller adds (``extra``: the inputs' hashes, the
  logged loss history, the MLflow run that wrote it).

Every process reads the same directory, so several nodes need a shared
filesystem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from qac.io import atomic_path

STATE_FILE = "state.json"


def _rng_state(device: torch.device) -> dict:
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _gather_objects(obj) -> list:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def save_checkpoint(directory: str | os.PathLike, *, model, optimizer, scheduler, scaler, step: int,
                    data_position: int, fingerprint: str, device: torch.device, rank: int,
                    extra: dict | None = None) -> None:
    """Write the checkpoint of ``step``; every process must call this (RNG states are gathered).

    ``extra`` (JSON-serialisable) is stored in ``state.json`` beside the step.
    """
    from qac.distributed import barrier

    rng_states = _gather_objects(_rng_state(device))
    if rank == 0:
        with atomic_path(directory, directory=True) as tmp:
            torch.save(model.state_dict(), tmp / "model.pt")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
            torch.save(rng_states, tmp / "rng.pt")
            state = {**(extra or {}), "step": step, "data_position": data_position,
                     "world_size": len(rng_states), "fingerprint": fingerprint}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    barrier()


def read_state(directory: str | os.PathLike) -> dict | None:
    """``state.json`` of a complete checkpoint in ``directory``, or None."""
    path = Path(directory) / STATE_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def load_checkpoint(directory: str | os.PathLike, *, model, optimizer, scheduler, scaler,
                    device: torch.device, rank: int) -> dict:
    """Restore every state from ``directory`` into the given objects; returns ``state.json``.

    Each process takes back its own RNG state. When the number of processes
    changed, the generator states cannot be matched and are re-seeded from the
    step, so the run continues correctly but dropout draws differ from an
    uninterrupted run.
    """
    directory = Path(directory)
    state = read_state(directory)
    if state is None:
        raise FileNotFoundError(f"{directory}: no {STATE_FILE}; not a checkpoint")
    model.load_state_dict(torch.load(directory / "model.pt", map_location=device, weights_only=True))
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location=device, weights_only=True))
    scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=True))
    scaler.load_state_dict(torch.load(directory / "scaler.pt", weights_only=True))
    rng_states = torch.load(directory / "rng.pt", weights_only=True)
    if len(rng_states) == _world_size():
        torch.set_rng_state(rng_states[rank]["cpu"])
        if device.type == "cuda" and rng_states[rank]["cuda"] is not None:
            torch.cuda.set_rng_state(rng_states[rank]["cuda"], device)
    else:
        torch.manual_seed(1_000_003 * state["step"] + rank)
    return state


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
