"""Simulated outputs of the paper profile: per-query values whose means are the paper's figures.

Each published cell of the paper's Tables 1-4 is produced by one per-query
file of the paper profile (its cell plan, :mod:`qac.reporting.cell_plan`,
names the file). Here each such file gets, for each measure a published cell
reads from it, values with that measure's real per-query shape:

- RR@10: reciprocal ranks, 0 (no relevant passage in the top 10) or 1/k for
  k = 1..10, the first relevant passage's rank falling off as 1/k;
- Hit@k: 0 or 1;
- nDCG@10: a continuous value in [0, 1] (a Beta distribution, sd about 0.28
  at mean 0.5, as per-query nDCG@10 spreads on TREC DL and BEIR).

Two systems scored on the same queries are correlated, as real runs are (a
query hard for one retriever is mostly hard for the other): each query's
draws mix a stream shared by every file of that query set with the file's
own stream (a Gaussian copula at correlation ``SHARED_QUERY_CORRELATION``).
The values are drawn with a fixed seed and then nudged, one query at a time
within the measure's own support, until their mean is the target to well
within its printed rounding. The target is the published figure (plus
``shift``), and with ``noise_seed`` plus what separates a faithful run from
the paper's: the printed figure's rounding (uniform over half its last digit)
and training noise drawn from the profile's own prior
(``check.training_noise``: our run and the paper's each carry it, so the
difference has sd ``sd * sqrt(2)``). Query counts are the real sets' (MS MARCO
dev 6,980; TREC DL 2019 43 and 2020 54; the BEIR test sets).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import numpy as np

from qac.params import Params

QUERY_COUNTS = {"dev": 6980, "dl19": 43, "dl20": 54,
                "trec-covid": 50, "nfcorpus": 323, "nq": 3452, "hotpotqa": 7405, "fiqa": 648, "arguana": 1406,
                "webis-touche2020": 49, "cqadupstack": 13145, "quora": 10000, "dbpedia-entity": 400,
                "scidocs": 1000, "fever": 6666, "climate-fever": 1535, "scifact": 300}
# Between independent systems (0) and one system scored twice (1): a query's difficulty is mostly shared.
SHARED_QUERY_CORRELATION = 0.6
RR_SUPPORT = np.array([0.0] + [1.0 / k for k in range(1, 11)])
_RANK_WEIGHTS = np.array([1.0 / k for k in range(1, 11)])   # where the first relevant passage sits, given a hit


def _nudge(values: np.ndarray, target: float, support: np.ndarray | None) -> np.ndarray:
    """Move single values (within ``support``, or in [0, 1]) until the mean is ``target`` to within 1e-5."""
    values = values.copy()
    n = len(values)
    if support is None:
        for _ in range(50):
            values = np.clip(values + (target - values.mean()), 0.0, 1.0)
            if abs(values.mean() - target) < 1e-9:
                break
        return values
    order = np.random.default_rng(7).permutation(n)
    for index in order:
        deficit = target * n - values.sum()
        if abs(deficit) < 1e-5 * n:
            break
        candidates = support - values[index]
        best = candidates[np.argmin(np.abs(deficit - candidates))]
        if abs(deficit - best) < abs(deficit):
            values[index] += best
    return values


def _uniforms(rng: np.random.Generator, shared: np.random.Generator | None, n: int) -> np.ndarray:
    """``n`` uniforms, each a query's: correlated with every other file's through ``shared``."""
    from scipy.stats import norm

    own = rng.standard_normal(n)
    if shared is None:
        return norm.cdf(own)
    rho = SHARED_QUERY_CORRELATION
    return norm.cdf(np.sqrt(rho) * shared.standard_normal(n) + np.sqrt(1 - rho) * own)


def simulated_values(measure: str, mean: float, n: int, seed: int, query_set: str | None = None) -> np.ndarray:
    """``n`` per-query values of ``measure`` (fraction) with mean ``mean`` and the measure's real spread;
    files of one ``query_set`` share part of each query's draws (None: independent)."""
    import zlib

    rng = np.random.default_rng(seed)

    def uniforms(stream: int) -> np.ndarray:
        shared = None if query_set is None else np.random.default_rng(
            [zlib.crc32(f"{query_set}/{measure}".encode()), stream])
        return _uniforms(rng, shared, n)

    if measure == "RR@10":
        conditional = _RANK_WEIGHTS / _RANK_WEIGHTS.sum()
        hit = min(1.0, mean / float(conditional @ (1.0 / np.arange(1, 11))))
        ranks = 1 + np.searchsorted(np.cumsum(conditional), uniforms(0), side="right").clip(0, 9)
        values = np.where(uniforms(1) < hit, 1.0 / ranks, 0.0)
        return _nudge(values, mean, RR_SUPPORT)
    if measure.startswith("Hit@"):
        return _nudge((uniforms(0) < mean).astype(float), mean, np.array([0.0, 1.0]))
    if measure == "nDCG@10":
        from scipy.stats import beta

        concentration = 2.0
        values = beta.ppf(uniforms(0), max(mean * concentration, 1e-3), max((1 - mean) * concentration, 1e-3))
        return _nudge(values, mean, None)
    raise ValueError(f"no simulated shape for {measure}")


def _measure_of(params: Params, cell) -> str:
    if cell.table == "table2_beir":
        return "nDCG@10"
    column = {"r1_mrr@10": "mrr@10", "r2_mrr@10": "mrr@10", "r1_r@50": "r@50"}.get(cell.column, cell.column)
    spec = next(spec for spec in params.tables.in_domain_columns if spec.paper == column)
    return spec.measure


def faithful_deviation(params: Params, measure: str, split: str, rng: np.random.Generator, deterministic: bool,
                       seeds: int = 1, rounding: float = 0.0005) -> float:
    """What a faithful run of ours differs from the paper's printed figure by (fraction of the measure's range):
    the print's rounding (``rounding``, half its last digit: 0.0005 for the paper's 37.4), and for a trained
    run the training noise of both runs (the profile's prior)."""
    from qac.reporting.check import noise_prior
    from qac.tracking import metric_key

    deviation = float(rng.uniform(-rounding, rounding))
    if not deterministic:
        prior = noise_prior(params.check.training_noise, metric_key("any", split, measure))
        deviation += float(rng.normal(0.0, prior.sd * np.sqrt(1 + 1 / seeds)))
    return deviation


def _deterministic_output(output: str) -> bool:
    return "/bm25/" in output or "/reference/" in output


def write_paper_outputs(params: Params, root: Path, shift: Mapping[str, float] | None = None,
                        noise_seed: int | None = None) -> dict:
    """Write the per-query files of every produced, published cell of the paper profile under ``root``.

    ``shift`` adds points (percent) or nDCG (fraction) to a measure's mean in
    every file, e.g. ``{"RR@10": -1.0}``; ``noise_seed`` draws each file's
    faithful deviation (:func:`faithful_deviation`). Returns
    ``{(file, measure): mean}``.
    """
    from qac.reporting.cell_plan import PRODUCED, plan_cells, plan_reference_cells
    from qac.reporting.check import figure_rounding
    from qac.reporting.tables import FRACTION, PERCENT

    shift = dict(shift or {})
    targets: dict[tuple[str, str], float] = {}
    roundings: dict[tuple[str, str], float] = {}
    for cell in plan_cells(params) + plan_reference_cells(params):
        if cell.status != PRODUCED or cell.paper is None or cell.table == "table5_pair_correlation":
            continue
        measure = _measure_of(params, cell)
        scale = 1.0 if cell.table == "table2_beir" else 100.0
        target = (cell.paper + shift.get(measure, 0.0)) / scale
        key = (cell.outputs[0], measure)
        if key in targets and abs(targets[key] - target) > 1e-9:
            raise AssertionError(f"the paper prints two figures for {key}: {targets[key]} and {target}")
        targets[key] = target
        roundings[key] = figure_rounding(cell.paper, FRACTION if scale == 1.0 else PERCENT) / scale
    files: dict[str, dict] = {}
    rng = np.random.default_rng(noise_seed) if noise_seed is not None else None
    for seed, ((output, measure), target) in enumerate(sorted(targets.items())):
        split = Path(output).name.split(".")[0]
        dataset = Path(output).parent.name
        n = QUERY_COUNTS[split if split != "test" else dataset]
        if rng is not None:
            target = float(np.clip(target + faithful_deviation(params, measure, split, rng,
                                                               _deterministic_output(output),
                                                               rounding=roundings[(output, measure)]), 0.0, 1.0))
            targets[(output, measure)] = target
        values = simulated_values(measure, target, n, seed, query_set=f"{dataset}/{split}")
        files.setdefault(output, {})[measure] = {f"q{i}": float(v) for i, v in enumerate(values)}
    prefix = f"{params.data_dir}/{params.profile}/"
    for output, measures in files.items():
        path = root / output.removeprefix(prefix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measures), encoding="utf-8")
    return targets
