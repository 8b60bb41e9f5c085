"""Which run beats which, per measure: the comparison report in ranx's style.

ranx's ``compare(qrels, runs, metrics, stat_test="fisher", max_p=...)`` prints
one row per run, one column per measure, each value followed by the letters of
the runs it beats with p below ``max_p`` (its "fisher" test is this project's
paired randomization test). :func:`comparison_table` builds the same table from
qac's per-query values (:func:`qac.evaluation.significance.randomization_test`),
so ranx run on the exported runs and qrels gives the same letters (up to the
Monte Carlo error of the two tests' permutations for p near ``max_p``).
"""

from __future__ import annotations

import math
import string
from typing import Mapping

from qac.evaluation.significance import randomization_test

PerQuery = Mapping[str, Mapping[str, Mapping[str, float]]]   # system -> measure -> qid -> value


def beaten(per_query: PerQuery, measure: str, max_p: float, permutations: int, seed: int) -> dict[str, list[str]]:
    """``{system: [systems it beats on measure with p < max_p]}`` (a higher mean and a significant test)."""
    systems = list(per_query)
    means = {s: math.fsum(per_query[s][measure].values()) / len(per_query[s][measure]) for s in systems}
    wins: dict[str, list[str]] = {s: [] for s in systems}
    for i, first in enumerate(systems):
        for second in systems[i + 1:]:
            p = randomization_test(per_query[first][measure], per_query[second][measure], permutations, seed)
            if p < max_p and means[first] != means[second]:
                winner, loser = (first, second) if means[first] > means[second] else (second, first)
                wins[winner].append(loser)
    return wins


def comparison_table(per_query: PerQuery, measures: list[str], max_p: float = 0.05, permutations: int = 1000,
                     seed: int = 42) -> str:
    """The Markdown table: ``#``, the run, then each measure's mean with the letters of the runs it beats."""
    systems = list(per_query)
    if len(systems) > len(string.ascii_lowercase):
        raise ValueError(f"{len(systems)} runs: the report letters at most {len(string.ascii_lowercase)}")
    letters = dict(zip(systems, string.ascii_lowercase))
    wins = {measure: beaten(per_query, measure, max_p, permutations, seed) for measure in measures}
    lines = ["| # | run | " + " | ".join(measures) + " |", "|---|---|" + "---|" * len(measures)]
    for system in systems:
        cells = []
        for measure in measures:
            values = per_query[system][measure]
            marks = "".join(sorted(letters[s] for s in wins[measure][system]))
            cells.append(f"{math.fsum(values.values()) / len(values):.4f}" + (f" ^{marks}^" if marks else ""))
        lines.append(f"| {letters[system]} | {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
