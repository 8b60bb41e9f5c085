"""The machine a run's numbers came from: the CPU, the kernels torch and its BLAS chose, the library versions.

Another machine moves every trained output by float rounding (its kernels sum
in another order), so a rerun check says which machine recorded the expected
values and which one ran now; two runs that differ here are not expected to
give the same bytes.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

LIBRARIES = ("torch", "numpy", "transformers", "tokenizers", "faiss-cpu", "bm25s", "scipy")
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_vector_flags() -> list[str]:
    """The vector instruction sets the CPU offers (avx2, avx512f, ...): what decides torch's kernel choice."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(flag for flag in set(flags) if flag in ("avx", "avx2", "fma", "avx512f", "avx512bw",
                                                          "avx512vl", "avx512_vnni", "amx_tile"))


def machine_environment() -> dict:
    """What a rerun on this machine computes with, as plain values for a YAML file."""
    import torch

    versions = {}
    for library in LIBRARIES:
        try:
            versions[library] = metadata.version(library)
        except metadata.PackageNotFoundError:
            continue
    return {"cpu": cpu_model(), "cpu_flags": cpu_vector_flags(), "cores": os.cpu_count(),
            "torch_kernels": torch.backends.cpu.get_cpu_capability(),
            "mkl_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS") or None,
            "threads": torch.get_num_threads(), "python": platform.python_version(), "libraries": versions}
