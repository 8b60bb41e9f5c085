"""The building blocks of the schema: constrained types, keys shared by several sections, the section base.

A key that means the same in every section holding it (a peak learning rate, a
warm-up ratio, top-k) is declared here once, with its type, range and
description, and the sections name it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from qac.names import (INSIDE_PATH_RULE, OUTPUT_FOLDER_RULE, PLAIN_NAME_RULE, is_inside_path, is_output_folder,
                       is_plain_name)


def _checked(test: Callable[[Any], bool], rule: str) -> AfterValidator:
    """A validator that refuses a value ``test`` rejects, with ``rule`` (what is expected) as the reason."""
    def check(value: Any) -> Any:
        if not test(value):
            raise ValueError(rule)
        return value

    return AfterValidator(check)


PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]          # [0, 1]
OpenFraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]      # (0, 1)
DropoutProbability = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]  # [0, 1)
# A learning rate above 1 moves AdamW's every weight by about its own size or more at each step (BERT's
# weights are ~0.02 across): nothing trains, and 1e308 overflows the optimizer's float32 state at step one.
MAX_LEARNING_RATE = 1.0
LEARNING_RATE_RULE = (f"a learning rate of at most {MAX_LEARNING_RATE:g}: AdamW moves every weight by about "
                      "the rate at each step, so a larger one throws the weights out of any trained range")


def _trainable_rate(value: float) -> bool:
    return value <= MAX_LEARNING_RATE


LearningRate = Annotated[NonNegativeFloat, _checked(_trainable_rate, LEARNING_RATE_RULE)]
# Optimizer steps of one run: a billion is years of any device's time, so a larger count is a typo (an extra
# zero or two), refused before the run starts rather than found out after days.
StepCount = Annotated[int, Field(ge=1, le=1_000_000_000)]

# An encoder's length counts the [CLS] and [SEP] its tokenizer adds (truncation keeps both), so a length
# under 3 leaves no token of text: every passage and query would encode as the same two tokens.
MIN_ENCODER_LENGTH = 3
ENCODER_LENGTH_RULE = (f"a length of at least {MIN_ENCODER_LENGTH} tokens: it counts the [CLS] and [SEP] the "
                       "encoder adds, so a shorter one reads no token of the text")


def _holds_a_token(value: int) -> bool:
    return value >= MIN_ENCODER_LENGTH


EncoderLength = Annotated[PositiveInt, _checked(_holds_a_token, ENCODER_LENGTH_RULE)]

# Keys that mean the same in every section holding them: type, range and description declared once.
PeakLearningRate = Annotated[LearningRate, Field(
    description=f"peak learning rate; at most {MAX_LEARNING_RATE:g}, as a larger step of AdamW moves every weight by "
                "more than its own size")]
WarmupRatio = Annotated[Fraction, Field(description="share of the steps with a rising learning rate")]
WeightDecay = Annotated[NonNegativeFloat, Field(description="AdamW weight decay")]
# Scores are divided by a temperature before the softmax. Dot products of BERT-sized vectors reach about 1e3
# and cosines 1, so 1 / 1e-4 keeps the logits near 1e7, far inside the range of bf16 and fp32 (3.4e38); a
# temperature like 1e-320 (a subnormal, whose inverse is infinite) makes every loss NaN from the first step.
MIN_TEMPERATURE = 1e-4
TEMPERATURE_RULE = (f"a temperature of at least {MIN_TEMPERATURE:g}: the scores are divided by it, and a smaller "
                    "one takes the logits out of the float range of bf16 and fp32, so every loss is NaN")


def _at_least_min_temperature(value: float) -> bool:
    return value >= MIN_TEMPERATURE


Temperature = Annotated[PositiveFloat, _checked(_at_least_min_temperature, TEMPERATURE_RULE)]
ContrastiveTemperature = Annotated[Temperature, Field(
    description=f"contrastive softmax temperature; at least {MIN_TEMPERATURE:g}, as the scores (dot products "
                "up to ~1e3, cosines up to 1) are divided by it and 1 / temperature must keep the logits inside "
                "the float range of bf16 and fp32")]
# Logits of a language model divided by it before sampling: the same bound keeps them finite.
SamplingTemperature = Temperature
SCALE_RULE = (f"a scale of at most {1 / MIN_TEMPERATURE:g}: the scale is an inverse temperature, and a larger one "
              "takes the logits out of the float range of bf16 and fp32, so every loss is NaN")


def _at_most_max_scale(value: float) -> bool:
    return value * MIN_TEMPERATURE <= 1


InverseTemperature = Annotated[PositiveFloat, _checked(_at_most_max_scale, SCALE_RULE)]
TopK = Annotated[NonNegativeInt, Field(description="sample among the k likeliest tokens (0: no top-k cut)")]
TopP = Annotated[Annotated[float, Field(gt=0, le=1)], Field(description="nucleus sampling mass")]


def _each_once(value: list) -> list:
    seen: list = []
    for item in value:
        if item in seen:        # by equality: the items may be unhashable (a categorical choice's list)
            raise ValueError(f"each entry once ({item!r} is listed twice)")
        seen.append(item)
    return value


# A list whose entries name things (datasets, splits, measures, variants, files): an entry written twice would
# be evaluated twice, shown as two columns, or counted twice in a mean or a majority.
Distinct = AfterValidator(_each_once)
SEEDS_RULE = "at least one seed and each seed once (null: run once with the top-level seed)"


def seeds_distinct(value: list[int]) -> bool:
    return bool(value) and len(set(value)) == len(value)


def _distinct_seeds(value: list[int]) -> list[int]:
    if not seeds_distinct(value):
        raise ValueError(SEEDS_RULE)
    return value


# Seeds of repeated runs: each one a run of its own, so a seed written twice would count one run twice in
# the mean and spread across seeds.
# A seed: what NumPy's, Python's and torch's generators all accept (NumPy refuses negatives, torch's manual
# seed a value past 64 bits), so one out of that range would stop a stage after its model loaded.
Seed = Annotated[int, Field(ge=0, lt=2**32)]
SeedList = Annotated[list[Seed], AfterValidator(_distinct_seeds)]
# A name that becomes one folder name (profile, dataset, variant, study); a path that stays inside its folder.
PlainName = Annotated[str, _checked(is_plain_name, PLAIN_NAME_RULE)]
InsidePath = Annotated[str, _checked(is_inside_path, INSIDE_PATH_RULE)]


OutputFolder = Annotated[str, _checked(is_output_folder, OUTPUT_FOLDER_RULE)]
ChunkSize = Annotated[PositiveInt, Field(description="passages per atomically committed chunk (resume unit)")]


# The cluster keys that reach a `#SBATCH` line or a shell line of a Slurm script (qac/cluster.py) hold what
# sbatch takes there and nothing that would end a directive or run as a command: a bad value is named with
# its file and line before any script is written, not found by sbatch at submission.
SLURM_TIME_RULE = ("a Slurm time limit above zero: minutes (an integer or 'MM'), 'MM:SS', 'HH:MM:SS', 'D-HH', "
                   "'D-HH:MM' or 'D-HH:MM:SS', with hours < 24 after days and minutes and seconds < 60 after a "
                   "larger unit")
SLURM_MEMORY_RULE = ("a Slurm memory size: a positive integer, optionally followed by K, M, G or T (such as 64G; "
                     "without a unit, megabytes)")
SLURM_NAME_RULE = "a Slurm name: letters, digits, '_', '-' and '.' (no spaces, quotes or shell characters)"
SLURM_NAMES_RULE = ("one or more Slurm names separated by ',': letters, digits, '_', '-' and '.' (no spaces, "
                    "quotes or shell characters)")
SCRIPT_PATH_RULE = ("an absolute path of letters, digits, '_', '-', '.', '+', ',', '=' and '@' (no spaces, quotes, "
                    "'%' or shell characters; no '.' or '..' component)")

_SLURM_TIME = re.compile(r"(?:(?P<days>[0-9]+)-(?P<day_hours>[0-9]{1,2})(?::(?P<day_minutes>[0-9]{1,2})"
                         r"(?::(?P<day_seconds>[0-9]{1,2}))?)?"
                         r"|(?P<hours>[0-9]+):(?P<minutes>[0-9]{1,2}):(?P<seconds>[0-9]{1,2})"
                         r"|(?P<lead_minutes>[0-9]+)(?::(?P<lead_seconds>[0-9]{1,2}))?)")
_SLURM_MEMORY = re.compile(r"[1-9][0-9]*[KMGT]?")
_SLURM_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_SCRIPT_PATH = re.compile(r"(?:/[A-Za-z0-9_.+,=@-]+)+/?|/")


def is_slurm_time(value: object) -> bool:
    """``value`` is a time limit sbatch takes as ``--time``: above zero, no field out of its unit's range."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value >= 1
    match = _SLURM_TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return False
    fields = {key: int(number) for key, number in match.groupdict().items() if number is not None}
    limits = {"day_hours": 24, "day_minutes": 60, "day_seconds": 60, "minutes": 60, "seconds": 60,
              "lead_seconds": 60}
    return all(fields[key] < limit for key, limit in limits.items() if key in fields) and any(fields.values())


def is_slurm_memory(value: object) -> bool:
    """``value`` is a memory size sbatch takes as ``--mem`` (an integer: megabytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value >= 1
    return isinstance(value, str) and bool(_SLURM_MEMORY.fullmatch(value))


def is_slurm_name(value: object, several: bool = False) -> bool:
    """``value`` is a partition, account or QOS name (``several``: names separated by ',')."""
    pattern = f"{_SLURM_NAME}(?:,{_SLURM_NAME})*" if several else _SLURM_NAME
    return isinstance(value, str) and bool(re.fullmatch(pattern, value))


def is_script_path(value: object) -> bool:
    """``value`` is an absolute path that reads the same in a ``#SBATCH`` line and in a shell line."""
    return isinstance(value, str) and bool(_SCRIPT_PATH.fullmatch(value)) \
        and all(part not in (".", "..") for part in value.split("/"))


SlurmTime = Annotated[str | int, _checked(is_slurm_time, SLURM_TIME_RULE)]
SlurmMemory = Annotated[str | int, _checked(is_slurm_memory, SLURM_MEMORY_RULE)]
SlurmName = Annotated[str, _checked(is_slurm_name, SLURM_NAME_RULE)]
SlurmNames = Annotated[str, _checked(lambda value: is_slurm_name(value, several=True), SLURM_NAMES_RULE)]
ScriptPath = Annotated[str, _checked(is_script_path, SCRIPT_PATH_RULE)]


class Section(BaseModel):
    """A mapping of the params file: every key declared, nothing else allowed; typed and frozen.

    Read a key as an attribute (``params.pretrain.common.lr``): a key the file leaves out reads as the
    schema's default, the one place defaults live. A section also reads as a read-only mapping of the
    keys the file set (``section["lr"]``, ``dict(section)``, ``{**common, **variant}``), which is what
    generic code needs: a variant's overrides merged over ``pretrain.common`` take the keys the variant
    set and no others, and logging every key logs what the file said.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    _file_order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _keep_file_order(cls, data: Any, handler: Any) -> Any:
        # The mapping view lists keys as the file wrote them (a dumped section reads like its source).
        section = handler(data)
        if isinstance(data, dict):
            section._file_order = tuple(key for key in data if key in type(section).model_fields)
        return section

    def keys(self) -> list[str]:
        """The keys the file set, in the file's order."""
        given = self.model_fields_set
        ordered = [name for name in self._file_order if name in given]
        return ordered + [name for name in type(self).model_fields if name in given and name not in ordered]

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.model_fields_set else default

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]  (pydantic's yields (key, value) pairs)
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.model_fields_set)

    def items(self) -> list[tuple[str, Any]]:
        return [(name, getattr(self, name)) for name in self.keys()]

    def values(self) -> list[Any]:
        return [getattr(self, name) for name in self.keys()]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (nested sections as dicts) of the keys the file set, in its order: what YAML or JSON
        writes."""
        return {key: _plain(value) for key, value in self.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


# Generic code asks isinstance(value, Mapping) before walking a value (logging, overrides by path).
Mapping.register(Section)
