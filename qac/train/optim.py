"""AdamW with linear warm-up and decay, as BERT-style pre-training uses it."""

from __future__ import annotations

import math

import torch

# Biases and LayerNorm weights are not decayed (BERT, the Hugging Face Trainer).
_NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float, warmup_ratio: float,
                    total_steps: int, device: torch.device, fused: bool | None = None):
    """``(AdamW, linear schedule)``; the fused AdamW kernel on GPU (``fused``: None) or where ``fused`` asks
    for it. Frozen parameters are left out. The fused kernel keeps the step count on the device, so the
    update reads nothing back to the host."""
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (no_decay if any(part in name for part in _NO_DECAY) else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, fused=device.type == "cuda" if fused is None else fused)
    warmup_steps = math.ceil(warmup_ratio * total_steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
    return optimizer, scheduler
