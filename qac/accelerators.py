"""Peak dense tensor-core FLOP/s of the accelerators a run may land on, looked up by exact device name.

MFU is only as good as its denominator: an H100 PCIe (756 TFLOP/s bf16) is
not an H100 SXM (989), and an NVL card is neither, although all three call
themselves "H100". The names are those ``torch.cuda.get_device_name`` reports;
a name not in :data:`DENSE_PEAK_FLOPS` gets no peak (and no MFU) rather than
a guess. Figures are the vendors' data-sheet dense peaks (no 2:4 sparsity) for
bf16 tensor cores, or fp16 where the card has no bf16 (V100).
"""

from __future__ import annotations

import torch

TERA = 1e12

# torch.cuda.get_device_name(...) -> dense bf16 tensor-core FLOP/s (V100: fp16)
DENSE_PEAK_FLOPS: dict[str, float] = {
    "NVIDIA B200": 2250 * TERA,
    "NVIDIA H200": 989.4 * TERA,                  # SXM, 141 GB
    "NVIDIA H200 NVL": 835.5 * TERA,
    "NVIDIA GH200 480GB": 989.4 * TERA,
    "NVIDIA H100 80GB HBM3": 989.4 * TERA,        # SXM5
    "NVIDIA H100 PCIe": 756.5 * TERA,
    "NVIDIA H100 NVL": 835.5 * TERA,
    "NVIDIA A100-SXM4-80GB": 312 * TERA,
    "NVIDIA A100-SXM4-40GB": 312 * TERA,
    "NVIDIA A100 80GB PCIe": 312 * TERA,
    "NVIDIA A100-PCIE-40GB": 312 * TERA,
    "NVIDIA L40S": 362.05 * TERA,
    "NVIDIA L40": 181.05 * TERA,
    "NVIDIA L4": 121 * TERA,
    "NVIDIA A10": 125 * TERA,
    "Tesla V100-SXM2-16GB": 125 * TERA,           # fp16: V100 has no bf16
    "Tesla V100-SXM2-32GB": 125 * TERA,
    "Tesla V100-PCIE-16GB": 112 * TERA,
    "Tesla V100-PCIE-32GB": 112 * TERA,
}


def device_name(device: torch.device) -> str:
    """The accelerator's name as the driver reports it; ``cpu`` off a GPU."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def peak_flops(device: torch.device) -> tuple[str, float | None]:
    """``(device name, dense peak FLOP/s)``; the peak is None where the exact name is not in the table (CPU)."""
    name = device_name(device)
    return name, DENSE_PEAK_FLOPS.get(name)
