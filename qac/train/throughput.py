"""What a training loop's speed figures mean: tokens/s, MFU, data wait, padding efficiency.

- ``tokens_per_second``: real (non-padding) tokens of both sides per second.
- ``padding_efficiency``: real tokens / padded tokens (what dynamic padding or
  length bucketing buys: the model computes over padded tokens).
- ``data_wait_share``: share of the loop's time spent waiting for the next
  batch (the DataLoader's queue empty), not in the step.
- ``mfu``: model FLOP utilisation, ``6 * parameters * padded tokens / time /
  peak``: the usual transformer estimate (forward 2, backward 4 FLOPs per
  parameter and token, attention's own FLOPs left out), over the dense bf16
  tensor-core peak of the device named in ``peak_device``. On a CPU, or a GPU
  not in :data:`PEAK_FLOPS`, no peak is assumed and no MFU is given.

Wall-clock figures: they go to MLflow and to ``metrics/timing/``, never to a
file DVC caches (the same inputs must give the same bytes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

# Dense bf16 tensor-core FLOP/s from the vendors' data sheets (no sparsity).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "V100": 125e12}


def peak_flops(device: torch.device) -> tuple[str, float | None]:
    """``(device name, assumed peak FLOP/s)``; the peak is None where none is known (CPU)."""
    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_FLOPS.items():
        if key in name:
            return name, peak
    return name, None


def trainable_parameters(model: torch.nn.Module) -> int:
    """Parameters that take part in the step (tied weights counted once)."""
    seen, total = set(), 0
    for parameter in model.parameters():
        if parameter.requires_grad and id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total


@dataclass
class ThroughputWindow:
    """Figures of the steps since the last report; call :meth:`report` at a logging step."""

    parameters: int
    peak: float | None
    start: float = field(default_factory=time.perf_counter)
    real_tokens: int = 0
    padded_tokens: int = 0
    waiting: float = 0.0
    steps: int = 0
    pairs: int = 0

    def add_batch(self, batch: dict) -> None:
        """Count a (CPU-side) batch's tokens: no device work, no sync."""
        for side in batch.values():
            mask = side["attention_mask"]
            self.real_tokens += int(mask.sum())
            self.padded_tokens += mask.numel()

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (checkpoint writing) out of the window."""
        self.start += seconds

    def report(self, real_tokens: float | None = None, padded_tokens: float | None = None) -> dict[str, float]:
        """The window's figures (token counts summed over processes when given) and a fresh window."""
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        real = self.real_tokens if real_tokens is None else real_tokens
        padded = self.padded_tokens if padded_tokens is None else padded_tokens
        figures = {"samples_per_second": self.pairs / elapsed, "tokens_per_second": real / elapsed,
                   "padding_efficiency": real / padded if padded else 0.0,
                   "data_wait_share": min(1.0, self.waiting / elapsed)}
        if self.peak:
            figures["mfu"] = 6.0 * self.parameters * padded / elapsed / self.peak
        self.start, self.real_tokens, self.padded_tokens, self.waiting, self.steps, self.pairs = (
            time.perf_counter(), 0, 0, 0.0, 0, 0)
        return figures


SPEED_KEYS = frozenset({"samples_per_second", "tokens_per_second", "padding_efficiency", "data_wait_share", "mfu"})
