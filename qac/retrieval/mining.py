"""Hard negatives: the highest-ranked documents of a run that are not positives."""

from __future__ import annotations

import random
from typing import Iterable, Mapping

from qac.evaluation.metrics import trec_order


def positives(qrels: Mapping[str, Mapping[str, int]], rel_threshold: int = 1) -> dict[str, list[str]]:
    """``{qid: [doc id]}``: the documents judged relevant (label >= ``rel_threshold``), queries with none left out."""
    found = {qid: [doc for doc, label in judged.items() if label >= rel_threshold] for qid, judged in qrels.items()}
    return {qid: docs for qid, docs in found.items() if docs}


def mine_hard_negatives(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    depth: int,
    skip_top: int = 0,
    exclude: Mapping[str, Iterable[str]] | None = None,
    rel_threshold: int = 1,
) -> dict[str, list[str]]:
    """For each query of ``run``, the documents ranked ``skip_top + 1 .. depth``, positives removed, in rank order.

    Ranks are the run's (trec_eval order) before positives are removed, so
    ``depth`` bounds how far down the ranking negatives come from, as in
    Tevatron's and the paper's "sample negatives from the top 200".
    ``exclude`` defaults to the positives of ``qrels`` (label >= ``rel_threshold``);
    documents judged non-relevant stay eligible.
    """
    if depth < 1 or not 0 <= skip_top < depth:
        raise ValueError(f"need depth >= 1 and 0 <= skip_top < depth, got depth={depth}, skip_top={skip_top}")
    excluded = {qid: set(docs) for qid, docs in (exclude if exclude is not None
                                                  else positives(qrels, rel_threshold)).items()}
    negatives = {}
    for qid, docs in run.items():
        skip = excluded.get(qid, set())
        negatives[qid] = [doc for doc in trec_order(docs)[skip_top:depth] if doc not in skip]
    return negatives


def sample_negatives(negatives: Mapping[str, list[str]], sample: int | None, seed: int) -> dict[str, list[str]]:
    """Each query's negatives cut to ``sample`` drawn at random once, kept in rank order (None: all of them).

    The release's ``build_train_hn.py --depth 200 --n_sample 128`` keeps 128 of the top 200's non-positives;
    the draw is seeded per query, so it does not depend on which other queries were mined.
    """
    if sample is None:
        return {qid: list(docs) for qid, docs in negatives.items()}
    kept = {}
    for qid, docs in negatives.items():
        chosen = set(random.Random(f"{seed}:mine:{qid}").sample(range(len(docs)), min(sample, len(docs))))
        kept[qid] = [doc for index, doc in enumerate(docs) if index in chosen]
    return kept


def negatives_records(run, qrels, depth: int, skip_top: int = 0, rel_threshold: int = 1,
                      found_positive_only: bool = False, sample: int | None = None,
                      seed: int = 0) -> list[dict]:
    """Records of a negatives file (``qid``, ``positives``, ``negatives``) for the queries with positives.

    ``found_positive_only`` leaves out the queries with no positive in the run's
    top ``depth``, the rule the official MS MARCO training triples follow
    (``finetune.r1_queries: triples``). ``sample`` keeps that many of each query's
    negatives, drawn with ``seed`` (:func:`sample_negatives`).
    """
    relevant = positives(qrels, rel_threshold)
    if found_positive_only:
        relevant = {qid: docs for qid, docs in relevant.items()
                    if set(trec_order(run.get(qid, {}))[:depth]) & set(docs)}
    mined = sample_negatives(mine_hard_negatives({qid: run.get(qid, {}) for qid in relevant}, qrels, depth,
                                                 skip_top, exclude=relevant), sample, seed)
    return [{"qid": qid, "positives": docs, "negatives": mined[qid]} for qid, docs in relevant.items()]
