"""The paper's claims, judged: each finding of claims.yaml tested on the profile's own outputs.

The paper's findings are differences (query context beats passage context,
mixing brings no gain, the query count barely matters, the BEIR average
rises). A reproduction of both cells of a pair says nothing about their
difference, so each claim is tested directly: a paired test over the
queries both systems were scored on, with each query's value averaged over
the seeds first (:class:`qac.reporting.lineage.SeededSource`), at
:data:`qac.evaluation.significance.ALPHA`:

- ``gain``: confirmed when the first system is significantly better;
  contradicted when significantly worse (significant: at its Holm-adjusted
  p over every gain test the check makes, so that the family of claims, not
  each one, holds the error rate at ALPHA); *not testable at this size* when
  the test's MDE exceeds the paper's effect (a true effect of the paper's
  size would usually go unseen); else not confirmed.
- ``level``: confirmed when the 90% interval of Δ lies inside ±margin (two
  one-sided tests at 0.05); contradicted when it lies wholly outside; not
  testable when its half-width alone reaches the margin; else not confirmed.
- ``no_gain``: as ``level``, on the upper side only.

Table 2's average is tested with every dataset as a stratum: the statistic
is the mean of the datasets' mean differences, and the randomization test
flips signs within each dataset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

from qac.errors import UserError
from qac.evaluation.significance import ALPHA, POWER, holm_adjust
from qac.params.vocabulary import CONTEXT_TYPES, PRETRAINING_METHODS
from qac.reporting.paper import METHOD_NAMES
from qac.reporting.tables import (FRACTION, PERCENT, RETRIEVER_LABELS, TableContext, _SCALE, _zero_shot_split)

CLAIMS_FILE = Path(__file__).with_name("claims.yaml")
CONFIRMED, NOT_CONFIRMED, CONTRADICTED, NOT_TESTABLE = ("confirmed", "not confirmed", "contradicted",
                                                       "not testable at this size")
KINDS = ("gain", "level", "no_gain")
BEIR_AVERAGE = "beir_average"
EACH = "each"
_Z_INTERVAL = NormalDist().inv_cdf(1 - ALPHA)          # a 90% two-sided interval: TOST at ALPHA
_Z_MDE = NormalDist().inv_cdf(1 - ALPHA / 2) + NormalDist().inv_cdf(POWER)
_SEVERITY = (CONTRADICTED, NOT_TESTABLE, NOT_CONFIRMED, CONFIRMED)


class ClaimsFileError(ValueError, UserError):
    """A claims file that cannot be read: the message names the file, the claim and the field."""


@dataclass(frozen=True)
class System:
    method: str
    context: str
    query_count: int | str | None = None


@dataclass(frozen=True)
class Claim:
    id: str
    where: str
    text: str
    kind: str
    first: System
    second: System
    retriever: str
    column: str
    effect: float | None = None
    margin: float | None = None
    baseline: float | None = None   # the paper's figure of the second system: the level its effect is relative to


def _system(raw: Any, where: str, fail) -> System:
    if not isinstance(raw, dict) or set(raw) - {"method", "context", "query_count"} or "method" not in raw:
        raise fail(f"{where}: a system is {{method, context, query_count}}, got {raw!r}")
    if raw["method"] not in PRETRAINING_METHODS:
        raise fail(f"{where}.method: {raw['method']!r} is not a pre-training method ({', '.join(PRETRAINING_METHODS)})")
    if raw.get("context") not in CONTEXT_TYPES:
        raise fail(f"{where}.context: {raw.get('context')!r} is not a context type ({', '.join(CONTEXT_TYPES)})")
    count = raw.get("query_count")
    if count is not None and count != EACH and not (isinstance(count, int) and not isinstance(count, bool)
                                                    and count > 0):
        raise fail(f"{where}.query_count: a positive whole number, null or '{EACH}', got {count!r}")
    return System(raw["method"], raw["context"], count)


def load_claims(path: str | Path = CLAIMS_FILE) -> list[Claim]:
    """The claims of ``path``, every field checked (one paragraph naming the claim and field when one is bad)."""
    import yaml

    path = Path(path)

    def fail(message: str) -> ClaimsFileError:
        return ClaimsFileError(f"{path}: {message}")

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise fail(f"cannot be read as YAML ({type(error).__name__}: {error})".split("\n")[0]) from None
    if not isinstance(document, dict) or not isinstance(document.get("claims"), list):
        raise fail("expected a mapping with a 'claims' list")
    claims, seen = [], set()
    for index, raw in enumerate(document["claims"]):
        where = f"claims[{index}]"
        if not isinstance(raw, dict):
            raise fail(f"{where}: not a mapping")
        allowed = {"id", "where", "claim", "kind", "first", "second", "retriever", "column", "effect", "margin",
                   "baseline"}
        unknown = set(raw) - allowed
        missing = {"id", "where", "claim", "kind", "first", "second", "retriever", "column", "baseline"} - set(raw)
        if unknown or missing:
            raise fail(f"{where}: {'unknown fields ' + str(sorted(unknown)) if unknown else ''}"
                       f"{'; ' if unknown and missing else ''}{'missing fields ' + str(sorted(missing)) if missing else ''}")
        if raw["kind"] not in KINDS:
            raise fail(f"{where}.kind: {raw['kind']!r} is not one of {', '.join(KINDS)}")
        number = "effect" if raw["kind"] == "gain" else "margin"
        value = raw.get(number)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise fail(f"{where}.{number}: a {raw['kind']} claim needs a positive finite {number}, got {value!r}")
        baseline = raw["baseline"]
        if isinstance(baseline, bool) or not isinstance(baseline, (int, float)) or not baseline > 0:
            raise fail(f"{where}.baseline: the paper's figure of the second system, a positive number, got "
                       f"{baseline!r}")
        if raw["id"] in seen:
            raise fail(f"{where}.id: {raw['id']!r} is listed twice")
        seen.add(raw["id"])
        claims.append(Claim(str(raw["id"]), str(raw["where"]), str(raw["claim"]), raw["kind"],
                            _system(raw["first"], f"{where}.first", fail), _system(raw["second"], f"{where}.second",
                                                                                   fail),
                            str(raw["retriever"]), str(raw["column"]),
                            float(raw["effect"]) if raw.get("effect") is not None else None,
                            float(raw["margin"]) if raw.get("margin") is not None else None, float(baseline)))
    return claims


@dataclass(frozen=True)
class Comparison:
    """One paired comparison, in the table unit: Δ, its standard error, the p-value, the MDE."""

    label: str
    delta: float
    std_error: float
    p_value: float
    n_queries: int
    p_holm: float | None = None      # adjusted over the family of gain tests (judge_claims); None: not adjusted

    @property
    def p_decision(self) -> float:
        return self.p_value if self.p_holm is None else self.p_holm

    @property
    def mde(self) -> float:
        return _Z_MDE * self.std_error


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    verdict: str
    comparisons: list[tuple[Comparison, str]] = field(default_factory=list)
    measure: str = ""
    reason: str | None = None
    level: float = 1.0      # our second system's figure over the paper's: the scale the effect is carried at

    def line(self) -> str:
        unit_digits = ".4f" if self.claim.column == BEIR_AVERAGE else ".2f"
        size = self.claim.effect if self.claim.kind == "gain" else self.claim.margin
        sign = {"gain": "+", "level": "±", "no_gain": "+"}[self.claim.kind]
        name = "paper" if self.claim.kind == "gain" else "margin"
        expected = f"{name} {sign}{size:g}"
        if abs(self.level - 1.0) > 1e-9:
            expected += (f", {sign}{size * self.level:{unit_digits}} at this profile's level "
                         f"({self.level:.3g} x the paper's {self.claim.baseline:g})")
        if self.reason:
            detail = self.reason
        else:
            several = len(self.comparisons) > 1
            detail = "; ".join(f"{c.label}Δ {c.delta:+{unit_digits}} (p={c.p_value:.2g}"
                               f"{'' if c.p_holm is None else f', p_holm={c.p_holm:.2g}'}, MDE {c.mde:{unit_digits}}, "
                               f"{c.n_queries} queries){': ' + verdict if several else ''}"
                               for c, verdict in self.comparisons)
            detail = f"{detail} ({expected}) on {self.measure}"
        return f"CLAIM {self.claim.id}: {self.verdict.upper()}: {detail}. Claim: {self.claim.text} [{self.claim.where}]"


def _decide(claim: Claim, comparison: Comparison, level: float = 1.0) -> str:
    """The verdict of one comparison; the paper's effect and margin are carried to our level (``level`` = our
    second system's figure / the paper's): a stand-in measure at another level moves in proportion."""
    delta, half, p = comparison.delta, _Z_INTERVAL * comparison.std_error, comparison.p_decision
    if claim.kind == "gain":
        if p < ALPHA and comparison.std_error > 0:
            return CONFIRMED if delta > 0 else CONTRADICTED
        if comparison.std_error == 0:
            return NOT_CONFIRMED        # the two systems score every query alike: no gain at all
        return NOT_TESTABLE if comparison.mde > claim.effect * level else NOT_CONFIRMED
    margin = claim.margin * level
    if claim.kind == "level":
        if abs(delta) + half < margin:
            return CONFIRMED
        if abs(delta) - half > margin:
            return CONTRADICTED
        return NOT_TESTABLE if half >= margin else NOT_CONFIRMED
    if delta + half < margin:
        return CONFIRMED
    if delta - half > margin:
        return CONTRADICTED
    return NOT_TESTABLE if half >= margin else NOT_CONFIRMED


def stratified_randomization_test(strata: Sequence[np.ndarray], trials: int, seed: int, chunk: int = 500) -> float:
    """Two-sided p of the paired randomization test of the mean over strata of each stratum's mean difference;
    signs flip query by query within each stratum. ``(1 + #as extreme) / (1 + trials)``."""
    weights = [1.0 / (len(d) * len(strata)) for d in strata]
    observed = abs(sum(w * float(d.sum()) for w, d in zip(weights, strata)))
    scale = max(1.0, max(float(np.abs(d).max()) for d in strata))
    tolerance = 1e-12 * scale
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, trials, chunk):
        n = min(chunk, trials - start)
        totals = np.zeros(n)
        for w, d in zip(weights, strata):
            signs = rng.integers(0, 2, size=(n, len(d)), dtype=np.int8) * 2 - 1
            totals += w * (signs @ d)
        extreme += int(np.count_nonzero(np.abs(totals) >= observed - tolerance))
    return (1 + extreme) / (1 + trials)


def _paired(first: dict, second: dict) -> np.ndarray | None:
    shared = sorted(set(first) & set(second))
    if len(shared) < 2:
        return None
    return np.array([first[q] - second[q] for q in shared], dtype=np.float64)


def _compare(label: str, strata: list[np.ndarray], scale: float, ctx: TableContext) -> Comparison:
    means = [float(d.mean()) for d in strata]
    variances = [float(d.var(ddof=1)) / len(d) for d in strata]
    delta = sum(means) / len(strata)
    std_error = math.sqrt(sum(variances)) / len(strata)
    # float noise of per-query values averaged in another order is no spread
    if std_error <= 1e-12 * max(1.0, max(float(np.abs(d).max()) for d in strata)):
        std_error = 0.0
    p_value = 1.0 if std_error == 0.0 and abs(delta) < 1e-12 else stratified_randomization_test(
        strata, ctx.permutations, ctx.seed)
    return Comparison(label, delta * scale, std_error * scale, p_value, sum(len(d) for d in strata))


def _variants(ctx: TableContext, system: System, main: int | None) -> list[tuple[str, Any]]:
    """``(label, variant)`` of a system: one, or with ``query_count: each`` every C but ``main``."""
    candidates = [v for v in ctx.study.variants() if v.method == system.method and v.context_type == system.context]
    if system.query_count == EACH:
        return [(f"C={v.query_count} vs C={main}: ", v) for v in sorted(candidates, key=lambda v: v.query_count or 0)
                if v.query_count != main]
    if system.query_count is not None:
        return [("", v) for v in candidates if v.query_count == system.query_count]
    variant = ctx.variant(system.method, system.context)
    return [("", variant)] if variant is not None else []


def _describe(system: System) -> str:
    return f"{METHOD_NAMES.get(system.method, system.method)} {system.context}-context"


def judge_claim(claim: Claim, ctx: TableContext) -> ClaimResult:
    second = _variants(ctx, claim.second, None)
    if not second:
        return ClaimResult(claim, NOT_TESTABLE, reason=f"this profile has no {_describe(claim.second)} variant"
                           + (f" with C = {ctx.main_query_count}" if claim.second.context != "passage"
                              and ctx.main_query_count else ""))
    second_variant = second[0][1]
    firsts = _variants(ctx, claim.first, second_variant.query_count)
    if not firsts:
        what = ("second query count C" if claim.first.query_count == EACH
                else f"{_describe(claim.first)} variant")
        return ClaimResult(claim, NOT_TESTABLE, reason=f"this profile has no {what}")
    if claim.column == BEIR_AVERAGE:
        retriever, scale = ctx.zero_shot_retriever, _SCALE[FRACTION]
        datasets = ctx.zero_shot_datasets
        if not datasets:
            return ClaimResult(claim, NOT_TESTABLE, reason="this profile has no zero-shot datasets")
        measure = (f"the nDCG@10 average over {len(datasets)} zero-shot dataset{'s' if len(datasets) > 1 else ''} "
                   f"({RETRIEVER_LABELS.get(retriever, retriever)})")
    else:
        column = ctx.column(claim.column)
        if column is None or column.missing:
            return ClaimResult(claim, NOT_TESTABLE, reason=f"this profile has no column for the paper's "
                               f"{claim.column}" + (f" ({column.missing})" if column is not None else ""))
        retriever, scale = claim.retriever, _SCALE[PERCENT]
        measure = f"{column.header} ({RETRIEVER_LABELS.get(retriever, retriever)})"
    second_source = ctx.study.finetuned(second_variant.name, retriever)
    level = _level(claim, second_source, datasets if claim.column == BEIR_AVERAGE else None,
                   None if claim.column == BEIR_AVERAGE else column)
    results = []
    for label, variant in firsts:
        first_source = ctx.study.finetuned(variant.name, retriever)
        if first_source is None or second_source is None:
            return ClaimResult(claim, NOT_TESTABLE, reason=f"no evaluation output of {variant.name if first_source is None else second_variant.name} "
                               f"({RETRIEVER_LABELS.get(retriever, retriever)}) in this profile's outputs")
        if claim.column == BEIR_AVERAGE:
            pairs = [(first_source.per_query(d, _zero_shot_split(first_source, d), "nDCG@10"),
                      second_source.per_query(d, _zero_shot_split(second_source, d), "nDCG@10")) for d in datasets]
        else:
            pairs = [(first_source.per_query(column.dataset, column.split, column.measure),
                      second_source.per_query(column.dataset, column.split, column.measure))]
        strata = [_paired(a, b) for a, b in pairs if a and b]
        if len(strata) < len(pairs) or any(d is None for d in strata):
            return ClaimResult(claim, NOT_TESTABLE, reason="per-query values missing for one of the two systems")
        comparison = _compare(label, strata, scale, ctx)
        results.append((comparison, _decide(claim, comparison, level)))
    verdict = next(v for v in _SEVERITY if any(r == v for _, r in results))
    return ClaimResult(claim, verdict, results, measure, level=level)


def _level(claim: Claim, source, datasets, column) -> float:
    """Our second system's figure over the paper's (1.0 where ours is missing)."""
    if source is None:
        return 1.0
    if datasets is not None:
        values = [source.metric(d, _zero_shot_split(source, d), "nDCG@10") for d in datasets]
        ours = None if any(v is None for v in values) else sum(values) / len(values) * _SCALE[FRACTION]
    else:
        value = source.metric(column.dataset, column.split, column.measure)
        ours = None if value is None else value * _SCALE[PERCENT]
    return 1.0 if not ours else ours / claim.baseline


def judge_claims(ctx: TableContext, claims: Sequence[Claim] | None = None) -> list[ClaimResult]:
    """Every claim judged; a gain is confirmed or contradicted only at its Holm-adjusted p over all the gain
    tests made (ten claims tested at 0.05 each would call one of them by chance in two runs of five)."""
    results = [judge_claim(claim, ctx) for claim in (load_claims() if claims is None else claims)]
    tests = [(i, j) for i, result in enumerate(results) if result.claim.kind == "gain"
             for j, _ in enumerate(result.comparisons)]
    adjusted = holm_adjust([results[i].comparisons[j][0].p_value for i, j in tests])
    for (i, j), p_holm in zip(tests, adjusted):
        comparisons = list(results[i].comparisons)
        comparison = replace(comparisons[j][0], p_holm=p_holm)
        comparisons[j] = (comparison, _decide(results[i].claim, comparison, results[i].level))
        verdict = next(v for v in _SEVERITY if any(r == v for _, r in comparisons))
        results[i] = replace(results[i], comparisons=comparisons, verdict=verdict)
    return results


def claims_summary(results: Sequence[ClaimResult]) -> str:
    counts = {verdict: sum(r.verdict == verdict for r in results) for verdict in reversed(_SEVERITY)}
    return "claims: " + ", ".join(f"{count} {verdict}" for verdict, count in counts.items()) + \
        f" of {len(results)} (qac/reporting/claims.yaml)"
