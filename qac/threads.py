"""CPU threads of processes that share the machine's cores: waiting threads sleep instead of spinning.

torch's CPU kernels run on an OpenMP thread pool whose idle threads spin for a
while before they sleep (GNU OpenMP's default). A process alone on the cores
loses nothing by it; several processes side by side (two DVC stages, the
workers of a hyper-parameter search) lose the cores their neighbours' threads
spin on: measured on 2 cores, two processes of small-model training took 133 s
spinning and 75 s sleeping. ``OMP_WAIT_POLICY`` is read when the OpenMP runtime
loads (when torch is imported), so it is set in the environment a process
starts with. The thread count is left alone: results summed over another
number of threads differ in their last bits.
"""

from __future__ import annotations

import os
from typing import Mapping


def shared_cores_environment(processes: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) for one of ``processes`` processes started side by side:
    with more than one, OpenMP's idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``, unless it is set)."""
    env = dict(os.environ if base is None else base)
    if processes > 1:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env
