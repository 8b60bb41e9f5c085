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
from qac.distributed import barrier

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


class DamagedCheckpoint(Exception):
    """A work checkpoint whose files cannot be read (a disk fault, a copy cut short): a cache, so the run
    discards it and starts over, saying why."""


def read_state(directory: str | os.PathLike) -> dict | None:
    """``state.json`` of a complete checkpoint in ``directory``, or None.

    A ``state.json`` that is not a JSON object comes back as ``{"damaged": why}``: no fingerprint matches
    it, so it is never resumed."""
    path = Path(directory) / STATE_FILE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:          # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {"damaged": f"{path} cannot be read ({type(error).__name__}: {error})"}
    return state if isinstance(state, dict) else {"damaged": f"{path} is not a JSON object"}


def load_checkpoint(directory: str | os.PathLike, *, model, optimizer, scheduler, scaler,
                    device: torch.device, rank: int) -> dict:
    """Restore every state from ``directory`` into the given objects; returns ``state.json``.

    Each process takes back its own RNG state. When the number of processes
    changed, the generator states cannot be matched and are re-seeded from the
    step, so the run continues correctly but dropout draws differ from an
    uninterrupted run. Every file is read before any state is set: a file that
    cannot be read raises :class:`DamagedCheckpoint` with the objects untouched.
    """
    import pickle

    directory = Path(directory)
    state = read_state(directory)
    if state is None:
        raise FileNotFoundError(f"{directory}: no {STATE_FILE}; not a checkpoint")
    if "damaged" in state:
        raise DamagedCheckpoint(state["damaged"])
    loaded = {}
    for name in ("model", "optimizer", "scheduler", "scaler", "rng"):
        path = directory / f"{name}.pt"
        try:
            loaded[name] = torch.load(path, map_location=device if name in ("model", "optimizer") else None,
                                      weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
            reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            raise DamagedCheckpoint(f"{path} cannot be read ({type(error).__name__}: {reason})") from error
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    scheduler.load_state_dict(loaded["scheduler"])
    scaler.load_state_dict(loaded["scaler"])
    rng_states = loaded["rng"]
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
