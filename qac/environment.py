"""The environment variables that steer how a stage runs, checked before it starts any work.

They choose where and how a stage computes, never what (``QAC_SEARCH_*``, the
torch.distributed timeouts, the variables torchrun sets); the library reads them
where they are used, deep inside a search or at a rendezvous, after minutes of
encoding. Every stage script checks them first (``pipelines/_environment.py``),
so a typo is one paragraph naming the variable instead of a traceback later, or
worse, a value that runs and silently searches nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from qac.timeouts import TIMEOUT_DEFAULTS, timeout_minutes
from qac.errors import UserError

TORCHRUN_INTEGERS = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def environment_problem(env: Mapping[str, str] | None = None) -> str | None:
    """The first unusable steering variable of ``env`` (default: this process's), as one sentence; else None."""
    env = os.environ if env is None else env
    for check in (_search_problem, _timeout_problem, _torchrun_problem):
        problem = check(env)
        if problem:
            return problem
    return None


def _search_problem(env: Mapping[str, str]) -> str | None:
    backend = env.get("QAC_SEARCH_BACKEND")
    if backend is not None:
        # Imported only when set: a stage that never searches does not run the search's module.
        from qac.retrieval.search import BACKENDS

        if backend not in BACKENDS:
            return f"QAC_SEARCH_BACKEND={backend!r}: expected one of {', '.join(BACKENDS)} (unset: auto)"
    device = env.get("QAC_SEARCH_DEVICE")
    if device is not None:
        problem = _device_problem(device)
        if problem:
            return f"QAC_SEARCH_DEVICE={device!r}: {problem}"
    blocks = env.get("QAC_SEARCH_BLOCKS")
    if blocks is not None:
        rows = [part.strip() for part in blocks.split(",")]
        if len(rows) != 2 or not all(row.isdigit() and int(row) > 0 for row in rows):
            return (f"QAC_SEARCH_BLOCKS={blocks!r}: expected two positive whole numbers, QUERIES,PASSAGES (the "
                    "PyTorch search's block rows, such as 1024,262144); unset, they follow the free memory")
    return None


def _device_problem(device: str) -> str | None:
    import torch

    try:
        parsed = torch.device(device.strip())
    except (RuntimeError, ValueError):
        return "expected cpu, cuda or cuda:N"
    if parsed.type not in ("cpu", "cuda"):
        return "expected cpu, cuda or cuda:N"
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            return "this machine has no CUDA device (or this torch has no CUDA support); unset it to search on the CPU"
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0"
    return None


def _timeout_problem(env: Mapping[str, str]) -> str | None:
    for name in TIMEOUT_DEFAULTS:
        try:
            timeout_minutes(name, env)
        except UserError as error:
            return str(error)
    return None


def _torchrun_problem(env: Mapping[str, str]) -> str | None:
    values = {}
    for name in TORCHRUN_INTEGERS:
        text = env.get(name)
        if text is None:
            continue
        if not text.strip().isdigit():
            return (f"{name}={text!r}: expected a whole number >= 0, as torchrun sets it (left over in the shell? "
                    "unset WORLD_SIZE, RANK and LOCAL_RANK to run as one process)")
        values[name] = int(text)
    if values.get("WORLD_SIZE") == 0:
        return "WORLD_SIZE='0': expected at least 1 process"
    if "WORLD_SIZE" in values and values.get("RANK", 0) >= values["WORLD_SIZE"]:
        return (f"RANK={values['RANK']} with WORLD_SIZE={values['WORLD_SIZE']}: ranks count from 0 to WORLD_SIZE - 1 "
                "(left over in the shell? unset WORLD_SIZE, RANK and LOCAL_RANK to run as one process)")
    return None


def working_folder_problem(params_file: Path, cwd: Path, checkout: Path) -> str | None:
    """A stage run elsewhere than the checkout on one of the checkout's own profiles, as one sentence; else None.

    Stages write under ``data/<profile>/`` and log to ``mlflow.db`` relative to the folder they run in, which DVC
    makes the checkout's root: run from ``docs/`` they would build a second study there. A params file of a
    project folder of its own (outside ``profiles/``) is that folder's business.
    """
    checkout = checkout.resolve()
    try:
        params_file.resolve().relative_to(checkout / "profiles")
    except ValueError:
        return None
    if cwd.resolve() == checkout:
        return None
    return (f"{params_file} is a profile of the checkout {checkout}, but the stage runs in {cwd}: its outputs would "
            f"go to {cwd / 'data'} and its runs to {cwd / 'mlflow.db'}; run it from {checkout} (as DVC does)")
