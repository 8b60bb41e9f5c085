"""MS MARCO's token lengths as histograms, so a benchmark pads (or unpads) what the paper's corpus gives.

A step's cost on real text depends on its length distribution: dynamic
padding pads every sequence of a side to the side's longest, and on MS MARCO
a batch nearly always holds one long passage. The histograms in
``msmarco_lengths.json`` (uncased WordPiece tokens, no special tokens) are
built here from MS MARCO's published statistics, so that the file travels
with the checkout and a benchmark needs nothing else:

- passages: mean 80.6 tokens, median 71, 95th percentile 142, 4.5% over 144;
- queries (the 6,980 dev queries): mean 9.0 tokens, longest 44.

Each histogram is a piecewise-linear quantile function through those
figures (and a few knots of its shape between them, chosen for a unimodal
distribution with a long right tail), one free knot solved so that the mean
is the published one, read at 20,000 evenly spaced probabilities and rounded
to whole tokens. The query median and shape are not published: the knots
there are an assumption (mode near 8, 1% over 22), stated in the file.
``python benchmarks/msmarco_lengths.py`` writes the file;
``tests/test_msmarco_lengths.py`` checks its statistics.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LENGTHS_FILE = Path(__file__).resolve().parent / "msmarco_lengths.json"
POINTS = 20_000

# (probability, tokens) knots; None marks the knot solved for the mean
PASSAGE_KNOTS = [(0.0, 6), (0.10, 38), (0.25, 54), (0.5, 71), (0.75, None), (0.95, 142), (0.955, 144.5),
                 (0.99, 190), (1.0, 260)]
PASSAGE_MEAN = 80.6
QUERY_KNOTS = [(0.0, 2), (0.25, 6), (0.5, 8), (0.75, None), (0.95, 16), (0.99, 22), (1.0, 44)]
QUERY_MEAN = 9.0


def quantiles(knots, free: float) -> np.ndarray:
    """Lengths at ``POINTS`` evenly spaced probabilities (mid-points) of the quantile function."""
    probabilities = np.array([p for p, _ in knots])
    tokens = np.array([free if t is None else t for _, t in knots], dtype=float)
    return np.interp((np.arange(POINTS) + 0.5) / POINTS, probabilities, tokens)


def solve(knots, mean: float) -> np.ndarray:
    """The rounded lengths whose mean is ``mean``: bisection on the free knot."""
    index = next(i for i, (_, t) in enumerate(knots) if t is None)
    low, high = knots[index - 1][1], knots[index + 1][1]
    for _ in range(60):
        middle = (low + high) / 2
        if quantiles(knots, middle).mean() < mean:
            low = middle
        else:
            high = middle
    return np.rint(quantiles(knots, (low + high) / 2)).astype(int)


def histogram(lengths: np.ndarray) -> dict[str, int]:
    values, counts = np.unique(lengths, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def build() -> dict:
    return {"what": "MS MARCO token lengths (uncased WordPiece, no special tokens): length -> count",
            "basis": "piecewise-linear quantile functions through MS MARCO's published statistics "
                     "(benchmarks/msmarco_lengths.py); the query median and shape are assumptions",
            "published": {"passages": {"mean": 80.6, "median": 71, "p95": 142, "share over 144": 0.045},
                          "queries": {"mean": 9.0, "max": 44}},
            "passages": histogram(solve(PASSAGE_KNOTS, PASSAGE_MEAN)),
            "queries": histogram(solve(QUERY_KNOTS, QUERY_MEAN))}


def load(path: Path = LENGTHS_FILE) -> dict[str, np.ndarray]:
    """``{"passages": lengths, "queries": lengths}``, every length repeated as often as counted."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {side: np.repeat(np.array([int(k) for k in data[side]]), list(data[side].values()))
            for side in ("passages", "queries")}


if __name__ == "__main__":
    LENGTHS_FILE.write_text(json.dumps(build(), indent=0) + "\n", encoding="utf-8")
    for side, lengths in load().items():
        print(f"{side}: mean {lengths.mean():.2f}, median {np.median(lengths):.0f}, "
              f"p95 {np.percentile(lengths, 95):.0f}, over 144 {(lengths > 144).mean():.3f}, max {lengths.max()}")
