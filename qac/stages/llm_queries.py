"""The generate_llm_queries@<g> stage, and where every LLM-query stage finds generator ``g``'s files.

``data/<profile>/llm_queries/<g>/`` holds what generator ``g``
(``llm_queries.generators.<g>``) wrote: ``queries.arrow`` (the schema of
``queries.arrow``: pid, queries, row i for passage i), ``prompts.json``
(the model, its revision, the templates, the few-shot examples and the type of
each candidate, so that every prompt can be rebuilt), ``metrics/queries.json``;
the filter stage adds ``filtered.arrow`` and ``metrics/filter.json`` (the kept
share of each filter and overall, Table 5's judge on the first query
before and after filtering, and ROUGE-L against the real training queries of
the passages' documents, before and after). Generation runs through the chunk store of
:mod:`qac.querygen.shards` as ``generate_queries`` does: sharded, resumable,
byte-identical on a rerun. The filter stage is :mod:`qac.stages.filter_llm_queries`, the pre-training
:mod:`qac.stages.pretrain_llm`.
"""

from __future__ import annotations

import json
from pathlib import Path

from qac.config import profile_dir
from qac.errors import UserError
from qac.distributed import autocast_dtype, init_distributed
from qac.io import atomic_path
from qac.llm_queries.prompts import PromptBook, check_templates, draw_examples
from qac.model_specs import is_packaged, packaged_file_problem
from qac.params import params_path
from qac.tracking.lifecycle import tracked_stage

FILTERED = "filtered.arrow"


def query_dir(params, generator: str) -> Path:
    """``data/<profile>/llm_queries/<generator>/``."""
    return profile_dir(params) / "llm_queries" / generator


def variant_queries(params, variant: str) -> Path:
    """The queries file an LLM-query variant pre-trains on."""
    spec = params.llm_queries.variants[variant]
    return query_dir(params, spec.generator) / (FILTERED if spec.filtered else "queries.arrow")


def checked_generator(params, name: str):
    generators = params.llm_queries.generators
    if name not in generators:
        raise UserError(f"{params_path()}: llm_queries.generators has no entry {name!r} (declared: "
                        f"{', '.join(generators) or 'none'})")
    return generators[name]


def prompt_book(params):
    """The prompts of every generator: the templates and ``shots`` examples drawn from the training queries."""
    # looked up when called: tests stand in for it
    from qac.querygen.generator_pairs import build_pairs

    section = params.llm_queries.generation
    problems = check_templates(section.query_types, section.templates, section.example_template)
    if problems:
        raise UserError(f"{params_path()}: llm_queries.generation." + "; ".join(problems))
    examples = []
    if section.shots:
        if not params.train_dataset:
            raise UserError(f"{params_path()}: llm_queries.generation.shots {section.shots} needs train_dataset "
                            "(the training queries the examples come from); set shots: 0 for zero-shot prompts")
        datasets = profile_dir(params) / "datasets"
        pairs = [(p.doc_id, p.source, p.target) for p in build_pairs(datasets, params.train_dataset,
                                                                     [params.train_dataset], False) if p.kind == "query"]
        try:
            examples = draw_examples(pairs, section.shots, params.seed)
        except ValueError as error:
            raise UserError(f"{params_path()}: llm_queries.generation.shots: {error}") from None
    return PromptBook(query_types=tuple(section.query_types), templates=dict(section.templates),
                      example_template=section.example_template, examples=tuple(examples),
                      passage_tokens=section.passage_tokens, example_tokens=section.example_tokens)


def causal_settings(params, name: str):
    # here, not at the top: it loads torch
    from qac.llm_queries.causal_lm import CausalSettings

    entry, section = checked_generator(params, name), params.llm_queries.generation
    sampling = {key: section[key] for key in ("queries_per_passage", "top_p", "top_k", "temperature",
                                              "repeat_penalty", "min_new_tokens", "max_new_tokens",
                                              "drop_duplicates", "drop_empty")}
    return CausalSettings(model=entry.model, revision=entry.revision, gguf_file=entry.gguf_file, chat=entry.chat,
                          prompts=prompt_book(params), seed=params.seed, **sampling)


def generate_llm_queries(params, name: str, *, shard=None, merge=False, merge_only=False) -> dict | None:
    """Generate ``queries.arrow`` and ``prompts.json`` of generator ``name``; the summary in the merging process."""
    import torch

    # here, not at the top: it loads torch
    from qac.llm_queries.causal_lm import CausalQueryGenerator, describe, load_causal_generator, resolve_decode
    # here, not at the top: it loads numpy, pyarrow, torch
    from qac.stages.generation import run_sharded_generation

    section = params.llm_queries.generation
    data, out_dir = profile_dir(params), query_dir(params, name)
    passages = data / "passages.arrow"
    spec = params.llm_queries.generators[name].model if name in params.llm_queries.generators else ""
    missing = packaged_file_problem(spec) if is_packaged(spec) else None
    if missing:         # before any input is read or model loaded: one paragraph naming the key and how to install
        raise UserError(f"llm_queries.generators.{name}.model: {missing}")
    settings = causal_settings(params, name)
    if not passages.exists():
        raise UserError(f"{passages} not found: run the split_passages stage first")
    ctx = init_distributed()
    dtype = autocast_dtype(section.dtype, ctx.device)
    decode = resolve_decode(section.decode, torch.device(ctx.device))
    # The batch and the loop shape the logits, so they are part of the chunks' fingerprint (resume stays exact).
    compute = {"dtype": str(dtype or "float32"), "batch_size": section.batch_size, "decode": decode,
               "sync_every": section.sync_every}
    stage = f"generate_llm_queries@{name}"

    def open_run():
        return tracked_stage(params, stage, stage, kind="querygen",
                             stage_params={**describe(settings), **{k: section[k] for k in section}, **compute},
                             inputs={"passages": passages}, output=out_dir / "queries.arrow", root=data)

    def make_generator():
        model, tokenizer = load_causal_generator(settings.model, settings.revision, settings.gguf_file, ctx.device,
                                                 seed=params.seed)
        return CausalQueryGenerator(model, tokenizer, settings, autocast_dtype=dtype, sync_every=section.sync_every,
                                    decode=decode)

    out_dir.mkdir(parents=True, exist_ok=True)
    merged = run_sharded_generation(ctx, shard=shard, merge=merge, merge_only=merge_only, stage=stage,
                                    passages_path=passages, output=out_dir / "queries.arrow",
                                    source=settings.model, settings=settings, section=section, compute=compute,
                                    open_run=open_run, make_generator=make_generator,
                                    summarize=lambda totals: totals.summary())
    if merged is None:
        return None
    with atomic_path(out_dir / "prompts.json") as tmp:
        tmp.write_text(json.dumps(describe(settings), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return merged[0]
