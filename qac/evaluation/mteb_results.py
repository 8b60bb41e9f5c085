"""Evaluation results as MTEB writes them: ``{model}/{revision}/{Task}.json`` and ``model_meta.json``.

A Table 2 figure then sits beside the MTEB leaderboard's own files and loads
with ``mteb.TaskResult.from_disk``. The fields follow MTEB 2's ``TaskResult``:
``task_name`` (MTEB's name for the BEIR set: ``SciFact``, ``NFCorpus``,
``FiQA2018``, ...), ``dataset_revision``, ``mteb_version``, ``scores`` (per
split, one entry per subset with ``main_score``, ``hf_subset``, ``languages``
and every measure under MTEB's name: ``ndcg_at_10``, ``mrr_at_10``,
``recall_at_100``, ...), ``evaluation_time`` (seconds) and
``kg_co2_emissions``. qac's figures come from its own prepared copy of each
set, so ``dataset_revision`` is that copy's content hash (MD5, as DVC hashes
it), not a Hugging Face revision: a profile that cuts a corpus (the smoke
profile) gives figures of the cut corpus, which its hash tells apart.
"""

from __future__ import annotations

import re

from qac.evaluation.metrics import Measure

# BEIR names (qac's dataset names) -> MTEB task names.
MTEB_TASKS = {
    "arguana": "ArguAna", "climate-fever": "ClimateFEVER", "cqadupstack": "CQADupstackRetrieval",
    "dbpedia-entity": "DBPedia", "fever": "FEVER", "fiqa": "FiQA2018", "hotpotqa": "HotpotQA",
    "msmarco": "MSMARCO", "nfcorpus": "NFCorpus", "nq": "NQ", "quora": "QuoraRetrieval", "scidocs": "SCIDOCS",
    "scifact": "SciFact", "trec-covid": "TRECCOVID", "webis-touche2020": "Touche2020", "touche2020": "Touche2020",
}
_FAMILIES = {"nDCG": "ndcg", "RR": "mrr", "R": "recall", "P": "precision", "AP": "map", "Hit": "hit_rate"}
# MTEB's main score of a retrieval task
MAIN_MEASURE = "nDCG@10"


def mteb_task_name(dataset: str) -> str:
    """MTEB's name for a qac dataset; a set MTEB does not know keeps a CamelCase form of its own name."""
    return MTEB_TASKS.get(dataset.lower()) or "".join(part.capitalize() for part in re.split(r"[-_ ]+", dataset))


def mteb_measure(name: str) -> str:
    """``nDCG@10`` -> ``ndcg_at_10``, ``AP`` -> ``map``: the key MTEB gives a measure."""
    measure = Measure.parse(name)
    family = _FAMILIES[measure.family]
    return family if measure.cutoff is None else f"{family}_at_{measure.cutoff}"


def task_result(dataset: str, dataset_revision: str, aggregates: dict[str, dict[str, float]],
                evaluation_time: float | None, mteb_version: str, languages: list[str]) -> dict:
    """One ``{Task}.json``: ``aggregates`` is ``{split: {measure: mean}}``; the main score is nDCG@10
    where it was measured, else the split's first measure."""
    scores = {}
    for split, values in aggregates.items():
        main = MAIN_MEASURE if MAIN_MEASURE in values else next(iter(values))
        scores[split] = [{"hf_subset": "default", "languages": languages, "main_score": values[main],
                          **{mteb_measure(name): value for name, value in values.items()}}]
    return {"dataset_revision": dataset_revision, "task_name": mteb_task_name(dataset), "mteb_version": mteb_version,
            "scores": scores, "evaluation_time": evaluation_time, "kg_co2_emissions": None}


def model_folder(name: str) -> str:
    """The folder MTEB keeps an ``organization/model`` name's results in (``organization__model``)."""
    return name.replace("/", "__")


def model_meta(name: str, revision: str, *, n_parameters: int, max_tokens: int, embed_dim: int,
               similarity: str, training_datasets: list[str], languages: list[str]) -> dict:
    """The ``model_meta.json`` MTEB writes beside a model's results (the fields of ``mteb.models.ModelMeta``):
    ``name`` is ``organization/model``, ``training_datasets`` the MTEB task names trained on."""
    if name.count("/") != 1:
        raise ValueError(f"model name {name!r}: MTEB names a model 'organization/model'")
    return {"loader": None, "name": name, "revision": revision, "release_date": None, "languages": languages,
            "n_parameters": n_parameters, "memory_usage_mb": round(n_parameters * 4 / 2**20, 2),
            "max_tokens": max_tokens, "embed_dim": embed_dim, "license": None, "open_weights": True,
            "public_training_code": None, "public_training_data": None,
            "framework": ["Sentence Transformers", "PyTorch"], "reference": None,
            "similarity_fn_name": similarity, "use_instructions": False,
            "training_datasets": sorted(training_datasets),
            "adapted_from": None, "superseded_by": None, "modalities": ["text"]}
