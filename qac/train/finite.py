"""A training step that is still training: every loss and gradient a finite number.

One NaN or infinity in a loss spreads through AdamW into every weight at the
next update, and the run goes on writing NaN checkpoints that later stages
read as trained models. The loops call :func:`check_step` after the backward
pass and before the optimizer step, so the weights never take a non-finite
update: the stage stops at that step with :class:`NonFiniteTraining`, which
names the step, what was not finite and the settings that most often cause it.

The check reads one value back from the device per step (the loss parts and
the gradients' norm, added up there first), the same wait a logged loss costs.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

import torch

from qac.errors import UserError

# What most often makes a step non-finite, in the order worth checking: a temperature whose division leaves
# the float range, a learning rate that throws the weights out of it, half precision overflowing.
SUSPECT_FIELDS = ("temperature", "lr", "warmup_ratio", "max_grad_norm", "dtype")


class NonFiniteTraining(UserError):
    """A loss or gradient that is not a finite number at ``step``: training stopped before the update."""

    def __init__(self, stage: str, step: int, what: str, suspects: Mapping[str, object]):
        self.stage, self.step, self.what, self.suspects = stage, step, what, dict(suspects)
        likely = ", ".join(f"{key} = {value}" for key, value in suspects.items())
        if any(key.startswith("pretrain.common.") for key in suspects):
            likely += " (or the variant's own value, where it sets one)"
        super().__init__(
            f"{stage}: {what} at step {step} is not a finite number (NaN or infinity); training stopped before "
            "this step changed the weights, and no finished model or checkpoint of it was written. The likely "
            f"cause is a setting: {likely or 'the learning rate or temperature'} (a temperature too small divides "
            "the scores out of the float range, a learning rate too large throws the weights out of it, fp16 "
            "overflows where bf16 or fp32 does not). Change it and run the stage again")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return type(self), (self.stage, self.step, self.what, self.suspects)


def suspects_of(settings: object, key_of: Callable[[str], str]) -> dict[str, object]:
    """``{dotted key: value}`` of the :data:`SUSPECT_FIELDS` that ``settings`` has (``key_of`` names a field's
    key in the params file)."""
    return {key_of(field): getattr(settings, field) for field in SUSPECT_FIELDS
            if getattr(settings, field, None) is not None}


def gradient_norm(parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor | None:
    """The sum of the gradients' norms, on their device (None: no gradient): not finite as soon as one
    gradient entry is not."""
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not grads:
        return None
    return torch.stack([norm.double() for norm in torch._foreach_norm(grads)]).sum()


def check_step(stage: str, step: int, loss: torch.Tensor | float, parameters: Iterable[torch.nn.Parameter] | None,
               suspects: Mapping[str, object]) -> float:
    """The step's loss (summed over its parts) as a float; raise :class:`NonFiniteTraining` when ``loss`` (a
    tensor of the step's loss, or its parts) or, with ``parameters``, their gradients are not all finite.
    ``step`` is the 1-based step about to be taken. A loop that logs the loss logs this value: the check
    and the log share the step's one read of the device.

    Leave ``parameters`` out where a loss scaler owns the gradients (fp16): an infinite scaled gradient is
    its signal to skip the step and lower the scale, not a failure.
    """
    values = [torch.as_tensor(loss).detach().double().sum()]
    norm = gradient_norm(parameters) if parameters is not None else None
    if norm is not None:
        values.append(norm.to(values[0].device))
    loss_value, *norm_value = torch.stack(values).tolist()      # one read of the device for both
    if not math.isfinite(loss_value):
        raise NonFiniteTraining(stage, step, "the loss", suspects)
    if norm_value and not math.isfinite(norm_value[0]):
        raise NonFiniteTraining(stage, step, "the gradient", suspects)
    return loss_value
