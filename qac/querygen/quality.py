"""How good are generated queries? ROUGE-L and self-retrieval on held-out pairs.

- ROUGE-L (F-measure, Porter stemming; the ``rouge-score`` package) of a
  generated query against the held-out reference (a real query or a title).
- Self-retrieval rate: the share of held-out sources whose document BM25
  (``bm25s``, English stop words) ranks first, strictly (a tie for first place
  counts as a miss), for the generated query. The same rate for a random
  sentence of the source is the floor a useful query must beat; the rate for the
  reference text is a ceiling of sorts.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from qac.querygen.pairs import Pair

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Mean ROUGE-L F-measure."""
    from rouge_score import rouge_scorer

    if not predictions:
        return 0.0
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return sum(scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references)) / len(predictions)


def random_sentence(text: str, rng: random.Random) -> str:
    """One sentence of ``text`` (split after ``.``, ``!`` or ``?``), drawn with ``rng``."""
    sentences = [s for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    return rng.choice(sentences) if sentences else ""


class SelfRetrieval:
    """A BM25 index over documents that answers: is this document ranked first for that query?"""

    def __init__(self, doc_ids: Sequence[str], texts: Sequence[str]):
        import bm25s

        if len(doc_ids) < 2:
            raise ValueError("self-retrieval needs at least two documents")
        self._bm25s = bm25s
        self.doc_ids = list(doc_ids)
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)

    def first_rate(self, queries: Sequence[str], doc_ids: Sequence[str]) -> float:
        """Share of ``queries`` whose document ``doc_ids[i]`` is strictly first."""
        if not queries:
            return 0.0
        tokens = self._bm25s.tokenize([q if q.strip() else "" for q in queries], stopwords="en", show_progress=False)
        results, scores = self.retriever.retrieve(tokens, k=2, show_progress=False)
        hits = 0
        for i, expected in enumerate(doc_ids):
            top, best, second = int(results[i][0]), float(scores[i][0]), float(scores[i][1])
            hits += self.doc_ids[top] == expected and best > 0 and best > second
        return hits / len(queries)


def evaluate_queries(heldout: Sequence[Pair], generated: Sequence[str], index: SelfRetrieval, seed: int) -> dict[str, float]:
    """ROUGE-L and self-retrieval of ``generated[i]`` for ``heldout[i]``, overall and per pair kind."""
    rng = random.Random(seed)
    baseline = [random_sentence(pair.source, rng) for pair in heldout]
    metrics: dict[str, float] = {}
    groups = {"all": list(range(len(heldout)))}
    for kind in sorted({pair.kind for pair in heldout}):
        groups[kind] = [i for i, pair in enumerate(heldout) if pair.kind == kind]
    for name, members in groups.items():
        keys = [f"{heldout[i].dataset}/{heldout[i].doc_id}" for i in members]
        prefix = "" if name == "all" else f"{name}/"
        metrics[f"{prefix}heldout_pairs"] = len(members)
        metrics[f"{prefix}rougeL"] = rouge_l([generated[i] for i in members], [heldout[i].target for i in members])
        metrics[f"{prefix}self_retrieval/generated"] = index.first_rate([generated[i] for i in members], keys)
        metrics[f"{prefix}self_retrieval/random_sentence"] = index.first_rate([baseline[i] for i in members], keys)
        metrics[f"{prefix}self_retrieval/reference"] = index.first_rate([heldout[i].target for i in members], keys)
        metrics[f"{prefix}empty_generated"] = sum(not generated[i].strip() for i in members)
    return metrics
