"""The building blocks of the schema: constrained types, keys shared by several sections, the section base.

A key that means the same in every section holding it (a peak learning rate, a
warm-up ratio, top-k) is declared here once, with its type, range and
description, and the sections name it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from qac.names import INSIDE_PATH_RULE, PLAIN_NAME_RULE, is_inside_path, is_plain_name


PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]          # [0, 1]
OpenFraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]      # (0, 1)
DropoutProbability = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # [0, 1)
LearningRate = NonNegativeFloat

# Keys that mean the same in every section holding them: type, range and description declared once.
PeakLearningRate = Annotated[LearningRate, Field(description="peak learning rate")]
WarmupRatio = Annotated[Fraction, Field(description="share of the steps with a rising learning rate")]
WeightDecay = Annotated[NonNegativeFloat, Field(description="AdamW weight decay")]
ContrastiveTemperature = Annotated[PositiveFloat, Field(description="contrastive softmax temperature")]
TopK = Annotated[NonNegativeInt, Field(description="sample among the k likeliest tokens (0: no top-k cut)")]
TopP = Annotated[Annotated[float, Field(gt=0, le=1)], Field(description="nucleus sampling mass")]


def _plain_name(value: str) -> str:
    if not is_plain_name(value):
        raise ValueError(PLAIN_NAME_RULE)
    return value


def _inside_path(value: str) -> str:
    if not is_inside_path(value):
        raise ValueError(INSIDE_PATH_RULE)
    return value


# A name that becomes one folder name (profile, dataset, variant, study); a path that stays inside its folder.
PlainName = Annotated[str, AfterValidator(_plain_name)]
InsidePath = Annotated[str, AfterValidator(_inside_path)]
ChunkSize = Annotated[PositiveInt, Field(description="passages per atomically committed chunk (resume unit)")]


class Section(BaseModel):
    """A mapping of the params file: every key declared, nothing else allowed."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
