"""Prompts for a causal-LM query generator: one template per query type, zero- or few-shot.

InPars and Promptagator prompt a language model with a handful of (document,
query) examples followed by the passage; recent synthetic-data studies mix
query types (claims, keywords, questions). Here each query type has its own
template (``llm_queries.generation.templates``) with two fields: ``{examples}``
(the few-shot block, empty in a zero-shot template that leaves it out) and
``{passage}``. The examples are ``shots`` (passage, query) pairs drawn once,
with the stage's seed, from the training queries of ``train_dataset``
(:func:`draw_examples`), the same for every passage, so a prompt is a
function of the passage and its query type alone. Candidate ``j`` of a
passage is of type ``query_types[j % len(query_types)]``.

Passages (the examples' and the prompted one) are cut to a token budget at a
token boundary of the generator's tokenizer, so a long document never pushes
the instruction out of the model's context.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Example:
    """A few-shot example: a training query and the text of a document judged relevant to it."""

    doc_id: str
    passage: str
    query: str


def draw_examples(pairs: Sequence[tuple[str, str, str]], shots: int, seed: int) -> list[Example]:
    """``shots`` examples from ``(doc id, passage, query)`` pairs, drawn with ``random.Random(seed)`` from
    the pairs sorted by (doc id, query), so the draw depends on the seed and the pairs, never on their order.
    One example per query at most: a query judged against two documents would teach the model twice."""
    if shots <= 0:
        return []
    by_query = {}
    for doc_id, passage, query in sorted(pairs, key=lambda p: (p[0], p[2])):
        by_query.setdefault(query, Example(doc_id, passage, query))
    candidates = sorted(by_query.values(), key=lambda e: (e.doc_id, e.query))
    if len(candidates) < shots:
        raise ValueError(f"{shots} few-shot examples asked for, but the training queries give {len(candidates)}")
    return random.Random(seed).sample(candidates, shots)


def cut_to_tokens(text: str, tokenizer, budget: int) -> str:
    """``text`` up to the end of its ``budget``-th token (of ``tokenizer``, no special tokens)."""
    text = " ".join(text.split())
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    if len(offsets) <= budget:
        return text
    return text[:offsets[budget - 1][1]].rstrip()


def check_templates(query_types: Sequence[str], templates: Mapping[str, str], example_template: str) -> list[str]:
    """Problems with the templates, as ``(key, message)`` strings: a query type without a template, a template
    without ``{passage}``, a field other than ``{examples}``/``{passage}`` (or ``{passage}``/``{query}`` in the
    example template)."""
    import string

    problems = []
    for kind in query_types:
        if kind not in templates:
            problems.append(f"templates: no template for query type {kind!r}")
            continue
        fields = {name for _, name, _, _ in string.Formatter().parse(templates[kind]) if name is not None}
        if "passage" not in fields:
            problems.append(f"templates.{kind}: has no {{passage}} field")
        if fields - {"passage", "examples"}:
            problems.append(f"templates.{kind}: unknown field(s) {sorted(fields - {'passage', 'examples'})} "
                            "(only {examples} and {passage})")
    fields = {name for _, name, _, _ in string.Formatter().parse(example_template) if name is not None}
    if fields != {"passage", "query"}:
        problems.append(f"example_template: needs exactly the fields {{passage}} and {{query}}, has {sorted(fields)}")
    return problems


@dataclass(frozen=True)
class PromptBook:
    """Everything a prompt is made of: recorded beside the queries, so that each prompt can be rebuilt."""

    query_types: tuple[str, ...]
    templates: Mapping[str, str]
    example_template: str
    examples: tuple[Example, ...]
    passage_tokens: int          # budget of the prompted passage
    example_tokens: int          # budget of each example's passage

    def type_of(self, candidate: int) -> str:
        """The query type of candidate ``candidate`` of any passage."""
        return self.query_types[candidate % len(self.query_types)]

    def examples_block(self, tokenizer) -> str:
        return "".join(self.example_template.format(passage=cut_to_tokens(e.passage, tokenizer, self.example_tokens),
                                                    query=" ".join(e.query.split()))
                       for e in self.examples)

    def prompts(self, passage: str, tokenizer, examples_block: str | None = None) -> dict[str, str]:
        """The prompt of each query type for ``passage``."""
        block = self.examples_block(tokenizer) if examples_block is None else examples_block
        cut = cut_to_tokens(passage, tokenizer, self.passage_tokens)
        return {kind: self.templates[kind].format(examples=block, passage=cut) for kind in dict.fromkeys(self.query_types)}

    def record(self) -> dict:
        """The JSON record: templates, the examples (doc id, passage, query) and the type of each candidate."""
        return {"query_types": list(self.query_types), "templates": {k: self.templates[k] for k in self.query_types},
                "example_template": self.example_template,
                "examples": [{"doc_id": e.doc_id, "passage": e.passage, "query": e.query} for e in self.examples],
                "passage_tokens": self.passage_tokens, "example_tokens": self.example_tokens,
                "candidate_type": "query_types[candidate index % len(query_types)]"}
