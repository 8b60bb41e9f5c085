"""The grammar of measure names (ir-measures'): ``RR@10``, ``R@50``, ``Hit@50``, ``P@10``, ``nDCG@10``, ``AP``.

It sits with the parameters, whose rules parse ``evaluate.metrics`` and ``hpo.metric`` with it while reading
the file (a misspelt measure stops before any work); :mod:`qac.evaluation.metrics` computes the measures it
names, with trec_eval's semantics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FAMILIES_WITH_OPTIONAL_CUTOFF = ("RR", "nDCG")
_FAMILIES_NEEDING_CUTOFF = ("R", "Hit", "P")
_FAMILIES_WITHOUT_CUTOFF = ("AP",)
_MEASURE_NAME = re.compile(r"^(RR|R|Hit|P|nDCG|AP)(?:@([1-9][0-9]*))?$")


@dataclass(frozen=True)
class Measure:
    """A parsed measure name: a family (``RR``, ``R``, ``Hit``, ``P``, ``nDCG``, ``AP``) and a cutoff."""

    family: str
    cutoff: int | None

    @classmethod
    def parse(cls, name: str) -> "Measure":
        match = _MEASURE_NAME.match(name.strip())
        if not match:
            raise ValueError(
                f"unknown measure {name!r}; use RR[@k], R@k, Hit@k, P@k, nDCG[@k] or AP (e.g. RR@10, nDCG@10)"
            )
        family, cutoff = match.group(1), match.group(2)
        cutoff = int(cutoff) if cutoff else None
        if family in _FAMILIES_NEEDING_CUTOFF and cutoff is None:
            raise ValueError(f"measure {name!r} needs a cutoff, e.g. {family}@100")
        if family in _FAMILIES_WITHOUT_CUTOFF and cutoff is not None:
            raise ValueError(f"measure {name!r}: AP is computed over the whole run; drop the cutoff")
        return cls(family, cutoff)

    @property
    def name(self) -> str:
        return self.family if self.cutoff is None else f"{self.family}@{self.cutoff}"
