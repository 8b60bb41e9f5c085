"""The model card of an exported retriever: its ``README.md``, as a sentence-transformers model carries one.

The card is written from the facts of the run that made the folder (:class:`CardFacts`,
gathered by :mod:`qac.reporting.export`): the base model and its revision, the
pre-training variant, the data and their hashes, the loss, every fine-tuning
parameter, the metrics, the training's time and host as MLflow recorded them,
the library versions, and the command that rebuilds it. The YAML front matter
is the Hugging Face hub's (``library_name``, ``base_model``, ``datasets``,
``tags``), so a hub or a model index reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml


@dataclass
class CardFacts:
    name: str
    base_model: str
    base_revision: str
    variant: dict[str, Any]
    finetune: dict[str, Any]
    encoding: dict[str, Any]
    datasets: dict[str, str]                       # dataset -> MD5 of its prepared folder
    metrics: dict[str, dict[str, float]]           # "<dataset>/<split>" -> {measure: mean}
    lineage: dict[str, Any]                        # run id, commit, dirty, profile, stage, command
    training: dict[str, Any] = field(default_factory=dict)   # what the MLflow run recorded (may be empty)
    versions: dict[str, str] = field(default_factory=dict)


def _front_matter(facts: CardFacts) -> str:
    meta = {"library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
            "tags": ["sentence-transformers", "dense-retrieval", "qac"], "base_model": facts.base_model,
            "datasets": sorted(facts.datasets)}
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _table(rows: list[tuple[str, Any]]) -> list[str]:
    return ["| key | value |", "|---|---|", *(f"| {key} | {value} |" for key, value in rows), ""]


def model_card(facts: CardFacts) -> str:
    """The card's Markdown (front matter, then one section per kind of fact)."""
    enc = facts.encoding
    lines = [_front_matter(facts), f"# {facts.name}", "",
             f"A dense passage retriever fine-tuned by qac (query-as-context pre-training, EMNLP 2023) from "
             f"`{facts.base_model}`. Queries are cut at {enc['query_max_len']} tokens and documents at "
             f"{enc['passage_max_len']}; `encode_query` and `encode_document` apply each length, "
             f"{enc['pooling']} pooling, scores by {'cosine' if enc['normalize'] else 'dot product'}. "
             f"A document is `title{enc['title_separator']!r}text` as trained (BEIR's zero-shot sets: title and "
             "text joined by a space).", "",
             "```python", "from sentence_transformers import SentenceTransformer", "",
             'model = SentenceTransformer("path/to/this/folder")',
             'queries = model.encode_query(["what is query-as-context pre-training"])',
             'documents = model.encode_document(["Query-as-context pre-training pairs a passage with ..."])',
             "scores = model.similarity(queries, documents)", "```", "",
             "## Base model and pre-training", "",
             *_table([("base model", f"`{facts.base_model}`"), ("base revision (MD5 of the checkpoint)",
                                                                 f"`{facts.base_revision}`"),
                      *((key, value) for key, value in facts.variant.items())]),
             "## Data", "", *_table([(name, f"MD5 `{md5}`") for name, md5 in facts.datasets.items()]),
             "## Loss and fine-tuning parameters", "",
             f"InfoNCE over the positive, {int(facts.finetune['train_n_passages']) - 1} hard negatives per query "
             f"and the in-batch passages, temperature {facts.finetune.get('temperature', 1.0)}.", "",
             *_table(sorted(facts.finetune.items())),
             "## Results", "", "| set | " + " | ".join(_measures(facts)) + " |",
             "|---|" + "---|" * len(_measures(facts)),
             *(f"| {name} | " + " | ".join(_value(values.get(m)) for m in _measures(facts)) + " |"
               for name, values in facts.metrics.items()), "",
             "## Training run", "",
             *(_table(sorted(facts.training.items())) if facts.training
               else ["The MLflow run was not reachable when this folder was exported: time and host unknown.", ""]),
             "## Framework versions (at export)", "", *_table(sorted(facts.versions.items())),
             "## Lineage", "", *_table(list(facts.lineage.items()))]
    return "\n".join(lines).rstrip() + "\n"


def _measures(facts: CardFacts) -> list[str]:
    return list(dict.fromkeys(m for values in facts.metrics.values() for m in values))


def _value(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"
