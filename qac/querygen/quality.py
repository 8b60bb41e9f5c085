"""How good are generated queries? Measured on held-out pairs and held-out documents.

- ROUGE-L (F-measure, Porter stemming; the ``rouge-score`` package) of each
  generated candidate against the held-out reference (a real query or a
  title), averaged over candidates; the same for the greedy query (the
  model's most likely one, so sampling noise apart) and, as a frame, for the
  source's first sentence (its title where the source starts with one).
- Self-retrieval: the share of candidates whose own document BM25 (``bm25s``,
  English stop words) ranks within the top ``depth`` (10 by default) with a
  positive score, and the share ranked first strictly (a tie for first place
  counts as a miss). The same rates for a random sentence of the source and
  for the reference text frame the figure: a sentence copied from the passage
  is an easy query for BM25, a real query a harder one.
- Empty and duplicate candidates: shares of all candidates (a duplicate repeats
  an earlier candidate of the same passage), as :func:`clean_candidates`
  counts them.
- Table 5 on held-out documents (:func:`judge_anchors`, :func:`judge_shares`):
  the paper's protocol, as the annotation stage follows it on the pre-training
  corpus. Each document is cut into passages as the split stage cuts the
  corpus; an anchor is a random passage, its passage context another random
  passage of the same document, and its queries are generated from the
  anchor. The share of each kind of pair the automatic judge of
  :mod:`qac.evaluation.annotation` calls highly correlated is compared on the
  same anchors, paired by document (randomization test, with the smallest
  difference the anchors could detect). On short single-topic documents the
  passage share sits near 1, where one query decides the comparison, so every
  candidate of the anchor is judged too and the judge's mean cosine of each
  kind is reported beside the shares.
"""

from __future__ import annotations

import math
import random
from itertools import accumulate
from dataclasses import dataclass
from typing import Mapping, Sequence

from qac.querygen.generator_pairs import Pair, sentences
from qac.evaluation.annotation import PASSAGE_PASSAGE, PASSAGE_QUERY, draw_passage_pair



def rouge_l_scores(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F-measure of each prediction against its reference."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references)]


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Mean ROUGE-L F-measure."""
    scores = rouge_l_scores(predictions, references)
    return sum(scores) / len(scores) if scores else 0.0


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of ``values`` (sample standard deviation / sqrt(n)); 0 below two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def random_sentence(text: str, rng: random.Random) -> str:
    """One sentence of ``text``, drawn with ``rng``."""
    found = sentences(text)
    return rng.choice(found) if found else ""


class SelfRetrieval:
    """A BM25 index over documents that answers: where does this query rank its own document?"""

    def __init__(self, doc_ids: Sequence[str], texts: Sequence[str]):
        import bm25s

        if len(doc_ids) < 2:
            raise ValueError("self-retrieval needs at least two documents")
        self._bm25s = bm25s
        self.doc_ids = list(doc_ids)
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)

    def hit_rates(self, queries: Sequence[str], doc_ids: Sequence[str], depth: int = 10) -> tuple[float, float]:
        """Shares of ``queries`` whose document ``doc_ids[i]`` is (strictly first, within the top ``depth``).

        A document counts only with a positive score: a query of stop words
        ranks documents arbitrarily and finds nothing.
        """
        if not queries:
            return 0.0, 0.0
        depth = max(2, min(int(depth), len(self.doc_ids)))
        tokens = self._bm25s.tokenize([q if q.strip() else "" for q in queries], stopwords="en", show_progress=False)
        results, scores = self.retriever.retrieve(tokens, k=depth, show_progress=False)
        first = within = 0
        for i, expected in enumerate(doc_ids):
            ranked = [self.doc_ids[int(d)] for d in results[i]]
            if expected in ranked and float(scores[i][ranked.index(expected)]) > 0:
                within += 1
                first += ranked[0] == expected and float(scores[i][0]) > float(scores[i][1])
        return first / len(queries), within / len(queries)

    def first_rate(self, queries: Sequence[str], doc_ids: Sequence[str]) -> float:
        """Share of ``queries`` whose document ``doc_ids[i]`` is strictly first."""
        return self.hit_rates(queries, doc_ids, 2)[0]


def candidate_shares(candidates: Sequence[Sequence[str]]) -> dict[str, float]:
    """Shares of empty and of duplicate candidates among all candidates (see :func:`clean_candidates`)."""
    # here, not at the top: it loads torch
    from qac.querygen.generate import clean_candidates

    total = empty = duplicates = 0
    for texts in candidates:
        _, stats = clean_candidates(texts, drop_duplicates=True, drop_empty=True)
        total, empty, duplicates = total + stats.candidates, empty + stats.empty, duplicates + stats.duplicates
    return {"candidates": total, "empty_share": empty / total if total else 0.0,
            "duplicate_share": duplicates / total if total else 0.0}


def evaluate_queries(heldout: Sequence[Pair], candidates: Sequence[Sequence[str]], index: SelfRetrieval, seed: int,
                     depth: int = 10, greedy: Sequence[str] | None = None) -> dict[str, float]:
    """Quality of ``candidates[i]`` (C generated queries) for ``heldout[i]``, overall and per pair kind.

    Keys (prefixed ``<kind>/`` per kind): ``rougeL`` and ``rougeL_se`` (the
    standard error over pairs of each pair's mean), ``rougeL_greedy`` (with
    ``greedy``, one greedy query per pair), ``rougeL_first_sentence``,
    ``self_retrieval/<query>/top1`` and
    ``/top<depth>`` for the generated candidates, a random sentence and the
    reference, ``empty_share``, ``duplicate_share`` and counts.
    """
    rng = random.Random(seed)
    baseline = [random_sentence(pair.source, rng) for pair in heldout]
    metrics: dict[str, float] = {}
    groups = {"all": list(range(len(heldout)))}
    for kind in sorted({pair.kind for pair in heldout}):
        groups[kind] = [i for i, pair in enumerate(heldout) if pair.kind == kind]
    for name, members in groups.items():
        prefix = "" if name == "all" else f"{name}/"
        flat = [(i, text) for i in members for text in candidates[i]]
        keys = {i: f"{heldout[i].dataset}/{heldout[i].doc_id}" for i in members}
        metrics[f"{prefix}heldout_pairs"] = len(members)
        scores = rouge_l_scores([text for _, text in flat], [heldout[i].target for i, _ in flat])
        metrics[f"{prefix}rougeL"] = sum(scores) / len(scores) if scores else 0.0
        # The pairs, not the candidates, are the sample: the standard error of the per-pair means.
        per_pair = {}
        for (i, _), score in zip(flat, scores):
            per_pair.setdefault(i, []).append(score)
        metrics[f"{prefix}rougeL_se"] = standard_error([sum(v) / len(v) for v in per_pair.values()])
        if greedy is not None:
            metrics[f"{prefix}rougeL_greedy"] = rouge_l([greedy[i] for i in members],
                                                        [heldout[i].target for i in members])
        metrics[f"{prefix}rougeL_first_sentence"] = rouge_l([(sentences(heldout[i].source) or [""])[0] for i in members],
                                                            [heldout[i].target for i in members])
        rated = {"generated": ([text for _, text in flat], [keys[i] for i, _ in flat]),
                 "random_sentence": ([baseline[i] for i in members], [keys[i] for i in members]),
                 "reference": ([heldout[i].target for i in members], [keys[i] for i in members])}
        for label, (queries, expected) in rated.items():
            first, within = index.hit_rates(queries, expected, depth)
            metrics[f"{prefix}self_retrieval/{label}/top1"] = first
            metrics[f"{prefix}self_retrieval/{label}/top{depth}"] = within
        shares = candidate_shares([candidates[i] for i in members])
        metrics[f"{prefix}candidates"] = shares["candidates"]
        metrics[f"{prefix}empty_share"] = shares["empty_share"]
        metrics[f"{prefix}duplicate_share"] = shares["duplicate_share"]
    return metrics


@dataclass(frozen=True)
class JudgeAnchor:
    """A held-out document cut in two: the anchor passage and its passage context."""

    key: str
    anchor: str
    passage: str


def judge_anchors(documents: Mapping[str, Sequence[dict]], maximum: int, seed: int) -> list[JudgeAnchor]:
    """Table 5's passage pairs of up to ``maximum`` documents, drawn as the annotation stage draws them.

    ``documents`` maps a document key to its passages in order (records with
    ``pid`` and ``text``, as the split stage writes them); documents with at
    least two passages qualify. ``random.Random(seed)`` draws the documents
    from the sorted keys, then each document's anchor and other passage
    (:func:`qac.evaluation.annotation.draw_passage_pair`).
    """
    rng = random.Random(seed)
    eligible = [key for key in sorted(documents) if len(documents[key]) >= 2]
    anchors = []
    for key in sorted(rng.sample(eligible, min(maximum, len(eligible)))):
        anchor, other = draw_passage_pair(documents[key], rng)
        anchors.append(JudgeAnchor(key, anchor["text"], other["text"]))
    return anchors


def judge_shares(judge, threshold: float, anchors: Sequence[JudgeAnchor], candidates: Sequence[Sequence[str]],
                 permutations: int = 10_000, seed: int = 0) -> dict[str, float]:
    """High-correlation shares and mean scores of (anchor, query) and (anchor, passage) pairs, by ``judge``.

    ``candidates[i]`` are the queries generated from ``anchors[i].anchor`` in
    their order; the first is Table 5's query. An empty query, or an anchor
    without any, is a low pair scored 0. ``judge/difference`` (query share
    minus passage share) is tested paired by anchor as Table 5 tests it
    (:func:`qac.evaluation.significance.compare_paired`, ``permutations`` sign flips
    seeded with ``seed``): its p-value and the smallest difference the anchors
    could detect at p < 0.05.
    """
    # here, not at the top: it loads numpy
    from qac.evaluation.significance import compare_paired

    if not anchors:
        return {}
    if len(candidates) != len(anchors):
        raise ValueError(f"{len(candidates)} candidate lists for {len(anchors)} anchors")
    per_anchor = [list(queries) or [""] for queries in candidates]
    pairs = [(a.anchor, query) for a, queries in zip(anchors, per_anchor) for query in queries]
    query_scores = [score if query.strip() else 0.0 for (_, query), score in zip(pairs, judge.scores(pairs))]
    query_high = [score >= threshold and query.strip() != "" for (_, query), score in zip(pairs, query_scores)]
    firsts = [0, *accumulate(len(queries) for queries in per_anchor)][:-1]
    passage_scores = judge.scores([(a.anchor, a.passage) for a in anchors])
    query_first = {a.key: float(query_high[i]) for a, i in zip(anchors, firsts)}
    passage_high = {a.key: float(score >= threshold) for a, score in zip(anchors, passage_scores)}
    shares = {f"judge/high_share/{PASSAGE_QUERY}": sum(query_first.values()) / len(anchors),
              f"judge/high_share/{PASSAGE_PASSAGE}": sum(passage_high.values()) / len(anchors)}
    comparison = compare_paired(query_first, passage_high, permutations, seed)
    tested = {key: value for key, value in (("judge/difference/p_value", comparison.p_value),
                                            ("judge/difference/mde", comparison.mde)) if value is not None}
    return {"judge/anchors": len(anchors), "judge/threshold": threshold, **shares,
            "judge/difference": shares[f"judge/high_share/{PASSAGE_QUERY}"] - shares[f"judge/high_share/{PASSAGE_PASSAGE}"],
            **tested,
            f"judge/high_share/{PASSAGE_QUERY}/all_candidates": sum(query_high) / len(query_high),
            f"judge/mean_score/{PASSAGE_QUERY}/all_candidates": sum(query_scores) / len(query_scores),
            f"judge/mean_score/{PASSAGE_PASSAGE}": sum(passage_scores) / len(passage_scores)}
