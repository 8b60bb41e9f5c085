"""Fine-tuning examples: (query, positive, negatives) groups from the training split only.

A training query is a query of the *train* split of the in-domain dataset with
at least one relevant document (label >= the split's threshold). Its hard
negatives come from a negatives file (BM25 or mined by retriever 1, format of
``bm25/negatives.jsonl``: ``qid``, ``positives``, ``negatives``). A query the
file has no usable negatives for gets negatives drawn uniformly from the
corpus (minus its positives), so every group has the same size; how many
queries that happened to is reported by :func:`negative_pool_stats`.
:func:`retriever1_queries` instead keeps only the queries with a pool, as the
release's retriever 1 trains only on the queries of the official triples.

Sampling is deterministic: the query order of an epoch and each group's
positive and negatives depend only on (seed, epoch, query id), never on the
process, the number of processes or Python's hash seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from qac.data.textfile import iter_jsonl
from qac.params.vocabulary import R1_QUERY_SETS


@dataclass(frozen=True)
class TrainingQuery:
    qid: str
    text: str
    positives: tuple[str, ...]
    negatives: tuple[str, ...]       # hard-negative pool in rank order; empty: corpus negatives


@dataclass(frozen=True)
class TrainingGroup:
    qid: str
    query: str
    positive: str
    negatives: tuple[str, ...]

    @property
    def passages(self) -> tuple[str, ...]:
        """Document ids in the order the loss expects: positive first."""
        return (self.positive, *self.negatives)


def read_negatives(path: str | Path) -> dict[str, list[str]]:
    """``qid -> negatives`` from a negatives file; a malformed line raises naming file, line and field."""
    negatives: dict[str, list[str]] = {}
    for line_number, record in enumerate(iter_jsonl(path), start=1):
        where = f"{path}:{line_number}"
        for field in ("qid", "negatives"):
            if field not in record:
                raise ValueError(f"{where}: missing field {field!r}")
        if not isinstance(record["negatives"], list):
            raise ValueError(f"{where}: field 'negatives' must be a list of document ids")
        qid = str(record["qid"])
        if qid in negatives:
            raise ValueError(f"{where}: query {qid!r} appears twice")
        negatives[qid] = [str(doc_id) for doc_id in record["negatives"]]
    return negatives


def merge_negatives(*sources: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Union of several negatives maps per query, keeping the first source's order first."""
    merged: dict[str, list[str]] = {}
    for source in sources:
        for qid, doc_ids in source.items():
            pool = merged.setdefault(qid, [])
            seen = set(pool)
            pool.extend(doc_id for doc_id in doc_ids if doc_id not in seen and not seen.add(doc_id))
    return merged


def retriever2_negatives(mined: Mapping[str, Sequence[str]], bm25: Mapping[str, Sequence[str]],
                         use_bm25: bool) -> dict[str, list[str]]:
    """Retriever 2's pools: the mined negatives, plus retriever 1's BM25 ones when ``use_bm25``
    (``finetune.r2_use_bm25_negatives``: the paper's "combined with the other negative passages";
    the release trains on the mined ones only)."""
    return merge_negatives(mined, bm25) if use_bm25 else {qid: list(pool) for qid, pool in mined.items()}


def training_queries(
    queries: Mapping[str, str],
    train_qrels: Mapping[str, Mapping[str, int]],
    negatives: Mapping[str, Sequence[str]],
    *,
    rel_threshold: int = 1,
    max_queries: int | None = None,
    seed: int = 0,
    corpus_ids: Iterable[str] | None = None,
) -> list[TrainingQuery]:
    """The training queries, with positives from ``train_qrels`` and negative pools.

    Only queries judged in ``train_qrels`` are kept, so no query or judgement of
    another split can reach training. A negatives entry for a query outside the
    training split is an error: it means the negatives file was built from the
    wrong queries. Positives are removed from every pool (and documents missing
    from ``corpus_ids``, when given). ``max_queries`` keeps a seeded random subset.
    """
    training_ids = set(train_qrels)
    strangers = sorted(set(negatives) - training_ids)
    if strangers:
        raise ValueError(f"negatives given for {len(strangers)} queries outside the training split "
                         f"(first: {strangers[0]!r})")
    known_docs = set(corpus_ids) if corpus_ids is not None else None
    selected: list[TrainingQuery] = []
    for qid in sorted(train_qrels):
        positives = tuple(sorted(doc for doc, label in train_qrels[qid].items() if int(label) >= rel_threshold))
        if not positives:
            continue
        if qid not in queries:
            raise ValueError(f"training query {qid!r} has judgements but no text")
        excluded = set(positives)
        pool = tuple(doc for doc in negatives.get(qid, ())
                     if doc not in excluded and (known_docs is None or doc in known_docs))
        selected.append(TrainingQuery(qid, queries[qid], positives, pool))
    if max_queries is not None and len(selected) > max_queries:
        keep = set(random.Random(f"{seed}:subset").sample(range(len(selected)), max_queries))
        selected = [query for index, query in enumerate(selected) if index in keep]
    return selected




def retriever1_queries(queries: Sequence[TrainingQuery], query_set: str) -> list[TrainingQuery]:
    """Retriever 1's training queries (``finetune.r1_queries``).

    ``judged``: every judged training query; one without a negative pool trains
    on random corpus negatives. ``triples``: only the queries with a pool, the
    release's stage-1 set. The official triples list about 400k of MS MARCO's
    ~503k judged queries (the others had no positive in the BM25 ranking the
    triples were drawn from, tevatron issue 81), so with ``r1_negatives:
    official`` these are the triples' queries; with ``bm25`` the bm25 stage
    writes negatives only for the queries whose positive its own ranking finds
    within ``bm25_depth`` (:func:`qac.retrieval.mining.negatives_records`), the
    same rule on our BM25 run.
    """
    if query_set not in R1_QUERY_SETS:
        raise ValueError(f"finetune.r1_queries: {query_set!r} is not one of {', '.join(R1_QUERY_SETS)}")
    if query_set == "judged":
        return list(queries)
    return [query for query in queries if query.negatives]


def negative_pool_stats(queries: Sequence[TrainingQuery], n_negatives: int) -> dict[str, int]:
    """How many queries have a full pool, a short one (sampled with repetition) or none (corpus negatives)."""
    full = sum(len(q.negatives) >= n_negatives for q in queries)
    empty = sum(not q.negatives for q in queries)
    return {"queries": len(queries), "full_pool": full, "short_pool": len(queries) - full - empty,
            "corpus_negatives": empty}


class GroupSampler:
    """Draws one epoch of training groups: a shuffled query order, a positive and ``n_negatives`` negatives each."""

    def __init__(self, queries: Sequence[TrainingQuery], corpus_ids: Sequence[str], n_negatives: int, seed: int):
        if not queries:
            raise ValueError("no training queries (none of the train split's queries has a relevant document)")
        if n_negatives < 0:
            raise ValueError(f"n_negatives must be >= 0, got {n_negatives}")
        self.queries = list(queries)
        self.corpus_ids = list(corpus_ids)
        self.n_negatives = n_negatives
        self.seed = seed

    def __len__(self) -> int:
        return len(self.queries)

    def epoch(self, epoch: int) -> list[TrainingGroup]:
        order = list(range(len(self.queries)))
        random.Random(f"{self.seed}:order:{epoch}").shuffle(order)
        return [self.group(self.queries[index], epoch) for index in order]

    def group(self, query: TrainingQuery, epoch: int) -> TrainingGroup:
        rng = random.Random(f"{self.seed}:group:{epoch}:{query.qid}")
        positive = rng.choice(query.positives)
        return TrainingGroup(query.qid, query.text, positive, self._negatives(query, rng))

    def _negatives(self, query: TrainingQuery, rng: random.Random) -> tuple[str, ...]:
        k = self.n_negatives
        pool = query.negatives
        if len(pool) >= k:
            return tuple(rng.sample(pool, k))
        if pool:
            # A short pool is used whole and topped up by repeating its members,
            # as Tevatron does, rather than mixing in easy random negatives.
            return tuple(rng.sample(pool, len(pool)) + rng.choices(pool, k=k - len(pool)))
        return self._corpus_negatives(query, rng)

    def _corpus_negatives(self, query: TrainingQuery, rng: random.Random) -> tuple[str, ...]:
        excluded = set(query.positives)
        if len(self.corpus_ids) - len(excluded) < self.n_negatives:
            raise ValueError(f"corpus of {len(self.corpus_ids)} documents is too small for "
                             f"{self.n_negatives} random negatives of query {query.qid!r}")
        chosen: list[str] = []
        while len(chosen) < self.n_negatives:
            doc_id = self.corpus_ids[rng.randrange(len(self.corpus_ids))]
            if doc_id not in excluded:
                excluded.add(doc_id)
                chosen.append(doc_id)
        return tuple(chosen)
