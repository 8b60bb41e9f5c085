"""How far a faithful result may land from a reference figure, and the basis of that distance.

A cell of ours is compared with a figure that is itself one draw: the
paper's one training run, or the recorded run of our own profile on another
machine. What separates two faithful results depends on what differs between
them, so each band names its basis:

- *Training noise* (a reproduction of a trained row): another seed, another
  cluster. The sd of one run's figure comes from the profile's own seeds where
  it ran three or more (Student's t quantile for so few), else from a prior
  kept in the parameters with its source (``check.training_noise``). Our
  figure is the mean of ``k`` seeds and the paper's one run, so the deviation
  has sd ``sd * sqrt(1 + 1/k)``. Query sampling is no part of it: both runs are
  scored on the same queries.
- *Float noise* (a deterministic row: a published checkpoint evaluated by our
  code, BM25): no training noise; only near-tied scores ordered another way,
  worth at most :data:`SLACK_QUERIES` queries of the measure.
- *Machine spread* (a rerun of our own profile): what other CPUs and kernel
  sets moved each measure, measured by rerunning the profile under them and
  pooled over the cells of one measure and dataset (the profile's expected file
  holds those runs' values, ``machine_runs``).

Each band is a two-sided interval at :data:`CELL_LEVEL` around the reference,
plus the reference's rounding (half its last printed digit). Over a family of
cells, a faithful result misses some bands by chance: :func:`allowed_misses`
says how many at :data:`FAMILY_LEVEL`, and :func:`shared_shift` tests the
shortfall (or excess) that every cell of one measure shares, which no per-cell
band sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

from scipy import stats

# Two queries' worth of a per-query measure in [0, 1]: near-tied scores summed in another order by other
# kernels reorder a document pair in a query or two; a change of code or data moves many more.
SLACK_QUERIES = 2
CELL_LEVEL = 0.01     # a faithful cell falls outside its band with this probability
FAMILY_LEVEL = 0.01   # ... and a faithful family fails the allowed misses or a shared-shift test with about this
SCALES = {"percent": 100.0, "fraction": 1.0}


@dataclass(frozen=True)
class Band:
    """A cell's band: ``size`` in the table unit (the rounding included), the ``basis`` that set it, how, and
    ``sd``, the sd of a faithful cell's deviation (None for a deterministic cell: no noise to pool)."""

    size: float
    basis: str
    how: str
    sd: float | None = None


def two_sided(level: float, df: float | None = None) -> float:
    """The quantile a two-sided interval at ``level`` reaches: the normal's, or Student's t with ``df``."""
    if df is None or math.isinf(df):
        return NormalDist().inv_cdf(1 - level / 2)
    return float(stats.t.ppf(1 - level / 2, df))


def sample_sd(values: Sequence[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((value - mean) ** 2 for value in values) / (len(values) - 1))


def float_floor(unit: str, n: int | None) -> float:
    """:data:`SLACK_QUERIES` queries' worth of a [0, 1] measure over ``n`` queries, in the table unit."""
    return SLACK_QUERIES * SCALES[unit] / n if n else 0.0


def training_band(unit: str, rounding: float, seed_values: Sequence[float], prior_sd: float | None,
                  prior_source: str | None) -> Band | None:
    """The band of a trained cell against one published run (None: no seeds to measure and no prior)."""
    k = len(seed_values)
    if k >= 3:
        sd = sample_sd(seed_values)
        quantile = two_sided(CELL_LEVEL, k - 1)
        deviation_sd = sd * math.sqrt(1 + 1 / k)
        how = (f"t({k - 1} df) {quantile:.2f} x sd {sd:.3g} of {k} seeds x sqrt(1 + 1/{k})")
        basis = "seed spread"
    elif prior_sd is not None:
        runs = max(k, 1)
        scaled = prior_sd * SCALES[unit]
        quantile = two_sided(CELL_LEVEL)
        deviation_sd = scaled * math.sqrt(1 + 1 / runs)
        how = (f"z {quantile:.2f} x prior sd {scaled:.3g} of one run x sqrt(1 + 1/{runs}); prior: {prior_source}")
        basis = "training noise prior"
    else:
        return None
    size = rounding + quantile * deviation_sd
    # the rounding of the printed figure is uniform over +-rounding: its variance joins the deviation's
    return Band(size, basis, f"{rounding:g} rounding + {how}", math.sqrt(deviation_sd ** 2 + rounding ** 2 / 3))


def deterministic_band(unit: str, rounding: float, n: int | None) -> Band:
    floor = float_floor(unit, n)
    queries = f" over {n} queries" if n else ""
    return Band(rounding + floor, "rounding + float noise",
                f"{rounding:g} rounding + {SLACK_QUERIES} queries' worth{queries} (no training noise)")


def pooled_machine_sd(deviations: Sequence[float]) -> float:
    """RMS of the deviations of other machines' runs from the recorded one (each is a difference of two draws)."""
    return math.sqrt(math.fsum(d * d for d in deviations) / len(deviations)) if deviations else 0.0


def machine_band(unit: str, n: int | None, group_sd: float, df: int, runs: int) -> Band:
    """A rerun cell's band: the larger of two queries' worth and the t interval of the measured machine spread."""
    floor = float_floor(unit, n)
    if df < 1:
        return Band(floor, "float noise", f"{SLACK_QUERIES} queries' worth over {n} queries (no other machine "
                                          "measured)")
    spread = two_sided(CELL_LEVEL, df) * group_sd
    how = (f"t({df} df) x {group_sd:.3g}, the spread of this measure over {runs} run{'s' if runs > 1 else ''} on "
           f"other machines and kernel sets; at least {SLACK_QUERIES} queries' worth ({floor:.3g})")
    return Band(max(floor, spread), "machine spread", how)


def allowed_misses(cells: int, level: float = CELL_LEVEL, family: float = FAMILY_LEVEL) -> int:
    """The most cells a faithful family of ``cells`` independent cells misses, but with probability ``family``."""
    if cells <= 0:
        return 0
    misses = 0
    while stats.binom.sf(misses, cells, level) > family:
        misses += 1
    return misses


@dataclass(frozen=True)
class SharedShift:
    """A combined test of one measure's cells: the mean standardised deviation, its z and whether it fails."""

    group: str
    cells: int
    mean_deviation: float
    z: float
    limit: float

    @property
    def fails(self) -> bool:
        return abs(self.z) > self.limit

    def line(self, unit_digits: str = ".2f") -> str:
        status = "FAIL" if self.fails else "OK  "
        direction = "short of" if self.mean_deviation < 0 else "above"
        return (f"{status} shared shift | {self.group}: {self.cells} cells, mean {abs(self.mean_deviation):{unit_digits}}"
                f" {direction} the reference, z = {self.z:+.2f} (|z| limit {self.limit:.2f}: two-sided "
                f"{FAMILY_LEVEL:g} over the measures tested); basis: training noise of each cell, pooled")


def shared_shift(group: str, deviations: Sequence[float], sds: Sequence[float], groups: int) -> SharedShift:
    """Stouffer's z of the standardised deviations of one measure's cells (independent runs), with a limit
    that holds the family of ``groups`` such tests to :data:`FAMILY_LEVEL` (Bonferroni)."""
    z = math.fsum(d / s for d, s in zip(deviations, sds)) / math.sqrt(len(deviations))
    limit = two_sided(FAMILY_LEVEL / max(groups, 1))
    return SharedShift(group, len(deviations), math.fsum(deviations) / len(deviations), z, limit)
