"""AdamW with linear warm-up and decay, as BERT-style pre-training uses it."""

from __future__ import annotations

import math

import torch

# Biases and LayerNorm weights are not decayed (BERT's recipe names them so).
_NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def decay_exempt_names(model: torch.nn.Module, rule: str = "names") -> set[str]:
    """Names of the parameters weight decay leaves alone. ``names``: biases and parameters named
    ``LayerNorm`` (BERT's modules; a GPT-2 block's ``ln_1`` / ``ln_2`` / ``ln_f`` weights are decayed).
    ``norm_layers``: biases and the weights of every LayerNorm module, whatever it is called, as the
    Hugging Face Trainer that the release trains with exempts them."""
    if rule == "names":
        return {name for name, _ in model.named_parameters() if any(part in name for part in _NO_DECAY)}
    if rule != "norm_layers":
        raise ValueError(f"decay_exempt: {rule!r} is not names or norm_layers")
    exempt = {name for name, _ in model.named_parameters() if name.endswith("bias")}
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm):
            exempt.update(f"{module_name}.{name}" if module_name else name
                          for name, _ in module.named_parameters(recurse=False))
    return exempt


def build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float, warmup_ratio: float,
                    total_steps: int, device: torch.device, fused: bool | None = None, decay_exempt: str = "names"):
    """``(AdamW, linear schedule)``; the fused AdamW kernel on GPU (``fused``: None) or where ``fused`` asks
    for it. Frozen parameters are left out; ``decay_exempt`` names the rule of :func:`decay_exempt_names`.
    The fused kernel keeps the step count on the device, so the update reads nothing back to the host."""
    from transformers import get_linear_schedule_with_warmup

    exempt = decay_exempt_names(model, decay_exempt)
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (no_decay if name in exempt else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, fused=device.type == "cuda" if fused is None else fused)
    warmup_steps = math.ceil(warmup_ratio * total_steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
    return optimizer, scheduler
