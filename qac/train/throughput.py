"""What a training loop's speed figures mean: tokens/s, MFU, data wait, padding efficiency.

- ``tokens_per_second``: real (non-padding) tokens of both sides per second.
- ``padding_efficiency``: real tokens / padded tokens (what dynamic padding or
  length bucketing buys: the model computes over padded tokens).
- ``data_wait_share``: share of the loop's time spent waiting for the next
  batch (the DataLoader's queue empty), not in the step.
- ``mfu``: model FLOP utilisation on real tokens: the step's FLOPs, counted
  once per run for each batch side per padded token (qac.train.flops,
  PyTorch's FLOP counter over forward and backward), times each side's real
  tokens, over the time and the device's dense bf16 peak (qac.accelerators,
  looked up by exact device name): the work padding makes the device do does
  not count.
- ``hfu``: hardware FLOP utilisation: the same over the padded tokens, what the
  device computed.
  On a CPU, or a GPU whose exact name is not in the peak table, no peak is
  assumed, neither is given, and the step's FLOPs are not counted.

Wall-clock figures: they go to MLflow and to ``metrics/timing/``, never to a
file DVC caches (the same inputs must give the same bytes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from qac.accelerators import peak_flops  # noqa: F401  (the loops and benchmarks read the peak from here)


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

    peak: float | None
    flops_per_token: dict[str, float] | None = None   # per batch side: counted FLOPs per padded token, once per run
    start: float = field(default_factory=time.perf_counter)
    real_tokens: int = 0
    padded_tokens: int = 0
    waiting: float = 0.0
    steps: int = 0
    pairs: int = 0
    model_flops: float = 0.0        # the steps' FLOPs over their real tokens
    hardware_flops: float = 0.0     # over their padded tokens

    def add_batch(self, batch: dict) -> None:
        """Count a (CPU-side) batch's tokens: no device work, no sync."""
        for name, side in batch.items():
            if "attention_mask" in side:
                mask = side["attention_mask"]
                real, padded = int(mask.sum()), mask.numel()
            else:       # a token stream (qac.data.streams): every position is a real token
                real = padded = side["input_ids"].numel()
            self.real_tokens += real
            self.padded_tokens += padded
            rate = (self.flops_per_token or {}).get(name, 0.0)
            self.model_flops += rate * real
            self.hardware_flops += rate * padded

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (checkpoint writing) out of the window."""
        self.start += seconds

    def counts(self) -> list[float]:
        """What :meth:`report` takes, from this process: sum it over processes first."""
        return [float(self.real_tokens), float(self.padded_tokens), self.model_flops, self.hardware_flops]

    def report(self, real_tokens: float | None = None, padded_tokens: float | None = None,
               model_flops: float | None = None, hardware_flops: float | None = None) -> dict[str, float]:
        """The window's figures (counts summed over processes when given, :meth:`counts`) and a fresh window."""
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        real = self.real_tokens if real_tokens is None else real_tokens
        padded = self.padded_tokens if padded_tokens is None else padded_tokens
        model_flops = self.model_flops if model_flops is None else model_flops
        hardware_flops = self.hardware_flops if hardware_flops is None else hardware_flops
        figures = {"samples_per_second": self.pairs / elapsed, "tokens_per_second": real / elapsed,
                   "padding_efficiency": real / padded if padded else 0.0,
                   "data_wait_share": min(1.0, self.waiting / elapsed)}
        if self.peak and hardware_flops:
            figures["mfu"] = model_flops / elapsed / self.peak
            figures["hfu"] = hardware_flops / elapsed / self.peak
        self.start, self.real_tokens, self.padded_tokens, self.waiting, self.steps, self.pairs = (
            time.perf_counter(), 0, 0, 0.0, 0, 0)
        self.model_flops, self.hardware_flops = 0.0, 0.0
        return figures

    def count_flops(self, model: torch.nn.Module, batch, run) -> None:
        """Count the FLOPs of the step ``run(model, batch)`` makes, per side and padded token, for this run
        (qac.train.flops.flops_per_side_token); call it before :meth:`add_batch` of the first batch.

        Only where a peak is known: the count is what MFU and HFU divide by it, and without one (a CPU) it
        would cost a small model's run more than its steps (the count replays the step op by op, once per
        batch side) for figures nobody gets. Then ``flops_per_token`` is ``{}``: counted, nothing to count."""
        # here, not at the top: it loads numpy
        from qac.train.flops import flops_per_side_token

        self.flops_per_token = flops_per_side_token(model, batch, run) if self.peak else {}


SPEED_KEYS = frozenset({"samples_per_second", "tokens_per_second", "padding_efficiency", "data_wait_share", "mfu",
                        "hfu"})
