"""What a profile costs on one GPU, stage by stage, from the latest GPU benchmark figures.

``qac profile plan NAME --cost`` prints it before anything runs and, once the
profile's runs are in the MLflow store, beside what they measured
(:mod:`qac.reporting.measured_cost`). The rates are
those ``benchmarks/bench_gpu.py`` measured and ``--publish`` committed as
``reports/bench_gpu.json`` (its device and date are printed with them):

- pre-training: pairs/s of the variant's method at its own pair length (a
  passage context is another 144-token passage, a query context a 32-token
  query: passage pairs are the more work), mixed contexts weighted by
  ``mixed_query_prob``, slowed by the measured GradCache overhead where the
  variant caches gradients, MASTER at its five decoders' rate (an upper bound
  for a variant with fewer);
- fine-tuning: each step is a forward and backward pass (about 3x a forward)
  over the batch's queries and ``train_n_passages`` passages each, at the
  measured encoding rate, for retrievers 1 and 2 (retriever 1 over the
  triples' ~400k queries with ``finetune.r1_queries: triples``, retriever 2
  over all ~503k);
- Table 2's retriever (``tables.zero_shot_retriever: beir``): the
  ``beir_retriever`` stage's training per zero-shot variant, its epochs over
  the ~503k hard-negative queries, at ``beir_retriever.passage_max_len``;
- encoding: MS MARCO's 8.8M passages twice per variant (retriever 1's
  encoding serves mining and evaluation, retriever 2's evaluation) and the
  25M-document BEIR union once per zero-shot retriever, at the zero-shot
  retriever's passage length (350 tokens for the ``beir`` retriever).
  Longer limits scale a pass linearly in tokens, an upper bound: with
  dynamic padding a text shorter than the limit costs less;
- query generation: per million split passages (the split corpus's size is
  known only once the split stage has run);
- LLM query generation (``llm_queries.generators`` with a ``parameters``
  count): per million split passages, 2 x parameters FLOPs for each prompt
  token (one prompt per query type in use, at most the passage's and the
  examples' token budgets and a template allowance) and each query token (C x
  ``max_new_tokens``) at the fallback's 35% MFU of 989 TFLOP/s, never
  measured: a lower bound, as decoding a token at a time runs below that MFU.

Without GPU figures it says so and falls back to what the documentation
states: encoding at the audit's 7.4 H100-hours per BEIR encoding
(docs/data.md, "Cost"), pre-training from 6 x parameters x tokens at the
35% MFU the project targets on an H100's 989 TFLOP/s, GradCache at 4/3 of the
full-batch step (each forward runs twice), and no generation rate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from qac.config import REPO_ROOT, render_profile
from qac.params.variants import variant_settings
from qac.benchmarking import markdown_table

if TYPE_CHECKING:
    from qac.params.sections import Params

FIGURES = REPO_ROOT / "reports" / "bench_gpu.json"
MSMARCO_PASSAGES = 8_841_823
MSMARCO_TRAIN_QUERIES = 502_939        # train queries with a judged passage
MSMARCO_TRIPLES_QUERIES = 400_000      # about 400k of them are in the official triples (tevatron issue 81)
ENCODED_TOKENS = 144                   # the length the rates are measured (and the audit's BEIR figure taken) at
BEIR_UNION_DOCUMENTS = 25_000_000      # the 14 BEIR corpora of Table 2, about 25M documents
QUERY_TOKENS = 32
PROMPT_TEMPLATE_TOKENS = 64            # an LLM prompt's instruction, labels and chat turn, over its passages
LLM_GENERATION = "generate LLM queries"

# The documented fallback (docs/data.md, "Cost"): 21 encodings of the BEIR union took about 156 H100-hours.
FALLBACK_ENCODE_RATE = 21 * BEIR_UNION_DOCUMENTS / (156 * 3600)
FALLBACK_MFU, FALLBACK_PEAK, BERT_BASE_PARAMETERS = 0.35, 989e12, 110e6
FALLBACK_GRAD_CACHE = 4 / 3            # the cached step re-runs each forward once: 4 of 3 units of work


@dataclass
class Rates:
    """Measured (or fallback) rates of one device."""

    device: str
    date: str
    source: str
    measured: bool
    pretrain: dict[tuple[str, str], float] = field(default_factory=dict)    # (method, context) -> pairs/s
    grad_cache_ratio: float | None = None
    encode: float | None = None                                               # passages/s at 144 tokens
    generation: float | None = None                                           # passages/s, 20 queries each
    measured_at: dict[str, str] = field(default_factory=dict)                 # section -> when it was measured

    def figure(self, *sections: str) -> str:
        """The device and date of the figures of ``sections`` a row's rate comes from: one benchmark file can
        merge runs of several days, so each row names its own."""
        when = " and ".join(f"{section} {self.measured_at.get(section, self.date)}" for section in sections)
        return f"{'' if self.measured else 'not measured: '}{self.device}, {when}"

    @classmethod
    def from_figures(cls, data: Mapping[str, Any], source: str) -> "Rates":
        # a pre-training section stopped midway (still "running", or failed at its cap) keeps the rows it finished
        sections = {name: s for name, s in data.get("sections", {}).items()
                    if s.get("status") == "done" or (name == "pretrain" and s.get("rows"))}
        dry = bool(data.get("dry_run"))
        rates = cls(device=data["device"], date=data["date"], measured=not dry,
                    source=f"a dry run's figures ({source}), not a GPU's" if dry else source)
        rates.measured_at = {name: section.get("measured", rates.date) for name, section in sections.items()}
        pretrain = sections.get("pretrain", {})
        for row in pretrain.get("rows", []):
            # the rows at the section's batch (a row at another batch shows how the rate scales)
            if row["recipe"] == "ours" and "pairs/s" in row and row.get("pairs/step", pretrain.get(
                    "batch_size")) == pretrain.get("batch_size"):
                rates.pretrain[(row["method"], row["context"])] = row["pairs/s"]
        if "grad_cache" in sections:
            rates.grad_cache_ratio = sections["grad_cache"]["time ratio"]
        if "encoding" in sections:
            rates.encode = sections["encoding"]["passages/s"]
        if "generation" in sections:
            rates.generation = sections["generation"]["rows"][0]["passages/s"]
        return rates

    @classmethod
    def fallback(cls) -> "Rates":
        rates = cls(device="H100 (assumed)", date="n/a", measured=False,
                    source="no GPU figures yet (reports/bench_gpu.json is missing): encoding at the audit's "
                           "7.4 H100-hours per BEIR encoding (docs/data.md), pre-training at 6 x parameters x "
                           "tokens and 35% MFU of 989 TFLOP/s, GradCache x4/3; run benchmarks/bench_gpu.py on a GPU and publish "
                           "its figures for measured ones")
        for method, decoders in (("cocondenser", 0), ("cotmae", 1), ("master", 5)):
            for context, other in (("passage", 144), ("query", QUERY_TOKENS)):
                # the encoder over both sides; MASTER's and CoT-MAE's decoders (2 layers of 12) over theirs
                tokens = 144 + other + decoders * (2 / 12) * 144
                rates.pretrain[(method, context)] = FALLBACK_MFU * FALLBACK_PEAK / (
                    6 * BERT_BASE_PARAMETERS * tokens)
        rates.encode = FALLBACK_ENCODE_RATE
        rates.grad_cache_ratio = FALLBACK_GRAD_CACHE
        return rates


def load_rates(path: str | Path | None = None) -> Rates:
    """The published GPU figures, or the documented fallback when there are none."""
    path = Path(path) if path else FIGURES
    if not path.exists():
        return Rates.fallback()
    return Rates.from_figures(json.loads(path.read_text(encoding="utf-8")), source=str(path))


def pair_rate(rates: Rates, variant: Mapping[str, Any]) -> tuple[float, str]:
    """Pairs/s of a pre-training variant (its settings: :func:`variant_settings`) and how it was derived."""
    method, context = variant["method"], variant["context_type"]
    if context == "mixed":
        share = variant["mixed_query_prob"]
        query, passage = rates.pretrain[(method, "query")], rates.pretrain[(method, "passage")]
        rate = 1 / (share / query + (1 - share) / passage)
        how = f"{method}, {share:.0%} query / {1 - share:.0%} passage pairs"
    else:
        rate, how = rates.pretrain[(method, context)], f"{method}, {context} pairs"
    if method == "master" and len(variant["master_decoders"]) < 5:
        how += " (the 5-decoder rate: an upper bound)"
    if variant["grad_cache_chunk"] and method == "cocondenser" and rates.grad_cache_ratio:
        rate /= rates.grad_cache_ratio
        how += f", GradCache chunk {variant['grad_cache_chunk']} (x{rates.grad_cache_ratio:.2f})"
    return rate, how


def stage_costs(params: Params, rates: Rates) -> list[dict[str, Any]]:
    """One row per stage and variant: what it processes, at what rate, in GPU-hours (None: no rate)."""
    extensions = params.llm_queries.variants     # costed apart: extension_costs
    variants = {name: variant_settings(params, name) for name in params.pretrain.variants if name not in extensions}
    rows = _variant_rows(params, rates, variants)
    if rates.encode:
        encodings = 2 * len(variants)
        rows.append({"stage": "encode MS MARCO (r1: mining and evaluation, r2: evaluation)", "variant": "all",
                     "work": f"{encodings} x {MSMARCO_PASSAGES:,} passages", "rate": f"{rates.encode:,.0f} passages/s",
                     "basis": "encoding rate", "hours": encodings * MSMARCO_PASSAGES / rates.encode / 3600,
                     "figures": rates.figure("encoding")})
        evaluate = params.evaluate
        zero_shot = evaluate.zero_shot_variants
        zero_shot = len(variants) if zero_shot is None else len(zero_shot)
        retrievers = evaluate.zero_shot_retrievers
        retrievers = 2 if retrievers is None else max(1, len(retrievers))
        beir = params.beir_retriever if params.tables.zero_shot_retriever == "beir" else None
        if zero_shot and beir:
            length = beir.passage_max_len / ENCODED_TOKENS
            per_query = beir.train_n_passages * length + QUERY_TOKENS / ENCODED_TOKENS
            passes = beir.epochs * MSMARCO_TRAIN_QUERIES * per_query * 3
            rows.append({"stage": "beir_retriever (Table 2's retriever)", "variant": f"{zero_shot} variants",
                         "work": f"{zero_shot} x {beir.epochs} epochs x {MSMARCO_TRAIN_QUERIES:,} queries",
                         "rate": f"{rates.encode:,.0f} passages/s",
                         "basis": f"3 x the encoding rate's forward, passages at {beir.passage_max_len} tokens "
                                  f"(x{length:.2f})",
                         "hours": zero_shot * passes / rates.encode / 3600, "figures": rates.figure("encoding")})
        if zero_shot:
            count = zero_shot * (1 if beir else retrievers)
            length = beir.passage_max_len / ENCODED_TOKENS if beir else 1.0
            rows.append({"stage": "encode BEIR (zero-shot)", "variant": f"{zero_shot} variants",
                         "work": f"{count} x {BEIR_UNION_DOCUMENTS:,} documents",
                         "rate": f"{rates.encode:,.0f} passages/s",
                         "basis": f"encoding rate, {beir.passage_max_len} tokens (x{length:.2f})" if beir
                         else "encoding rate",
                         "hours": count * length * BEIR_UNION_DOCUMENTS / rates.encode / 3600,
                         "figures": rates.figure("encoding")})
    rows.append({"stage": "generate queries", "variant": "per million split passages",
                 "work": "1,000,000 passages", "rate": f"{rates.generation:,.1f} passages/s" if rates.generation
                 else "no figure", "basis": "query generation, 20 queries of up to 64 tokens",
                 "hours": 1e6 / rates.generation / 3600 if rates.generation else None,
                 "figures": rates.figure("generation") if rates.generation else "none"})
    return rows


def _variant_rows(params: Params, rates: Rates, variants: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The pre-training row of each trained variant, then the fine-tuning row of each variant."""
    rows = []
    for name, variant in variants.items():
        if variant["method"] == "none":
            continue
        pairs = variant["steps"] * variant["batch_size"]
        try:
            rate, how = pair_rate(rates, variant)
        except KeyError as missing:
            rows.append({"stage": "pretrain", "variant": name, "work": f"{pairs:,} pairs", "rate": "no figure",
                         "basis": f"the figures have no rate for {missing.args[0]}", "hours": None, "figures": "none"})
            continue
        cached = variant["grad_cache_chunk"] and variant["method"] == "cocondenser" and rates.grad_cache_ratio
        rows.append({"stage": "pretrain", "variant": name, "work": f"{pairs:,} pairs", "rate": f"{rate:,.0f} pairs/s",
                     "basis": how, "hours": pairs / rate / 3600,
                     "figures": rates.figure("pretrain", "grad_cache") if cached else rates.figure("pretrain")})
    finetune = params.finetune
    if rates.encode:
        per_query = finetune.train_n_passages + QUERY_TOKENS / ENCODED_TOKENS   # passage-equivalents
        r1_queries = MSMARCO_TRIPLES_QUERIES if finetune.r1_queries == "triples" else MSMARCO_TRAIN_QUERIES
        epochs = finetune.epochs
        passes = epochs * (r1_queries + MSMARCO_TRAIN_QUERIES) * per_query * 3   # r1 and r2, forward + backward
        for name in variants:
            rows.append({"stage": "finetune (r1 and r2)", "variant": name,
                         "work": f"{epochs} epochs x {r1_queries:,} queries (r1) and {MSMARCO_TRAIN_QUERIES:,} (r2)",
                         "rate": f"{rates.encode:,.0f} passages/s", "basis": "3 x the encoding rate's forward",
                         "hours": passes / rates.encode / 3600, "figures": rates.figure("encoding")})
    return rows


def extension_costs(params: Params, rates: Rates) -> list[dict[str, Any]]:
    """The rows of the study's extensions (``llm_queries``): each generator's generation per million split
    passages, then each LLM-query variant's pre-training, fine-tuning and its two MS MARCO encodings."""
    rows = [llm_generation_cost(params, name) for name in params.llm_queries.generators]
    variants = {name: variant_settings(params, name) for name in params.llm_queries.variants}
    rows += _variant_rows(params, rates, variants)
    if rates.encode:
        rows += [{"stage": "encode MS MARCO (r1: mining and evaluation, r2: evaluation)", "variant": name,
                  "work": f"2 x {MSMARCO_PASSAGES:,} passages", "rate": f"{rates.encode:,.0f} passages/s",
                  "basis": "encoding rate", "hours": 2 * MSMARCO_PASSAGES / rates.encode / 3600,
                  "figures": rates.figure("encoding")} for name in variants]
    return rows


def llm_generation_cost(params: Params, name: str) -> dict[str, Any]:
    """The row of generator ``name``: its FLOPs per million passages at the fallback MFU (see the module)."""
    section, parameters = params.llm_queries.generation, params.llm_queries.generators[name].parameters
    count = section.queries_per_passage
    types = len({section.query_types[j % len(section.query_types)] for j in range(count)})
    prompt = section.passage_tokens + section.shots * section.example_tokens + PROMPT_TEMPLATE_TOKENS
    tokens = types * prompt + count * section.max_new_tokens
    row = {"stage": LLM_GENERATION, "variant": name, "work": "1,000,000 passages",
           "basis": f"{types} prompts of <= {prompt:,} tokens and {count} queries of <= {section.max_new_tokens} "
                    f"tokens a passage", "figures": "not measured: 2 x parameters FLOPs a token at 35% MFU of "
                                                   "989 TFLOP/s (a lower bound)"}
    if parameters is None:
        return {**row, "rate": "no figure", "hours": None,
                "basis": row["basis"] + f"; llm_queries.generators.{name}.parameters is null"}
    rate = FALLBACK_MFU * FALLBACK_PEAK / (2 * parameters * tokens)
    return {**row, "rate": f"{rate:,.0f} passages/s ({parameters / 1e9:.2g}B parameters)",
            "hours": 1e6 / rate / 3600}


def variant_hours(rows: list[dict[str, Any]], variant: str) -> float | None:
    """GPU-hours of the rows of ``variant`` (of :func:`extension_costs`: pre-training, fine-tuning, encodings);
    None when one of them has no rate."""
    hours = [row["hours"] for row in rows if row["variant"] == variant]
    return None if not hours or any(h is None for h in hours) else sum(hours)


def cost_text(params: Params, rates: Rates, measured=None) -> str:
    """The projection; ``measured(rows)``, when given, is a column beside it: what the profile's runs measured
    for each row (:func:`qac.reporting.measured_cost.projection_column`)."""
    rows = stage_costs(params, rates)
    columns = ["stage", "variant", "work", "rate", "basis", "hours", "figures"]
    if measured is not None:
        rows = [{**row, "measured": text} for row, text in zip(rows, measured(rows))]
        columns.append("measured")
    known = sum(row["hours"] for row in rows if row["hours"] is not None and row["stage"] != "generate queries")
    if rates.measured:
        head = f"GPU-hours on one {rates.device}, measured {rates.date} ({rates.source})."
    else:
        head = f"GPU-hours on one {rates.device}: NOT measured, {rates.source}."
    head = f"profile {params.profile}: {head}"
    table = markdown_table([{**row, "hours": f"{row['hours']:,.1f}" if row["hours"] is not None else "n/a"}
                            for row in rows], columns)
    text = f"{head}\n\n{table}\n\nTotal (query generation apart): {known:,.0f} GPU-hours."
    extension = extension_costs(params, rates)
    if extension:
        runs = sum(row["hours"] for row in extension if row["hours"] is not None and row["stage"] != LLM_GENERATION)
        text += ("\n\nExtensions (llm_queries: LLM-query variants, their own table, not the paper's cells):\n\n"
                 + markdown_table([{**row, "hours": f"{row['hours']:,.1f}" if row["hours"] is not None else "n/a"}
                                   for row in extension], columns[:7])
                 + f"\n\nExtension total (LLM query generation apart): {runs:,.0f} GPU-hours.")
    return text


def print_cost(name: str, figures: str | Path | None = None, measured=None) -> int:
    """Print the projection of profile ``name``; ``measured(params)``, when given, returns the column of
    measured figures beside it (None: the profile has no runs to show) and a note printed below."""
    # here, not at the top: it loads pydantic
    from qac.params import validate_params

    params = validate_params(render_profile(name))
    beside = measured(params) if measured is not None else None
    column, note = beside if beside is not None else (None, None)
    print(cost_text(params, load_rates(figures), column))
    if note:
        print(f"\n{note}")
    return 0
