"""The pretrain_llm@<variant> stage: pre-train an LLM-query variant on its generator's queries.

An ``llm_queries.variants`` entry is a pre-training variant (it reads as a
``pretrain.variants`` entry everywhere, so fine-tuning, evaluation and the
tables treat it as one) whose query contexts come from
``data/<profile>/llm_queries/<generator>/filtered.arrow`` (or
``queries.arrow`` with ``filtered: false``) instead of the doc2query
generator's ``queries.arrow``. The work, its resumption and its outputs are
those of ``pretrain@<variant>`` (:func:`qac.train.pretrain.pretrain`, into
``data/<profile>/pretrain/<variant>/``), plus ``queries.json`` (:func:`queries_record`): which queries the
encoder learned from, with their generator's figures, for the extension table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from qac.errors import UserError
from qac.config import profile_dir
from qac.io import file_md5
from qac.params import params_path
from qac.stages.llm_queries import query_dir, variant_queries
from qac.stages.pretrain import pretrain_variant

QUERIES_RECORD = "queries.json"     # beside the encoder: the queries it pre-trained on (the extension table reads it)


def pretrain_llm_variant(params: Mapping[str, Any], variant: str, *, log_models: bool = False) -> dict:
    """Pre-train LLM-query variant ``variant`` as ``pretrain@<variant>`` would, on its generator's queries;
    the run's summary (:func:`qac.stages.pretrain.pretrain_variant`: the same run, resumption and outputs)."""
    # here, not at the top: it loads pydantic, torch
    from qac.train.pretrain import PretrainSettings

    if variant not in params.llm_queries.variants:
        raise UserError(f"{params_path()}: {variant!r} is no key of llm_queries.variants (declared: "
                        f"{', '.join(params.llm_queries.variants) or 'none'})")
    settings = PretrainSettings.from_params(params, variant)
    if settings.context_type == "passage" or settings.method == "none":
        raise UserError(f"{params_path()}: llm_queries.variants.{variant} reads no queries (method "
                        f"{settings.method}, context {settings.context_type}): make it a pretrain.variants entry")
    queries = variant_queries(params, variant)
    if not queries.exists():
        raise UserError(f"{queries} not found: run the stage that writes it first")

    def write_record(staging: Path) -> None:
        record = queries_record(params, variant, queries, settings.query_count)
        (staging / QUERIES_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")

    return pretrain_variant(params, variant, log_models=log_models, query_set=queries,
                            stage=f"pretrain_llm@{variant}", write_extra=write_record)


def queries_record(params: Mapping[str, Any], variant: str, queries: Path, query_count: int) -> dict[str, Any]:
    """What LLM-query variant ``variant`` pre-trained on: its generator (model, revision), whether filtered, the
    query file and its MD5, the passages and the queries it read (the first ``query_count`` non-blank ones of
    each passage), and the figures its generator's stages wrote (``metrics/queries.json``, ``metrics/filter.json``
    of ``llm_queries/<generator>/``)."""
    # here, not at the top: it loads numpy, pyarrow
    from qac.data.arrowstore import open_queries
    # here, not at the top: it loads numpy
    from qac.reporting.lineage import read_json

    spec = params.llm_queries.variants[variant]
    folder = query_dir(params, spec.generator)
    # As the pre-training reads them (qac.data.context_pairs): the first query_count, less the blank ones.
    used = [[q for q in (texts or [])[:query_count] if q.strip()]
            for texts in open_queries(queries).column("queries").to_pylist()]

    def figures(name: str) -> dict[str, Any] | None:
        path = folder / "metrics" / f"{name}.json"
        return read_json(path) if path.is_file() else None

    prompts = folder / "prompts.json"
    described = read_json(prompts) if prompts.is_file() else {}
    return {"generator": spec.generator, "model": described.get("model"), "revision": described.get("revision"),
            "filtered": bool(spec.filtered), "query_set": str(queries.relative_to(profile_dir(params))),
            "query_set_md5": file_md5(queries), "query_count": query_count, "passages": len(used),
            "passages_with_queries": sum(1 for texts in used if texts), "queries": sum(map(len, used)),
            "generation": figures("queries"), "filter": figures("filter") if spec.filtered else None}
